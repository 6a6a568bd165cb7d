//! Secret redaction: the one scrub every text a model provider or a tool owner sends the fleet goes
//! through before the fleet stores, streams or logs it, so a provider that echoes the key it was
//! called with cannot put that key anywhere the fleet keeps.

use std::borrow::Cow;

use aho_corasick::AhoCorasick;

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// The shortest configured value (and bearer credential) that is redacted, in bytes. Shorter ones
/// are not real secrets, and scrubbing them would eat common words out of every answer.
pub const MIN_SECRET_LEN: usize = 8;

/// The shortest key after `sk-` that counts as an API key (OpenAI's and Anthropic's are far longer).
const MIN_SK_KEY_LEN: usize = 20;

/// The schemes whose credential is redacted wherever the scheme appears as a word.
const SCHEMES: [&str; 2] = ["bearer", "basic"];

/// Names whose value is a credential wherever the name appears as a word and is given a value
/// (`api_key='…'`, `"password": "…"`, `token=…`), longest first. Any case.
const CREDENTIAL_NAMES: [&str; 12] = [
    "refresh_token",
    "access_token",
    "client_secret",
    "secret_key",
    "auth_token",
    "password",
    "api_key",
    "api-key",
    "apikey",
    "passwd",
    "secret",
    "token",
];

/// The shortest value given to a credential name that is redacted.
const MIN_NAMED_VALUE_LEN: usize = 4;

/// Replaces the process's configured secrets, and anything shaped like a credential, with
/// [`REDACTED`]. Built once from the configuration; its `Debug` never shows a secret.
#[derive(Clone, Default)]
pub struct Redactor {
    /// Longest first (the longest is reported by `longest`).
    secrets: Vec<String>,
    /// Every secret in one automaton, built once: a text is scanned once for all of them, with
    /// overlapping matches reported, so a run of overlapping secrets is found whole.
    finder: Option<AhoCorasick>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} secrets)", self.secrets.len())
    }
}

impl Redactor {
    /// A redactor of `secrets` (surrounding whitespace ignored); values shorter than
    /// [`MIN_SECRET_LEN`] are ignored.
    pub fn new<S: AsRef<str>>(secrets: impl IntoIterator<Item = S>) -> Self {
        let mut secrets: Vec<String> =
            secrets.into_iter().map(|s| s.as_ref().trim().to_string()).filter(|s| s.len() >= MIN_SECRET_LEN).collect();
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
        // An automaton that cannot be built (past its size limits) leaves the scan secret by secret.
        let finder = (!secrets.is_empty()).then(|| AhoCorasick::new(&secrets).ok()).flatten();
        Redactor { secrets, finder }
    }

    /// `text` without its secrets: every occurrence of a configured secret, the credential after
    /// `Bearer`/`Basic` (any case; the scheme is kept) and any `sk-` key of 20 or more key
    /// characters becomes [`REDACTED`]. Clean text comes back borrowed. Applying it twice changes
    /// nothing more.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut spans = self.secret_spans(text);
        spans.extend(credential_spans(text));
        if spans.is_empty() {
            return Cow::Borrowed(text);
        }
        spans.sort_unstable();
        let mut out = String::with_capacity(text.len());
        let mut done = 0;
        for (start, end) in merge(spans) {
            out.push_str(&text[done..start]);
            out.push_str(REDACTED);
            done = end;
        }
        out.push_str(&text[done..]);
        Cow::Owned(out)
    }

    /// `text` without its secrets (`redact`) and without `extra`, a secret not configured here
    /// (the secret of the tool or webhook whose answer this is); an `extra` shorter than
    /// [`MIN_SECRET_LEN`] is no secret.
    pub fn redact_with<'a>(&self, extra: Option<&str>, text: &'a str) -> Cow<'a, str> {
        match extra.filter(|s| s.len() >= MIN_SECRET_LEN && text.contains(*s)) {
            Some(secret) => Cow::Owned(self.redact(&text.replace(secret, REDACTED)).into_owned()),
            None => self.redact(text),
        }
    }

    /// Redacts every string of `value` (keys included), in place, as `redact_with` does: a tool's
    /// result is data, and a secret in it is as much a secret as one in an error.
    pub fn redact_json(&self, extra: Option<&str>, value: &mut serde_json::Value) {
        use serde_json::Value;
        match value {
            Value::String(text) => {
                if let Cow::Owned(clean) = self.redact_with(extra, text) {
                    *text = clean;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|item| self.redact_json(extra, item)),
            Value::Object(map) => {
                let dirty: Vec<String> =
                    map.keys().filter(|k| matches!(self.redact_with(extra, k), Cow::Owned(_))).cloned().collect();
                for key in dirty {
                    if let Some(v) = map.remove(&key) {
                        map.insert(self.redact_with(extra, &key).into_owned(), v);
                    }
                }
                map.values_mut().for_each(|v| self.redact_json(extra, v));
            }
            _ => {}
        }
    }

    /// Whether no secret is configured (the shape scrubs still apply).
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// The longest configured secret, in bytes (0 without any).
    pub fn longest(&self) -> usize {
        self.secrets.first().map_or(0, String::len)
    }

    fn secret_spans(&self, text: &str) -> Vec<(usize, usize)> {
        match &self.finder {
            Some(finder) => finder.find_overlapping_iter(text).map(|m| (m.start(), m.end())).collect(),
            None => self
                .secrets
                .iter()
                .flat_map(|secret| text.match_indices(secret.as_str()).map(|(at, s)| (at, at + s.len())))
                .collect(),
        }
    }

    /// A redactor for a stream of pieces (a model's content tokens): see [`StreamRedactor`].
    pub fn stream(&self) -> StreamRedactor<'_> {
        StreamRedactor { redactor: self, held: String::new(), after_word: false }
    }
}

/// Overlapping or touching spans joined, in order.
fn merge(sorted: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(sorted.len());
    for (start, end) in sorted {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// Characters of a bearer credential (RFC 7235's token68).
fn is_credential_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b)
}

/// Characters of an `sk-` API key.
fn is_key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

/// The spans of credentials recognised by their shape, in one pass over the bytes: at a word's
/// start, an `sk-…` key, the credential after `Bearer `/`Basic ` (any case, then spaces), or the
/// value given to a credential name (`named_value`). Every span starts and ends at an ASCII byte,
/// so it is a `str` boundary.
fn credential_spans(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let word_start = i == 0 || !bytes[i - 1].is_ascii_alphanumeric();
        if !word_start {
            i += 1;
            continue;
        }
        if let Some(span) = sk_key(bytes, i).or_else(|| scheme_credential(bytes, i)) {
            spans.push(span);
            i = span.1;
        } else if let Some(span) = named_value(bytes, i) {
            spans.push(span);
            // The value may itself be a scheme's word, whose credential follows it.
            i = span.0;
        } else {
            i += 1;
        }
    }
    spans
}

/// How far from `from` bytes satisfying `of` run.
fn run_from(bytes: &[u8], from: usize, of: impl Fn(u8) -> bool) -> usize {
    from + bytes[from..].iter().take_while(|b| of(**b)).count()
}

/// An `sk-…` API key starting at `i`.
fn sk_key(bytes: &[u8], i: usize) -> Option<(usize, usize)> {
    if !bytes[i..].starts_with(b"sk-") {
        return None;
    }
    let end = run_from(bytes, i + 3, is_key_byte);
    (end - (i + 3) >= MIN_SK_KEY_LEN).then_some((i, end))
}

/// The credential after a scheme (`Bearer`, `Basic`) starting at `i`.
fn scheme_credential(bytes: &[u8], i: usize) -> Option<(usize, usize)> {
    let scheme = SCHEMES.iter().find(|s| starts_with_ignore_case(&bytes[i..], s.as_bytes()))?;
    let after = i + scheme.len();
    let start = run_from(bytes, after, |b| b == b' ' || b == b'\t');
    let end = run_from(bytes, start, is_credential_byte);
    (start > after && end - start >= MIN_SECRET_LEN).then_some((start, end))
}

/// The value given to a credential name (`CREDENTIAL_NAMES`) starting at `i`: the name, quotes or
/// spaces, `=` or `:`, quotes or spaces, and the value.
fn named_value(bytes: &[u8], i: usize) -> Option<(usize, usize)> {
    let quote_or_space = |b: u8| matches!(b, b' ' | b'\t' | b'\'' | b'"');
    let name = CREDENTIAL_NAMES.iter().find(|n| starts_with_ignore_case(&bytes[i..], n.as_bytes()))?;
    let after = run_from(bytes, i + name.len(), quote_or_space);
    if !matches!(bytes.get(after), Some(b'=' | b':')) {
        return None;
    }
    let start = run_from(bytes, after + 1, quote_or_space);
    let end = run_from(bytes, start, is_credential_byte);
    (end - start >= MIN_NAMED_VALUE_LEN).then_some((start, end))
}

fn starts_with_ignore_case(haystack: &[u8], prefix: &[u8]) -> bool {
    haystack.len() >= prefix.len() && haystack[..prefix.len()].eq_ignore_ascii_case(prefix)
}

/// Redaction of a text that arrives in pieces, where a secret may be cut across two of them: a
/// piece's tail that could begin a configured secret is held back until the next piece shows
/// whether it does. Only a tail that starts a word is held (a secret stands apart from the text
/// around it), so the ends of ordinary words go out with their piece. Only configured secrets are
/// held for; the shape scrubs apply to each piece as it goes out.
pub struct StreamRedactor<'a> {
    redactor: &'a Redactor,
    held: String,
    /// Whether the last character sent out is alphanumeric (a held tail then starts no word).
    after_word: bool,
}

impl StreamRedactor<'_> {
    /// What of the text so far may go out now, redacted (`None`: nothing yet).
    pub fn push(&mut self, piece: &str) -> Option<String> {
        self.held.push_str(piece);
        let keep = self.unfinished_tail();
        let ready: String = self.held.drain(..self.held.len() - keep).collect();
        let last = ready.chars().next_back()?;
        self.after_word = last.is_alphanumeric();
        Some(self.redactor.redact(&ready).into_owned())
    }

    /// The rest, at the end of the stream.
    pub fn finish(self) -> Option<String> {
        (!self.held.is_empty()).then(|| self.redactor.redact(&self.held).into_owned())
    }

    /// How many bytes at the end of what is held could be the start of a configured secret (or of
    /// a whole secret that the redaction of the part before would cut).
    fn unfinished_tail(&self) -> usize {
        let held = self.held.as_str();
        let longest = self.redactor.longest().min(held.len());
        // A whole secret ending the text is redacted as it is; only a proper prefix waits.
        (1..longest.saturating_add(1))
            .rev()
            .filter(|n| held.is_char_boundary(held.len() - n))
            .filter(|n| self.starts_word(held.len() - n))
            .find(|n| {
                let tail = &held[held.len() - n..];
                self.redactor.secrets.iter().any(|s| s.len() > *n && s.starts_with(tail))
            })
            .unwrap_or(0)
    }

    /// Whether the held text's byte `at` begins a word.
    fn starts_word(&self, at: usize) -> bool {
        match self.held[..at].chars().next_back() {
            Some(before) => !before.is_alphanumeric(),
            None => !self.after_word,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-test-SECRET-0123456789abcdef";

    fn redactor() -> Redactor {
        Redactor::new([KEY, "hunter2-long-password", "short"])
    }

    #[test]
    fn configured_secrets_are_replaced_wherever_they_are() {
        let r = redactor();
        assert_eq!(r.redact(&format!("invalid api key {KEY}")), "invalid api key [redacted]");
        assert_eq!(r.redact(KEY), REDACTED, "the whole text");
        assert_eq!(r.redact(&format!("{KEY}{KEY}")), REDACTED, "back to back");
        assert_eq!(r.redact(&format!("\"{KEY}\",x")), "\"[redacted]\",x");
        assert_eq!(r.redact("pw=hunter2-long-password;"), "pw=[redacted];");
        assert_eq!(r.redact("é hunter2-long-password é"), "é [redacted] é");
    }

    #[test]
    fn short_values_are_not_secrets() {
        let r = redactor();
        assert_eq!(r.redact("a short answer"), "a short answer");
        assert_eq!(Redactor::new(["", "   ", "1234567"]).secrets.len(), 0);
        assert_eq!(format!("{r:?}"), "Redactor(2 secrets)", "Debug shows no secret");
    }

    #[test]
    fn overlapping_secrets_are_redacted_as_one_run() {
        let r = Redactor::new(["abcdefgh12", "fgh12345xyz"]);
        assert_eq!(r.redact("<abcdefgh12345xyz>"), "<[redacted]>");
        let nested = Redactor::new(["outer-secret-value", "secret-v"]);
        assert_eq!(nested.redact("an outer-secret-value and a secret-v"), "an [redacted] and a [redacted]");
    }

    proptest::proptest! {
        /// The automaton finds what a scan secret by secret finds: every occurrence, overlapping
        /// ones included.
        #[test]
        fn one_scan_finds_what_a_scan_per_secret_finds(
            secrets in proptest::collection::vec("[ab]{8,10}", 1..4),
            text in "[ab ]{0,40}",
        ) {
            let r = Redactor::new(&secrets);
            let mut found = r.secret_spans(&text);
            let mut each: Vec<(usize, usize)> = r
                .secrets
                .iter()
                .flat_map(|s| {
                    let text = &text;
                    (0..text.len()).filter(move |at| text[*at..].starts_with(s.as_str())).map(move |at| (at, at + s.len()))
                })
                .collect();
            found.sort_unstable();
            each.sort_unstable();
            proptest::prop_assert_eq!(found, each);
        }
    }

    #[test]
    fn bearer_and_basic_credentials_lose_the_credential_only() {
        let r = Redactor::default();
        assert_eq!(r.redact("Authorization: Bearer abc.DEF-123_456"), "Authorization: Bearer [redacted]");
        assert_eq!(r.redact("authorization: bearer   abcdefghij, next"), "authorization: bearer   [redacted], next");
        assert_eq!(r.redact("BASIC dXNlcjpwYXNzd29yZA=="), "BASIC [redacted]");
        assert_eq!(r.redact("missing bearer token"), "missing bearer token", "a word, not a credential");
        assert_eq!(r.redact("Bearer"), "Bearer");
        assert_eq!(r.redact("xBearer abcdefghij"), "xBearer abcdefghij", "only a word of its own");
        assert_eq!(r.redact("Bearer\nabcdefghij"), "Bearer\nabcdefghij", "same line only");
    }

    #[test]
    fn api_key_shapes_are_redacted() {
        let r = Redactor::default();
        assert_eq!(r.redact("key sk-abcdefghijklmnopqrstuvwxyz012 bad"), "key [redacted] bad");
        assert_eq!(r.redact("sk-proj-AbC_dEf-0123456789xyz."), "[redacted].");
        assert_eq!(r.redact("sk-short"), "sk-short");
        assert_eq!(r.redact("task-abcdefghijklmnopqrstuvwxyz"), "task-abcdefghijklmnopqrstuvwxyz", "inside a word");
    }

    #[test]
    fn clean_text_is_borrowed_and_redaction_is_idempotent() {
        let r = redactor();
        assert!(matches!(r.redact("nothing to see here, basic bearer sk-"), Cow::Borrowed(_)));
        for text in [
            format!("Bearer {KEY} and {KEY}"),
            "Basic dXNlcjpwYXNzd29yZA== hunter2-long-password".to_string(),
            format!("{KEY}hunter2-long-password sk-abcdefghijklmnopqrstuvwxyz"),
        ] {
            let once = r.redact(&text).into_owned();
            assert!(!once.contains(KEY) && !once.contains("hunter2"), "{once}");
            assert_eq!(r.redact(&once), once, "twice changes nothing more");
            assert!(matches!(r.redact(&once), Cow::Borrowed(_)));
        }
    }

    /// Every way of cutting `text` into two or three pieces streams out as `text` redacted whole.
    #[test]
    fn a_secret_cut_across_stream_pieces_is_still_redacted() {
        let r = redactor();
        let text = format!("the key is {KEY}, see");
        let whole = r.redact(&text).into_owned();
        for a in 0..=text.len() {
            for b in a..=text.len() {
                let mut stream = r.stream();
                let mut out = String::new();
                for piece in [&text[..a], &text[a..b], &text[b..]] {
                    out.extend(stream.push(piece));
                }
                out.extend(stream.finish());
                assert_eq!(out, whole, "cut at {a} and {b}");
            }
        }
    }

    #[test]
    fn clean_pieces_stream_out_as_they_come() {
        let r = redactor();
        let mut stream = r.stream();
        assert_eq!(stream.push("Hel").as_deref(), Some("Hel"));
        assert_eq!(stream.push("lo world").as_deref(), Some("lo world"));
        assert_eq!(stream.push(" sk-te"), Some(" ".into()), "a possible secret's start waits");
        assert_eq!(stream.push("a"), Some("sk-tea".into()), "and goes once it is not one");
        assert_eq!(stream.push("short").as_deref(), Some("short"));
        assert_eq!(stream.push(" sk-test"), Some(" ".into()));
        assert_eq!(stream.finish().as_deref(), Some("sk-test"), "the end lets the rest out");

        let mut stream = r.stream();
        assert_eq!(stream.push("thanks").as_deref(), Some("thanks"), "a word's end is no secret's start");
        assert_eq!(stream.push("h").as_deref(), Some("h"), "nor is a piece that goes on a word");
        assert_eq!(stream.push(" h"), Some(" ".into()));
        assert_eq!(stream.push("unter2-long-password!").as_deref(), Some("[redacted]!"));
    }

    #[test]
    fn a_json_values_strings_and_keys_are_redacted_in_place() {
        let r = Redactor::new(["sk-test-SECRET-0123456789abcdef"]);
        let mut v = serde_json::json!({"echo": "key sk-test-SECRET-0123456789abcdef", "n": 3,
            "list": ["sk-test-SECRET-0123456789abcdef", {"sk-test-SECRET-0123456789abcdef": true}]});
        r.redact_json(None, &mut v);
        assert_eq!(
            v,
            serde_json::json!({"echo": "key [redacted]", "n": 3, "list": ["[redacted]", {"[redacted]": true}]})
        );
    }

    #[test]
    fn a_secret_not_configured_is_replaced_where_it_is_named() {
        let mut v = serde_json::json!({"echo": "my secret is whsec_tool_secret_0001", "whsec_tool_secret_0001": [1]});
        let r = Redactor::new(["sk-test-SECRET-0123456789abcdef"]);
        r.redact_json(Some("whsec_tool_secret_0001"), &mut v);
        assert_eq!(v, serde_json::json!({"echo": "my secret is [redacted]", "[redacted]": [1]}));
        let mut short = serde_json::json!("abc");
        r.redact_json(Some("abc"), &mut short);
        assert_eq!(short, "abc", "too short to be a secret");
        let both = "whsec_tool_secret_0001 and sk-test-SECRET-0123456789abcdef";
        assert_eq!(r.redact_with(Some("whsec_tool_secret_0001"), both), "[redacted] and [redacted]");
    }

    #[test]
    fn a_value_given_to_a_credential_name_is_redacted() {
        let r = Redactor::default();
        let text = r#"rejected api_key='sk-live-51HxQ2' password: "pa55w0rd-x" token=abcd1234, Secret : s3cr3t!"#;
        assert_eq!(
            r.redact(text),
            r#"rejected api_key='[redacted]' password: "[redacted]" token=[redacted], Secret : [redacted]!"#
        );
        assert_eq!(r.redact(&r.redact(text)), r.redact(text), "applying it twice changes nothing");
        assert_eq!(r.redact("token: Bearer abcdefgh12"), "token: [redacted] [redacted]");
        for kept in ["completion_tokens: 12", "max_tokens=100", "the token is spent", "password: no", "tokens=5"] {
            assert_eq!(r.redact(kept), kept);
        }
    }
}

//! Error hygiene: the one form every error takes before it is stored or emitted (attempt history,
//! execution and dead-letter records, SSE `error` frames, webhook payloads).

/// The longest error message the fleet stores or emits, in characters.
pub const MAX_ERROR_CHARS: usize = 512;

/// One short line: stack-trace lines dropped, ANSI escapes and control characters gone, URLs
/// stripped of credentials, query string and fragment, at most [`MAX_ERROR_CHARS`] characters.
/// Applying it twice changes nothing more.
pub fn sanitize_error(text: &str) -> String {
    let mut in_backtrace = false;
    let mut kept = Vec::new();
    for line in text.split(['\n', '\r']) {
        let plain = strip_controls(line);
        let trimmed = plain.trim();
        if trimmed.eq_ignore_ascii_case("stack backtrace:") {
            in_backtrace = true;
            continue;
        }
        if trimmed.is_empty() || is_stack_frame(trimmed, in_backtrace) {
            continue;
        }
        kept.push(plain);
    }
    let joined = kept.join(" ");
    let words: Vec<String> = joined.split_whitespace().map(scrub_urls).collect();
    truncate_chars(&words.join(" "), MAX_ERROR_CHARS)
}

/// Whether a line is a frame of a stack trace (Java, JavaScript, Python, Go, Rust backtraces).
fn is_stack_frame(line: &str, in_backtrace: bool) -> bool {
    let numbered = line.split_once(": ").is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    line.starts_with("at ")
        || line.starts_with("File \"")
        || line.starts_with("Traceback (most recent call last)")
        || line.starts_with("goroutine ")
        || (line.starts_with("...") && line.ends_with("more"))
        || (in_backtrace && (numbered || line.starts_with("at ")))
}

/// Removes ANSI escape sequences and turns other control characters into spaces.
fn strip_controls(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters… final byte in @..~; other escapes: ESC plus one character.
            if chars.peek() == Some(&'[') {
                chars.next();
                for d in chars.by_ref() {
                    if ('@'..='~').contains(&d) {
                        break;
                    }
                }
            } else {
                chars.next();
            }
        } else if c.is_control() {
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

/// Strips userinfo, query string and fragment from every `scheme://…` URL inside `word`.
fn scrub_urls(word: &str) -> String {
    let mut out = String::with_capacity(word.len());
    let mut rest = word;
    while let Some(pos) = rest.find("://") {
        out.push_str(&rest[..pos + 3]);
        let after = &rest[pos + 3..];
        let end = after.find(['"', '\'', '<', '>', '`', ')', ']', '}', ',']).unwrap_or(after.len());
        let (url, tail) = after.split_at(end);
        let authority_end = url.find(['/', '?', '#']).unwrap_or(url.len());
        let host = match url[..authority_end].rfind('@') {
            Some(at) => &url[at + 1..authority_end],
            None => &url[..authority_end],
        };
        out.push_str(host);
        let path = &url[authority_end..];
        out.push_str(&path[..path.find(['?', '#']).unwrap_or(path.len())]);
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// A URL as shown to anyone but an operator: scheme, host, port and path (user info and a query
/// string may hold a credential; a tool owner's `?api_key=…` is not a tenant's to read).
pub fn url_without_credentials(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(u) => {
            let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
            format!("{}://{}{port}{}", u.scheme(), u.host_str().unwrap_or(""), u.path())
        }
        Err(_) => "(not a URL)".to_string(),
    }
}

fn truncate_chars(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(max - 1).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shown_url_keeps_its_host_and_path_only() {
        assert_eq!(
            url_without_credentials("https://u:p@hooks.example:8443/a/b?api_key=s3cret#x"),
            "https://hooks.example:8443/a/b"
        );
        assert_eq!(url_without_credentials("http://h.example/x"), "http://h.example/x");
        assert_eq!(url_without_credentials("nope"), "(not a URL)");
    }

    #[test]
    fn credentials_and_query_strings_leave_urls() {
        assert_eq!(
            sanitize_error("GET https://admin:hunter2@internal.example/api?token=abc123#frag failed"),
            "GET https://internal.example/api failed"
        );
        assert_eq!(sanitize_error("(amqp://guest:guest@rabbit:5672/%2f)"), "(amqp://rabbit:5672/%2f)");
        assert_eq!(
            sanitize_error("see http://a.example/x?y=1, http://b.example"),
            "see http://a.example/x, http://b.example"
        );
        assert_eq!(sanitize_error("HTTP 500"), "HTTP 500");
    }

    #[test]
    fn stack_traces_and_controls_are_dropped_into_one_line() {
        let java =
            "java.lang.IllegalStateException: boom\n\tat com.example.Foo.bar(Foo.java:42)\n\t... 3 more\nCaused by: x";
        assert_eq!(sanitize_error(java), "java.lang.IllegalStateException: boom Caused by: x");
        let python = "Traceback (most recent call last):\n  File \"app.py\", line 3, in <module>\nValueError: bad";
        assert_eq!(sanitize_error(python), "ValueError: bad");
        let rust = "panicked: oops\nstack backtrace:\n   0: std::panicking\n   1: main";
        assert_eq!(sanitize_error(rust), "panicked: oops");
        assert_eq!(sanitize_error("\u{1b}[31mred\u{1b}[0m\u{7}bell\r\n\tnext"), "red bell next");
    }

    #[test]
    fn long_errors_are_cut_to_the_limit() {
        let long = "é".repeat(2000);
        let cut = sanitize_error(&long);
        assert_eq!(cut.chars().count(), MAX_ERROR_CHARS);
        assert!(cut.ends_with('…'));
        assert_eq!(sanitize_error(&cut), cut, "idempotent");
    }
}

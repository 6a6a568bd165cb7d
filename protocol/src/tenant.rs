//! Tenants and their token usage: whose a turn or tool call is (`resolve`), the hourly usage
//! buckets kept per tenant, per assistant, per both and per session (one hash per UTC day, its
//! fields named here), and the optional daily token caps. Pure: no I/O.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

/// How long a day's usage hash is kept: 35 days past the day's end.
pub const USAGE_TTL_SECS: u64 = 36 * 86_400;
const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;

/// A tenant's name: 1-64 characters of `A-Z a-z 0-9 . _ -` (so it can sit in a key's field and in
/// a `FLEET_API_TOKENS` entry without quoting).
pub fn is_tenant_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Whose a request's work is: the token's tenant when it is bound to one (a different `requested`
/// tenant is refused), else the tenant the request names, else the token's name.
pub fn resolve(bound: Option<&str>, requested: Option<&str>, token_name: &str) -> Result<String, String> {
    match (bound, requested) {
        (Some(b), Some(r)) if b != r => {
            Err(format!("tenant {r:?} is not this token's: a tenant-bound token creates work only for its tenant"))
        }
        (Some(b), _) => Ok(b.to_string()),
        (None, Some(r)) if !is_tenant_name(r) => {
            Err("tenant must be 1-64 characters of A-Z, a-z, 0-9, '.', '_' and '-'".into())
        }
        (None, Some(r)) => Ok(r.to_string()),
        (None, None) => Ok(token_name.to_string()),
    }
}

/// What separates a tenant from its session key in a session's stored id. A client's session key
/// cannot hold it (keys refuse control characters), so no key of anyone's names another tenant's
/// session, and showing a stored id is cutting at it.
pub const SESSION_SCOPE_SEPARATOR: char = '\u{1f}';

/// The id a session is stored under: a tenant-bound caller's key is its tenant's own (two tenants
/// using one key have two sessions, so none can squat or race another's); an unbound caller's, and
/// a room's (`room_…`, made by the fleet, unguessable), are the key itself.
pub fn session_storage_id<'a>(bound: Option<&str>, key: &'a str) -> std::borrow::Cow<'a, str> {
    match bound {
        Some(tenant) if !crate::ids::is_id("room_", key) => {
            std::borrow::Cow::Owned(format!("{tenant}{SESSION_SCOPE_SEPARATOR}{key}"))
        }
        _ => std::borrow::Cow::Borrowed(key),
    }
}

/// The session key a stored id shows its client: the id without its tenant's scope.
pub fn session_key_shown(stored: &str) -> &str {
    stored.split_once(SESSION_SCOPE_SEPARATOR).map_or(stored, |(_, key)| key)
}

/// The UTC day (days since the epoch) of `ms`: the day's usage hash.
pub fn day_of(ms: i64) -> i64 {
    ms.div_euclid(DAY_MS)
}

/// The hour (hours since the epoch) of `ms`: one usage bucket.
pub fn hour_of(ms: i64) -> i64 {
    ms.div_euclid(HOUR_MS)
}

/// The measures of a bucket, as field parts.
const MEASURES: [&str; 3] = ["p", "c", "r"];

/// What a usage query or write is about: a tenant, an assistant, one tenant's assistant, or a
/// session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageScope<'a> {
    Tenant(&'a str),
    Assistant(&'a str),
    TenantAssistant(&'a str, &'a str),
    Session(&'a str),
}

impl UsageScope<'_> {
    /// The hash field of `measure` (`p`, `c`, `r`) in `hour` for this scope. The name comes last,
    /// so an assistant's id may hold any character.
    fn field(&self, hour: i64, measure: &str) -> String {
        match self {
            UsageScope::Tenant(t) => format!("t|{hour}|{measure}|{t}"),
            UsageScope::Assistant(a) => format!("a|{hour}|{measure}|{a}"),
            UsageScope::TenantAssistant(t, a) => format!("ta|{hour}|{measure}|{t}|{a}"),
            UsageScope::Session(s) => format!("s|{hour}|{measure}|{s}"),
        }
    }

    /// The three fields of `hour` (prompt, completion, requests).
    pub fn fields(&self, hour: i64) -> [String; 3] {
        MEASURES.map(|m| self.field(hour, m))
    }
}

/// The field holding a tenant's tokens (prompt + completion) on a day: what its cap compares.
pub fn daily_total_field(tenant: &str) -> String {
    format!("d|{tenant}")
}

/// Whose one model call was: what its usage is counted under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call<'a> {
    pub tenant: &'a str,
    pub assistant: &'a str,
    pub session: &'a str,
}

/// One model call's increments: (field, amount) pairs for its day's hash.
pub fn increments(call: Call<'_>, at_ms: i64, prompt: u64, completion: u64) -> Vec<(String, u64)> {
    let Call { tenant, assistant, session } = call;
    let hour = hour_of(at_ms);
    let mut out = Vec::with_capacity(13);
    for scope in [
        UsageScope::Tenant(tenant),
        UsageScope::Assistant(assistant),
        UsageScope::TenantAssistant(tenant, assistant),
        UsageScope::Session(session),
    ] {
        let [p, c, r] = scope.fields(hour);
        out.extend([(p, prompt), (c, completion), (r, 1)]);
    }
    out.push((daily_total_field(tenant), prompt + completion));
    out
}

/// One hour's usage, as `GET /v1/usage` answers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", schema(as = UsageBucket))]
pub struct UsageBucket {
    /// RFC 3339: the hour's start (UTC).
    pub hour: String,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Model calls that answered.
    pub requests: u64,
}

/// The hours from `since_ms` to `until_ms` (both included, by the hour they fall in), grouped by
/// day; `None` when the range is reversed or longer than `max_hours`.
pub fn hours(since_ms: i64, until_ms: i64, max_hours: i64) -> Option<BTreeMap<i64, Vec<i64>>> {
    let (first, last) = (hour_of(since_ms), hour_of(until_ms));
    if last < first || last - first >= max_hours {
        return None;
    }
    let mut days: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for h in first..=last {
        days.entry(h.div_euclid(24)).or_default().push(h);
    }
    Some(days)
}

/// The buckets with any usage, from each hour's three values (prompt, completion, requests).
pub fn buckets(values: impl IntoIterator<Item = (i64, [u64; 3])>) -> Vec<UsageBucket> {
    values
        .into_iter()
        .filter(|(_, v)| v.iter().any(|n| *n > 0))
        .map(|(hour, [p, c, r])| UsageBucket {
            hour: crate::timefmt::rfc3339_from_millis(hour * HOUR_MS),
            prompt_tokens: p,
            completion_tokens: c,
            requests: r,
        })
        .collect()
}

/// `FLEET_TENANT_DAILY_TOKENS`: comma-separated `TENANT=TOKENS` (tokens per UTC day, prompt and
/// completion together).
pub fn parse_daily_caps(raw: &str) -> Result<BTreeMap<String, u64>, String> {
    let mut caps = BTreeMap::new();
    for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (tenant, tokens) = entry.split_once('=').ok_or_else(|| format!("{entry:?} is not TENANT=TOKENS"))?;
        let tenant = tenant.trim();
        if !is_tenant_name(tenant) {
            return Err(format!("{tenant:?} is not a tenant name (1-64 of A-Z a-z 0-9 . _ -)"));
        }
        let tokens: u64 =
            tokens.trim().parse().map_err(|_| format!("{tenant}'s cap {:?} is not a whole number", tokens.trim()))?;
        caps.insert(tenant.to_string(), tokens);
    }
    Ok(caps)
}

/// The `tenant` label of usage metrics for a tenant no configuration names: a label per name a
/// request may give would be a series per name.
pub const OTHER_TENANT: &str = "other";

/// `FLEET_TENANTS`: comma-separated tenant names, the tenants usage metrics name.
pub fn parse_tenants(raw: &str) -> Result<BTreeSet<String>, String> {
    let mut tenants = BTreeSet::new();
    for name in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        if !is_tenant_name(name) {
            return Err(format!("{name:?} is not a tenant name (1-64 of A-Z a-z 0-9 . _ -)"));
        }
        tenants.insert(name.to_string());
    }
    Ok(tenants)
}

/// The tenants bound in `FLEET_API_TOKENS` (`TOKEN@TENANT`, `TOKEN@TENANT:SCOPES`): their names
/// only, never a token. An entry that is not a binding (or not a valid one) names none.
pub fn bound_in_tokens(raw: &str) -> BTreeSet<String> {
    raw.split(',')
        .filter_map(|entry| entry.trim().split(':').next()?.split_once('@').map(|(_, tenant)| tenant.to_string()))
        .filter(|tenant| is_tenant_name(tenant))
        .collect()
}

/// The `tenant` label of `tenant`'s usage: its name when the configuration names it (a bounded
/// set), else `other`; a turn of no tenant is `other` too.
pub fn metric_label<'a>(named: &BTreeSet<String>, tenant: Option<&'a str>) -> &'a str {
    match tenant {
        Some(t) if named.contains(t) => t,
        _ => OTHER_TENANT,
    }
}

/// Whether a tenant that used `used` tokens today may start a model call under `cap`.
pub fn within_cap(cap: Option<u64>, used: u64) -> bool {
    cap.is_none_or(|cap| used < cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_tenants_session_key_is_its_own_and_shows_as_it_was_sent() {
        let acme = session_storage_id(Some("acme"), "user_42");
        let beta = session_storage_id(Some("beta"), "user_42");
        assert_ne!(acme, beta, "two tenants, two sessions");
        assert_eq!(session_storage_id(None, "user_42"), "user_42", "an unbound fleet keys sessions as it did");
        let room = "room_0123456789abcdef0123456789abcdef";
        assert_eq!(session_storage_id(Some("acme"), room), room, "a room is the fleet's id");
        assert_eq!(session_key_shown(&acme), "user_42");
        assert_eq!(session_key_shown("user_42"), "user_42");
        assert_eq!(session_key_shown(&session_storage_id(Some("acme"), "a\u{1f}b")), "a\u{1f}b");
    }

    #[test]
    fn a_bound_token_decides_the_tenant_else_the_request_else_the_tokens_name() {
        assert_eq!(resolve(Some("acme"), None, "token-ab").unwrap(), "acme");
        assert_eq!(resolve(Some("acme"), Some("acme"), "token-ab").unwrap(), "acme");
        assert!(resolve(Some("acme"), Some("other"), "token-ab").unwrap_err().contains("tenant-bound"));
        assert_eq!(resolve(None, Some("beta"), "token-ab").unwrap(), "beta");
        assert_eq!(resolve(None, None, "token-ab").unwrap(), "token-ab");
        assert!(resolve(None, Some("a|b"), "token-ab").is_err());
        assert!(resolve(None, Some(""), "token-ab").is_err());
    }

    #[test]
    fn tenant_names_are_short_and_plain() {
        assert!(is_tenant_name("tenant-A_1.x"));
        assert!(!is_tenant_name("a:b") && !is_tenant_name("a@b") && !is_tenant_name(&"x".repeat(65)));
    }

    #[test]
    fn one_call_increments_each_scope_and_the_daily_total() {
        let at = 3 * DAY_MS + 5 * HOUR_MS + 10;
        let inc = increments(Call { tenant: "acme", assistant: "asst|1", session: "s|1" }, at, 10, 5);
        let h = hour_of(at);
        assert_eq!(h, 3 * 24 + 5);
        assert!(inc.contains(&(format!("t|{h}|p|acme"), 10)));
        assert!(inc.contains(&(format!("a|{h}|c|asst|1"), 5)));
        assert!(inc.contains(&(format!("ta|{h}|r|acme|asst|1"), 1)));
        assert!(inc.contains(&(format!("s|{h}|p|s|1"), 10)));
        assert!(inc.contains(&("d|acme".to_string(), 15)));
        assert_eq!(inc.len(), 13);
        assert_eq!(UsageScope::Session("s1").fields(h), [0, 1, 2].map(|i| format!("s|{h}|{}|s1", MEASURES[i])));
        assert_eq!(day_of(at), 3);
    }

    #[test]
    fn hours_group_by_day_and_refuse_reversed_or_long_ranges() {
        let days = hours(23 * HOUR_MS, 25 * HOUR_MS + 1, 100).unwrap();
        assert_eq!(days.get(&0), Some(&vec![23]));
        assert_eq!(days.get(&1), Some(&vec![24, 25]));
        assert!(hours(5 * HOUR_MS, 4 * HOUR_MS, 100).is_none());
        assert!(hours(0, 100 * HOUR_MS, 100).is_none());
        assert!(hours(0, 99 * HOUR_MS, 100).is_some());
    }

    #[test]
    fn only_hours_with_usage_become_buckets() {
        let b = buckets([(0, [0, 0, 0]), (1, [3, 4, 1])]);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].hour, "1970-01-01T01:00:00.000Z");
        assert_eq!((b[0].prompt_tokens, b[0].completion_tokens, b[0].requests), (3, 4, 1));
    }

    #[test]
    fn metrics_name_only_the_tenants_the_configuration_names() {
        let named = parse_tenants(" acme, beta ,").unwrap();
        assert_eq!(named.iter().map(String::as_str).collect::<Vec<_>>(), ["acme", "beta"]);
        assert!(parse_tenants("a|b").is_err());
        assert_eq!(metric_label(&named, Some("acme")), "acme");
        assert_eq!(metric_label(&named, Some("token-1234abcd")), "other");
        assert_eq!(metric_label(&named, None), "other");
        let bound = bound_in_tokens("plain-token-0123456789, t-0123456789@acme:usage:read+turns:write,t2@gamma,x@a|b");
        assert_eq!(bound.iter().map(String::as_str).collect::<Vec<_>>(), ["acme", "gamma"]);
        assert!(bound_in_tokens("").is_empty());
    }

    #[test]
    fn daily_caps_parse_and_compare() {
        let caps = parse_daily_caps("tenantA=100000, b=5").unwrap();
        assert_eq!(caps.get("tenantA"), Some(&100_000));
        assert_eq!(caps.get("b"), Some(&5));
        assert!(
            parse_daily_caps("a").is_err() && parse_daily_caps("a=x").is_err() && parse_daily_caps("a:b=1").is_err()
        );
        assert!(parse_daily_caps("").unwrap().is_empty());
        assert!(within_cap(None, u64::MAX) && within_cap(Some(10), 9) && !within_cap(Some(10), 10));
    }
}

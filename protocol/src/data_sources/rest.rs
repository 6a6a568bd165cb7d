//! A `rest_api` source's query: a path under its base URL with `$n` placeholders filled by
//! percent-encoded parameters, and a JSON answer read as a table.

use serde_json::{Map, Value};

/// Why a REST query's path or parameters were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestPathError {
    #[error("a REST query is a path starting with `/` (e.g. `/users?active=true`), at most 2048 characters, without control characters or a fragment")]
    BadPath,
    #[error("the query takes {expects} parameter(s), {given} given")]
    Count { expects: usize, given: usize },
    #[error("parameter ${0} must be a string, a number, a boolean or null")]
    NotScalar(usize),
    #[error("the path leaves the source's base URL")]
    Escapes,
}

/// `base_url` joined with `path` (its query string included), each `$n` replaced by parameter n
/// percent-encoded whole (so a value cannot add a segment or a query field). The result must stay
/// under the base URL: same scheme, host and port, and a path below the base's.
pub fn rest_url(base_url: &str, path: &str, parameters: &[Value]) -> Result<url::Url, RestPathError> {
    if !path.starts_with('/') || path.starts_with("//") || path.len() > 2048 {
        return Err(RestPathError::BadPath);
    }
    if path.chars().any(char::is_control) || path.contains('#') {
        return Err(RestPathError::BadPath);
    }
    let filled = fill(path, parameters)?;
    let base = url::Url::parse(base_url).map_err(|_| RestPathError::Escapes)?;
    let joined = format!("{}{filled}", base_url.trim_end_matches('/'));
    let url = url::Url::parse(&joined).map_err(|_| RestPathError::BadPath)?;
    let base_path = base.path().trim_end_matches('/');
    let below = url.path().strip_prefix(base_path).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
    let same_origin = (url.scheme(), url.host_str(), url.port_or_known_default())
        == (base.scheme(), base.host_str(), base.port_or_known_default());
    if !below || !same_origin {
        return Err(RestPathError::Escapes);
    }
    Ok(url)
}

fn fill(path: &str, parameters: &[Value]) -> Result<String, RestPathError> {
    let (mut out, mut expects) = (String::with_capacity(path.len()), 0usize);
    let mut rest = path;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits: String = rest[at + 1..].chars().take_while(char::is_ascii_digit).collect();
        let Some(n) = digits.parse::<usize>().ok().filter(|n| *n >= 1) else {
            out.push('$');
            rest = &rest[at + 1..];
            continue;
        };
        expects = expects.max(n);
        let text = match parameters.get(n - 1) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) => String::new(),
            Some(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
            Some(_) => return Err(RestPathError::NotScalar(n)),
            None => String::new(),
        };
        out.push_str(&percent_encoded(&text));
        rest = &rest[at + 1 + digits.len()..];
    }
    out.push_str(rest);
    if expects != parameters.len() {
        return Err(RestPathError::Count { expects, given: parameters.len() });
    }
    Ok(out)
}

/// Every byte but RFC 3986's unreserved characters as `%XX`: right in a path segment and in a
/// query value alike.
fn percent_encoded(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-_~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A JSON answer as a table.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonTable {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Value>>,
    pub truncated: bool,
}

/// The rows of a JSON answer: an array is one row per item; an object with exactly one array
/// field (`{"data": [...], "next": "..."}`) is that array's; any other object is one row; a
/// scalar is one row. An object item's keys are columns, in the order they first appear (those
/// new in one object in alphabetical order; a missing key is `null`); a non-object item is the
/// column `value`. Values stay JSON. At most `max_rows` rows, `truncated` when there were more.
pub fn json_table(answer: Value, max_rows: usize) -> JsonTable {
    let items = match answer {
        Value::Array(items) => items,
        Value::Object(mut object) => match only_array_field(&object) {
            Some(key) => match object.remove(&key) {
                Some(Value::Array(items)) => items,
                _ => Vec::new(),
            },
            None => vec![Value::Object(object)],
        },
        scalar => vec![scalar],
    };
    let truncated = items.len() > max_rows;
    let items: Vec<Value> = items.into_iter().take(max_rows).collect();
    let mut columns: Vec<String> = Vec::new();
    for item in &items {
        let mut keys: Vec<&String> = match item {
            Value::Object(object) => object.keys().collect(),
            _ => vec![],
        };
        // Alphabetical within an object, whatever order the JSON map keeps.
        keys.sort();
        let scalar_key = "value".to_string();
        let keys = if item.is_object() { keys } else { vec![&scalar_key] };
        for key in keys {
            if !columns.contains(key) {
                columns.push(key.clone());
            }
        }
    }
    let rows = items
        .into_iter()
        .map(|item| match item {
            Value::Object(mut object) => columns.iter().map(|c| object.remove(c).unwrap_or(Value::Null)).collect(),
            scalar => columns.iter().map(|c| if c == "value" { scalar.clone() } else { Value::Null }).collect(),
        })
        .collect();
    JsonTable { columns, rows, truncated }
}

fn only_array_field(object: &Map<String, Value>) -> Option<String> {
    let mut arrays = object.iter().filter(|(_, v)| v.is_array()).map(|(k, _)| k);
    match (arrays.next(), arrays.next()) {
        (Some(key), None) => Some(key.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_path_joins_its_base_with_encoded_parameters() {
        let url = rest_url("https://api.example.com/v1", "/users?active=true", &[]).unwrap();
        assert_eq!(url.as_str(), "https://api.example.com/v1/users?active=true");
        let url = rest_url("https://api.example.com/v1/", "/users/$1/orders?since=$2", &[json!("a b/../c"), json!(7)])
            .unwrap();
        assert_eq!(url.as_str(), "https://api.example.com/v1/users/a%20b%2F%2E%2E%2Fc/orders?since=7");
        let injected = rest_url("https://api.example.com", "/search?q=$1", &[json!("x&admin=true#frag")]).unwrap();
        assert_eq!(injected.query(), Some("q=x%26admin%3Dtrue%23frag"));
    }

    #[test]
    fn paths_that_leave_the_base_or_miscount_are_refused() {
        let base = "https://api.example.com/v1";
        assert_eq!(rest_url(base, "users", &[]), Err(RestPathError::BadPath));
        assert_eq!(rest_url(base, "//evil.example/x", &[]), Err(RestPathError::BadPath));
        assert_eq!(rest_url(base, "/a#b", &[]), Err(RestPathError::BadPath));
        assert_eq!(rest_url(base, "/../admin", &[]), Err(RestPathError::Escapes));
        assert_eq!(rest_url(base, "@evil.example/x", &[]), Err(RestPathError::BadPath));
        assert_eq!(rest_url("https://api.example.com", "/x", &[]).unwrap().as_str(), "https://api.example.com/x");
        assert_eq!(rest_url(base, "/u/$1", &[]), Err(RestPathError::Count { expects: 1, given: 0 }));
        assert_eq!(rest_url(base, "/u", &[json!(1)]), Err(RestPathError::Count { expects: 0, given: 1 }));
        assert_eq!(rest_url(base, "/u/$1", &[json!([1])]), Err(RestPathError::NotScalar(1)));
        assert_eq!(rest_url(base, "/price$", &[]).unwrap().path(), "/v1/price$");
    }

    #[test]
    fn answers_read_as_tables() {
        let t = json_table(json!([{"id": 1, "name": "a"}, {"id": 2, "email": "b@x"}]), 10);
        assert_eq!(t.columns, vec!["id", "name", "email"]);
        assert_eq!(t.rows, vec![vec![json!(1), json!("a"), json!(null)], vec![json!(2), json!(null), json!("b@x")]]);
        assert!(!t.truncated);
        let wrapped = json_table(json!({"data": [{"id": 1}, {"id": 2}, {"id": 3}], "next": "c2"}), 2);
        assert_eq!((wrapped.rows.len(), wrapped.truncated), (2, true));
        let one = json_table(json!({"id": 1, "tags": ["a"], "roles": ["b"]}), 10);
        assert_eq!(one.rows.len(), 1);
        let scalars = json_table(json!([1, "two", {"x": 3}]), 10);
        assert_eq!(scalars.columns, vec!["value", "x"]);
        assert_eq!(scalars.rows[2], vec![json!(null), json!(3)]);
        assert_eq!(json_table(json!("ok"), 10).rows, vec![vec![json!("ok")]]);
    }
}

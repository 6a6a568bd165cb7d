//! Token scopes (least privilege): what each route requires, read from its OpenAPI declaration,
//! and how `FLEET_API_TOKENS` entries name the scopes a token carries. Pure: no I/O.

use std::collections::HashMap;

use axum::http::Method;
use serde_json::Value;

/// One right a token can carry. Scopes are independent: `tools:write` does not grant `tools:read`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    ToolsRead,
    ToolsWrite,
    CallsWrite,
    TurnsWrite,
    SessionsRead,
    SessionsWrite,
    ExecutionsRead,
    ExecutionsWrite,
    DeadLettersRead,
    DeadLettersAdmin,
    WebhooksRead,
    WebhooksWrite,
    AssistantsRead,
    AssistantsWrite,
    AuditRead,
    UsageRead,
    ConsoleRead,
    ConsoleAdmin,
}

impl Scope {
    pub const ALL: [Scope; 18] = [
        Scope::ToolsRead,
        Scope::ToolsWrite,
        Scope::CallsWrite,
        Scope::TurnsWrite,
        Scope::SessionsRead,
        Scope::SessionsWrite,
        Scope::ExecutionsRead,
        Scope::ExecutionsWrite,
        Scope::DeadLettersRead,
        Scope::DeadLettersAdmin,
        Scope::WebhooksRead,
        Scope::WebhooksWrite,
        Scope::AssistantsRead,
        Scope::AssistantsWrite,
        Scope::AuditRead,
        Scope::UsageRead,
        Scope::ConsoleRead,
        Scope::ConsoleAdmin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::ToolsRead => "tools:read",
            Scope::ToolsWrite => "tools:write",
            Scope::CallsWrite => "calls:write",
            Scope::TurnsWrite => "turns:write",
            Scope::SessionsRead => "sessions:read",
            Scope::SessionsWrite => "sessions:write",
            Scope::ExecutionsRead => "executions:read",
            Scope::ExecutionsWrite => "executions:write",
            Scope::DeadLettersRead => "dead_letters:read",
            Scope::DeadLettersAdmin => "dead_letters:admin",
            Scope::WebhooksRead => "webhooks:read",
            Scope::WebhooksWrite => "webhooks:write",
            Scope::AssistantsRead => "assistants:read",
            Scope::AssistantsWrite => "assistants:write",
            Scope::AuditRead => "audit:read",
            Scope::UsageRead => "usage:read",
            Scope::ConsoleRead => "console:read",
            Scope::ConsoleAdmin => "console:admin",
        }
    }

    pub fn parse(name: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|s| s.as_str() == name)
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// What a token may do: everything (a plain token, as before scopes existed) or the listed scopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    Full,
    Scoped(u32),
}

impl Grant {
    pub fn scoped(scopes: impl IntoIterator<Item = Scope>) -> Grant {
        Grant::Scoped(scopes.into_iter().fold(0, |bits, s| bits | s.bit()))
    }

    pub fn allows(self, scope: Scope) -> bool {
        match self {
            Grant::Full => true,
            Grant::Scoped(bits) => bits & scope.bit() != 0,
        }
    }
}

/// One `FLEET_API_TOKENS` entry: `TOKEN` (full rights) or `TOKEN:SCOPE+SCOPE...`. A bearer token
/// has no `:` (RFC 6750's token68), so the first `:` starts the scopes. (`TOKEN` may end in
/// `@TENANT`, which `config::api_tokens` takes off.)
pub fn parse_token_entry(entry: &str) -> Result<(&str, Grant), String> {
    let Some((token, list)) = entry.split_once(':') else { return Ok((entry, Grant::Full)) };
    let mut scopes = Vec::new();
    for name in list.split('+').map(str::trim) {
        let scope = Scope::parse(name).ok_or_else(|| {
            let known: Vec<&str> = Scope::ALL.iter().map(|s| s.as_str()).collect();
            format!("{name:?} is not a scope; scopes are {}", known.join(", "))
        })?;
        scopes.push(scope);
    }
    Ok((token, Grant::scoped(scopes)))
}

/// The role a route's security requirement names beside its scope when only an operator (a token
/// bound to no tenant) may use it, whatever scopes a tenant's token holds: the fleet's
/// configuration that every tenant's work shares (changing a tool or closing its circuit, any
/// webhook, which would be sent every tenant's events) and the audit log (which names every
/// tenant's ids). OpenAPI 3.1 lets a non-OAuth requirement list such role names.
pub const OPERATOR_ROLE: &str = "operator";

/// What a tenant-bound token gets on a route, declared with the route (its operation's
/// `x-tenancy`): `tenant_walk` asks each route about another tenant's things and holds it to this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TenantView {
    /// About one resource: another tenant's is as if it did not exist (404).
    Resource,
    /// A listing: only the caller's tenant's entries.
    Listing,
    /// A bulk operation: another tenant's items are not touched.
    Bulk,
    /// Makes or reads only the caller's own or shared things.
    Own,
    /// The operators' configuration or log: a bound token is refused (403).
    Operator,
}

impl TenantView {
    pub const EXTENSION: &str = "x-tenancy";

    pub fn parse(text: &str) -> Option<TenantView> {
        Some(match text {
            "resource" => TenantView::Resource,
            "listing" => TenantView::Listing,
            "bulk" => TenantView::Bulk,
            "own" => TenantView::Own,
            "operator" => TenantView::Operator,
            _ => return None,
        })
    }
}

/// What a route demands of a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteRule {
    pub scope: Scope,
    pub operator_only: bool,
}

/// Every authenticated route's rule by method and route template, read from the API's OpenAPI
/// document: a handler's `security(("bearer" = [SCOPE, "operator"?]))` is the one place a route
/// declares what it needs, so the check enforced and the contract published cannot differ.
#[derive(Debug, Default)]
pub struct RouteRules(HashMap<String, Vec<(Method, RouteRule)>>);

impl RouteRules {
    /// The rules of `doc`'s operations that name `scheme` in their security requirement. An
    /// operation naming no known scope, more than one, or an unknown role, or declaring no
    /// `x-tenancy` (or `operator` without the role), is refused, naming it.
    pub fn from_openapi(doc: &Value, scheme: &str) -> Result<RouteRules, String> {
        let mut rules = HashMap::new();
        let paths = doc["paths"].as_object().ok_or("the document has no paths")?;
        for (path, item) in paths {
            for (method, op) in item.as_object().into_iter().flatten() {
                let requirements = op["security"].as_array().into_iter().flatten();
                let Some(names) = requirements.filter_map(|r| r.get(scheme)?.as_array()).next() else { continue };
                let mut scope = None;
                let mut operator_only = false;
                for name in names.iter().map(|n| n.as_str().unwrap_or_default()) {
                    match (Scope::parse(name), name == OPERATOR_ROLE, scope) {
                        (Some(s), _, None) => scope = Some(s),
                        (None, true, _) => operator_only = true,
                        _ => return Err(format!("{method} {path}: {name:?} is a second scope or an unknown role")),
                    }
                }
                let scope = scope.ok_or_else(|| format!("{method} {path} declares no scope"))?;
                let view = op[TenantView::EXTENSION].as_str().and_then(TenantView::parse).ok_or_else(|| {
                    format!("{method} {path} declares no x-tenancy (resource, listing, bulk, own or operator)")
                })?;
                if (view == TenantView::Operator) != operator_only {
                    return Err(format!(
                        "{method} {path}: x-tenancy operator goes with the operator role, and only it"
                    ));
                }
                let method = Method::from_bytes(method.to_uppercase().as_bytes()).map_err(|e| e.to_string())?;
                let rule = RouteRule { scope, operator_only };
                rules.entry(path.clone()).or_insert_with(Vec::new).push((method, rule));
            }
        }
        Ok(RouteRules(rules))
    }

    /// The rule of `route` (its template) for `method`; a `HEAD` is its `GET`'s. Looked up on
    /// every request, so it allocates nothing.
    pub fn get(&self, method: &Method, route: &str) -> Option<RouteRule> {
        let method = if method == Method::HEAD { &Method::GET } else { method };
        self.0.get(route)?.iter().find(|(m, _)| m == method).map(|(_, rule)| *rule)
    }

    /// How many operations have a rule.
    pub fn len(&self) -> usize {
        self.0.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The operator-only routes, as `METHOD template`, sorted.
    pub fn operator_only(&self) -> Vec<String> {
        let mut routes: Vec<String> = self
            .0
            .iter()
            .flat_map(|(p, rules)| rules.iter().filter(|(_, r)| r.operator_only).map(move |(m, _)| format!("{m} {p}")))
            .collect();
        routes.sort();
        routes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(ops: serde_json::Value) -> Value {
        serde_json::json!({ "paths": ops })
    }

    #[test]
    fn a_rule_is_read_from_the_operations_security_requirement() {
        let d = doc(serde_json::json!({
            "/v1/tools": {"get": {"security": [{"bearer": ["tools:read"]}], "x-tenancy": "own"},
                          "post": {"security": [{"bearer": ["tools:write", "operator"]}], "x-tenancy": "operator"}},
            "/v1/openapi.json": {"get": {"security": [{}]}}
        }));
        let rules = RouteRules::from_openapi(&d, "bearer").unwrap();
        assert_eq!(rules.len(), 2, "a public operation has no rule");
        assert_eq!(
            rules.get(&Method::GET, "/v1/tools"),
            Some(RouteRule { scope: Scope::ToolsRead, operator_only: false })
        );
        assert_eq!(rules.get(&Method::HEAD, "/v1/tools"), rules.get(&Method::GET, "/v1/tools"));
        assert_eq!(
            rules.get(&Method::POST, "/v1/tools"),
            Some(RouteRule { scope: Scope::ToolsWrite, operator_only: true })
        );
        assert_eq!(rules.get(&Method::GET, "/v1/nope"), None);
        assert_eq!(rules.operator_only(), vec!["POST /v1/tools".to_string()]);
    }

    #[test]
    fn an_operation_without_one_known_scope_is_refused_naming_it() {
        for names in [
            serde_json::json!([]),
            serde_json::json!(["operator"]),
            serde_json::json!(["tools:read", "tools:write"]),
            serde_json::json!(["tools:raed"]),
        ] {
            let d = doc(serde_json::json!({"/v1/x": {"get": {"security": [{"bearer": names}], "x-tenancy": "own"}}}));
            let e = RouteRules::from_openapi(&d, "bearer").unwrap_err();
            assert!(e.contains("get /v1/x"), "{names}: {e}");
        }
    }

    #[test]
    fn an_operation_without_its_tenancy_or_with_the_wrong_one_is_refused_naming_it() {
        for (names, tenancy) in [
            (serde_json::json!(["tools:read"]), serde_json::Value::Null),
            (serde_json::json!(["tools:read"]), serde_json::json!("everyone")),
            (serde_json::json!(["tools:read"]), serde_json::json!("operator")),
            (serde_json::json!(["tools:write", "operator"]), serde_json::json!("own")),
        ] {
            let op = serde_json::json!({"security": [{"bearer": names}], "x-tenancy": tenancy});
            let e = RouteRules::from_openapi(&doc(serde_json::json!({"/v1/x": {"get": op}})), "bearer").unwrap_err();
            assert!(e.contains("get /v1/x") && e.contains("x-tenancy"), "{names} {tenancy}: {e}");
        }
    }

    #[test]
    fn a_plain_token_has_full_rights_and_a_scoped_one_only_its_scopes() {
        assert_eq!(parse_token_entry("plain-token-0123456789").unwrap(), ("plain-token-0123456789", Grant::Full));
        let (token, grant) = parse_token_entry("ci-token-0123456789:tools:read+calls:write").unwrap();
        assert_eq!(token, "ci-token-0123456789");
        assert!(grant.allows(Scope::ToolsRead) && grant.allows(Scope::CallsWrite));
        assert!(!grant.allows(Scope::ToolsWrite) && !grant.allows(Scope::DeadLettersAdmin));
        assert!(Scope::ALL.iter().all(|s| Grant::Full.allows(*s)));
    }

    #[test]
    fn an_unknown_or_empty_scope_is_refused_naming_it() {
        let e = parse_token_entry("tok-0123456789abcdef:tools:wirte").unwrap_err();
        assert!(e.contains("\"tools:wirte\"") && e.contains("tools:write"), "{e}");
        assert!(parse_token_entry("tok-0123456789abcdef:").is_err());
        assert!(parse_token_entry("tok-0123456789abcdef:tools:read+").is_err());
    }

    #[test]
    fn every_scope_name_round_trips() {
        for s in Scope::ALL {
            assert_eq!(Scope::parse(s.as_str()), Some(s));
        }
        assert_eq!(Scope::parse(OPERATOR_ROLE), None, "the operator role is no scope");
    }
}

//! Token scopes (least privilege): what each route requires, and how `FLEET_API_TOKENS` entries
//! name the scopes a token carries. Pure: no I/O.

use axum::http::Method;

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

/// The scope a route requires, by method and route template (`None`: the route is not scoped,
/// e.g. an unknown one, answered 404 anyway). Seed 000's rooms are sessions: reading one (its
/// messages, its stream) is `sessions:read`, creating or closing one `sessions:write`, and
/// sending a message (which starts a turn) `turns:write`.
pub fn required_scope(method: &Method, route: &str) -> Option<Scope> {
    let read = method == Method::GET || method == Method::HEAD;
    let scope = match route {
        "/v1/tools" | "/v1/tools/{tool}" if read => Scope::ToolsRead,
        "/v1/tools" | "/v1/tools/{tool}" => Scope::ToolsWrite,
        "/v1/tool-calls" | "/v1/tool-calls/batch" => Scope::CallsWrite,
        "/v1/turns" => Scope::TurnsWrite,
        "/v1/sessions/{id}/stream" | "/v1/sessions/{id}/stream-token" | "/v1/sessions/{id}/messages" => {
            Scope::SessionsRead
        }
        "/v1/sessions/{id}" => Scope::SessionsWrite,
        "/v1/executions" | "/v1/executions/{id}" => Scope::ExecutionsRead,
        "/v1/audit" => Scope::AuditRead,
        "/v1/usage" => Scope::UsageRead,
        "/v1/tools/{tool}/circuit/close" => Scope::ToolsWrite,
        "/v1/executions/{id}/cancel" => Scope::ExecutionsWrite,
        "/v1/dead-letters" | "/v1/dead-letters/{id}" if read => Scope::DeadLettersRead,
        "/v1/dead-letters"
        | "/v1/dead-letters/{id}"
        | "/v1/dead-letters/retry"
        | "/v1/dead-letters/purge"
        | "/v1/dead-letters/{id}/retry" => Scope::DeadLettersAdmin,
        "/v1/webhooks" | "/v1/webhooks/{id}" if read => Scope::WebhooksRead,
        "/v1/webhooks" | "/v1/webhooks/{id}" => Scope::WebhooksWrite,
        "/v1/agents/assistants" | "/v1/agents/assistants/{assistant_id}" if read => Scope::AssistantsRead,
        "/v1/agents/assistants" | "/v1/agents/assistants/{assistant_id}" => Scope::AssistantsWrite,
        "/v1/agents/rooms/{room_id}/messages" if !read => Scope::TurnsWrite,
        "/v1/agents/rooms"
        | "/v1/agents/rooms/{room_id}"
        | "/v1/agents/rooms/{room_id}/messages"
        | "/v1/agents/rooms/{room_id}/stream"
        | "/v1/agents/rooms/{room_id}/stream-token" => Scope::SessionsRead,
        "/v1/agents/{assistant_id}/rooms" | "/v1/agents/rooms/{room_id}/close" => Scope::SessionsWrite,
        "/v2/agents/{agent_key}/sessions/{session_key}/events" => Scope::TurnsWrite,
        _ => return None,
    };
    Some(scope)
}

/// Whether the route is the operator's alone, refused to a tenant-bound token whatever it holds:
/// the fleet's configuration that every tenant's work shares (changing a tool or closing its
/// circuit, any webhook, which would be sent every tenant's events) and the audit log (which
/// names every tenant's ids). Reading the tools is not: a tenant's turns and calls name them.
pub fn operator_only(method: &Method, route: &str) -> bool {
    let read = method == Method::GET || method == Method::HEAD;
    match route {
        "/v1/tools" | "/v1/tools/{tool}" => !read,
        "/v1/tools/{tool}/circuit/close" | "/v1/audit" | "/v1/webhooks" | "/v1/webhooks/{id}" => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_configuration_and_the_audit_log_are_the_operators() {
        for (method, route) in [
            (Method::POST, "/v1/tools"),
            (Method::PUT, "/v1/tools/{tool}"),
            (Method::DELETE, "/v1/tools/{tool}"),
            (Method::POST, "/v1/tools/{tool}/circuit/close"),
            (Method::GET, "/v1/webhooks"),
            (Method::PUT, "/v1/webhooks/{id}"),
            (Method::GET, "/v1/audit"),
        ] {
            assert!(operator_only(&method, route), "{method} {route}");
        }
        for (method, route) in [
            (Method::GET, "/v1/tools"),
            (Method::GET, "/v1/tools/{tool}"),
            (Method::POST, "/v1/turns"),
            (Method::GET, "/v1/usage"),
            (Method::POST, "/v1/agents/assistants"),
        ] {
            assert!(!operator_only(&method, route), "{method} {route}");
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
    fn every_scope_name_round_trips_and_writes_differ_from_reads() {
        for s in Scope::ALL {
            assert_eq!(Scope::parse(s.as_str()), Some(s));
        }
        assert_eq!(required_scope(&Method::GET, "/v1/tools/{tool}"), Some(Scope::ToolsRead));
        assert_eq!(required_scope(&Method::DELETE, "/v1/tools/{tool}"), Some(Scope::ToolsWrite));
        assert_eq!(required_scope(&Method::DELETE, "/v1/dead-letters/{id}"), Some(Scope::DeadLettersAdmin));
        assert_eq!(required_scope(&Method::GET, "/v1/sessions/{id}/stream"), Some(Scope::SessionsRead));
        assert_eq!(required_scope(&Method::DELETE, "/v1/sessions/{id}"), Some(Scope::SessionsWrite));
        assert_eq!(required_scope(&Method::POST, "/v1/executions/{id}/cancel"), Some(Scope::ExecutionsWrite));
        assert_eq!(required_scope(&Method::GET, "/v1/nope"), None);
        assert_eq!(required_scope(&Method::PUT, "/v1/agents/assistants/{assistant_id}"), Some(Scope::AssistantsWrite));
        assert_eq!(required_scope(&Method::GET, "/v1/agents/assistants"), Some(Scope::AssistantsRead));
        assert_eq!(required_scope(&Method::POST, "/v1/agents/rooms/{room_id}/messages"), Some(Scope::TurnsWrite));
        assert_eq!(required_scope(&Method::GET, "/v1/agents/rooms/{room_id}/messages"), Some(Scope::SessionsRead));
        assert_eq!(required_scope(&Method::POST, "/v1/agents/rooms/{room_id}/close"), Some(Scope::SessionsWrite));
    }
}

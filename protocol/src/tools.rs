//! Tool identity: the opaque ids the registry hands out, and telling an id from a name in a path.

/// A new tool id: `tool_` and 32 random hex digits. Random rather than derived from the name, so
/// a tool deleted and registered again under its name never answers to the old id.
pub fn new_tool_id() -> String {
    format!("tool_{}", uuid::Uuid::new_v4().simple())
}

/// Whether `s` has a tool id's shape. Names of this shape are reserved, so a path segment is
/// either an id or a name, never both.
pub fn is_tool_id(s: &str) -> bool {
    s.strip_prefix("tool_")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// Who runs a tool's calls: the fleet (`callback`, or `mcp` for a tool an MCP server lists) or the
/// session's client (`client`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ToolExecution {
    /// The fleet: a signed POST to the tool's `callback_url` (the seed's tool callback).
    #[default]
    Callback,
    /// The client of the session (seed 001's client tools): the turn lists the call as pending and
    /// waits, holding no worker, until the client submits its `tool_output`.
    Client,
    /// The fleet, through a registered MCP server (`POST /v1/mcp_servers`): a `tools/call` of
    /// `tool` on `server`. Discovery writes it; it is never given to `/v1/tools`.
    Mcp(McpToolRef),
    /// The fleet, against a registered data source (`POST /v1/data-sources`): a read-only query.
    /// The registration writes it; it is never given to `/v1/tools`.
    DataSource(DataSourceRef),
}

impl ToolExecution {
    pub fn is_callback(&self) -> bool {
        *self == ToolExecution::Callback
    }

    /// The MCP server and tool behind it, for a tool discovered from one.
    pub fn mcp(&self) -> Option<&McpToolRef> {
        match self {
            ToolExecution::Mcp(m) => Some(m),
            ToolExecution::Callback | ToolExecution::Client | ToolExecution::DataSource(_) => None,
        }
    }

    /// The data source behind it, for a data source's tool.
    pub fn data_source(&self) -> Option<&DataSourceRef> {
        match self {
            ToolExecution::DataSource(d) => Some(d),
            _ => None,
        }
    }
}

/// Which registered data source a fleet tool queries.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct DataSourceRef {
    /// The source's id (`ds_…`).
    pub source_id: String,
}

/// Which MCP server's tool a fleet tool is, and what the server says of it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct McpToolRef {
    /// The registered server's name.
    pub server: String,
    /// The tool's name on that server (what `tools/call` names).
    pub tool: String,
    #[serde(default)]
    pub hints: ToolHints,
}

/// An MCP tool's annotations (the server's hints, not guarantees): they decide only whether an
/// outcome the fleet cannot know may be tried again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct ToolHints {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world: Option<bool>,
}

impl ToolHints {
    /// Whether a second call has the effect of one: the tool only reads, or says it is idempotent.
    pub fn repeatable(&self) -> bool {
        self.read_only == Some(true) || self.idempotent == Some(true)
    }
}

/// Whether `name` keeps the fleet's (and OpenAI's function-name) rule: 1-64 of `[A-Za-z0-9_-]`.
pub fn is_plain_tool_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whether `name` may be enabled or called: a plain tool name, or an MCP tool's `server.tool`
/// whose function name toward the model (`server__tool`) is a plain one.
pub fn is_callable_tool_name(name: &str) -> bool {
    let mcp = name.split_once('.').is_some_and(|(server, tool)| {
        !server.is_empty() && is_plain_tool_name(tool) && is_plain_tool_name(&model_function_name(name))
    });
    is_plain_tool_name(name) || mcp
}

/// The fleet name of MCP server `server`'s tool `tool`: `server.tool`. The dot is what no plain
/// tool name holds, so a discovered tool never takes a registered tool's name.
pub fn mcp_fleet_name(server: &str, tool: &str) -> String {
    format!("{server}.{tool}")
}

/// The function name the model is given for fleet tool `name`: the name itself, with an MCP
/// tool's `.` written `__` (OpenAI's rule allows no dot).
pub fn model_function_name(name: &str) -> String {
    name.replacen('.', "__", 1)
}

/// The fleet tool a model's function name stands for, among `offered`: the one whose function
/// name it is, else the name as the model gave it (refused later as any unknown tool is).
pub fn fleet_tool_for<'a>(function: &'a str, offered: &'a [String]) -> &'a str {
    if offered.iter().any(|n| n == function) {
        return function;
    }
    offered.iter().find(|n| model_function_name(n) == function).map_or(function, String::as_str)
}

/// What `/v1/tools/{tool}` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolRef<'a> {
    Id(&'a str),
    Name(&'a str),
}

impl<'a> ToolRef<'a> {
    pub fn parse(segment: &'a str) -> Self {
        if is_tool_id(segment) {
            ToolRef::Id(segment)
        } else {
            ToolRef::Name(segment)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_are_told_apart() {
        let id = new_tool_id();
        assert!(is_tool_id(&id), "{id}");
        assert_ne!(id, new_tool_id());
        assert_eq!(ToolRef::parse(&id), ToolRef::Id(&id));
        for name in ["search_products", "tool_abc", "tool_", "tool_0123456789abcdef0123456789ABCDEF", "x"] {
            assert_eq!(ToolRef::parse(name), ToolRef::Name(name), "{name}");
        }
        assert!(!is_tool_id("tool_0123456789abcdef0123456789abcde"), "31 digits");
        assert!(!is_tool_id("tool_0123456789abcdef0123456789abcdef0"), "33 digits");
    }

    #[test]
    fn an_mcp_tool_is_server_dot_tool_and_server_underscores_tool_to_the_model() {
        let name = mcp_fleet_name("files", "read_text");
        assert_eq!(name, "files.read_text");
        assert!(!is_plain_tool_name(&name), "no plain tool can take it");
        assert_eq!(model_function_name(&name), "files__read_text");
        assert!(is_plain_tool_name(&model_function_name(&name)));
        assert_eq!(model_function_name("search"), "search");
        let offered = vec!["files.read_text".to_string(), "a__b".to_string()];
        assert_eq!(fleet_tool_for("files__read_text", &offered), "files.read_text");
        assert_eq!(fleet_tool_for("a__b", &offered), "a__b", "a plain tool keeps its own name");
        assert_eq!(fleet_tool_for("other", &offered), "other");
        assert!(is_callable_tool_name("files.read_text") && is_callable_tool_name("search"));
        assert!(!is_callable_tool_name("a.b.c") && !is_callable_tool_name(".x") && !is_callable_tool_name("a/b"));
    }

    #[test]
    fn executions_keep_their_wire_names_and_hints_decide_repeats() {
        assert_eq!(serde_json::to_value(ToolExecution::Client).unwrap(), "client");
        let mcp = ToolExecution::Mcp(McpToolRef { server: "s".into(), tool: "t".into(), hints: ToolHints::default() });
        let back: ToolExecution = serde_json::from_value(serde_json::to_value(&mcp).unwrap()).unwrap();
        assert_eq!(back.mcp().map(|m| m.tool.as_str()), Some("t"));
        assert!(!ToolHints::default().repeatable());
        assert!(ToolHints { idempotent: Some(true), ..Default::default() }.repeatable());
        assert!(ToolHints { read_only: Some(true), ..Default::default() }.repeatable());
    }
}

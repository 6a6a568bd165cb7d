//! MCP tools as the fleet reads them (seed 002's `INTERACTION.ACT.MCP`): discovery budgets and
//! cursors, tool names and schemas, and a `tools/call` answer mapped to an `ExternalResult`.
//! The client that speaks to servers is `fleet_platform::mcp`; every decision it makes is here.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::external_result::{ExternalResult, InteractionError, ResultReference, ResultStatus};
use crate::schema::ToolSchema;

/// Seed 002's `McpRegistry` defaults: one discovery reads at most 100 pages and 1000 tools in all.
pub const DEFAULT_MAX_DISCOVERY_PAGES: u32 = 100;
pub const DEFAULT_MAX_CAPABILITIES: u32 = 1000;
/// The code of a tool's `isError` answer that carries no safe error of its own (seed 002).
pub const MCP_TOOL_ERROR: &str = "MCP_TOOL_ERROR";
/// The codes of calls that got no answer: never sent (safe to retry), sent but unanswered (the
/// caller must reconcile: MCP has no idempotency key), past their deadline.
pub const MCP_UNAVAILABLE: &str = "MCP_UNAVAILABLE";
pub const MCP_NO_ANSWER: &str = "MCP_NO_ANSWER";
pub const MCP_TIMEOUT: &str = "MCP_TIMEOUT";
/// The code of a success whose structured content breaks the tool's `outputSchema`.
pub const MCP_OUTPUT_INVALID: &str = "MCP_OUTPUT_INVALID";
/// The MCP specification's bound on a tool's name.
pub const MAX_TOOL_NAME_CHARS: usize = 128;

/// How much one discovery may read. Both are positive: [`DiscoveryBudget::new`] refuses 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveryBudget {
    pub max_discovery_pages: u32,
    pub max_capabilities: u32,
}

impl Default for DiscoveryBudget {
    fn default() -> Self {
        DiscoveryBudget { max_discovery_pages: DEFAULT_MAX_DISCOVERY_PAGES, max_capabilities: DEFAULT_MAX_CAPABILITIES }
    }
}

impl DiscoveryBudget {
    pub fn new(max_discovery_pages: u32, max_capabilities: u32) -> Result<Self, DiscoveryError> {
        if max_discovery_pages == 0 {
            return Err(DiscoveryError::BadBudget("maxDiscoveryPages"));
        }
        if max_capabilities == 0 {
            return Err(DiscoveryError::BadBudget("maxCapabilities"));
        }
        Ok(DiscoveryBudget { max_discovery_pages, max_capabilities })
    }
}

/// Why a discovery failed. Never a silent cut: a listing is whole or it is this error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiscoveryError {
    #[error("{0} must be a positive integer")]
    BadBudget(&'static str),
    #[error("the tool list needs more than {max} pages (maxDiscoveryPages)")]
    TooManyPages { max: u32 },
    #[error("the tool list has more than {max} tools (maxCapabilities)")]
    TooManyCapabilities { max: u32 },
    #[error("server {server} repeated the cursor {cursor:?} in its tool list")]
    RepeatedCursor { server: String, cursor: String },
    #[error("server {server} lists a tool with an invalid name {name:?}: {why}")]
    BadToolName { server: String, name: String, why: &'static str },
    #[error("server {server} lists the tool {name} twice")]
    DuplicateTool { server: String, name: String },
    #[error("server {server}'s tool {name}: {detail}")]
    InvalidSchema { server: String, name: String, detail: String },
}

/// What a discovery has read so far. One progress may span several servers: seed 002's budget is
/// for one `discover` across every server it visits.
#[derive(Debug, Clone)]
pub struct DiscoveryProgress {
    budget: DiscoveryBudget,
    pages: u32,
    capabilities: u32,
}

/// What to do after a page: ask for the page at this cursor, or stop (the listing is whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextPage {
    Fetch(String),
    Done,
}

/// The cursors one server's listing has given, to refuse a loop.
#[derive(Debug, Default)]
pub struct CursorTrail(HashSet<String>);

impl DiscoveryProgress {
    pub fn new(budget: DiscoveryBudget) -> Self {
        DiscoveryProgress { budget, pages: 0, capabilities: 0 }
    }

    pub fn budget(&self) -> DiscoveryBudget {
        self.budget
    }

    /// Whether another page may be asked for (checked before each request, so an exhausted budget
    /// fails before it makes the server do the work).
    pub fn may_fetch(&self) -> Result<(), DiscoveryError> {
        if self.pages >= self.budget.max_discovery_pages {
            return Err(DiscoveryError::TooManyPages { max: self.budget.max_discovery_pages });
        }
        Ok(())
    }

    /// Counts a page of `tools` tools that ended with `next_cursor`, and says what comes next. An
    /// empty cursor ends the listing, as absent does (the official SDKs read it so).
    pub fn page(
        &mut self,
        server: &str,
        trail: &mut CursorTrail,
        tools: usize,
        next_cursor: Option<&str>,
    ) -> Result<NextPage, DiscoveryError> {
        self.pages += 1;
        let tools = u32::try_from(tools).unwrap_or(u32::MAX);
        self.capabilities = self.capabilities.saturating_add(tools);
        if self.capabilities > self.budget.max_capabilities {
            return Err(DiscoveryError::TooManyCapabilities { max: self.budget.max_capabilities });
        }
        match next_cursor.filter(|c| !c.is_empty()) {
            None => Ok(NextPage::Done),
            Some(cursor) if !trail.0.insert(cursor.to_string()) => {
                Err(DiscoveryError::RepeatedCursor { server: server.to_string(), cursor: clip(cursor, 64) })
            }
            Some(cursor) => {
                self.may_fetch()?;
                Ok(NextPage::Fetch(cursor.to_string()))
            }
        }
    }
}

/// A tool's hints (MCP `ToolAnnotations`): hints only, never a policy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct McpToolHints {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_hint: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive_hint: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent_hint: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world_hint: Option<bool>,
}

/// One tool a server lists (seed 002's `McpCapability` without its server), its schemas checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct McpTool {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub input_schema: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    #[serde(default)]
    pub annotations: McpToolHints,
}

/// Why a name is not a tool name MCP allows: 1 to 128 of `[A-Za-z0-9_.-]`.
pub fn tool_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("it is empty")
    } else if name.chars().count() > MAX_TOOL_NAME_CHARS {
        Some("it is longer than 128 characters")
    } else if !name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')) {
        Some("it has characters other than letters, digits, '_', '-' and '.'")
    } else {
        None
    }
}

/// A result's `source`: `server:tool` (seed 002).
pub fn source(server: &str, tool: &str) -> String {
    format!("{server}:{tool}")
}

/// Checks one server's whole listing: names valid and unique, schemas JSON Schemas.
pub fn check_tools(server: &str, tools: &[McpTool]) -> Result<(), DiscoveryError> {
    let mut seen = HashSet::new();
    for tool in tools {
        if let Some(why) = tool_name_problem(&tool.name) {
            return Err(DiscoveryError::BadToolName { server: server.into(), name: clip(&tool.name, 64), why });
        }
        if !seen.insert(tool.name.as_str()) {
            return Err(DiscoveryError::DuplicateTool { server: server.into(), name: tool.name.clone() });
        }
        let schemas = [("inputSchema", Some(&tool.input_schema)), ("outputSchema", tool.output_schema.as_ref())];
        for (field, schema) in schemas {
            let Some(schema) = schema else { continue };
            let invalid = |detail: String| DiscoveryError::InvalidSchema {
                server: server.into(),
                name: tool.name.clone(),
                detail,
            };
            if !schema.is_object() {
                return Err(invalid(format!("{field} is not a JSON object")));
            }
            ToolSchema::compile_at(schema, field).map_err(|e| invalid(e.to_string()))?;
        }
    }
    Ok(())
}

/// A `tools/call` answer (the JSON of MCP's `CallToolResult`) as seed 002's `ExternalResult`.
/// `isError: true` is `failed`, with the safe error the answer's `structuredContent.error` gives
/// (`{code, message}`), else `MCP_TOOL_ERROR` and its text when that is safe to show. A success
/// always carries something: an answer with nothing is an empty text.
pub fn call_result(call_id: &str, server: &str, tool: &str, answer: &Value) -> ExternalResult {
    let blocks = answer.get("content").and_then(Value::as_array).cloned().unwrap_or_default();
    let (content, references) = content_of(&blocks);
    let structured = answer.get("structuredContent").cloned();
    let failed = answer.get("isError").and_then(Value::as_bool).unwrap_or(false);
    let mut result = ExternalResult {
        call_id: call_id.into(),
        source: source(server, tool),
        status: ResultStatus::Success,
        content,
        structured_content: structured,
        references,
        error: None,
        metadata: None,
    };
    if failed {
        result.status = ResultStatus::Failed;
        result.error = Some(tool_error(&result));
    } else if result.content.is_none() && result.structured_content.is_none() && result.references.is_empty() {
        result.content = Some(Value::String(String::new()));
    }
    result
}

/// `result` checked against the tool's `outputSchema`, when it has one: MCP has a tool with one
/// answer structured content that conforms, so a success without it, or with content that does
/// not conform, becomes `failed` with `MCP_OUTPUT_INVALID` (its content kept for the record).
pub fn checked_output(tool: &McpTool, result: ExternalResult) -> ExternalResult {
    match &tool.output_schema {
        Some(schema) => checked_against(ToolSchema::compile_at(schema, "outputSchema").as_ref(), result),
        None => result,
    }
}

/// [`checked_output`] with the `outputSchema` compiled once by the caller (its error: the schema
/// itself is unusable, which fails every success too).
pub fn checked_against<E: std::fmt::Display>(
    schema: Result<&ToolSchema, &E>,
    mut result: ExternalResult,
) -> ExternalResult {
    if !result.is_success() {
        return result;
    }
    let problem = match (&result.structured_content, schema) {
        (_, Err(e)) => Some(e.to_string()),
        (None, Ok(_)) => Some("the tool answered no structuredContent".to_string()),
        (Some(data), Ok(schema)) => schema.check_at(data, "structuredContent").err().map(|e| e.to_string()),
    };
    if let Some(problem) = problem {
        result.status = ResultStatus::Failed;
        let message = format!("The answer does not match the tool's outputSchema: {problem}");
        result.error = Some(InteractionError::fleet(MCP_OUTPUT_INVALID, &clip(&message, 300)));
    }
    result
}

/// The safe error of an `isError` answer.
fn tool_error(result: &ExternalResult) -> InteractionError {
    let given = result.structured_content.as_ref().and_then(|s| s.get("error"));
    if let Some((code, message)) = given.and_then(|e| Some((e.get("code")?.as_str()?, e.get("message")?.as_str()?))) {
        let retryable = given.and_then(|e| e.get("retryable")).and_then(Value::as_bool);
        let safe = InteractionError::safe(code, message, retryable);
        if safe.code == code && safe.message == message {
            return safe;
        }
    }
    let text = match &result.content {
        Some(Value::String(text)) => text.as_str(),
        _ => "",
    };
    let text = if text.is_empty() { "The MCP tool reported an error" } else { text };
    InteractionError::safe(MCP_TOOL_ERROR, text, None)
}

/// MCP content blocks as seed 002's `MessageContent` and references: one text block is its text;
/// otherwise text blocks are `text` parts and other blocks `json` parts; `resource_link` blocks
/// are references.
fn content_of(blocks: &[Value]) -> (Option<Value>, Vec<ResultReference>) {
    let mut parts = Vec::new();
    let mut references = Vec::new();
    for block in blocks {
        let kind = block.get("type").and_then(Value::as_str).unwrap_or_default();
        match (kind, block.get("text").and_then(Value::as_str), block.get("uri").and_then(Value::as_str)) {
            ("text", Some(text), _) => parts.push(json!({"type": "text", "text": text})),
            ("resource_link", _, Some(uri)) if !uri.is_empty() => references.push(ResultReference {
                uri: uri.to_string(),
                media_type: block.get("mimeType").and_then(Value::as_str).map(str::to_string),
                digest: None,
            }),
            _ => parts.push(json!({"type": "json", "data": block})),
        }
    }
    let content = match parts.as_slice() {
        [] => None,
        [only] if only["type"] == "text" => Some(only["text"].clone()),
        _ => Some(Value::Array(parts)),
    };
    (content, references)
}

/// A call that never reached the server: failed, and safe to retry.
pub fn unsent_result(call_id: &str, server: &str, tool: &str, reason: &str) -> ExternalResult {
    let mut error = InteractionError::fleet(MCP_UNAVAILABLE, reason);
    error.retryable = Some(true);
    ExternalResult::ended(call_id, &source(server, tool), ResultStatus::Failed, error)
}

/// A call that was sent and got no answer: `unknown`, to reconcile before any retry.
pub fn unknown_result(call_id: &str, server: &str, tool: &str, reason: &str) -> ExternalResult {
    let error = InteractionError::fleet(MCP_NO_ANSWER, reason);
    ExternalResult::ended(call_id, &source(server, tool), ResultStatus::Unknown, error)
}

/// A call past its deadline: `timeout` (it may still have its effect).
pub fn timeout_result(call_id: &str, server: &str, tool: &str) -> ExternalResult {
    let error = InteractionError::fleet(MCP_TIMEOUT, "The MCP tool did not answer in time");
    ExternalResult::ended(call_id, &source(server, tool), ResultStatus::Timeout, error)
}

fn clip(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, input: Value) -> McpTool {
        McpTool {
            name: name.into(),
            description: None,
            input_schema: input,
            output_schema: None,
            annotations: Default::default(),
        }
    }

    #[test]
    fn budgets_are_positive() {
        assert_eq!(DiscoveryBudget::default(), DiscoveryBudget::new(100, 1000).unwrap());
        assert_eq!(DiscoveryBudget::new(0, 5), Err(DiscoveryError::BadBudget("maxDiscoveryPages")));
        assert_eq!(DiscoveryBudget::new(5, 0), Err(DiscoveryError::BadBudget("maxCapabilities")));
    }

    #[test]
    fn pages_follow_cursors_until_the_end() {
        let mut p = DiscoveryProgress::new(DiscoveryBudget::new(3, 100).unwrap());
        let mut trail = CursorTrail::default();
        assert_eq!(p.page("s", &mut trail, 10, Some("a")), Ok(NextPage::Fetch("a".into())));
        assert_eq!(p.page("s", &mut trail, 10, Some("b")), Ok(NextPage::Fetch("b".into())));
        assert_eq!(p.page("s", &mut trail, 10, None), Ok(NextPage::Done));
        let mut q = DiscoveryProgress::new(DiscoveryBudget::default());
        assert_eq!(q.page("s", &mut CursorTrail::default(), 1, Some("")), Ok(NextPage::Done));
    }

    #[test]
    fn a_listing_past_its_pages_fails() {
        let mut p = DiscoveryProgress::new(DiscoveryBudget::new(2, 100).unwrap());
        let mut trail = CursorTrail::default();
        assert!(p.may_fetch().is_ok());
        p.page("s", &mut trail, 1, Some("a")).unwrap();
        assert_eq!(p.page("s", &mut trail, 1, Some("b")), Err(DiscoveryError::TooManyPages { max: 2 }));
        // Exactly at the budget is whole.
        let mut q = DiscoveryProgress::new(DiscoveryBudget::new(2, 100).unwrap());
        q.page("s", &mut trail, 1, Some("x")).unwrap();
        assert_eq!(q.page("s", &mut trail, 1, None), Ok(NextPage::Done));
        assert_eq!(q.may_fetch(), Err(DiscoveryError::TooManyPages { max: 2 }));
    }

    #[test]
    fn a_listing_past_its_capabilities_fails_across_servers() {
        let mut p = DiscoveryProgress::new(DiscoveryBudget::new(10, 5).unwrap());
        assert_eq!(p.page("a", &mut CursorTrail::default(), 5, None), Ok(NextPage::Done));
        assert_eq!(
            p.page("b", &mut CursorTrail::default(), 1, None),
            Err(DiscoveryError::TooManyCapabilities { max: 5 })
        );
    }

    #[test]
    fn a_repeated_cursor_fails() {
        let mut p = DiscoveryProgress::new(DiscoveryBudget::default());
        let mut trail = CursorTrail::default();
        p.page("s", &mut trail, 1, Some("a")).unwrap();
        p.page("s", &mut trail, 1, Some("b")).unwrap();
        let e = p.page("s", &mut trail, 1, Some("a")).unwrap_err();
        assert!(matches!(e, DiscoveryError::RepeatedCursor { .. }), "{e}");
    }

    #[test]
    fn names_and_schemas_are_checked() {
        let good = tool("files.read_text-1", json!({"type": "object"}));
        assert_eq!(check_tools("s", std::slice::from_ref(&good)), Ok(()));
        for bad in ["", "a b", "a/b", &"x".repeat(129)] {
            let e = check_tools("s", &[tool(bad, json!({}))]).unwrap_err();
            assert!(matches!(e, DiscoveryError::BadToolName { .. }), "{bad}: {e}");
        }
        let e = check_tools("s", &[good.clone(), good.clone()]).unwrap_err();
        assert!(matches!(e, DiscoveryError::DuplicateTool { .. }));
        let e = check_tools("s", &[tool("t", json!({"type": "nonsense"}))]).unwrap_err();
        assert!(e.to_string().contains("inputSchema"), "{e}");
        let mut out = good;
        out.output_schema = Some(json!({"type": 12}));
        assert!(check_tools("s", &[out]).unwrap_err().to_string().contains("outputSchema"));
        assert!(check_tools("s", &[tool("t", json!(true))]).unwrap_err().to_string().contains("not a JSON object"));
    }

    #[test]
    fn an_error_answer_is_failed_with_a_safe_error() {
        let answer = json!({"content": [{"type": "text", "text": "boom"}], "isError": true});
        let r = call_result("c1", "files", "fail", &answer);
        assert_eq!((r.status, r.source.as_str()), (ResultStatus::Failed, "files:fail"));
        assert_eq!(r.error.as_ref().unwrap().code, MCP_TOOL_ERROR);
        assert_eq!(r.error.unwrap().message, "boom");
        let leak = json!({"content": [{"type": "text", "text": "Traceback: /srv/app.py"}], "isError": true});
        let e = call_result("c1", "s", "t", &leak).error.unwrap();
        assert_eq!(
            (e.code.as_str(), e.message.as_str()),
            (MCP_TOOL_ERROR, crate::external_result::UNSAFE_ERROR_MESSAGE)
        );
        let given =
            json!({"isError": true, "structuredContent": {"error": {"code": "NOT_FOUND", "message": "No such file"}}});
        assert_eq!(call_result("c", "s", "t", &given).error.unwrap().code, "NOT_FOUND");
    }

    #[test]
    fn a_success_keeps_structured_content_and_links() {
        let answer = json!({
            "content": [{"type": "text", "text": "3"}, {"type": "resource_link", "uri": "file:///a", "name": "a", "mimeType": "text/plain"}],
            "structuredContent": {"result": 3}
        });
        let r = call_result("c", "math", "add", &answer);
        assert!(r.is_success());
        assert_eq!(r.content, Some(json!("3")));
        assert_eq!(r.structured_content, Some(json!({"result": 3})));
        assert_eq!(r.references[0].uri, "file:///a");
        let image = json!({"content": [{"type": "image", "data": "AA==", "mimeType": "image/png"}]});
        assert_eq!(call_result("c", "s", "t", &image).content.unwrap()[0]["type"], "json");
        assert_eq!(call_result("c", "s", "t", &json!({"content": []})).content, Some(json!("")));
    }

    #[test]
    fn a_success_must_match_its_output_schema() {
        let mut add = tool("add", json!({"type": "object"}));
        add.output_schema =
            Some(json!({"type": "object", "properties": {"result": {"type": "integer"}}, "required": ["result"]}));
        let good = call_result("c", "m", "add", &json!({"structuredContent": {"result": 3}}));
        assert!(checked_output(&add, good).is_success());
        let bad = checked_output(&add, call_result("c", "m", "add", &json!({"structuredContent": {"result": "3"}})));
        assert_eq!((bad.status, bad.error.unwrap().code.as_str()), (ResultStatus::Failed, MCP_OUTPUT_INVALID));
        let none =
            checked_output(&add, call_result("c", "m", "add", &json!({"content": [{"type": "text", "text": "3"}]})));
        assert_eq!(none.status, ResultStatus::Failed);
        // A failure stays the failure it was; a tool without a schema is not checked.
        let failed = call_result("c", "m", "add", &json!({"isError": true}));
        assert_eq!(checked_output(&add, failed).error.unwrap().code, MCP_TOOL_ERROR);
        let plain = tool("echo", json!({"type": "object"}));
        assert!(checked_output(&plain, call_result("c", "m", "echo", &json!({"content": []}))).is_success());
    }

    #[test]
    fn unanswered_calls_say_how() {
        let r = unsent_result("c", "s", "t", "connection refused");
        assert_eq!((r.status, r.error.unwrap().retryable), (ResultStatus::Failed, Some(true)));
        assert_eq!(unknown_result("c", "s", "t", "dropped").status, ResultStatus::Unknown);
        assert_eq!(timeout_result("c", "s", "t").status, ResultStatus::Timeout);
    }
}

//! A model's tool-call arguments checked against the tool's registered JSON Schema before any
//! callback: arguments that fail it go back to the model as an error, and the tool owner is not
//! called with them.

use serde_json::Value;

use crate::context::Cx;

/// Why `arguments` cannot go to `tool_name`, or `None` when they may (also when the tool cannot be
/// read now, or its stored schema predates the check and does not compile: the callback path then
/// decides, as it did before).
pub(crate) async fn schema_problem(cx: &Cx<'_>, tool_name: &str, arguments: &Value) -> Option<String> {
    let tool = cx.tool(tool_name).await.ok()??;
    let errors = tool.schema()?.check(arguments).err()?;
    Some(format!("the arguments do not match the parameters schema of tool {tool_name:?}: {errors}"))
}

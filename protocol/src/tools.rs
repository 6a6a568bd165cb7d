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

/// Who runs a tool's calls: the fleet (`callback`) or the session's client (`client`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ToolExecution {
    /// The fleet: a signed POST to the tool's `callback_url` (the seed's tool callback).
    #[default]
    Callback,
    /// The client of the session (seed 001's client tools): the turn lists the call as pending and
    /// waits, holding no worker, until the client submits its `tool_output`.
    Client,
}

impl ToolExecution {
    pub fn is_callback(&self) -> bool {
        *self == ToolExecution::Callback
    }
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
}

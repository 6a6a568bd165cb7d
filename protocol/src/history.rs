//! A session's conversation history as plain data: the stored entry, which whole exchanges the
//! budget drops, and the seed's cursor paging of `GET /v1/sessions/{id}/messages`.

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::chat::{Message, ToolCall};

/// Messages a session keeps at most (`FLEET_SESSION_HISTORY_MAX_MESSAGES`).
pub const DEFAULT_MAX_MESSAGES: usize = 100;
/// Bytes of stored entries a session keeps at most (`FLEET_SESSION_HISTORY_MAX_BYTES`).
pub const DEFAULT_MAX_BYTES: usize = 256 * 1024;
/// A session's history lives this long after its last use.
pub const HISTORY_TTL_SECS: u64 = 7 * 24 * 3600;
/// How long a session's bindings (its tenant, its agent) live past the latest turn or read that
/// renewed them: longer than any of the session's data can (a turn writes for at most
/// `IDEMPOTENCY_TTL_SECS` after it was accepted, and what it writes lives `HISTORY_TTL_SECS`), so
/// the guard of a session's data never lapses before the data. A room's bindings never expire.
pub const SESSION_BINDING_TTL_SECS: u64 = 30 * 24 * 3600;
/// The seed's listing: `limit` default and maximum.
pub const DEFAULT_PAGE: usize = 50;
pub const MAX_PAGE: usize = 100;

/// One remembered message. `seq` is assigned by the store, increasing per session; `exchange` is
/// the turn that produced it (the unit the budget drops).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// Written by the store (spliced into the JSON), so never serialised here while unset.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub seq: u64,
    pub id: String,
    pub exchange: String,
    pub role: String,
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The answer's reasoning, for an agent that replays it (`chat::Message::reasoning`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    pub created_at: String,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl HistoryEntry {
    /// The message as the model reads it.
    pub fn to_message(&self) -> Message {
        Message {
            role: self.role.clone(),
            content: self.content.clone(),
            tool_calls: self.tool_calls.clone(),
            tool_call_id: self.tool_call_id.clone(),
            // The history keeps a loaded image's note, never the image: a later turn that wants
            // it loads it again.
            images: vec![],
            reasoning: self.reasoning.clone(),
        }
    }

    /// The seed's listing shape: `id, role, content, tool_calls, created_at` (+ `tool_call_id`).
    pub fn to_api(&self) -> MessageOut {
        let calls = self.tool_calls.iter().map(|c| MessageToolCall {
            id: c.id.clone(),
            tool_name: c.name.clone(),
            arguments: c.arguments.clone(),
        });
        MessageOut {
            id: self.id.clone(),
            role: self.role.clone(),
            content: self.content.clone(),
            created_at: self.created_at.clone(),
            execution_id: self.exchange.clone(),
            tool_calls: (self.role == "assistant").then(|| calls.collect()),
            tool_call_id: self.tool_call_id.clone(),
        }
    }
}

/// A remembered message as the API shows it (a session's or a room's messages).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", schema(as = Message))]
pub struct MessageOut {
    /// `msg_…`.
    pub id: String,
    /// `user`, `system`, `assistant` or `tool`.
    pub role: String,
    /// Null for an assistant message that only calls tools.
    pub content: Option<String>,
    /// RFC 3339: when it was sent or made.
    pub created_at: String,
    /// The turn it belongs to: `GET /v1/executions/{id}`, `POST /v1/executions/{id}/cancel`.
    pub execution_id: String,
    /// The tools the assistant called (an assistant's message only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<MessageToolCall>>,
    /// The call a tool result answers (a tool's message only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// A tool call in an assistant's message.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct MessageToolCall {
    pub id: String,
    pub tool_name: String,
    /// The arguments as the model wrote them (a JSON text).
    pub arguments: String,
}

/// The entries one finished turn adds: its own messages (`own`, in order, the first being its
/// `first`-th own message), the last being its final answer, which keeps the id the turn streamed
/// it under (`final_id`).
pub fn exchange_entries(
    turn_id: &str,
    first: usize,
    own: &[Message],
    final_id: &str,
    created_at: &str,
) -> Vec<HistoryEntry> {
    let base = format!("msg_{}", turn_id.strip_prefix("exec_").unwrap_or(turn_id));
    own.iter()
        .enumerate()
        .map(|(i, m)| HistoryEntry {
            seq: 0,
            id: if i + 1 == own.len() { final_id.to_string() } else { format!("{base}_h{}", first + i) },
            exchange: turn_id.to_string(),
            role: m.role.clone(),
            content: m.content.clone(),
            tool_calls: m.tool_calls.clone(),
            tool_call_id: m.tool_call_id.clone(),
            reasoning: m.reasoning.clone(),
            created_at: created_at.to_string(),
        })
        .collect()
}

/// The message log's entries of a turn's own (user) messages, as sent: their ids derive from the
/// turn (`msg_<turn>_u<i>`), so a republished turn logs them once.
pub fn sent_entries(turn_id: &str, messages: &[(String, String)], created_at: &str) -> Vec<HistoryEntry> {
    let base = format!("msg_{}", turn_id.strip_prefix("exec_").unwrap_or(turn_id));
    messages
        .iter()
        .enumerate()
        .map(|(i, (role, content))| HistoryEntry {
            seq: 0,
            id: format!("{base}_u{i}"),
            exchange: turn_id.to_string(),
            role: role.clone(),
            content: Some(content.clone()),
            tool_calls: vec![],
            tool_call_id: None,
            reasoning: None,
            created_at: created_at.to_string(),
        })
        .collect()
}

/// The message log's entry of an assistant message a model call made (`message_id` is the call's
/// own, the id its events streamed under).
pub fn answer_entry(turn_id: &str, message_id: &str, message: &Message, created_at: &str) -> HistoryEntry {
    HistoryEntry {
        seq: 0,
        id: message_id.to_string(),
        exchange: turn_id.to_string(),
        role: "assistant".into(),
        content: message.content.clone(),
        tool_calls: message.tool_calls.clone(),
        tool_call_id: None,
        reasoning: None,
        created_at: created_at.to_string(),
    }
}

/// The message log's entry of a tool call's result (the call's key, `turn::call_key`, names it).
pub fn result_entry(turn_id: &str, call_key: &str, call_id: &str, content: &str, created_at: &str) -> HistoryEntry {
    let base = format!("msg_{}", turn_id.strip_prefix("exec_").unwrap_or(turn_id));
    HistoryEntry {
        seq: 0,
        id: format!("{base}_t{call_key}"),
        exchange: turn_id.to_string(),
        role: "tool".into(),
        content: Some(content.to_string()),
        tool_calls: vec![],
        tool_call_id: Some(call_id.to_string()),
        reasoning: None,
        created_at: created_at.to_string(),
    }
}

/// How many entries, from the oldest, to drop so that the rest fit `max_messages` and `max_bytes`.
/// `entries` are (exchange, stored bytes), oldest first. Only whole exchanges are dropped, so a
/// tool result never outlives its call; an exchange larger than the budget by itself goes too.
pub fn entries_to_drop(entries: &[(&str, usize)], max_messages: usize, max_bytes: usize) -> usize {
    let mut count = entries.len();
    let mut bytes: usize = entries.iter().map(|(_, b)| b).sum();
    let mut drop = 0;
    while drop < entries.len() && (count > max_messages || bytes > max_bytes) {
        let exchange = entries[drop].0;
        while drop < entries.len() && entries[drop].0 == exchange {
            count -= 1;
            bytes -= entries[drop].1;
            drop += 1;
        }
    }
    drop
}

/// `desc` (newest first, the default) or `asc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Order {
    Asc,
    #[default]
    Desc,
}

/// A listing's `limit` (`DEFAULT_PAGE` when absent), checked: 1 to `MAX_PAGE`. The seed's
/// message listing and seed 000's assistant and room listings share it.
pub fn page_limit(limit: Option<&str>) -> Result<usize, String> {
    match limit {
        None => Ok(DEFAULT_PAGE),
        Some(l) => match l.parse::<usize>() {
            Ok(n @ 1..=MAX_PAGE) => Ok(n),
            _ => Err(format!("limit must be an integer between 1 and {MAX_PAGE}")),
        },
    }
}

/// A listing request, checked: the error names the parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRequest {
    pub limit: usize,
    pub after: Option<u64>,
    pub order: Order,
}

impl PageRequest {
    pub fn parse(limit: Option<&str>, cursor: Option<&str>, order: Option<&str>) -> Result<Self, String> {
        let limit = page_limit(limit)?;
        let order = match order {
            None => Order::Desc,
            Some("asc") => Order::Asc,
            Some("desc") => Order::Desc,
            Some(_) => return Err("order must be asc or desc".into()),
        };
        let after = match cursor {
            None | Some("") => None,
            Some(c) => Some(decode_cursor(c).ok_or("cursor is not a next_cursor this listing returned")?),
        };
        Ok(PageRequest { limit, after, order })
    }
}

/// An opaque cursor: the `seq` of the last entry a page returned.
pub fn encode_cursor(seq: u64) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{{\"seq\":{seq}}}"))
}

pub fn decode_cursor(cursor: &str) -> Option<u64> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(cursor).ok()?;
    let v: Value = serde_json::from_slice(&raw).ok()?;
    v["seq"].as_u64()
}

/// One page of `entries` (oldest first, increasing `seq`): the page, `has_more`, `next_cursor`.
pub fn page<'a>(entries: &'a [HistoryEntry], req: &PageRequest) -> (Vec<&'a HistoryEntry>, bool, Option<String>) {
    let ordered: Vec<&HistoryEntry> = match req.order {
        Order::Asc => entries.iter().filter(|e| req.after.is_none_or(|a| e.seq > a)).collect(),
        Order::Desc => entries.iter().rev().filter(|e| req.after.is_none_or(|a| e.seq < a)).collect(),
    };
    let has_more = ordered.len() > req.limit;
    let page: Vec<&HistoryEntry> = ordered.into_iter().take(req.limit).collect();
    let next = if has_more { page.last().map(|e| encode_cursor(e.seq)) } else { None };
    (page, has_more, next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sessions_bindings_outlive_the_latest_write_of_its_data() {
        const { assert!(SESSION_BINDING_TTL_SECS > crate::IDEMPOTENCY_TTL_SECS + HISTORY_TTL_SECS) };
    }
    use serde_json::json;

    fn entry(seq: u64) -> HistoryEntry {
        HistoryEntry {
            seq,
            id: format!("msg_{seq}"),
            exchange: "exec_1".into(),
            role: "user".into(),
            content: Some(seq.to_string()),
            tool_calls: vec![],
            tool_call_id: None,
            reasoning: None,
            created_at: "2026-01-01T00:00:00Z".into(),
        }
    }

    #[test]
    fn nothing_is_dropped_within_the_budget() {
        assert_eq!(entries_to_drop(&[("a", 10), ("a", 10), ("b", 10)], 3, 30), 0);
        assert_eq!(entries_to_drop(&[], 0, 0), 0);
    }

    #[test]
    fn the_count_drops_the_oldest_whole_exchange() {
        // Four of `a` (a call and its result among them) then two of `b`: over 4, `a` goes whole.
        let e = [("a", 1), ("a", 1), ("a", 1), ("a", 1), ("b", 1), ("b", 1)];
        assert_eq!(entries_to_drop(&e, 4, 1000), 4);
        assert_eq!(entries_to_drop(&e, 5, 1000), 4, "never half an exchange");
        assert_eq!(entries_to_drop(&e, 6, 1000), 0);
    }

    #[test]
    fn the_bytes_drop_oldest_first_until_they_fit() {
        let e = [("a", 100), ("b", 50), ("b", 50), ("c", 30)];
        assert_eq!(entries_to_drop(&e, 100, 230), 0);
        assert_eq!(entries_to_drop(&e, 100, 229), 1);
        assert_eq!(entries_to_drop(&e, 100, 130), 1);
        assert_eq!(entries_to_drop(&e, 100, 129), 3);
        assert_eq!(entries_to_drop(&e, 100, 10), 4, "an exchange over the budget by itself goes too");
    }

    #[test]
    fn exchange_entries_keep_the_final_id_and_the_calls() {
        let call = ToolCall { id: "call_1".into(), name: "t".into(), arguments: "{}".into() };
        let own = vec![
            Message::text("user", "hi"),
            Message {
                role: "assistant".into(),
                content: None,
                tool_calls: vec![call.clone()],
                tool_call_id: None,
                images: vec![],
                reasoning: None,
            },
            Message {
                role: "tool".into(),
                content: Some("r".into()),
                tool_calls: vec![],
                tool_call_id: Some("call_1".into()),
                images: vec![],
                reasoning: None,
            },
            Message::text("assistant", "done"),
        ];
        let e = exchange_entries("exec_abc", 0, &own, "msg_final", "2026-01-01T00:00:00Z");
        let ids: Vec<&str> = e.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, ["msg_abc_h0", "msg_abc_h1", "msg_abc_h2", "msg_final"]);
        assert_eq!(e[1].to_message().tool_calls, vec![call]);
        assert_eq!(e[2].to_message().tool_call_id.as_deref(), Some("call_1"));
        assert!(e.iter().all(|x| x.exchange == "exec_abc"));
        assert!(!serde_json::to_string(&e[0]).unwrap().contains("seq"), "the store numbers it");
        assert_eq!(json!(e[0].to_api())["role"], "user");
        assert!(json!(e[0].to_api()).get("tool_calls").is_none());
        assert_eq!(json!(e[3].to_api())["tool_calls"], json!([]));
    }

    #[test]
    fn pages_follow_the_cursor_both_ways() {
        let all: Vec<HistoryEntry> = (1..=5).map(entry).collect();
        let req = PageRequest::parse(Some("2"), None, None).unwrap();
        let (p, more, next) = page(&all, &req);
        assert_eq!(p.iter().map(|e| e.seq).collect::<Vec<_>>(), [5, 4]);
        assert!(more);
        let req = PageRequest::parse(Some("2"), next.as_deref(), None).unwrap();
        let (p, _, next) = page(&all, &req);
        assert_eq!(p.iter().map(|e| e.seq).collect::<Vec<_>>(), [3, 2]);
        let req = PageRequest::parse(Some("2"), next.as_deref(), None).unwrap();
        let (p, more, next) = page(&all, &req);
        assert_eq!(p.iter().map(|e| e.seq).collect::<Vec<_>>(), [1]);
        assert!(!more);
        assert_eq!(next, None);
        let req = PageRequest::parse(Some("3"), None, Some("asc")).unwrap();
        let (p, more, next) = page(&all, &req);
        assert_eq!(p.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
        assert!(more);
        let req = PageRequest::parse(None, next.as_deref(), Some("asc")).unwrap();
        assert_eq!(page(&all, &req).0.iter().map(|e| e.seq).collect::<Vec<_>>(), [4, 5]);
    }

    #[test]
    fn bad_listing_parameters_are_named() {
        assert!(PageRequest::parse(Some("101"), None, None).unwrap_err().contains("limit"));
        assert!(PageRequest::parse(Some("0"), None, None).unwrap_err().contains("limit"));
        assert!(PageRequest::parse(Some("x"), None, None).unwrap_err().contains("limit"));
        assert!(PageRequest::parse(None, None, Some("up")).unwrap_err().contains("order"));
        assert!(PageRequest::parse(None, Some("nonsense"), None).unwrap_err().contains("cursor"));
        assert_eq!(
            PageRequest::parse(None, None, None).unwrap(),
            PageRequest { limit: 50, after: None, order: Order::Desc }
        );
        assert_eq!(decode_cursor(&encode_cursor(42)), Some(42));
    }
}

//! A session's compaction (seed 001) as plain data: which whole exchanges of the remembered history
//! it replaces, what the model is asked to summarise, and the one entry that stands for them after.

use serde::{Deserialize, Serialize};

use crate::history::HistoryEntry;

/// Without an anchor, a compaction keeps this many of the most recent exchanges as they are.
pub const DEFAULT_KEEP_RECENT_INPUTS: usize = 1;

/// What the model is asked, unless the request gives its own `compaction_message`.
pub const DEFAULT_PROMPT: &str = "Summarise the conversation below so that it can replace it: keep every fact, \
    decision, open question and tool result the rest of the conversation may need. Answer with the summary only.";

/// A compaction asked of a session, kept in its turn's state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Compaction {
    /// Compact up to this turn's exchange, inclusive; none: all but the most recent `keep_recent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_to_turn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    #[serde(default)]
    pub keep_recent: usize,
    /// Set with the summary: what it replaces (entries up to this `seq`) and what it reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done: Option<Done>,
}

/// A made summary, saved before the history is rewritten (a copy of the step finishes it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Done {
    /// The entries up to this one are replaced; none: there was nothing to compact.
    pub up_to_seq: Option<u64>,
    pub report: Report,
}

/// What the `compaction` event reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Exchanges (turns, and earlier summaries) replaced.
    pub turns_compacted: u64,
    /// Remembered messages replaced.
    pub events_compacted: u64,
    pub summary_text: Option<String>,
    pub summary_key: String,
}

/// What a compaction will replace.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub up_to_seq: u64,
    pub turns: u64,
    pub entries: u64,
    /// The replaced messages as text for the model.
    pub transcript: String,
}

/// The oldest whole exchanges to replace (`history` oldest first): through `up_to_turn`'s, or all
/// but the `keep_recent` newest; `None` when that is nothing (an anchor no longer remembered was
/// compacted or dropped before).
pub fn plan(history: &[HistoryEntry], up_to_turn: Option<&str>, keep_recent: usize) -> Option<Plan> {
    let mut exchanges: Vec<&str> = Vec::new();
    for e in history {
        if exchanges.last() != Some(&e.exchange.as_str()) {
            exchanges.push(&e.exchange);
        }
    }
    let turns = match up_to_turn {
        Some(turn) => exchanges.iter().position(|x| *x == turn)? + 1,
        None => exchanges.len().saturating_sub(keep_recent),
    };
    if turns == 0 {
        return None;
    }
    let last = exchanges[turns - 1];
    let end = history.iter().rposition(|e| e.exchange == last)? + 1;
    let replaced = &history[..end];
    Some(Plan {
        up_to_seq: replaced.last()?.seq,
        turns: turns as u64,
        entries: replaced.len() as u64,
        transcript: transcript(replaced),
    })
}

/// The messages as a plain transcript (the summarising call has no tools, so tool messages are
/// given as text).
pub fn transcript(entries: &[HistoryEntry]) -> String {
    let mut out = String::new();
    for e in entries {
        let content = e.content.as_deref().unwrap_or_default();
        match e.role.as_str() {
            "tool" => out.push_str(&format!("tool result: {content}\n")),
            role => {
                if !content.is_empty() {
                    out.push_str(&format!("{role}: {content}\n"));
                }
                for call in &e.tool_calls {
                    out.push_str(&format!("{role} called tool {} with {}\n", call.name, call.arguments));
                }
            }
        }
    }
    out
}

/// The key of a compaction's summary.
pub fn summary_key(turn_id: &str) -> String {
    format!("sum_{}", turn_id.strip_prefix("exec_").unwrap_or(turn_id))
}

/// The history entry that replaces the compacted ones (the store gives it the last one's `seq`).
pub fn summary_entry(turn_id: &str, summary: &str, created_at: &str) -> HistoryEntry {
    HistoryEntry {
        seq: 0,
        id: summary_key(turn_id),
        exchange: turn_id.to_string(),
        role: "system".into(),
        content: Some(format!("Summary of the earlier conversation: {summary}")),
        tool_calls: vec![],
        tool_call_id: None,
        reasoning: None,
        created_at: created_at.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64, exchange: &str, role: &str, content: &str) -> HistoryEntry {
        HistoryEntry {
            seq,
            id: format!("m{seq}"),
            exchange: exchange.into(),
            role: role.into(),
            content: Some(content.into()),
            tool_calls: vec![],
            tool_call_id: None,
            reasoning: None,
            created_at: "t".into(),
        }
    }

    fn history() -> Vec<HistoryEntry> {
        vec![
            entry(1, "a", "user", "hi"),
            entry(2, "a", "assistant", "hello"),
            entry(3, "b", "user", "weather?"),
            entry(4, "b", "tool", "sunny"),
            entry(5, "b", "assistant", "sunny"),
            entry(6, "c", "user", "thanks"),
            entry(7, "c", "assistant", "welcome"),
        ]
    }

    #[test]
    fn without_an_anchor_all_but_the_newest_exchanges_are_replaced() {
        let p = plan(&history(), None, 1).unwrap();
        assert_eq!((p.up_to_seq, p.turns, p.entries), (5, 2, 5));
        assert!(
            p.transcript.starts_with("user: hi\nassistant: hello\nuser: weather?\ntool result: sunny\n"),
            "{}",
            p.transcript
        );
        assert_eq!(plan(&history(), None, 0).unwrap().entries, 7);
        assert_eq!(plan(&history(), None, 3), None, "nothing older than what is kept");
    }

    #[test]
    fn an_anchor_replaces_through_its_exchange() {
        let p = plan(&history(), Some("a"), 1).unwrap();
        assert_eq!((p.up_to_seq, p.turns, p.entries), (2, 1, 2));
        assert_eq!(plan(&history(), Some("c"), 5).unwrap().turns, 3, "an anchor ignores keep_recent");
        assert_eq!(plan(&history(), Some("gone"), 0), None);
    }

    #[test]
    fn a_summary_stands_for_what_it_replaced() {
        let s = summary_entry("exec_ab", "they said hi", "t");
        assert_eq!((s.id.as_str(), s.role.as_str()), ("sum_ab", "system"));
        assert!(s.content.unwrap().ends_with("they said hi"));
    }
}

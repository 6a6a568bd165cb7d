//! What a stream request asks for, decided from its `Last-Event-ID` header and query string
//! (pure): where the stream starts and whether it ends after the next `done`.

use std::collections::HashMap;

/// A Redis stream id (`<ms>-<seq>`), ordered as Redis orders them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct StreamId(u64, u64);

impl StreamId {
    pub(crate) const ZERO: StreamId = StreamId(0, 0);

    pub(crate) fn parse(id: &str) -> Option<StreamId> {
        let (ms, seq) = id.split_once('-')?;
        let digits = |p: &str| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit());
        if !digits(ms) || !digits(seq) {
            return None;
        }
        Some(StreamId(ms.parse().ok()?, seq.parse().ok()?))
    }

    /// The greatest id before this one: reading "after" it starts with this one.
    pub(crate) fn before(self) -> StreamId {
        match self {
            StreamId(0, 0) => self,
            StreamId(ms, 0) => StreamId(ms - 1, u64::MAX),
            StreamId(ms, seq) => StreamId(ms, seq - 1),
        }
    }
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.0, self.1)
    }
}

/// Where a stream starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Start {
    /// After this event (`Last-Event-ID`, or `?last_event_id=`).
    After(StreamId),
    /// At the oldest event the session's stream still keeps (`?since=start`).
    Beginning,
    /// With the next event appended (the default).
    Now,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StreamRequest {
    pub(crate) start: Start,
    /// `?until=done`: the stream ends after the next `done` event.
    pub(crate) until_done: bool,
}

/// Reads the request. The header wins over `last_event_id`, which wins over `since`: a browser's
/// `EventSource` reconnects to the same URL and sends the id of the last event it saw as the
/// header, so a reconnection resumes where it broke off whatever the URL says.
pub(crate) fn parse(
    last_event_id_header: Option<&str>,
    query: &HashMap<String, String>,
) -> Result<StreamRequest, String> {
    let event_id = |id: &str, source: &str| {
        StreamId::parse(id).ok_or_else(|| format!("{source} {id:?} is not an event id this stream sent"))
    };
    let header = last_event_id_header.map(|id| event_id(id, "Last-Event-ID")).transpose()?;
    let param = query.get("last_event_id").map(|id| event_id(id, "last_event_id")).transpose()?;
    let since = match query.get("since").map(String::as_str) {
        None | Some("now") => Start::Now,
        Some("start") => Start::Beginning,
        Some(other) => return Err(format!("since must be \"start\" or \"now\", not {other:?}")),
    };
    let until_done = match query.get("until").map(String::as_str) {
        None => false,
        Some("done") => true,
        Some(other) => return Err(format!("until must be \"done\", not {other:?}")),
    };
    let start = header.or(param).map(Start::After).unwrap_or(since);
    Ok(StreamRequest { start, until_done })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn stream_ids_are_redis_ids_in_redis_order() {
        assert_eq!(StreamId::parse("1700000000000-0"), Some(StreamId(1_700_000_000_000, 0)));
        assert!(StreamId::parse("2-0") > StreamId::parse("1-9"));
        assert!(StreamId::parse("1-10") > StreamId::parse("1-9"), "numeric, not textual");
        for bad in ["abc", "1-2-3", "1-", "-1", "1", "", "1-x", "99999999999999999999-0"] {
            assert_eq!(StreamId::parse(bad), None, "{bad:?}");
        }
        assert_eq!(StreamId::parse("5-3").unwrap().to_string(), "5-3");
    }

    #[test]
    fn the_header_wins_then_last_event_id_then_since() {
        let all = query(&[("last_event_id", "2-0"), ("since", "start")]);
        assert_eq!(parse(Some("3-0"), &all).unwrap().start, Start::After(StreamId(3, 0)));
        assert_eq!(parse(None, &all).unwrap().start, Start::After(StreamId(2, 0)));
        assert_eq!(parse(None, &query(&[("since", "start")])).unwrap().start, Start::Beginning);
        assert_eq!(parse(None, &query(&[])).unwrap(), StreamRequest { start: Start::Now, until_done: false });
        assert!(parse(None, &query(&[("until", "done")])).unwrap().until_done);
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        assert!(parse(Some("x"), &query(&[])).unwrap_err().contains("Last-Event-ID"));
        assert!(parse(None, &query(&[("last_event_id", "x")])).unwrap_err().contains("last_event_id"));
        assert!(parse(None, &query(&[("since", "yesterday")])).unwrap_err().contains("since"));
        assert!(parse(None, &query(&[("until", "end")])).unwrap_err().contains("until"));
        // A bad header is refused even when the query would do.
        assert!(parse(Some("x"), &query(&[("last_event_id", "2-0")])).is_err());
    }
}

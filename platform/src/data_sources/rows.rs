//! The rows a query keeps: at most `max_rows`, and at most `max_bytes` of their JSON. The driver
//! reads a row at a time and stops at the first that does not fit, so nothing past the caps is
//! held.

use fleet_protocol::data_sources::{QueryLimits, QueryResult};
use serde_json::Value;
use tokio::time::Instant;

pub(crate) struct CappedRows {
    rows: Vec<Vec<Value>>,
    bytes: u64,
    max_rows: u64,
    max_bytes: u64,
    truncated: bool,
}

impl CappedRows {
    pub(crate) fn new(limits: &QueryLimits) -> Self {
        CappedRows {
            rows: Vec::new(),
            bytes: 0,
            max_rows: limits.max_rows,
            max_bytes: limits.max_bytes,
            truncated: false,
        }
    }

    /// Keeps `row` if it fits; returns whether the reader should go on.
    pub(crate) fn push(&mut self, row: Vec<Value>) -> bool {
        let size = json_size(&row);
        if self.rows.len() as u64 >= self.max_rows || self.bytes + size > self.max_bytes {
            self.truncated = true;
            return false;
        }
        self.bytes += size;
        self.rows.push(row);
        true
    }

    /// How many more rows the reader may fetch to learn whether the result is cut: one past the cap.
    pub(crate) fn room(&self) -> u64 {
        (self.max_rows + 1).saturating_sub(self.rows.len() as u64)
    }

    pub(crate) fn truncated(&self) -> bool {
        self.truncated
    }

    pub(crate) fn into_result(self, columns: Vec<String>, started: Instant) -> QueryResult {
        QueryResult {
            columns,
            row_count: self.rows.len() as u64,
            rows: self.rows,
            execution_time_ms: started.elapsed().as_millis() as u64,
            truncated: self.truncated,
        }
    }
}

/// The length of `row` as JSON, without building the text.
fn json_size(row: &[Value]) -> u64 {
    let mut counter = Counter(0);
    // Writing to a counter cannot fail, and a `Value` always serialises.
    let _ = serde_json::to_writer(&mut counter, row);
    counter.0
}

struct Counter(u64);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rows_stop_at_either_cap() {
        let limits = QueryLimits { max_rows: 2, ..QueryLimits::default() };
        let mut rows = CappedRows::new(&limits);
        assert_eq!(rows.room(), 3);
        assert!(rows.push(vec![json!(1)]) && rows.push(vec![json!(2)]));
        assert!(!rows.push(vec![json!(3)]));
        let result = rows.into_result(vec!["n".into()], Instant::now());
        assert_eq!((result.row_count, result.truncated), (2, true));

        let limits = QueryLimits { max_bytes: 1024, ..QueryLimits::default() };
        let mut rows = CappedRows::new(&limits);
        let wide = vec![json!("x".repeat(500))];
        assert_eq!(json_size(&wide), 504);
        assert!(rows.push(wide.clone()) && rows.push(wide.clone()));
        assert!(!rows.push(wide));
        assert!(rows.truncated());
    }
}

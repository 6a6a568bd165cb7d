//! What a model is told about a data source: its description, then each table with its columns,
//! their types and the mappings' descriptions and synonyms, within a bound.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::mapping::resolve;
use super::{SemanticMapping, Table};

/// The source as a model reads it, at most `max_chars` characters. A longer text is cut at the
/// end of a line (at a character boundary when a line is longer than the bound), with a note
/// saying so; a mapping whose key names no table or column of `tables` (the schema changed since)
/// is left out.
pub fn tool_description(
    name: &str,
    description: Option<&str>,
    tables: &[Table],
    mappings: &BTreeMap<String, SemanticMapping>,
    max_chars: usize,
) -> String {
    let mut text = format!("Data source `{}`", one_line(name));
    match description.map(one_line).filter(|d| !d.is_empty()) {
        Some(description) => {
            let _ = write!(text, ": {description}");
        }
        None => text.push('.'),
    }
    let (mut by_table, mut by_column) = (BTreeMap::new(), BTreeMap::new());
    for (key, mapping) in mappings {
        match resolve(key, tables) {
            Ok((table, None)) => {
                by_table.insert(table.name.as_str(), mapping);
            }
            Ok((table, Some(column))) => {
                by_column.insert((table.name.as_str(), column), mapping);
            }
            Err(_) => {}
        }
    }
    let _ = write!(text, "\nTables ({}):", tables.len());
    for table in tables {
        let _ = write!(text, "\n- {}{}", one_line(&table.name), annotation(by_table.get(table.name.as_str())));
        for (at, column) in table.columns.iter().enumerate() {
            let nullable = if column.nullable { ", nullable" } else { "" };
            let mapping = by_column.get(&(table.name.as_str(), at));
            let _ = write!(
                text,
                "\n  - {} ({}{nullable}){}",
                one_line(&column.name),
                one_line(&column.r#type),
                annotation(mapping)
            );
        }
    }
    bounded(text, max_chars)
}

/// `: description. Also called: a, b.` for a mapping, nothing without one.
fn annotation(mapping: Option<&&SemanticMapping>) -> String {
    let Some(mapping) = mapping else { return String::new() };
    let mut out = String::new();
    if let Some(description) = mapping.description.as_deref().map(one_line) {
        let _ = write!(out, ": {}", description.trim_end_matches('.'));
        out.push('.');
    }
    if !mapping.synonyms.is_empty() {
        let lead = if out.is_empty() { ": " } else { " " };
        let synonyms: Vec<String> = mapping.synonyms.iter().map(|s| one_line(s)).collect();
        let _ = write!(out, "{lead}Also called: {}.", synonyms.join(", "));
    }
    out
}

/// A text on one line: each run of whitespace is one space, so no name can start a line of its own.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn bounded(text: String, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text;
    }
    let note = format!("\n… (cut: the full schema is longer than {max_chars} characters)");
    let room = max_chars.saturating_sub(note.chars().count());
    if room == 0 {
        return text.chars().take(max_chars).collect();
    }
    let mut kept: String = text.chars().take(room).collect();
    if let Some(end) = kept.rfind('\n') {
        kept.truncate(end);
    }
    kept + &note
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data_sources::mapping::tests::seed_tables;

    fn seed_mappings() -> BTreeMap<String, SemanticMapping> {
        let mapping = |d: &str, s: &[&str]| SemanticMapping {
            description: Some(d.into()),
            synonyms: s.iter().map(|s| s.to_string()).collect(),
        };
        BTreeMap::from([
            ("customers".into(), mapping("Customer accounts and profiles", &["users", "clients"])),
            ("customers.created_at".into(), mapping("When the customer signed up", &["signup date"])),
            ("orders.total_amount".into(), SemanticMapping { description: None, synonyms: vec!["order total".into()] }),
            ("invoices".into(), mapping("gone since", &[])),
        ])
    }

    #[test]
    fn the_model_reads_tables_columns_types_and_mappings() {
        let text = tool_description(
            "sales_database",
            Some("Sales and customer data"),
            &seed_tables(),
            &seed_mappings(),
            10_000,
        );
        let expected = "Data source `sales_database`: Sales and customer data\n\
            Tables (2):\n\
            - customers: Customer accounts and profiles. Also called: users, clients.\n  \
              - id (uuid)\n  \
              - email (varchar)\n  \
              - name (varchar, nullable)\n  \
              - created_at (timestamp): When the customer signed up. Also called: signup date.\n\
            - orders\n  \
              - id (uuid)\n  \
              - customer_id (uuid)\n  \
              - total_amount (numeric): Also called: order total.\n  \
              - created_at (timestamp)";
        assert_eq!(text, expected);
        assert!(!text.contains("gone since"), "a stale mapping is left out");
    }

    #[test]
    fn a_long_description_is_cut_at_a_line_with_a_note() {
        let full = tool_description("s", None, &seed_tables(), &seed_mappings(), usize::MAX);
        let whole = full.chars().count();
        assert_eq!(tool_description("s", None, &seed_tables(), &seed_mappings(), whole), full);
        for max in [whole - 1, 200, 120, 90, 10, 0] {
            let text = tool_description("s", None, &seed_tables(), &seed_mappings(), max);
            assert!(text.chars().count() <= max, "{max}: {text}");
            if max >= 120 {
                assert!(text.ends_with(&format!("(cut: the full schema is longer than {max} characters)")), "{text}");
                let kept = text.rsplit_once("\n…").unwrap().0;
                assert!(full.starts_with(kept) && full[kept.len()..].starts_with('\n'), "cut at a line end: {text}");
            }
        }
        // A name of multi-byte characters is cut on a character boundary.
        let wide = tool_description("ééééééééééééééééééééééééééééééé", None, &[], &BTreeMap::new(), 12);
        assert_eq!(wide.chars().count(), 12);
    }
}

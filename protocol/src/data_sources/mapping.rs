//! Semantic mappings (the seed's `PATCH .../semantic-mappings`): descriptions and synonyms for a
//! source's tables (`customers`) and columns (`customers.created_at`), checked against its schema.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Table;

/// Keys one source may map at most.
pub const MAX_MAPPINGS: usize = 1_000;
/// Synonyms one key may have at most, and characters in each.
pub const MAX_SYNONYMS: usize = 32;
pub const MAX_SYNONYM_CHARS: usize = 100;
pub const MAX_DESCRIPTION_CHARS: usize = 1_000;

/// What the model is told about a table or a column beyond its name and type.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SemanticMapping {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default)]
    pub synonyms: Vec<String>,
}

/// A mapping the schema or the bounds refuse; each names its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MappingError {
    #[error("mappings.{key}: the source has no table `{key}`")]
    UnknownTable { key: String },
    #[error("mappings.{key}: table `{table}` has no column `{column}`")]
    UnknownColumn { key: String, table: String, column: String },
    #[error("mappings.{key}: {reason}")]
    Invalid { key: String, reason: String },
    #[error("mappings: at most {max} keys per source")]
    TooMany { max: usize },
}

/// `existing` with `patch` laid over it: a key in the patch replaces that key's mapping whole,
/// a key the patch maps to `null` is removed, and every other key is kept as it was. Each key the
/// patch sets must name a table of `tables` (`customers`) or one of its columns
/// (`customers.created_at`; a table named `schema.table` takes `schema.table.column`). Synonyms
/// are trimmed, and repeats dropped.
pub fn merge_mappings(
    existing: &BTreeMap<String, SemanticMapping>,
    patch: &BTreeMap<String, Option<SemanticMapping>>,
    tables: &[Table],
) -> Result<BTreeMap<String, SemanticMapping>, MappingError> {
    let mut merged = existing.clone();
    for (key, mapping) in patch {
        match mapping {
            None => {
                merged.remove(key);
            }
            Some(mapping) => {
                resolve(key, tables)?;
                merged.insert(key.clone(), checked(key, mapping)?);
            }
        }
    }
    if merged.len() > MAX_MAPPINGS {
        return Err(MappingError::TooMany { max: MAX_MAPPINGS });
    }
    Ok(merged)
}

/// The table a key names, and its column when it names one.
pub(super) fn resolve<'t>(key: &str, tables: &'t [Table]) -> Result<(&'t Table, Option<usize>), MappingError> {
    if let Some(table) = tables.iter().find(|t| t.name == key) {
        return Ok((table, None));
    }
    let Some((table_name, column)) = key.rsplit_once('.') else {
        return Err(MappingError::UnknownTable { key: key.to_string() });
    };
    let table = tables
        .iter()
        .find(|t| t.name == table_name)
        .ok_or_else(|| MappingError::UnknownTable { key: key.to_string() })?;
    match table.columns.iter().position(|c| c.name == column) {
        Some(at) => Ok((table, Some(at))),
        None => Err(MappingError::UnknownColumn {
            key: key.to_string(),
            table: table_name.to_string(),
            column: column.to_string(),
        }),
    }
}

fn checked(key: &str, mapping: &SemanticMapping) -> Result<SemanticMapping, MappingError> {
    let invalid = |reason: String| MappingError::Invalid { key: key.to_string(), reason };
    let description = match mapping.description.as_deref().map(str::trim) {
        Some(d) if d.chars().count() > MAX_DESCRIPTION_CHARS => {
            return Err(invalid(format!("the description is longer than {MAX_DESCRIPTION_CHARS} characters")));
        }
        Some("") | None => None,
        Some(d) => Some(d.to_string()),
    };
    if mapping.synonyms.len() > MAX_SYNONYMS {
        return Err(invalid(format!("at most {MAX_SYNONYMS} synonyms")));
    }
    let mut synonyms: Vec<String> = Vec::new();
    for synonym in &mapping.synonyms {
        let synonym = synonym.trim();
        if synonym.is_empty() || synonym.chars().count() > MAX_SYNONYM_CHARS || synonym.chars().any(char::is_control) {
            return Err(invalid(format!("each synonym must be 1-{MAX_SYNONYM_CHARS} characters on one line")));
        }
        if !synonyms.iter().any(|s| s == synonym) {
            synonyms.push(synonym.to_string());
        }
    }
    Ok(SemanticMapping { description, synonyms })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::data_sources::Column;

    pub(crate) fn seed_tables() -> Vec<Table> {
        let column = |name: &str, r#type: &str, nullable| Column { name: name.into(), r#type: r#type.into(), nullable };
        vec![
            Table {
                name: "customers".into(),
                columns: vec![
                    column("id", "uuid", false),
                    column("email", "varchar", false),
                    column("name", "varchar", true),
                    column("created_at", "timestamp", false),
                ],
            },
            Table {
                name: "orders".into(),
                columns: vec![
                    column("id", "uuid", false),
                    column("customer_id", "uuid", false),
                    column("total_amount", "numeric", false),
                    column("created_at", "timestamp", false),
                ],
            },
        ]
    }

    fn mapping(description: &str, synonyms: &[&str]) -> SemanticMapping {
        SemanticMapping {
            description: Some(description.into()),
            synonyms: synonyms.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn the_seeds_patch_is_taken_and_merged_over_what_was_there() {
        let patch: BTreeMap<String, Option<SemanticMapping>> = serde_json::from_value(serde_json::json!({
            "customers": {"description": "Customer accounts and profiles", "synonyms": ["users", "clients", "accounts", "members"]},
            "customers.created_at": {"description": "When the customer signed up", "synonyms": ["signup date"]},
            "orders.total_amount": {"description": "Total order value in USD", "synonyms": [" order total ", "order total"]}
        }))
        .unwrap();
        let existing = BTreeMap::from([
            ("orders".to_string(), mapping("Purchase orders", &["purchases"])),
            ("customers".to_string(), mapping("old", &[])),
        ]);
        let merged = merge_mappings(&existing, &patch, &seed_tables()).unwrap();
        assert_eq!(merged.len(), 4);
        assert_eq!(merged["orders"], mapping("Purchase orders", &["purchases"]), "kept");
        assert_eq!(merged["customers"].description.as_deref(), Some("Customer accounts and profiles"), "replaced");
        assert_eq!(merged["orders.total_amount"].synonyms, vec!["order total"]);
        let removal = BTreeMap::from([("orders".to_string(), None)]);
        assert!(!merge_mappings(&merged, &removal, &seed_tables()).unwrap().contains_key("orders"));
    }

    #[test]
    fn a_key_naming_no_table_or_column_is_refused_by_name() {
        let tables = seed_tables();
        let one = |key: &str| BTreeMap::from([(key.to_string(), Some(mapping("d", &[])))]);
        let e = merge_mappings(&BTreeMap::new(), &one("invoices"), &tables).unwrap_err();
        assert_eq!(e.to_string(), "mappings.invoices: the source has no table `invoices`");
        let e = merge_mappings(&BTreeMap::new(), &one("customers.phone"), &tables).unwrap_err();
        assert_eq!(e.to_string(), "mappings.customers.phone: table `customers` has no column `phone`");
        let e = merge_mappings(&BTreeMap::new(), &one("invoices.total"), &tables).unwrap_err();
        assert!(matches!(e, MappingError::UnknownTable { .. }), "{e}");
        let mut dotted = tables.clone();
        dotted[0].name = "sales.customers".into();
        assert!(merge_mappings(&BTreeMap::new(), &one("sales.customers.email"), &dotted).is_ok());
        assert!(merge_mappings(&BTreeMap::new(), &one("sales.customers"), &dotted).is_ok());
    }

    #[test]
    fn mappings_are_bounded() {
        let tables = seed_tables();
        let too_many: Vec<&str> = vec!["s"; MAX_SYNONYMS + 1];
        let patch = BTreeMap::from([("customers".to_string(), Some(mapping("d", &too_many)))]);
        let e = merge_mappings(&BTreeMap::new(), &patch, &tables).unwrap_err();
        assert!(e.to_string().starts_with("mappings.customers: "), "{e}");
        let patch = BTreeMap::from([("customers".to_string(), Some(mapping("d", &["two\nlines"])))]);
        assert!(merge_mappings(&BTreeMap::new(), &patch, &tables).is_err());
    }
}

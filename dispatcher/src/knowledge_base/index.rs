//! The services ranked for a query: a tantivy index in RAM over their ids, names, descriptions
//! and capabilities, scored with BM25 and English stemming (so "scheduling" meets "schedule").
//! A query is cut into the index's own terms, each looked for in every field: what a user types
//! is never read as query syntax, so no punctuation can fail a search.

use std::sync::{Arc, Mutex};

use tantivy::collector::TopDocs;
use tantivy::query::{BooleanQuery, BoostQuery, Query, TermQuery};
use tantivy::schema::{Field, IndexRecordOption, Schema, TextFieldIndexing, TextOptions, Value as _, STORED};
use tantivy::tokenizer::TokenStream as _;
use tantivy::{Index, IndexReader, IndexWriter, ReloadPolicy, TantivyDocument, Term};

use super::catalog::ServiceOut;

/// The text fields and how much a match in each counts: a service's name says most about it,
/// a long description least.
const FIELDS: [(&str, f32); 4] = [("name", 3.0), ("id", 2.0), ("capabilities", 1.5), ("description", 1.0)];
/// The most distinct terms of one query that are looked for.
const MAX_TERMS: usize = 32;
/// The indexing arena: tantivy's least (it is taken as pages fill, not at once).
const WRITER_MEMORY: usize = 15_000_000;

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("the services index failed: {0}")]
    Tantivy(#[from] tantivy::TantivyError),
    #[error("building the services index stopped: {0}")]
    Stopped(String),
}

/// The services, indexed.
pub struct ServiceIndex {
    services: Vec<ServiceOut>,
    index: Index,
    reader: IndexReader,
    /// In the order of `FIELDS`.
    fields: [Field; 4],
    /// Each document's place in `services`.
    place: Field,
}

impl ServiceIndex {
    /// Indexes `services` (blocking: a few milliseconds for a few hundred).
    pub fn build(services: Vec<ServiceOut>) -> Result<Self, IndexError> {
        let mut schema = Schema::builder();
        let indexing =
            TextFieldIndexing::default().set_tokenizer("en_stem").set_index_option(IndexRecordOption::WithFreqs);
        let text = TextOptions::default().set_indexing_options(indexing);
        let fields = FIELDS.map(|(name, _)| schema.add_text_field(name, text.clone()));
        let place = schema.add_u64_field("place", STORED);
        let index = Index::create_in_ram(schema.build());
        let mut writer: IndexWriter = index.writer_with_num_threads(1, WRITER_MEMORY)?;
        for (n, service) in services.iter().enumerate() {
            let mut doc = TantivyDocument::default();
            doc.add_text(fields[0], &service.name);
            doc.add_text(fields[1], &service.id);
            for capability in &service.capabilities {
                doc.add_text(fields[2], capability);
            }
            doc.add_text(fields[3], &service.description);
            doc.add_u64(place, n as u64);
            writer.add_document(doc)?;
        }
        writer.commit()?;
        writer.wait_merging_threads()?;
        let reader = index.reader_builder().reload_policy(ReloadPolicy::Manual).try_into()?;
        Ok(ServiceIndex { services, index, reader, fields, place })
    }

    /// What it was built from.
    pub fn services(&self) -> &[ServiceOut] {
        &self.services
    }

    /// The services matching `query` best first, at most `limit`; equal scores keep the order
    /// the index was built in. A query with no word in it matches nothing.
    pub fn search(&self, query: &str, limit: usize) -> Result<Vec<&ServiceOut>, IndexError> {
        let terms = self.terms(query)?;
        if terms.is_empty() || limit == 0 || self.services.is_empty() {
            return Ok(vec![]);
        }
        let mut clauses: Vec<Box<dyn Query>> = Vec::with_capacity(terms.len() * FIELDS.len());
        for (field, (_, boost)) in self.fields.iter().zip(FIELDS) {
            for term in &terms {
                let found = TermQuery::new(Term::from_field_text(*field, term), IndexRecordOption::WithFreqs);
                clauses.push(Box::new(BoostQuery::new(Box::new(found), boost)));
            }
        }
        let searcher = self.reader.searcher();
        let every = TopDocs::with_limit(self.services.len()).order_by_score();
        let mut ranked = Vec::new();
        for (score, address) in searcher.search(&BooleanQuery::union(clauses), &every)? {
            let doc: TantivyDocument = searcher.doc(address)?;
            if let Some(place) = doc.get_first(self.place).and_then(|v| v.as_u64()) {
                ranked.push((score, place as usize));
            }
        }
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        Ok(ranked.into_iter().take(limit).filter_map(|(_, place)| self.services.get(place)).collect())
    }

    /// The distinct terms the index's analyzer makes of `query`, at most `MAX_TERMS`.
    fn terms(&self, query: &str) -> Result<Vec<String>, IndexError> {
        let mut analyzer = self.index.tokenizer_for_field(self.fields[0])?;
        let mut stream = analyzer.token_stream(query);
        let mut terms: Vec<String> = Vec::new();
        while let Some(token) = stream.next() {
            if terms.len() == MAX_TERMS {
                break;
            }
            if !terms.contains(&token.text) {
                terms.push(token.text.clone());
            }
        }
        Ok(terms)
    }
}

/// The index last built: a search over the same services uses it again, and any change (a
/// server registered, a tool deleted) builds a new one, so what was registered a moment ago is
/// found at once.
#[derive(Default)]
pub struct IndexCache {
    last: Mutex<Option<Arc<ServiceIndex>>>,
}

impl IndexCache {
    /// The index of `services`, built off the async threads when they changed.
    pub async fn index_of(&self, services: Vec<ServiceOut>) -> Result<Arc<ServiceIndex>, IndexError> {
        let cached = self.last.lock().expect("the index cache's lock").clone();
        if let Some(index) = cached.filter(|i| i.services() == services.as_slice()) {
            return Ok(index);
        }
        let built = tokio::task::spawn_blocking(move || ServiceIndex::build(services))
            .await
            .map_err(|e| IndexError::Stopped(e.to_string()))??;
        let built = Arc::new(built);
        *self.last.lock().expect("the index cache's lock") = Some(Arc::clone(&built));
        Ok(built)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::knowledge_base::catalog::{AuthType, ServiceSource};

    fn service(id: &str, name: &str, description: &str, capabilities: &[&str]) -> ServiceOut {
        ServiceOut {
            id: id.into(),
            name: name.into(),
            description: description.into(),
            auth_type: AuthType::Oauth2,
            capabilities: capabilities.iter().map(|c| c.to_string()).collect(),
            source: ServiceSource::Catalog,
        }
    }

    /// The seed's example among services that have nothing to do with calendars, and one that
    /// schedules without being a calendar.
    fn catalog() -> Vec<ServiceOut> {
        vec![
            service(
                "slack",
                "Slack",
                "Team messaging: channels and direct messages",
                &["post_message", "list_channels"],
            ),
            service("stripe", "Stripe", "Online payments and invoicing", &["create_invoice", "refund_payment"]),
            service("calendly", "Calendly", "Booking pages for meetings", &["create_booking_link"]),
            service(
                "google_calendar",
                "Google Calendar",
                "Calendar and scheduling service",
                &["create_event", "list_events", "update_event", "delete_event"],
            ),
            service("github", "GitHub", "Code hosting, issues and pull requests", &["create_issue"]),
            service(
                "microsoft_calendar",
                "Microsoft Outlook Calendar",
                "Microsoft 365 calendar service",
                &["create_event", "list_events", "update_event"],
            ),
            service("zoom", "Zoom", "Video meetings; schedules a meeting with a link", &["schedule_meeting"]),
        ]
    }

    fn ids(found: Vec<&ServiceOut>) -> Vec<&str> {
        found.into_iter().map(|s| s.id.as_str()).collect()
    }

    #[test]
    fn the_seeds_calendar_query_ranks_both_calendars_first() {
        let index = ServiceIndex::build(catalog()).unwrap();
        let found = ids(index.search("calendar scheduling", 5).unwrap());
        assert_eq!(&found[..2], ["google_calendar", "microsoft_calendar"], "{found:?}");
        assert_eq!(found.get(2), Some(&"zoom"), "stemming: scheduling meets schedules: {found:?}");
        assert_eq!(found.len(), 3, "nothing else mentions either word: {found:?}");
        assert_eq!(ids(index.search("calendar scheduling", 1).unwrap()), ["google_calendar"]);
    }

    #[test]
    fn ids_names_capabilities_and_descriptions_are_all_searched() {
        let index = ServiceIndex::build(catalog()).unwrap();
        assert_eq!(ids(index.search("refund", 3).unwrap()), ["stripe"], "a capability's word");
        assert_eq!(ids(index.search("GITHUB", 3).unwrap()), ["github"], "case does not matter");
        assert_eq!(ids(index.search("pull requests", 3).unwrap()), ["github"], "a description's words");
        assert_eq!(ids(index.search("microsoft_calendar", 1).unwrap()), ["microsoft_calendar"], "an id");
    }

    #[test]
    fn punctuation_and_query_syntax_are_only_words() {
        let index = ServiceIndex::build(catalog()).unwrap();
        for query in ["\"", "(((", "name:slack AND -", "*", "~2 ^3", "'); DROP", "calendar]["] {
            assert!(index.search(query, 5).is_ok(), "{query}");
        }
        assert_eq!(ids(index.search("name:slack AND -", 5).unwrap())[0], "slack");
        assert!(index.search("!!! ???", 5).unwrap().is_empty());
        assert!(index.search("unrelated nonsense", 5).unwrap().is_empty());
        assert!(ServiceIndex::build(vec![]).unwrap().search("calendar", 5).unwrap().is_empty());
    }

    #[test]
    fn the_example_catalog_answers_the_seeds_query_with_its_two_calendars() {
        let text = include_str!("../../../deploy/services-catalog.example.json");
        let entries = crate::knowledge_base::catalog::parse_catalog(text).unwrap();
        let index = ServiceIndex::build(entries.iter().map(ServiceOut::from_entry).collect()).unwrap();
        let found = ids(index.search("calendar scheduling", 5).unwrap());
        assert_eq!(found[..2], ["google_calendar", "microsoft_calendar"], "{found:?}");
    }

    #[tokio::test]
    async fn the_cache_builds_again_only_when_the_services_changed() {
        let cache = IndexCache::default();
        let first = cache.index_of(catalog()).await.unwrap();
        let same = cache.index_of(catalog()).await.unwrap();
        assert!(Arc::ptr_eq(&first, &same));
        let mut more = catalog();
        more.push(service("orders", "orders", "Looks an order up by its id", &["orders.lookup_order"]));
        let rebuilt = cache.index_of(more).await.unwrap();
        assert!(!Arc::ptr_eq(&first, &rebuilt));
        assert_eq!(ids(rebuilt.search("order", 5).unwrap()), ["orders"]);
    }
}

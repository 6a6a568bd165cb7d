//! Seed 000's knowledge base: the services an assistant can connect to. `catalog` holds the pure
//! parts (the operator's catalog file checked, a service as the API shows it, whichever source it
//! comes from); `index` ranks services for a query with tantivy's BM25.

pub mod catalog;
pub mod index;

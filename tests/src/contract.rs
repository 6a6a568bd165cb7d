//! The API's contract as checked in (`docs/openapi.json`): its text, and its operations for the
//! tests that walk every route.

use reqwest::Method;
use serde_json::Value;

/// `docs/openapi.json` as checked in.
pub fn checked_in() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json")).expect("docs/openapi.json")
}

/// One operation of the document: its method, path template and OpenAPI operation object.
pub struct Operation {
    pub method: Method,
    pub path: String,
    pub op: Value,
}

/// Every operation of the checked-in document.
pub fn operations() -> Vec<Operation> {
    let doc: Value = serde_json::from_str(&checked_in()).expect("docs/openapi.json is JSON");
    let mut found = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("the document has paths") {
        for (method, op) in item.as_object().expect("a path item is an object") {
            let method = Method::from_bytes(method.to_uppercase().as_bytes()).expect("an HTTP method");
            found.push(Operation { method, path: path.clone(), op: op.clone() });
        }
    }
    found
}

//! Seed 000's data sources through the API (issue 48), against the real PostgreSQL and MariaDB of
//! `scripts/ensure-services.sh`: the seed's calls (register, list, get with its tables, update,
//! query with a `$1` text parameter against a timestamp, semantic mappings, refresh, delete); a
//! write refused by the database with nothing changed, a parameter that never becomes SQL, a wrong
//! password and an unsupported type each a 4xx naming why, the password never shown; and an
//! assistant that answers the seed's "How many users signed up last month?" from the database
//! through its model's SQL, a copy of whose query job is only acked, as is a copy of a source's
//! extraction job.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::data_source_drivers::{MariaDb, PgSchema, DATABASE, PASSWORD, USER};
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::tap::JobTap;
use fleet_tests::turn::{llm_fleet, post_turn, turn_body};
use fleet_tests::{metric, spawn_fleet, wait_for, Fleet, FleetOptions};

fn postgres(name: &str, schema: &PgSchema, password: &str) -> Value {
    json!({"name": name, "type": "postgresql", "description": "Sales and customer data",
        "connection": {"host": "127.0.0.1", "port": 5432, "database": DATABASE, "username": USER,
            "password": password, "schema": schema.name}})
}

async fn ready(fleet: &Fleet, id: &str) -> Value {
    wait_for("the schema", Duration::from_secs(30), || async {
        let (_, body) = fleet.get(&format!("/v1/data-sources/{id}")).await;
        (body["data"]["schema_status"] == "ready").then(|| body["data"].clone())
    })
    .await
}

async fn query(fleet: &Fleet, id: &str, sql: &str, parameters: Value) -> (u16, Value) {
    let body = json!({"query": sql, "parameters": parameters});
    fleet.post(&format!("/v1/data-sources/{id}/query"), &body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_data_source_calls_run_against_postgresql() {
    let pg = PgSchema::new().await;
    let fleet = spawn_fleet(FleetOptions::default()).await;

    let (status, body) = fleet.post("/v1/data-sources", &postgres("sales_database", &pg, PASSWORD)).await;
    assert_eq!(status, 201, "{body}");
    let id = body["data"]["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("ds_"), "{body}");
    assert_eq!(body["data"]["status"], "connected", "{body}");
    assert_eq!(body["data"]["tool_name"], "ds.sales_database");
    let source = ready(&fleet, &id).await;
    let tables: Vec<&str> = source["tables"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(tables, ["customers", "orders"], "{source}");
    let customers = &source["tables"][0]["columns"];
    assert_eq!(customers[0], json!({"name": "id", "type": "uuid", "nullable": false}), "{customers}");
    let (_, listed) = fleet.get("/v1/data-sources").await;
    assert_eq!(listed["data"].as_array().unwrap().len(), 1, "{listed}");
    for shown in [body.to_string(), source.to_string(), listed.to_string()] {
        assert!(!shown.contains(PASSWORD), "the password is never shown: {shown}");
    }

    // The seed's query: a text parameter compared with a timestamp, bound by the driver.
    let seed = "SELECT * FROM customers WHERE created_at > $1 LIMIT 10";
    let (status, rows) = query(&fleet, &id, seed, json!(["2026-01-01"])).await;
    assert_eq!(status, 200, "{rows}");
    assert_eq!(rows["data"]["columns"], json!(["id", "email", "name", "created_at"]));
    assert_eq!(rows["data"]["row_count"], 2);
    assert_eq!(rows["data"]["rows"][0][1], "john@example.com");
    assert_eq!(rows["data"]["rows"][0][3], "2026-01-15T10:00:00Z");
    let (_, none) = query(&fleet, &id, "SELECT * FROM customers WHERE email = $1", json!(["' OR 1=1 --"])).await;
    assert_eq!(none["data"]["row_count"], 0, "a parameter never becomes SQL: {none}");

    // A write fails at the database; nothing changed.
    let before = pg.state().await;
    let (status, refused) =
        query(&fleet, &id, "INSERT INTO customers VALUES (gen_random_uuid(), 'x@y', 'X', now())", json!([])).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (422, Some("read_only")), "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("read-only"), "{refused}");
    assert_eq!(pg.state().await, before);

    // Semantic mappings: merged, checked against the schema, told to the model.
    let mappings = json!({"mappings": {
        "customers": {"description": "Customer accounts and profiles", "synonyms": ["users", "clients"]},
        "customers.created_at": {"description": "When the customer signed up", "synonyms": ["signup date"]}}});
    let (status, patched) =
        fleet.request(Method::PATCH, &format!("/v1/data-sources/{id}/semantic-mappings"), Some(&mappings)).await;
    assert_eq!(status, 200, "{patched}");
    assert_eq!(patched["data"]["semantic_mappings"]["customers"]["synonyms"], json!(["users", "clients"]));
    let (_, tool) = fleet.get("/v1/tools/ds.sales_database").await;
    let told = tool["data"]["description"].as_str().unwrap();
    assert!(told.contains("signup date") && told.contains("created_at"), "{told}");
    let missing = json!({"mappings": {"invoices": {"description": "none such"}}});
    let path = format!("/v1/data-sources/{id}/semantic-mappings");
    let (status, body) = fleet.request(Method::PATCH, &path, Some(&missing)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("unknown_mapping_target")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("invoices"), "{body}");

    // Update, refresh, and what is refused at registration.
    let change = json!({"description": "Updated description with more context"});
    let (status, body) = fleet.request(Method::PUT, &format!("/v1/data-sources/{id}"), Some(&change)).await;
    assert_eq!((status, body["data"]["description"].as_str()), (200, Some("Updated description with more context")));
    let (status, body) = fleet.post(&format!("/v1/data-sources/{id}/refresh-schema"), &json!({})).await;
    assert_eq!(status, 202, "{body}");
    ready(&fleet, &id).await;
    let (status, body) = fleet.post("/v1/data-sources", &postgres("sales_database", &pg, PASSWORD)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("data_source_exists")), "{body}");
    let (status, body) = fleet.post("/v1/data-sources", &postgres("wrong", &pg, "not-the-password")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("data_source_unreachable")), "{body}");
    assert!(!body.to_string().contains("not-the-password"), "{body}");
    let mongo = json!({"name": "m", "type": "mongodb", "connection": {}});
    let (status, body) = fleet.post("/v1/data-sources", &mongo).await;
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("data_source_type_unsupported")), "{body}");
    assert_eq!(fleet.get("/v1/data-sources").await.1["data"].as_array().unwrap().len(), 1, "nothing refused is kept");

    assert_eq!(fleet.request(Method::DELETE, &format!("/v1/data-sources/{id}"), None).await.0, 204);
    assert_eq!(fleet.get(&format!("/v1/data-sources/{id}")).await.0, 404);
    assert_eq!(fleet.get("/v1/tools/ds.sales_database").await.0, 404, "its tool went with it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mariadb_source_answers_the_seeds_query_and_refuses_writes() {
    let maria = MariaDb::new().await;
    let fleet = spawn_fleet(FleetOptions::default()).await;
    let registration = json!({"name": "shop", "type": "mysql", "connection": {"host": "127.0.0.1", "port": 3306,
        "database": maria.name, "username": USER, "password": PASSWORD}});
    let (status, body) = fleet.post("/v1/data-sources", &registration).await;
    assert_eq!(status, 201, "{body}");
    let id = body["data"]["id"].as_str().unwrap().to_string();
    let source = ready(&fleet, &id).await;
    assert_eq!(source["tables"].as_array().unwrap().len(), 2, "{source}");
    let seed = "SELECT email FROM customers WHERE created_at > $1 ORDER BY email LIMIT 10";
    let (status, rows) = query(&fleet, &id, seed, json!(["2026-01-01"])).await;
    assert_eq!(status, 200, "{rows}");
    assert_eq!(rows["data"]["rows"], json!([["jane@example.com"], ["john@example.com"]]));
    let before = maria.counts().await;
    let (status, refused) = query(&fleet, &id, "DELETE FROM orders", json!([])).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (422, Some("read_only")), "{refused}");
    assert_eq!(maria.counts().await, before);
}

/// The model writes SQL for the seed's question; the fleet runs it as a durable tool call.
fn analyst(body: &Value, _: usize) -> LlmReply {
    let messages = body["messages"].as_array().unwrap();
    match messages.iter().find(|m| m["role"] == "tool") {
        None => LlmReply::ToolCalls(vec![(
            "call_sql".into(),
            "ds__sales".into(),
            json!({"query": "SELECT COUNT(*) AS signups FROM customers WHERE created_at >= $1 AND created_at < $2",
                "parameters": ["2026-01-01", "2026-02-01"]})
            .to_string(),
        )]),
        Some(tool) => {
            let told = tool["content"].to_string();
            let n = if told.contains("[[2]]") || told.contains("[2]") { "2" } else { "an unknown number of" };
            LlmReply::text(&format!("{n} users signed up last month."))
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assistant_answers_how_many_users_signed_up_last_month_from_the_database() {
    let pg = PgSchema::new().await;
    let llm = MockLlm::start(analyst).await;
    let fleet = spawn_fleet(llm_fleet(&llm).workers(1)).await;
    let (status, body) = fleet.post("/v1/data-sources", &postgres("sales", &pg, PASSWORD)).await;
    assert_eq!(status, 201, "{body}");
    ready(&fleet, body["data"]["id"].as_str().unwrap()).await;

    let tap = JobTap::start(&fleet).await;
    let turn = post_turn(&fleet, &turn_body("s_signups", "How many users signed up last month?", &["ds.sales"])).await;
    let done = fleet.wait_status(&turn, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(done["turn"]["final_message"]["content"], "2 users signed up last month.", "{done}");
    let offered = llm.requests()[0].body["tools"].to_string();
    assert!(offered.contains("ds__sales") && offered.contains("created_at"), "the model is told the schema: {offered}");

    // A copy of the query's job is only acked.
    let call = tap.first("the query's job", |t| t.kind() == "tool_call").await;
    let duplicates = || async { metric(&fleet.worker_metrics(0).await, "fleet_duplicate_deliveries_total{kind=\"tool_call\"}") };
    let before = duplicates().await;
    tap.republish(&call).await;
    wait_for("the copy counted", Duration::from_secs(20), || async { (duplicates().await > before).then_some(()) })
        .await;
    let record = fleet.wait_status(call.execution_id(), "succeeded", Duration::from_secs(5)).await;
    assert_eq!(record["attempts"].as_array().unwrap().len(), 1, "{record}");
    assert_eq!(llm.requests().len(), 2);
    tap.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_of_a_sources_extraction_job_is_only_acked() {
    let pg = PgSchema::new().await;
    let fleet = spawn_fleet(FleetOptions::default().workers(1)).await;
    let tap = JobTap::start(&fleet).await;
    let (status, body) = fleet.post("/v1/data-sources", &postgres("copied", &pg, PASSWORD)).await;
    assert_eq!(status, 201, "{body}");
    let id = body["data"]["id"].as_str().unwrap().to_string();
    let source = ready(&fleet, &id).await;
    let extraction = tap.first("the extraction's job", |t| t.json.to_string().contains("\"extract_schema\"")).await;
    let (_, tool) = fleet.get("/v1/tools/ds.copied").await;

    let duplicates =
        || async { metric(&fleet.worker_metrics(0).await, "fleet_duplicate_deliveries_total{kind=\"tool_call\"}") };
    let before = duplicates().await;
    tap.republish(&extraction).await;
    wait_for("the copy counted", Duration::from_secs(20), || async { (duplicates().await > before).then_some(()) })
        .await;
    assert_eq!(fleet.get(&format!("/v1/data-sources/{id}")).await.1["data"], source, "the source is as it was");
    assert_eq!(fleet.get("/v1/tools/ds.copied").await.1, tool, "its tool is as it was");
    let record = fleet.wait_status(extraction.execution_id(), "succeeded", Duration::from_secs(5)).await;
    assert_eq!(record["attempts"].as_array().unwrap().len(), 1, "{record}");
    tap.close().await;
}

//! Seed 000's data sources through the API (issue 48), against the real PostgreSQL and MariaDB of
//! `scripts/ensure-services.sh`: the seed's calls (register, list, get with its tables, update,
//! query with a `$1` text parameter against a timestamp, semantic mappings, refresh, delete); a
//! write refused by the database with nothing changed, a parameter that never becomes SQL, a wrong
//! password and an unsupported type each a 4xx naming why, the password never shown; and an
//! assistant that answers the seed's "How many users signed up last month?" from the database
//! through its model's SQL, a copy of whose query job is only acked, as is a copy of a source's
//! extraction job. And the seed's own curl examples (`tests/seeds/000/data-sources.sh`) run as
//! written against both databases, a seed assistant answering the seed's two questions between
//! them, with the seed's password in no answer, log line or Redis value.

use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::data_source_drivers::{maria_admin, rest_api, MariaDb, PgSchema, DATABASE, PASSWORD, USER};
use fleet_tests::fleet::redis_values_containing;
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::seed::{self, steps, Running, MARIA_SEED_TABLES, PG_SEED_TABLES};
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

// ---------------------------------------------------------------------------------------------
// The seed's own examples

/// The seed's password for its `readonly_user` (scripts/ensure-services.sh).
const SEED_PASSWORD: &str = "secure_password";

/// Fills the `sales` database of `scripts/ensure-services.sh` afresh with the seed's tables (as
/// `fleet_test`; the seed's `readonly_user` may only read them).
async fn fill_sales(source_type: &str) {
    if source_type == "postgresql" {
        let config = format!("host=127.0.0.1 port=5432 user={USER} password={PASSWORD} dbname=sales");
        let (client, connection) = tokio_postgres::connect(&config, tokio_postgres::NoTls)
            .await
            .expect("PostgreSQL's `sales` database (scripts/ensure-services.sh)");
        let driver = tokio::spawn(connection);
        client.batch_execute(&format!("DROP TABLE IF EXISTS orders, customers; {PG_SEED_TABLES}")).await.unwrap();
        drop(client);
        driver.await.unwrap().unwrap();
    } else {
        use mysql_async::prelude::Queryable;
        let mut admin = maria_admin(Some("sales")).await;
        admin.query_drop("DROP TABLE IF EXISTS orders, customers").await.unwrap();
        for statement in MARIA_SEED_TABLES {
            admin.query_drop(statement).await.expect("the seed's tables are made");
        }
        let _ = admin.disconnect().await;
    }
}

/// `rows` wherever it is in a tool's answer.
fn rows_in(v: &Value) -> Option<&Value> {
    match v {
        Value::Object(map) => map.get("rows").or_else(|| map.values().find_map(rows_in)),
        Value::Array(items) => items.iter().find_map(rows_in),
        _ => None,
    }
}

/// The model of the seed's "Semantic Mappings": each question answered with the SQL the seed
/// pairs with it, through the data source's tool, then from the first value of its rows.
fn seed_analyst(body: &Value, _: usize) -> LlmReply {
    let messages = body["messages"].as_array().unwrap();
    let asked = messages.iter().rposition(|m| m["role"] == "user").unwrap();
    let question = messages[asked]["content"].to_string();
    let tool = body["tools"].as_array().into_iter().flatten().find_map(|t| t["function"]["name"].as_str());
    let (sql, say) = if question.contains("signed up") {
        ("SELECT COUNT(*) FROM customers WHERE created_at >= '2026-01-01'", "users signed up last month")
    } else {
        ("SELECT SUM(total_amount) FROM orders WHERE created_at >= '2026-01-14'", "in sales this week")
    };
    match messages[asked..].iter().find(|m| m["role"] == "tool") {
        None => LlmReply::ToolCalls(vec![(
            format!("call_{asked}"),
            tool.unwrap_or("no_tool_offered").into(),
            json!({"query": sql}).to_string(),
        )]),
        Some(answer) => {
            let content = &answer["content"];
            let parsed = content.as_str().and_then(|t| serde_json::from_str::<Value>(t).ok()).unwrap_or(content.clone());
            let first = rows_in(&parsed).map(|rows| rows[0][0].clone()).unwrap_or(Value::Null);
            let first = first.as_str().map_or_else(|| first.to_string(), str::to_string);
            LlmReply::text(&format!("{first} {say}."))
        }
    }
}

/// A seed assistant enabling the source's tool, a room, and the seed's two questions in it:
/// what the assistant answered to each.
async fn ask_the_seeds_questions(fleet: &Fleet) -> Vec<String> {
    let assistant = json!({"name": "sales_analyst", "title": "Sales Analyst",
        "instructions": "Answer questions about sales from the sales database.",
        "enabled_tools": ["ds.sales_database"]});
    let (status, body) = fleet.post("/v1/agents/assistants", &assistant).await;
    assert_eq!(status, 201, "{body}");
    let path = format!("/v1/agents/{}/rooms", body["data"]["id"].as_str().unwrap());
    let (status, room) = fleet.post(&path, &json!({"namespace": "user_123"})).await;
    assert_eq!(status, 201, "{room}");
    let room_id = room["data"]["id"].as_str().unwrap();
    let mut answers = Vec::new();
    for question in ["How many users signed up last month?", "What's the total sales this week?"] {
        let path = format!("/v1/agents/rooms/{room_id}/messages");
        let (status, sent) = fleet.post(&path, &json!({"content": question, "role": "user"})).await;
        assert_eq!(status, 201, "{sent}");
        fleet.wait_status(sent["data"]["execution_id"].as_str().unwrap(), "succeeded", Duration::from_secs(30)).await;
        let (_, page) = fleet.get(&format!("{path}?order=desc&limit=1")).await;
        let last = &page["data"]["messages"][0];
        assert_eq!(last["role"], "assistant", "{page}");
        answers.push(last["content"].as_str().unwrap().to_string());
    }
    answers
}

/// Runs `tests/seeds/000/data-sources.sh` against `source_type` on `port`, asking the seed's
/// questions while the source exists; checks each answer the seed shows.
async fn run_the_seeds_examples(source_type: &str, port: u16) {
    fill_sales(source_type).await;
    let llm = MockLlm::start(seed_analyst).await;
    let fleet = spawn_fleet(FleetOptions { capture_logs: true, ..llm_fleet(&llm).workers(1) }).await;
    let mut env = seed::base_env(&fleet);
    env.extend([("DB_TYPE", source_type.to_string()), ("DB_HOST", "127.0.0.1".into()), ("DB_PORT", port.to_string())]
        .map(|(k, v)| (k.to_string(), v)));
    let mut script = Running::start(seed::bash("data-sources.sh", &env));
    script.until(Duration::from_secs(60), |l| l == "## waiting for the test").await;
    let answers = ask_the_seeds_questions(&fleet).await;
    script.send_line("").await;
    assert_eq!(script.to_end(Duration::from_secs(60)).await, 0);
    println!("the seed's data-source calls ({source_type}) printed:\n{}", script.seen.join("\n"));
    println!("the assistant answered: {answers:?}");

    let steps = steps(&script.seen);
    let answer = |title: &str, status: u16| {
        let step = steps.iter().find(|s| s.title == title).unwrap_or_else(|| panic!("step {title}"));
        assert_eq!(step.status, status, "{title}: {}", step.body);
        step.body["data"].clone()
    };
    let registered = answer("register a data source", 201);
    assert!(registered["id"].as_str().unwrap().starts_with("ds_"), "{registered}");
    assert_eq!((registered["name"].as_str(), registered["type"].as_str()), (Some("sales_database"), Some(source_type)));
    assert_eq!(registered["status"], "connected", "{registered}");
    // The check and the extraction are one job: the 201 comes after the check, the extraction
    // often done by then.
    assert!(["extracting", "ready"].contains(&registered["schema_status"].as_str().unwrap()), "{registered}");
    assert_eq!(answer("list data sources", 200)[0]["id"], registered["id"]);
    let source = answer("get data source", 200);
    assert_eq!(source["schema_status"], "ready", "{source}");
    let tables: Vec<&str> = source["tables"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(tables, ["customers", "orders"], "{source}");
    let columns: Vec<&str> =
        source["tables"][0]["columns"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(columns, ["id", "email", "name", "created_at"], "{source}");
    assert_eq!(source["tables"][0]["columns"][2]["nullable"], true, "{source}");
    assert_eq!(answer("update data source", 200)["description"], "Updated description with more context");
    answer("refresh schema", 202);
    let rows = answer("execute query", 200);
    assert_eq!(rows["columns"], json!(["id", "email", "name", "created_at"]), "{rows}");
    assert_eq!(rows["row_count"], 2, "{rows}");
    let emails: Vec<&Value> = rows["rows"].as_array().unwrap().iter().map(|r| &r[1]).collect();
    assert_eq!(emails, [&json!("john@example.com"), &json!("jane@example.com")], "{rows}");
    assert!(rows["execution_time_ms"].is_u64(), "{rows}");
    let mapped = answer("semantic mappings", 200);
    assert_eq!(mapped["semantic_mappings"]["orders.total_amount"]["synonyms"][0], "order total", "{mapped}");
    answer("delete data source", 204);
    let steps_after: Vec<&str> = steps.iter().map(|s| s.title.as_str()).collect();
    assert_eq!(steps.iter().find(|s| s.title == "get it after the delete").unwrap().status, 404, "{steps_after:?}");

    assert_eq!(answers, ["2 users signed up last month.", "1220.49 in sales this week."]);
    let asked = llm.requests();
    let offered = asked[0].body["tools"].to_string();
    assert!(offered.contains("signup date") && offered.contains("order total"), "the mappings reach the model: {offered}");

    let shown = format!("{}{}", script.seen.join("\n"), fleet.logs());
    assert!(!shown.contains(SEED_PASSWORD), "the password is never shown nor logged");
    assert!(redis_values_containing(&fleet, SEED_PASSWORD).await.is_empty(), "the password is sealed in Redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_data_source_examples_run_as_written_against_postgresql() {
    run_the_seeds_examples("postgresql", 5432).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_data_source_examples_run_as_written_against_mariadb() {
    run_the_seeds_examples("mysql", 3306).await;
}

/// An operator lists the databases' network: a source on it is reached while callbacks keep the
/// private-address guard, and a source on another private address is refused naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_private_network_opens_to_data_sources_only() {
    let pg = PgSchema::new().await;
    let options = FleetOptions::default()
        .env("FLEET_ALLOW_PRIVATE_CALLBACKS", "false")
        .env("FLEET_DATA_SOURCE_NETWORKS", "127.0.0.0/8");
    let fleet = spawn_fleet(options).await;
    let (status, body) = fleet.post("/v1/data-sources", &postgres("listed", &pg, PASSWORD)).await;
    assert_eq!((status, body["data"]["status"].as_str()), (201, Some("connected")), "{body}");
    let mut unlisted = postgres("unlisted", &pg, PASSWORD);
    unlisted["connection"]["host"] = json!("::1");
    let (status, body) = fleet.post("/v1/data-sources", &unlisted).await;
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("data_source_unreachable")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("::1"), "{body}");

    let tool = json!({"description": "local", "parameters": {"type": "object"},
        "callback_url": "http://127.0.0.1:9/hook", "callback_secret": "whsec_listed_network_0001"});
    let (status, body) = fleet.request(Method::PUT, "/v1/tools/local", Some(&tool)).await;
    assert_eq!(status, 422, "a callback to the listed network is still refused: {body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("private"), "{body}");
}

/// A `rest_api` source through the API and a model: registered with its header hidden, queried
/// with a `$1` in its path (GETs under its base URL only), a path leaving the base URL and a wrong
/// token each a 422 naming why without the token; a turn's model asks it who is active.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rest_api_source_answers_the_api_and_a_model() {
    let api = rest_api().await;
    let llm = MockLlm::start(|body, _| {
        let messages = body["messages"].as_array().unwrap();
        match messages.iter().find(|m| m["role"] == "tool") {
            None => LlmReply::ToolCalls(vec![(
                "call_rest".into(),
                "ds__users_api".into(),
                json!({"query": "/users?active=$1", "parameters": ["true"]}).to_string(),
            )]),
            Some(told) => {
                let told = told["content"].to_string();
                let names: Vec<&str> = ["Ann", "Bob", "Cy"].into_iter().filter(|n| told.contains(n)).collect();
                LlmReply::text(&format!("Active: {}.", names.join(" and ")))
            }
        }
    })
    .await;
    let fleet = spawn_fleet(llm_fleet(&llm).workers(1)).await;
    let token = "Bearer rest-token-55aa";
    let source = |name: &str, token: &str| {
        json!({"name": name, "type": "rest_api",
            "connection": {"base_url": api.base_url, "headers": {"Authorization": token}}})
    };
    let (status, body) = fleet.post("/v1/data-sources", &source("users_api", token)).await;
    assert_eq!((status, body["data"]["status"].as_str()), (201, Some("connected")), "{body}");
    assert_eq!(body["data"]["connection"]["headers"]["Authorization"], "****", "{body}");
    let id = body["data"]["id"].as_str().unwrap().to_string();
    let shown = ready(&fleet, &id).await;
    assert_eq!(shown["tables"], json!([]), "a REST source has no tables: {shown}");

    let (status, rows) = query(&fleet, &id, "/users?active=$1", json!(["true"])).await;
    assert_eq!(status, 200, "{rows}");
    assert_eq!(rows["data"]["columns"], json!(["active", "id", "name", "email"]), "{rows}");
    assert_eq!(rows["data"]["row_count"], 2, "{rows}");
    let (status, refused) = query(&fleet, &id, "/../admin", json!([])).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (422, Some("bad_parameter")), "{refused}");
    let (status, refused) = fleet.post("/v1/data-sources", &source("wrong_token", "Bearer not-the-token-99")).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (422, Some("data_source_unreachable")), "{refused}");
    assert!(!refused.to_string().contains("not-the-token-99"), "{refused}");

    let turn = post_turn(&fleet, &turn_body("s_rest", "Who is active?", &["ds.users_api"])).await;
    let done = fleet.wait_status(&turn, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(done["turn"]["final_message"]["content"], "Active: Ann and Cy.", "{done}");
    let seen = api.seen.lock().unwrap().clone();
    assert!(seen.iter().all(|request| request.starts_with("GET /v1")), "GETs under the base URL only: {seen:?}");
    assert!(!seen.iter().any(|request| request.contains("admin")), "{seen:?}");
}

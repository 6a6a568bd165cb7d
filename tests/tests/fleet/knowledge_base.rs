//! Seed 000's "Knowledge Base Search" against a real fleet: the seed's four curl examples run as
//! written (curl, its base URL the fleet's) over an operator's catalog file holding its two
//! calendars among unrelated services; an MCP server and a callback tool registered a moment
//! before are found by search and gone once deleted; bad requests get 4xx naming the problem; no
//! answer holds a secret; and a catalog file with a secret, a duplicate id or bad JSON stops the
//! dispatcher at start naming the file and the entry.

use std::path::{Path, PathBuf};

use reqwest::Method;
use serde_json::{json, Value};

use fleet_tests::rust_mcp::RustMcpServer;
use fleet_tests::{spawn_fleet, Fleet, FleetOptions};

const TOOL_SECRET: &str = "whsec_knowledge_base_tool_0001";
const MCP_TOKEN: &str = "mcp-header-token-kb-77d1";
const BOUND: &str = "kb-acme-token-0123456789";

/// The seed's two calendars among services that have nothing to do with calendars, and one that
/// schedules without being one.
fn catalog() -> Value {
    json!([
        {"id": "slack", "name": "Slack", "description": "Team messaging: channels and direct messages",
         "auth_type": "api_key", "capabilities": ["post_message", "list_channels"]},
        {"id": "google_calendar", "name": "Google Calendar", "description": "Calendar and scheduling service",
         "auth_type": "oauth2", "capabilities": ["create_event", "list_events", "update_event", "delete_event"],
         "oauth": {"authorization_url": "https://accounts.google.com/o/oauth2/v2/auth",
                   "token_url": "https://oauth2.googleapis.com/token",
                   "scopes": ["https://www.googleapis.com/auth/calendar"]}},
        {"id": "stripe", "name": "Stripe", "description": "Online payments and invoicing",
         "auth_type": "api_key", "capabilities": ["create_invoice", "refund_payment"]},
        {"id": "zoom", "name": "Zoom", "description": "Video meetings; schedules a meeting with a link",
         "auth_type": "oauth2", "capabilities": ["schedule_meeting"],
         "oauth": {"authorization_url": "https://zoom.us/oauth/authorize", "token_url": "https://zoom.us/oauth/token"}},
        {"id": "microsoft_calendar", "name": "Microsoft Outlook Calendar", "description": "Microsoft 365 calendar service",
         "auth_type": "oauth2", "capabilities": ["create_event", "list_events", "update_event"],
         "oauth": {"authorization_url": "https://login.microsoftonline.com/common/oauth2/v2.0/authorize",
                   "token_url": "https://login.microsoftonline.com/common/oauth2/v2.0/token",
                   "scopes": ["offline_access", "Calendars.ReadWrite"]}},
        {"id": "github", "name": "GitHub", "description": "Code hosting, issues and pull requests",
         "auth_type": "oauth2", "capabilities": ["create_issue"],
         "oauth": {"authorization_url": "https://github.com/login/oauth/authorize",
                   "token_url": "https://github.com/login/oauth/access_token", "scopes": ["repo"]}}
    ])
}

/// A folder of its own for a test's catalog files, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("fleet-kb-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn write(&self, name: &str, text: &str) -> String {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn catalog_fleet(dir: &TempDir) -> Fleet {
    let catalog = dir.write("services.json", &serde_json::to_string_pretty(&catalog()).unwrap());
    let mut fleet = spawn_fleet(
        FleetOptions::default()
            .workers(0)
            .env("FLEET_SERVICES_CATALOG", &catalog)
            .env("FLEET_API_TOKENS", &format!("kb-admin-token-0123456789,{BOUND}@acme")),
    )
    .await;
    fleet.token = "kb-admin-token-0123456789".into();
    fleet
}

/// Runs `curl -s` with `args` as the seed writes them: the answer's status and JSON body.
fn curl(args: &[String]) -> (u16, Value) {
    let out = std::process::Command::new("curl").arg("-s").arg("-w").arg("\n%{http_code}").args(args).output();
    let out = out.expect("curl is on PATH");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, status) = text.rsplit_once('\n').unwrap_or_else(|| panic!("curl: {text}"));
    (status.parse().unwrap(), serde_json::from_str(body).unwrap_or_else(|_| Value::String(body.into())))
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

/// The seed's "Search Services", "Lookup Service", "Get Service Details" and "Get Service OAuth
/// Config", each as the seed writes it, with the fleet's base URL and token.
fn the_seeds_calls(fleet: &Fleet) -> [(u16, Value); 4] {
    let base = format!("{}/v1", fleet.api);
    let auth = format!("Authorization: Bearer {}", fleet.token);
    let search = strings(&[
        "-X",
        "POST",
        &format!("{base}/knowledge-base/services/search"),
        "-H",
        &auth,
        "-H",
        "Content-Type: application/json",
        "-d",
        "{\n    \"query\": \"calendar scheduling\",\n    \"limit\": 5\n  }",
    ]);
    let lookup = strings(&[
        "-X",
        "POST",
        &format!("{base}/knowledge-base/services/lookup"),
        "-H",
        &auth,
        "-H",
        "Content-Type: application/json",
        "-d",
        r#"{"service_id": "google_calendar"}"#,
    ]);
    let details = strings(&[&format!("{base}/knowledge-base/services/google_calendar"), "-H", &auth]);
    let oauth = strings(&[&format!("{base}/knowledge-base/services/google_calendar/oauth"), "-H", &auth]);
    [curl(&search), curl(&lookup), curl(&details), curl(&oauth)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_four_calls_answer_from_the_operators_catalog() {
    let dir = TempDir::new();
    let fleet = catalog_fleet(&dir).await;
    let [(status, search), (lookup_status, lookup), (details_status, details), (oauth_status, oauth)] =
        the_seeds_calls(&fleet);

    assert_eq!(status, 200, "{search}");
    let services = search["data"]["services"].as_array().unwrap();
    let ids: Vec<&str> = services.iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids[..2], ["google_calendar", "microsoft_calendar"], "ranked by relevance: {ids:?}");
    assert!(ids.len() <= 5 && !ids.contains(&"stripe") && !ids.contains(&"slack"), "{ids:?}");
    // The seed's answer, field for field (and where the fleet knows it from).
    assert_eq!(
        services[0],
        json!({"id": "google_calendar", "name": "Google Calendar", "description": "Calendar and scheduling service",
               "auth_type": "oauth2", "capabilities": ["create_event", "list_events", "update_event", "delete_event"],
               "source": "catalog"})
    );
    assert_eq!(services[1]["name"], "Microsoft Outlook Calendar");
    assert_eq!(services[1]["capabilities"], json!(["create_event", "list_events", "update_event"]));

    assert_eq!((lookup_status, details_status), (200, 200), "{lookup} {details}");
    assert_eq!(lookup["data"], services[0]);
    assert_eq!(details["data"], services[0]);

    assert_eq!(oauth_status, 200, "{oauth}");
    assert_eq!(
        oauth["data"],
        json!({"service_id": "google_calendar", "name": "Google Calendar", "auth_type": "oauth2",
               "authorization_url": "https://accounts.google.com/o/oauth2/v2/auth",
               "token_url": "https://oauth2.googleapis.com/token",
               "scopes": ["https://www.googleapis.com/auth/calendar"]})
    );

    // A tenant-bound token reads the same shared catalog.
    let body = json!({"query": "calendar", "limit": 2});
    let (status, bound) =
        fleet.request_as(BOUND, &Method::POST, "/v1/knowledge-base/services/search", Some(&body)).await;
    assert_eq!(status, 200, "{bound}");
    assert_eq!(bound["data"]["services"].as_array().unwrap().len(), 2);
    refusals(&fleet).await;
}

/// Bad requests and unknown or non-OAuth services: 4xx naming the problem.
async fn refusals(fleet: &Fleet) {
    let search = "/v1/knowledge-base/services/search";
    for (body, says) in [
        (json!({"query": ""}), "query must not be empty"),
        (json!({"query": "   ", "limit": 5}), "query must not be empty"),
        (json!({"limit": 5}), "query"),
        (json!({"query": "calendar", "limit": 0}), "limit must be 1-50"),
        (json!({"query": "calendar", "limit": 51}), "limit must be 1-50"),
        (json!({"query": "calendar", "limit": "five"}), "limit"),
    ] {
        let (status, answer) = fleet.post(search, &body).await;
        assert_eq!((status, answer["error"]["code"].as_str()), (422, Some("invalid_request")), "{body}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(says), "{body}: {answer}");
    }
    // Punctuation is words to look for, never syntax that fails.
    for query in ["\"calendar", "name:slack AND (", "*", "!!!"] {
        let (status, answer) = fleet.post(search, &json!({"query": query})).await;
        assert_eq!(status, 200, "{query}: {answer}");
    }
    let (status, answer) = fleet.post(search, &json!({"query": "quantum teleportation"})).await;
    assert_eq!((status, answer["data"]["services"].clone()), (200, json!([])), "{answer}");

    let lookup = "/v1/knowledge-base/services/lookup";
    let (status, answer) = fleet.post(lookup, &json!({"service_id": ""})).await;
    assert_eq!(status, 422, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("service_id"), "{answer}");
    let (status, answer) = fleet.post(lookup, &json!({"service_id": "outlook"})).await;
    assert_eq!((status, answer["error"]["code"].as_str()), (404, Some("unknown_service")), "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("\"outlook\""), "{answer}");
    for path in ["/v1/knowledge-base/services/outlook", "/v1/knowledge-base/services/outlook/oauth"] {
        let (status, answer) = fleet.get(path).await;
        assert_eq!((status, answer["error"]["code"].as_str()), (404, Some("unknown_service")), "{path}: {answer}");
    }
    let (status, answer) = fleet.get("/v1/knowledge-base/services/stripe/oauth").await;
    assert_eq!((status, answer["error"]["code"].as_str()), (409, Some("no_oauth")), "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("api_key"), "{answer}");
    let resp = fleet
        .http
        .post(format!("{}{lookup}", fleet.api))
        .bearer_auth(&fleet.token)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_or_tool_registered_a_moment_ago_is_found_and_gone_once_deleted() {
    let dir = TempDir::new();
    let fleet = catalog_fleet(&dir).await;
    let mcp = RustMcpServer::start().await.unwrap();
    let api = &fleet;
    let search = |query: &str| {
        let body = json!({"query": query, "limit": 10});
        async move { api.post("/v1/knowledge-base/services/search", &body).await }
    };
    // Searched once before, so the index of the catalog alone exists and must be built anew.
    let (_, before) = search("order status").await;
    assert_eq!(before["data"]["services"], json!([]), "{before}");

    let server = json!({"name": "orders", "url": mcp.url, "headers": {"Authorization": format!("Bearer {MCP_TOKEN}")}});
    let (status, body) = fleet.post("/v1/mcp_servers", &server).await;
    assert_eq!(status, 201, "{body}");
    let tool = json!({"description": "Today's weather forecast for a city", "parameters": {"type": "object"},
        "callback_url": "http://127.0.0.1:9/weather", "callback_secret": TOOL_SECRET});
    let (status, body) = fleet.request(Method::PUT, "/v1/tools/weather_report", Some(&tool)).await;
    assert_eq!(status, 201, "{body}");

    let (status, found) = search("order status").await;
    assert_eq!(status, 200, "{found}");
    assert_eq!(
        found["data"]["services"][0],
        json!({"id": "orders", "name": "orders",
               "description": "An MCP server registered with the fleet. Its tools: Looks an order up by its id: its status.",
               "auth_type": "bearer", "capabilities": ["orders.lookup_order"], "source": "mcp_server"}),
        "{found}"
    );
    let (_, weather) = search("weather forecast").await;
    assert_eq!(
        weather["data"]["services"][0],
        json!({"id": "weather_report", "name": "weather_report", "description": "Today's weather forecast for a city",
               "auth_type": "hmac", "capabilities": ["weather_report"], "source": "tool"}),
        "{weather}"
    );
    // Its tool is its capability, no service of its own; each is read by id like a catalog entry.
    let (_, by_tool) = search("lookup_order").await;
    let ids: Vec<&str> = by_tool["data"]["services"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["orders"]);
    let (status, server_shown) = fleet.get("/v1/knowledge-base/services/orders").await;
    assert_eq!((status, &server_shown["data"]), (200, &found["data"]["services"][0]));
    let (status, tool_shown) = fleet.post("/v1/knowledge-base/services/lookup", &json!({"service_id": "weather_report"})).await;
    assert_eq!((status, &tool_shown["data"]), (200, &weather["data"]["services"][0]));
    for id in ["orders", "weather_report"] {
        let (status, answer) = fleet.get(&format!("/v1/knowledge-base/services/{id}/oauth")).await;
        assert_eq!((status, answer["error"]["code"].as_str()), (409, Some("no_oauth")), "{id}: {answer}");
    }
    for text in [&found, &weather, &by_tool, &server_shown, &tool_shown] {
        let text = text.to_string();
        assert!(!text.contains(MCP_TOKEN) && !text.contains(TOOL_SECRET), "no secret is ever shown: {text}");
    }

    assert_eq!(fleet.request(Method::DELETE, "/v1/mcp_servers/orders", None).await.0, 204);
    assert_eq!(fleet.request(Method::DELETE, "/v1/tools/weather_report", None).await.0, 204);
    for query in ["order status", "weather forecast"] {
        let (_, gone) = search(query).await;
        assert_eq!(gone["data"]["services"], json!([]), "{query}: {gone}");
    }
    assert_eq!(fleet.get("/v1/knowledge-base/services/orders").await.0, 404);
    mcp.stop().await;
}

/// Starts the dispatcher with `catalog` as its catalog file: its exit code and what it wrote to
/// stderr. A dispatcher that does not stop in 20 s is killed (`None`).
fn start_with_catalog(catalog: &Path) -> (Option<i32>, String) {
    let mut child = std::process::Command::new(fleet_tests::fleet::binary("dispatcher"))
        .env_clear()
        .env("FLEET_SECRETS_KEY", fleet_tests::fleet::TEST_SECRETS_KEY)
        .env("FLEET_API_TOKENS", "kb-start-token-0123456789")
        .env("FLEET_HTTP_ADDR", "127.0.0.1:1")
        .env("FLEET_SERVICES_CATALOG", catalog)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if child.try_wait().unwrap().is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).trim().to_string())
}

#[test]
fn a_catalog_with_a_secret_a_duplicate_or_bad_json_stops_the_dispatcher_naming_the_file_and_entry() {
    let dir = TempDir::new();
    let mut with_secret = catalog();
    with_secret[1]["oauth"]["client_secret"] = json!("GOCSPX-never-shown");
    let mut twice = catalog();
    twice.as_array_mut().unwrap().push(catalog()[4].clone());
    for (name, text, says) in [
        ("secret.json", with_secret.to_string(), "entry [1] (id \"google_calendar\"): field \"oauth.client_secret\""),
        ("twice.json", twice.to_string(), "entry [6] (id \"microsoft_calendar\"): its id is also entry [4]'s"),
        ("broken.json", "[{\"id\": \"slack\",".to_string(), "is not JSON"),
        ("object.json", "{}".to_string(), "must be a JSON array of services"),
    ] {
        let path = dir.write(name, &text);
        let (code, stderr) = start_with_catalog(Path::new(&path));
        assert_eq!(code, Some(2), "{name}: a configuration error: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{name}: one line: {stderr}");
        assert!(stderr.contains(&format!("FLEET_SERVICES_CATALOG: {path}: {says}")), "{name}: {stderr}");
        assert!(!stderr.contains("GOCSPX"), "the secret's value is never repeated: {stderr}");
    }
    let (code, stderr) = start_with_catalog(&dir.0.join("missing.json"));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("missing.json: cannot be read"), "{stderr}");
}

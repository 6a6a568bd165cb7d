//! Seed 001's artifacts as a client written from the seed uses them: files uploaded to a session
//! (`multipart/form-data`) answer their ids, appear as the session's `artifact_upload` event, are
//! told to the session's next turn and served back byte for byte; a file over the cap or of a type
//! not taken is refused and nothing is stored; a model loads an image with the built-in
//! `load_image` tool (the `image_load` event) and its next call carries the image as an
//! `image_url` part; deleting the session deletes its files and records; another tenant reaches
//! none of it. Real dispatcher, workers, broker, Redis and a file-system artifact store; the model
//! is scripted.

use base64::Engine;
use reqwest::Method;
use serde_json::{json, Value};

use fleet_tests::agent_events::{of_type};
use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::turn::llm_fleet;
use fleet_tests::{spawn_fleet, Fleet};

/// A 1×1 PNG.
const PNG_B64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

fn png() -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(PNG_B64).unwrap()
}

/// One file of a form: its filename, content type and bytes.
type Part<'a> = (&'a str, &'a str, &'a [u8]);

/// A `multipart/form-data` body of `file` parts, and its content type.
fn form(files: &[Part<'_>]) -> (String, Vec<u8>) {
    let boundary = "fleet-test-boundary-7c1d";
    let mut body = Vec::new();
    for (filename, mime, bytes) in files {
        let head = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\nContent-Type: {mime}\r\n\r\n"
        );
        body.extend_from_slice(head.as_bytes());
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

fn artifacts_path(agent: &str, session: &str) -> String {
    format!("/v2/agents/{agent}/sessions/{session}/artifacts")
}

async fn upload_as(fleet: &Fleet, token: &str, agent: &str, session: &str, files: &[Part<'_>]) -> (u16, Value) {
    let (content_type, body) = form(files);
    let resp = fleet
        .http
        .post(format!("{}{}", fleet.api, artifacts_path(agent, session)))
        .bearer_auth(token)
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn upload(fleet: &Fleet, agent: &str, session: &str, files: &[Part<'_>]) -> (u16, Value) {
    upload_as(fleet, &fleet.token, agent, session, files).await
}

/// An artifact's bytes and content type (404: none).
async fn fetch_as(fleet: &Fleet, token: &str, agent: &str, session: &str, id: &str) -> (u16, String, Vec<u8>) {
    let url = format!("{}{}/{id}", fleet.api, artifacts_path(agent, session));
    let resp = fleet.http.get(url).bearer_auth(token).send().await.unwrap();
    let status = resp.status().as_u16();
    let mime = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    (status, mime, resp.bytes().await.unwrap().to_vec())
}

async fn create_agent(fleet: &Fleet, name: &str) {
    let body = json!({"name": name, "title": name, "instructions": "You are helpful."});
    let (status, resp) = fleet.post("/v1/agents/assistants", &body).await;
    assert_eq!(status, 201, "{resp}");
}

async fn send(fleet: &Fleet, agent: &str, session: &str, text: &str) -> Value {
    let body = json!({"type": "input", "messages": [{"type": "text", "content": text}], "since": "start"});
    let (status, resp) = fleet.post(&format!("/v2/agents/{agent}/sessions/{session}/events"), &body).await;
    assert_eq!(status, 201, "{resp}");
    resp
}

/// Every file under the fleet's artifact store.
fn stored_files(fleet: &Fleet) -> Vec<std::path::PathBuf> {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let mut out = vec![];
    walk(&fleet.artifacts_dir(), &mut out);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_are_stored_announced_told_to_the_next_turn_served_and_forgotten_with_their_session() {
    let llm = MockLlm::start(|_, _| LlmReply::text("Noted.")).await;
    let fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_ARTIFACT_MAX_BYTES", "65536")).await;
    create_agent(&fleet, "filer").await;
    let image = png();
    let text = b"quarterly numbers: up".to_vec();
    let (status, resp) =
        upload(&fleet, "filer", "s1", &[("pixel.png", "image/png", &image), ("notes.txt", "text/plain", &text)]).await;
    assert_eq!(status, 201, "{resp}");
    let stored = resp["artifacts"].as_array().unwrap().clone();
    assert_eq!(stored.len(), 2);
    for (shown, (name, mime, size)) in
        stored.iter().zip([("pixel.png", "image/png", image.len()), ("notes.txt", "text/plain", text.len())])
    {
        let id = shown["artifact_id"].as_str().unwrap();
        assert!(id.starts_with("art_") && id.len() == 36 && id[4..].bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        assert_eq!((shown["filename"].as_str(), shown["mime_type"].as_str()), (Some(name), Some(mime)));
        assert_eq!(shown["size_bytes"].as_u64(), Some(size as u64));
    }
    assert_eq!(stored_files(&fleet).len(), 2);

    // The upload is the session's event, as seed 001 shows it; the next turn's model is told.
    let answer = send(&fleet, "filer", "s1", "What did I upload?").await;
    let uploads = of_type(&answer, "artifact_upload");
    assert_eq!(uploads.len(), 1, "{answer}");
    let event = uploads[0];
    assert_eq!(event["artifacts"], json!(stored), "{event}");
    let told = event["agent_upload_message"].as_str().unwrap();
    assert!(told.contains("pixel.png") && told.contains(stored[1]["artifact_id"].as_str().unwrap()), "{told}");
    for base in ["id", "session_key", "created_at"] {
        assert!(event[base].is_string(), "{base}: {event}");
    }
    assert_eq!(event["session_key"], "s1");
    let asked = llm.requests().last().unwrap().clone();
    let users: Vec<String> = asked.messages().iter().filter(|m| m["role"] == "user").map(|m| m["content"].to_string()).collect();
    assert!(users.iter().any(|c| c.contains("The user uploaded notes.txt (text/plain, 21 bytes)")), "{users:?}");
    assert_eq!(of_type(&answer, "agent_output").len(), 1, "{answer}");

    // Each file comes back as it went in, with its type.
    for (shown, bytes) in stored.iter().zip([&image, &text]) {
        let (status, mime, got) = fetch_as(&fleet, &fleet.token, "filer", "s1", shown["artifact_id"].as_str().unwrap()).await;
        assert_eq!((status, mime.as_str()), (200, shown["mime_type"].as_str().unwrap()));
        assert_eq!(&got, bytes);
    }

    // A file over the cap, or of a type not taken, refuses the whole request: nothing is stored.
    let big = vec![b'x'; 65_537];
    let (status, resp) =
        upload(&fleet, "filer", "s1", &[("ok.png", "image/png", &image), ("huge.txt", "text/plain", &big)]).await;
    assert_eq!((status, resp["error"]["code"].as_str()), (413, Some("artifact_too_large")), "{resp}");
    assert!(resp["error"]["message"].as_str().unwrap().contains("huge.txt"), "{resp}");
    let (status, resp) = upload(&fleet, "filer", "s1", &[("tool.exe", "application/x-msdownload", b"MZ\x90\0")]).await;
    assert_eq!(status, 415, "{resp}");
    assert!(resp["error"]["message"].as_str().unwrap().contains("application/x-msdownload"), "{resp}");
    let (status, resp) = upload(&fleet, "filer", "s1", &[("fake.png", "image/png", b"GIF89a not a png")]).await;
    assert_eq!(status, 415, "an image's bytes must be its type: {resp}");
    assert_eq!(stored_files(&fleet).len(), 2, "a refused upload stores nothing");
    let again = send(&fleet, "filer", "s1", "Anything new?").await;
    assert_eq!(of_type(&again, "artifact_upload").len(), 1, "no event for a refused upload: {again}");

    // Deleting the session deletes its files and records.
    let (status, _) = fleet.request(Method::DELETE, "/v1/sessions/s1", None).await;
    assert_eq!(status, 204);
    for shown in &stored {
        let (status, _, _) = fetch_as(&fleet, &fleet.token, "filer", "s1", shown["artifact_id"].as_str().unwrap()).await;
        assert_eq!(status, 404);
    }
    assert_eq!(stored_files(&fleet), Vec::<std::path::PathBuf>::new(), "the files are gone");
    let records = format!("{}session:{{s1}}:artifacts", fleet.key_prefix);
    let left: bool = redis::AsyncCommands::exists(&mut fleet.redis().await, &records).await.unwrap();
    assert!(!left, "no record of the files is left");
}

/// The model loads the image it is offered, then answers.
fn looking_model(body: &Value, _: usize) -> LlmReply {
    let messages = body["messages"].as_array().unwrap();
    let offered = body["tools"].as_array().into_iter().flatten().find(|t| t["function"]["name"] == "load_image");
    let loaded = messages.last().is_some_and(|m| m["role"] == "user" && m["content"].is_array());
    match offered {
        Some(tool) if !loaded && messages.last().is_some_and(|m| m["content"] == "Look at my picture.") => {
            let id = tool["function"]["parameters"]["properties"]["artifact_id"]["enum"][0].clone();
            let arguments = json!({"artifact_id": id, "detail": "high"}).to_string();
            LlmReply::ToolCalls(vec![("call_1".into(), "load_image".into(), arguments)])
        }
        _ => LlmReply::text("A single pixel."),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_loads_an_uploaded_image_and_its_next_call_carries_it() {
    let llm = MockLlm::start(looking_model).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;
    create_agent(&fleet, "viewer").await;
    let image = png();
    let (status, resp) = upload(&fleet, "viewer", "v1", &[("pixel.png", "image/png", &image)]).await;
    assert_eq!(status, 201, "{resp}");
    let id = resp["artifacts"][0]["artifact_id"].as_str().unwrap().to_string();

    let answer = send(&fleet, "viewer", "v1", "Look at my picture.").await;
    let loads = of_type(&answer, "image_load");
    assert_eq!(loads.len(), 1, "{answer}");
    assert_eq!((loads[0]["artifact_id"].as_str(), loads[0]["detail"].as_str()), (Some(id.as_str()), Some("high")));
    assert_eq!(of_type(&answer, "agent_output")[0]["content"], "A single pixel.");

    let requests = llm.requests();
    assert_eq!(requests.len(), 2, "the call, then the answer");
    let offered = &requests[0].body["tools"];
    assert!(offered.to_string().contains(&id), "load_image offers the session's image: {offered}");
    let shown = requests[1].messages().into_iter().find(|m| m["content"].is_array()).expect("a message with parts");
    assert_eq!(shown["role"], "user");
    let part = shown["content"].as_array().unwrap().iter().find(|p| p["type"] == "image_url").unwrap().clone();
    assert_eq!(part["image_url"]["url"], format!("data:image/png;base64,{PNG_B64}"));
    assert_eq!(part["image_url"]["detail"], "high");
    let tool_answer = requests[1].messages().into_iter().find(|m| m["role"] == "tool").unwrap();
    assert!(tool_answer["content"].as_str().unwrap().contains(&id), "{tool_answer}");

    // The history keeps the note, not the image: the next turn's prompt carries no image.
    send(&fleet, "viewer", "v1", "Thanks.").await;
    let later = llm.requests().last().unwrap().clone();
    assert!(!later.body.to_string().contains("image_url"), "{}", later.body);
    assert!(later.contents().iter().any(|c| c == &format!("[image {id} loaded]")), "{:?}", later.contents());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_can_neither_upload_to_nor_read_a_session_not_its_own() {
    const ADMIN: &str = "art-admin-token-0123456789";
    const ACME: &str = "art-acme-token-0123456789";
    const BETA: &str = "art-beta-token-0123456789";
    let llm = MockLlm::start(|_, _| LlmReply::text("ok")).await;
    let tokens = format!("{ADMIN},{ACME}@acme,{BETA}@beta");
    let mut fleet = spawn_fleet(llm_fleet(&llm).env("FLEET_API_TOKENS", &tokens)).await;
    fleet.token = ADMIN.to_string();
    let agent = json!({"name": "acme_filer", "title": "Filer", "instructions": "Help."});
    let (status, made) = fleet.request_as(ACME, &Method::POST, "/v1/agents/assistants", Some(&agent)).await;
    assert_eq!(status, 201, "{made}");
    let agent_id = made["data"]["id"].as_str().unwrap().to_string();
    let (status, resp) = upload_as(&fleet, ACME, &agent_id, "private", &[("a.txt", "text/plain", b"acme's")]).await;
    assert_eq!(status, 201, "{resp}");
    let id = resp["artifacts"][0]["artifact_id"].as_str().unwrap().to_string();
    assert_eq!(fetch_as(&fleet, ACME, &agent_id, "private", &id).await.0, 200);

    // Beta sees neither acme's agent nor its session: 404, as if they did not exist.
    let (status, resp) = upload_as(&fleet, BETA, &agent_id, "private", &[("b.txt", "text/plain", b"beta's")]).await;
    assert_eq!(status, 404, "{resp}");
    assert_eq!(fetch_as(&fleet, BETA, &agent_id, "private", &id).await.0, 404);
    // Through a shared agent, beta's key names beta's own session, which holds none of acme's files.
    let shared = json!({"name": "shared_filer", "title": "Shared", "instructions": "Help."});
    let (status, _) = fleet.request_as(ADMIN, &Method::POST, "/v1/agents/assistants", Some(&shared)).await;
    assert_eq!(status, 201);
    let (status, _) = upload_as(&fleet, ACME, "shared_filer", "common", &[("c.txt", "text/plain", b"acme")]).await;
    assert_eq!(status, 201);
    let (status, resp) = upload_as(&fleet, BETA, "shared_filer", "common", &[("d.txt", "text/plain", b"beta")]).await;
    assert_eq!(status, 201, "beta's own session of that key: {resp}");
    assert_eq!(fetch_as(&fleet, BETA, "shared_filer", "common", &id).await.0, 404);
    let (_, _, got) = fetch_as(&fleet, ACME, &agent_id, "private", &id).await;
    assert_eq!(got, b"acme's", "acme's file is unchanged");
}

/// An S3-compatible server (moto's, from `scripts/ensure-seed-clients.sh`) on a port of its own,
/// with one bucket; stopped when dropped.
struct S3Server {
    child: std::process::Child,
    endpoint: String,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl S3Server {
    async fn start(bucket: &str) -> S3Server {
        let port = fleet_tests::free_port();
        let server = fleet_tests::seed::clients_dir().join("venv/bin/moto_server");
        let child = std::process::Command::new(server)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start moto_server (scripts/ensure-seed-clients.sh installs it)");
        let s3 = S3Server { child, endpoint: format!("http://127.0.0.1:{port}") };
        let http = reqwest::Client::new();
        let url = format!("{}/{bucket}", s3.endpoint);
        fleet_tests::wait_for("the S3 server", std::time::Duration::from_secs(30), || async {
            http.put(&url).send().await.ok().filter(|r| r.status().is_success()).map(|_| ())
        })
        .await;
        s3
    }

    /// The keys under `prefix` in `bucket` (a ListObjectsV2, path style).
    async fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let url = format!("{}/{bucket}?list-type=2&prefix={prefix}", self.endpoint);
        let listing = reqwest::get(url).await.unwrap().text().await.unwrap();
        listing.split("<Key>").skip(1).filter_map(|k| k.split("</Key>").next()).map(str::to_string).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_compatible_store_holds_the_files_the_worker_reads_and_the_session_forgets() {
    let s3 = S3Server::start("fleet-artifacts").await;
    let llm = MockLlm::start(looking_model).await;
    let prefix = format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let options = llm_fleet(&llm)
        .env("FLEET_ARTIFACTS_URL", &format!("s3://fleet-artifacts/{prefix}"))
        .env("AWS_ENDPOINT", &s3.endpoint)
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing");
    let fleet = spawn_fleet(options).await;
    create_agent(&fleet, "s3_viewer").await;
    let image = png();
    let (status, resp) = upload(&fleet, "s3_viewer", "v1", &[("pixel.png", "image/png", &image)]).await;
    assert_eq!(status, 201, "{resp}");
    let id = resp["artifacts"][0]["artifact_id"].as_str().unwrap().to_string();
    let stored = s3.keys("fleet-artifacts", &prefix).await;
    assert_eq!(stored.len(), 1, "the file is in the bucket: {stored:?}");
    assert!(stored_files(&fleet).is_empty(), "and nothing on the local disk");
    let (status, _, bytes) = fetch_as(&fleet, &fleet.token, "s3_viewer", "v1", &id).await;
    assert_eq!((status, bytes), (200, image.clone()));

    // The worker reads the image from the bucket into the model's request.
    let answer = send(&fleet, "s3_viewer", "v1", "Look at my picture.").await;
    assert_eq!(of_type(&answer, "image_load").len(), 1, "{answer}");
    let shown = llm.requests()[1].body.to_string();
    assert!(shown.contains(&format!("data:image/png;base64,{PNG_B64}")), "{shown}");

    let (status, resp) = fleet.request(Method::DELETE, "/v1/sessions/v1", None).await;
    assert!(status == 200 || status == 204, "{resp}");
    assert_eq!(s3.keys("fleet-artifacts", &prefix).await, Vec::<String>::new(), "forgotten with the session");
}

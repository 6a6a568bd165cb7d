//! What the worker's outgoing requests may do: a model's redirect is not followed (the
//! conversation and its key go nowhere else).

use std::time::Duration;

use fleet_tests::llm::{LlmReply, MockLlm};
use fleet_tests::spawn_fleet;
use fleet_tests::turn::{llm_fleet, post_turn, read_until_done, turn_body};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_redirect_is_not_followed_and_ends_the_turn() {
    let elsewhere = MockLlm::start(|_, _| LlmReply::text("answered from elsewhere")).await;
    let location = format!("{}/chat/completions", elsewhere.base_url());
    let llm = MockLlm::start(move |_, _| LlmReply::Redirect(307, location.clone())).await;
    let fleet = spawn_fleet(llm_fleet(&llm)).await;

    let id = post_turn(&fleet, &turn_body("s_redirect", "the whole conversation", &[])).await;
    let failed = fleet.wait_status(&id, "dead_lettered", Duration::from_secs(20)).await;
    assert_eq!(elsewhere.requests().len(), 0, "the redirect's target got nothing");
    assert_eq!(llm.requests().len(), 1, "a redirect is permanent: not tried again");
    let attempts = failed["attempts"].as_array().unwrap();
    assert_eq!(attempts[0]["http_status"], 307, "{failed}");
    let error = attempts[0]["error"].as_str().unwrap();
    assert!(error.contains("redirect") && error.contains("not followed"), "{error}");

    let (_, dead) = fleet.get(&format!("/v1/dead-letters/{id}")).await;
    assert_eq!(dead["data"]["reason"], "permanent", "{dead}");
    let frames = read_until_done(&fleet, "s_redirect", Some("0-0")).await;
    let error = frames.iter().find(|f| f.2 == "error").expect("an error event");
    assert!(error.3.to_string().contains("redirect"), "{}", error.3);
}

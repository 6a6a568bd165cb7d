//! Seed 001's image load: while the session holds image artifacts, the model is offered the
//! built-in `load_image` tool. A call is answered at once, like a handoff: its outcome recorded
//! under the call's key, the `image_load` event sent, and the image due in the state saved with
//! the round. The next step shows it in a user message after the round's tool results, as a
//! reference (`ImageRef`); the bytes are read from the artifact store only when a request is
//! built (`Shown`), so no turn state or history in Redis ever holds them. The history keeps the
//! message's text note alone: a later turn that needs the image loads it again, rather than every
//! later prompt paying for it.

use std::collections::HashMap;

use serde_json::{json, Value};

use fleet_protocol::artifacts::{self, LOAD_IMAGE_TOOL};
use fleet_protocol::chat::{data_url, ImageRef};
use fleet_protocol::turn::{self, call_key, CallOutcome, Message, PendingCall, ToolCall, TurnState};

use super::{emit, ClaimedStep};
use crate::context::Cx;
use crate::outcome::Outcome;

/// Whether a call is the built-in tool's (a registered tool of that name, enabled, is that tool's).
pub(super) fn is_load(state: &TurnState, call: &ToolCall) -> bool {
    call.name == LOAD_IMAGE_TOOL && !state.enabled(LOAD_IMAGE_TOOL)
}

/// The built-in tool's spec, if the session holds images (and no enabled tool has its name).
pub(super) async fn offered(cx: &Cx<'_>, state: &TurnState) -> Option<Value> {
    if state.enabled(LOAD_IMAGE_TOOL) {
        return None;
    }
    let found = cx.store.sessions().artifacts(&state.session_id).await.ok()?;
    let ids: Vec<String> = found.iter().filter(|a| a.is_image()).map(|a| a.artifact_id.clone()).collect();
    artifacts::load_image_spec(&ids)
}

/// A `load_image` call, answered at once: the image is due in the next model call (refused, the
/// model is told why). `Err` ends the step (Redis unavailable: parked).
pub(super) async fn load(
    step: &ClaimedStep<'_>,
    state: &mut TurnState,
    round: u32,
    position: u32,
    call: &ToolCall,
) -> Result<PendingCall, Outcome> {
    let cx = &step.cx;
    let key = call_key(round, position);
    let arguments = turn::parse_arguments(&call.arguments).unwrap_or_default();
    let Ok(found) = cx.store.sessions().artifacts(&state.session_id).await else {
        return Err(step.release_and_park().await);
    };
    let (outcome, loaded) = match artifacts::check_load(&arguments, &found) {
        Ok((image, detail)) => {
            let result = json!({"loaded": image.artifact_id, "detail": detail.as_str()});
            let due = ImageRef { artifact_id: image.artifact_id, mime_type: image.mime_type, detail };
            (CallOutcome { ok: true, result, external: None }, Some(due))
        }
        Err(refused) => (CallOutcome { ok: false, result: json!(refused), external: None }, None),
    };
    step.answer_now(&key, round, &outcome).await?;
    if let Some(due) = loaded {
        let event = artifacts::image_load_event(&due.artifact_id, due.detail, &state.message_id);
        emit(cx, &state.session_id, event).await;
        state.images_due.push(due);
    }
    Ok(PendingCall::answered(call, key))
}

/// The data URLs of the images the conversation shows, read from the artifact store before the
/// model call (an image whose file is gone, its session deleted, is left out of the request).
#[derive(Debug, Default)]
pub(super) struct Shown(HashMap<String, String>);

impl Shown {
    /// Reads every image the conversation shows; `Err` ends the step (the store is unavailable:
    /// the claim given back, parked).
    pub(super) async fn read(step: &ClaimedStep<'_>, state: &TurnState) -> Result<Shown, Outcome> {
        let mut urls = HashMap::new();
        for image in state.conversation.iter().flat_map(|m| &m.images) {
            if urls.contains_key(&image.artifact_id) {
                continue;
            }
            match step.cx.config.common.artifacts.get(&state.session_id, &image.artifact_id).await {
                Ok(Some(bytes)) => {
                    urls.insert(image.artifact_id.clone(), data_url(&image.mime_type, &bytes));
                }
                Ok(None) => tracing::warn!(artifact_id = image.artifact_id, "a loaded image's file is gone"),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read a loaded image; parked");
                    return Err(step.release_and_park().await);
                }
            }
        }
        Ok(Shown(urls))
    }

    /// The request's messages: each in its OpenAI form, a message's images as content parts.
    pub(super) fn messages(&self, conversation: &[Message]) -> Vec<Value> {
        conversation
            .iter()
            .map(|m| {
                let urls: Vec<Option<String>> = m.images.iter().map(|i| self.0.get(&i.artifact_id).cloned()).collect();
                m.to_openai_with_images(&urls)
            })
            .collect()
    }
}

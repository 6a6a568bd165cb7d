//! A tool configuration's argument overrides resolved against the live session (seed 001), at
//! each launch of a call: the agent's secrets opened with `FLEET_SECRETS_KEY` (in memory only),
//! the session's metadata (a room's), and the newest output of a tool configuration, in this turn
//! first, else in the session's earlier turns.

use std::collections::HashMap;

use serde_json::Value;

use fleet_platform::store::Store;
use fleet_protocol::agent_config::{read_path, secret_owner, Overrides, Reference};
use fleet_protocol::secrets::SecretsKey;
use fleet_protocol::turn::TurnState;

/// How to treat the agent's secrets while resolving.
#[derive(Clone, Copy)]
pub(crate) enum Secrets<'a> {
    /// Opened: the values a call is launched with.
    Opened(&'a SecretsKey),
    /// Left shut: only what events show (a secret is `****` there anyway).
    Shut,
}

/// The overrides `configuration` gives a call of turn `turn_id` now; the error names what could
/// not be resolved (the call then short-circuits, told to the model).
pub(crate) async fn resolve(
    store: &Store,
    secrets: Secrets<'_>,
    state: &TurnState,
    turn_id: &str,
    configuration: &str,
) -> Result<Overrides, String> {
    let agent = state.agent.as_ref().ok_or("the turn has no agent")?;
    let config = agent
        .config
        .tool_configurations
        .get(configuration)
        .ok_or_else(|| format!("the agent has no tool configuration {configuration:?}"))?;
    let references: Vec<Reference> =
        config.argument_overrides.values().filter_map(|v| Reference::of(v).ok().flatten()).collect();
    let wants_metadata = references.iter().any(|r| matches!(r, Reference::Metadata(..)));
    let wants_outputs = references.iter().any(|r| matches!(r, Reference::ToolOutput(..)));
    // Read side by side: each is one round trip, and a launch waits for them.
    let (metadata, outputs) = tokio::join!(
        async {
            match wants_metadata {
                true => session_metadata(store, &state.session_id).await,
                false => Ok(None),
            }
        },
        async {
            match wants_outputs {
                true => prior_outputs(store, state, turn_id).await,
                false => Ok(HashMap::new()),
            }
        }
    );
    let (metadata, outputs) = (metadata?, outputs?);
    let lookup = |reference: &Reference| match reference {
        Reference::Secret(name) => {
            let sealed = agent.config.secrets.get(name).ok_or_else(|| format!("the agent has no secret {name:?}"))?;
            match secrets {
                Secrets::Opened(key) => key
                    .decrypt(&secret_owner(&state.assistant.id, name), sealed)
                    .map(Value::String)
                    .map_err(|_| format!("secret {name:?} cannot be opened with this fleet's secrets key")),
                Secrets::Shut => Ok(Value::Null),
            }
        }
        Reference::Metadata(key, path) => metadata
            .as_ref()
            .and_then(|m| m.get(key))
            .and_then(|v| read_path(v, path))
            .cloned()
            .ok_or_else(|| format!("the session's metadata has no {}", dotted(key, path))),
        Reference::ToolOutput(name, path) => outputs
            .get(name)
            .and_then(|v| read_path(v, path))
            .cloned()
            .ok_or_else(|| format!("no output of tool configuration {} in this session yet", dotted(name, path))),
    };
    config.resolve(&lookup)
}

fn dotted(name: &str, path: &str) -> String {
    if path.is_empty() {
        format!("{name:?}")
    } else {
        format!("\"{name}.{path}\"")
    }
}

/// A room's metadata (a session that is no room has none).
async fn session_metadata(store: &Store, session: &str) -> Result<Option<serde_json::Map<String, Value>>, String> {
    let room = store.registry().get_room(session).await.map_err(|e| format!("cannot read the session: {e}"))?;
    Ok(room.map(|r| r.metadata))
}

/// The newest successful output of each tool configuration: this turn's calls, newest first,
/// over what the session's earlier turns left.
async fn prior_outputs(store: &Store, state: &TurnState, turn_id: &str) -> Result<HashMap<String, Value>, String> {
    let unreadable = |e: fleet_platform::store::StoreError| format!("cannot read the session's tool outputs: {e}");
    let configured = state.tool_calls.iter().any(|c| c.configuration.is_some());
    let sessions = store.sessions();
    let (earlier, outcomes) = tokio::join!(sessions.tool_outputs(&state.session_id), async {
        match configured {
            true => sessions.call_outcomes(turn_id).await.map(Some),
            false => Ok(None),
        }
    });
    let mut outputs = earlier.map_err(unreadable)?;
    if let Some(outcomes) = outcomes.map_err(unreadable)? {
        outputs.extend(newest_outputs(state, &outcomes));
    }
    Ok(outputs)
}

/// The newest successful output of each configuration this turn called: what the session keeps
/// for later turns.
pub(crate) fn newest_outputs(
    state: &TurnState,
    outcomes: &HashMap<String, fleet_protocol::turn::CallOutcome>,
) -> Vec<(String, Value)> {
    let mut newest: HashMap<&str, &Value> = HashMap::new();
    for call in &state.tool_calls {
        if let (Some(name), Some(outcome)) = (&call.configuration, outcomes.get(call.outcome_key())) {
            if outcome.ok {
                newest.insert(name, &outcome.result);
            }
        }
    }
    newest.into_iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

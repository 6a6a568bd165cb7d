//! Seed 001's artifacts: `POST /v2/agents/{agent_key}/sessions/{session_key}/artifacts` uploads
//! files to a session (`multipart/form-data`, one `file` part each), and `GET …/artifacts/{id}`
//! hands one back. Every part is read and checked before anything is stored, so a refused request
//! (413 over `FLEET_ARTIFACT_MAX_BYTES`, 415 a type not taken) stores nothing. The files go to the
//! artifact store first; then one script writes their records, the session's `artifact_upload`
//! event and the note the model reads: a user message appended to the session's history. The
//! history is safe to append to beside a running turn (entries are numbered as they land, and a
//! compaction or a trim drops only the entries it read), and the running turn does not read the
//! history again, so the note reaches the session's next turn, once: no note is kept anywhere else
//! to be taken, lost or doubled.

use axum::extract::multipart::{Field, MultipartRejection};
use axum::extract::{Multipart, Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::{Bytes, BytesMut};
use serde::Serialize;
use utoipa::ToSchema;

use fleet_platform::artifacts::ArtifactError;
use fleet_platform::now_ms;
use fleet_protocol::artifacts::{self as files, Artifact, Refusal};
use fleet_protocol::timefmt::rfc3339_from_millis;
use fleet_protocol::turn;

use crate::error::ApiError;
use crate::routes::agent_events::{agent, agents_session, own_session};
use crate::tenancy::Tenancy;
use crate::AppState;

/// The upload's form: one or more `file` parts, each with its filename and content type.
#[allow(dead_code)]
#[derive(ToSchema)]
pub(crate) struct UploadForm {
    /// A file; repeat the part for more (at most 20).
    #[schema(value_type = Vec<String>, format = Binary)]
    file: Vec<u8>,
}

/// The stored files, as seed 001's `ArtifactReference`s.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct UploadAnswer {
    artifacts: Vec<ArtifactShown>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ArtifactShown {
    /// `art_` and 32 hex digits.
    artifact_id: String,
    filename: String,
    mime_type: String,
    size_bytes: u64,
}

impl From<&Artifact> for ArtifactShown {
    fn from(a: &Artifact) -> Self {
        ArtifactShown {
            artifact_id: a.artifact_id.clone(),
            filename: a.filename.clone(),
            mime_type: a.mime_type.clone(),
            size_bytes: a.size_bytes,
        }
    }
}

/// Uploads files to the session: 201 with their ids; the session's next turn is told of them.
#[utoipa::path(post, path = "/v2/agents/{agent_key}/sessions/{session_key}/artifacts", extensions(("x-tenancy" = json!("resource"))), tag = "agent-sessions",
    security(("bearer" = ["turns:write"])),
    params(("agent_key" = String, Path, description = "The agent: an assistant's id (`asst_…`) or name"),
        ("session_key" = String, Path, description = "The session (a room's id, or any key: the first input or upload makes it the agent's session)")),
    request_body(content = UploadForm, content_type = "multipart/form-data"),
    responses((status = 201, description = "The files were stored; the session's stream has their `artifact_upload` event", body = UploadAnswer),
        (status = 400, description = "The form is malformed (no `file` part, another part, a part without a filename)", body = crate::routes::docs::ErrorBody),
        (status = 404, description = "No such agent, or the session is another agent's", body = crate::routes::docs::ErrorBody),
        (status = 409, description = "The room is closed", body = crate::routes::docs::ErrorBody),
        (status = 413, description = "A file is over `FLEET_ARTIFACT_MAX_BYTES` (the message names it)", body = crate::routes::docs::ErrorBody),
        (status = 415, description = "A file's type is not taken, or an image's bytes are not its type (the message names it)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn upload_artifacts(
    State(state): State<AppState>,
    tenancy: Tenancy,
    Path((agent_key, session_key)): Path<(String, String)>,
    form: Result<Multipart, MultipartRejection>,
) -> Result<(StatusCode, Json<UploadAnswer>), ApiError> {
    crate::validate::identifier("session_key", Some(&session_key)).map_err(bad_request)?;
    let session = tenancy.session(&session_key);
    let agent = agent(&state, tenancy.bound.as_deref(), &agent_key).await?;
    own_session(&state, &tenancy, &agent, &session).await?;
    let form = form.map_err(|e| bad_request(ApiError::invalid(format!("the body is not a multipart form: {e}"))))?;
    let parts = read_files(form, state.config.artifact_max_bytes).await?;
    let created_at = rfc3339_from_millis(now_ms());
    let artifacts: Vec<Artifact> = parts
        .iter()
        .map(|(filename, mime_type, bytes)| Artifact {
            artifact_id: files::new_artifact_id(),
            filename: filename.clone(),
            mime_type: mime_type.clone(),
            size_bytes: bytes.len() as u64,
            created_at: created_at.clone(),
            tenant: tenancy.bound.clone(),
        })
        .collect();
    store_files(&state, &session, &artifacts, parts.into_iter().map(|(_, _, b)| b)).await?;
    let note = files::upload_message(&artifacts);
    let event = turn::with_base_fields(files::upload_event(&artifacts, &note), &session, now_ms());
    let entry = files::upload_entry(&artifacts, &note, &created_at);
    if let Err(e) = state.store.sessions().record_upload(&session, &artifacts, &entry, &event).await {
        take_back(&state, &session, &artifacts).await;
        return Err(e.into());
    }
    let shown = artifacts.iter().map(ArtifactShown::from).collect();
    Ok((StatusCode::CREATED, Json(UploadAnswer { artifacts: shown })))
}

/// One artifact's bytes, with its type; the session's agent, tenant and the artifact must match.
#[utoipa::path(get, path = "/v2/agents/{agent_key}/sessions/{session_key}/artifacts/{artifact_id}", extensions(("x-tenancy" = json!("resource"))), tag = "agent-sessions",
    security(("bearer" = ["sessions:read"])),
    params(("agent_key" = String, Path, description = "The agent: an assistant's id (`asst_…`) or name"),
        ("session_key" = String, Path, description = "The session"),
        ("artifact_id" = String, Path, description = "`art_…`, as the upload answered")),
    responses((status = 200, description = "The file, with its type as `Content-Type`", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 404, description = "No such agent, session or artifact (or another tenant's)", body = crate::routes::docs::ErrorBody),
        crate::routes::docs::CommonErrors))]
pub(crate) async fn get_artifact(
    State(state): State<AppState>,
    tenancy: Tenancy,
    Path((agent_key, session_key, artifact_id)): Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let missing = || ApiError::new(StatusCode::NOT_FOUND, "artifact_not_found", format!("no artifact {artifact_id:?}"));
    crate::validate::identifier("session_key", Some(&session_key)).map_err(bad_request)?;
    let session = tenancy.session(&session_key);
    let agent = agent(&state, tenancy.bound.as_deref(), &agent_key).await?;
    crate::routes::common::check_session(&state, &tenancy, &session).await?;
    if !agents_session(&state, &agent, &session).await? || !files::is_artifact_id(&artifact_id) {
        return Err(missing());
    }
    let Some(found) = state.store.sessions().artifact(&session, &artifact_id).await? else { return Err(missing()) };
    if !tenancy.sees(found.tenant.as_deref()) {
        return Err(missing());
    }
    let bytes = state.config.common.artifacts.get(&session, &artifact_id).await.map_err(unavailable)?;
    let Some(bytes) = bytes else { return Err(missing()) };
    let mime = HeaderValue::from_str(&found.mime_type).unwrap_or(HeaderValue::from_static("application/octet-stream"));
    Ok(([(header::CONTENT_TYPE, mime)], bytes).into_response())
}

/// Every `file` part of the form (filename, type, bytes), each checked; the first refusal is the
/// answer, before anything is stored.
async fn read_files(mut form: Multipart, max: usize) -> Result<Vec<(String, String, Bytes)>, ApiError> {
    let mut parts = Vec::new();
    while let Some(field) = form.next_field().await.map_err(malformed)? {
        if field.name() != Some("file") {
            let name = field.name().unwrap_or_default().to_string();
            return Err(bad_request(ApiError::invalid(format!("part {name:?} is not a file part (name each `file`)"))));
        }
        if parts.len() == files::MAX_FILES {
            return Err(bad_request(ApiError::invalid(format!("at most {} files an upload", files::MAX_FILES))));
        }
        let given = field.file_name().unwrap_or_default().to_string();
        let Some(filename) = files::clean_filename(&given) else {
            return Err(bad_request(ApiError::invalid(format!("file part {} has no filename", parts.len()))));
        };
        let mime_type = files::essence(field.content_type().unwrap_or("application/octet-stream"));
        let bytes = read_bounded(field, &filename, max).await?;
        files::check_file(&filename, &mime_type, &bytes, max).map_err(refused)?;
        parts.push((filename, mime_type, bytes));
    }
    if parts.is_empty() {
        return Err(bad_request(ApiError::invalid("the form has no `file` part")));
    }
    Ok(parts)
}

/// A part's bytes, read no further than one byte past `max`.
async fn read_bounded(mut field: Field<'_>, filename: &str, max: usize) -> Result<Bytes, ApiError> {
    let mut bytes = BytesMut::new();
    while let Some(chunk) = field.chunk().await.map_err(malformed)? {
        if bytes.len() + chunk.len() > max {
            return Err(refused(Refusal::TooLarge { filename: filename.to_string(), max }));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes.freeze())
}

/// Puts each file in the artifact store; a failure takes back those already put.
async fn store_files(
    state: &AppState,
    session: &str,
    artifacts: &[Artifact],
    bytes: impl Iterator<Item = Bytes>,
) -> Result<(), ApiError> {
    let store = &state.config.common.artifacts;
    for (artifact, bytes) in artifacts.iter().zip(bytes) {
        if let Err(e) = store.put(session, &artifact.artifact_id, bytes).await {
            take_back(state, session, artifacts).await;
            return Err(unavailable(e));
        }
    }
    Ok(())
}

/// Deletes the files of an upload that was not recorded (one left behind goes with its session).
async fn take_back(state: &AppState, session: &str, artifacts: &[Artifact]) {
    for artifact in artifacts {
        if let Err(e) = state.config.common.artifacts.delete(session, &artifact.artifact_id).await {
            tracing::warn!(error = %e, artifact_id = artifact.artifact_id, "an unrecorded upload's file stays");
        }
    }
}

/// The status a refused file answers: 413 too large, 415 a type not taken (or not its bytes').
fn refused(refusal: Refusal) -> ApiError {
    let (status, code) = match refusal {
        Refusal::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "artifact_too_large"),
        Refusal::Unsupported { .. } => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
        Refusal::Mismatch { .. } => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "artifact_type_mismatch"),
    };
    ApiError::new(status, code, refusal.message())
}

fn malformed(e: axum::extract::multipart::MultipartError) -> ApiError {
    bad_request(ApiError::invalid(format!("the multipart form is malformed: {}", e.body_text())))
}

/// Seed 001 answers a malformed request with 400.
fn bad_request(e: ApiError) -> ApiError {
    ApiError { status: StatusCode::BAD_REQUEST, code: "invalid_request", ..e }
}

pub(crate) fn unavailable(e: ArtifactError) -> ApiError {
    tracing::warn!(error = %e, "the artifact store failed");
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "artifact_store_unavailable",
        "the artifact store is unavailable; try again",
    )
}

/// This module's routes, each with its OpenAPI operation (path, method, scope). The upload's body
/// is bounded per file by `FLEET_ARTIFACT_MAX_BYTES` as it is read (and in count by
/// `MAX_FILES`), not by the API's body limit.
pub(crate) fn routes() -> utoipa_axum::router::OpenApiRouter<AppState> {
    utoipa_axum::router::OpenApiRouter::new()
        .routes(utoipa_axum::routes!(upload_artifacts))
        .layer(axum::extract::DefaultBodyLimit::disable())
        .routes(utoipa_axum::routes!(get_artifact))
}

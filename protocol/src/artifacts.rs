//! Seed 001's artifacts as plain data: what an uploaded file's record holds, which files an upload
//! takes (type and size, an image's bytes checked against its declared type), the note the model
//! reads about an upload, and the built-in `load_image` tool that puts an image artifact into a
//! turn's conversation.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::chat::ImageDetail;
use crate::history::HistoryEntry;

/// An artifact's id: `art_` and 32 hex digits.
pub const ARTIFACT_ID_PREFIX: &str = "art_";

/// The largest file an upload takes by default (`FLEET_ARTIFACT_MAX_BYTES`).
pub const DEFAULT_MAX_BYTES: usize = 10 * 1024 * 1024;

/// Files one upload request may carry at most.
pub const MAX_FILES: usize = 20;

/// The built-in tool a turn offers while its session holds image artifacts.
pub const LOAD_IMAGE_TOOL: &str = "load_image";

/// The types an upload takes: images, PDF and text.
pub const ALLOWED_TYPES: [&str; 9] = [
    "image/png",
    "image/jpeg",
    "image/gif",
    "image/webp",
    "application/pdf",
    "text/plain",
    "text/csv",
    "text/markdown",
    "application/json",
];

/// One stored file of a session, as its record in Redis keeps it (the API shows the first four).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Artifact {
    pub artifact_id: String,
    pub filename: String,
    pub mime_type: String,
    pub size_bytes: u64,
    /// RFC 3339.
    pub created_at: String,
    /// The tenant of the token that uploaded it (none: an operator's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

impl Artifact {
    /// Seed 001's `ArtifactReference`: id, filename, type and size.
    pub fn reference(&self) -> Value {
        json!({"artifact_id": self.artifact_id, "filename": self.filename, "mime_type": self.mime_type,
            "size_bytes": self.size_bytes})
    }

    pub fn is_image(&self) -> bool {
        is_image(&self.mime_type)
    }
}

/// A new artifact id (random, 128 bits).
pub fn new_artifact_id() -> String {
    format!("{ARTIFACT_ID_PREFIX}{}", uuid::Uuid::new_v4().simple())
}

/// The name a file is kept under: the last part of the name its client gave (no directories),
/// without control characters, at most 255 characters; `None` when nothing is left.
pub fn clean_filename(given: &str) -> Option<String> {
    let last = given.rsplit(['/', '\\']).next().unwrap_or_default();
    let kept: String = last.chars().filter(|c| !c.is_control()).take(255).collect();
    let kept = kept.trim();
    (!kept.is_empty() && kept != "." && kept != "..").then(|| kept.to_string())
}

/// Whether `id` has an artifact id's shape (so it can name an object's key safely).
pub fn is_artifact_id(id: &str) -> bool {
    id.strip_prefix(ARTIFACT_ID_PREFIX)
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
}

pub fn is_image(mime_type: &str) -> bool {
    mime_type.starts_with("image/")
}

/// Why an upload's file is refused: the status it answers is the caller's (413, 415, 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    TooLarge {
        filename: String,
        max: usize,
    },
    Unsupported {
        filename: String,
        mime_type: String,
    },
    /// An image whose bytes are not the type it says (or not an image at all).
    Mismatch {
        filename: String,
        mime_type: String,
    },
}

impl Refusal {
    pub fn message(&self) -> String {
        match self {
            Refusal::TooLarge { filename, max } => format!("file {filename:?} is over the limit of {max} bytes"),
            Refusal::Unsupported { filename, mime_type } => format!(
                "file {filename:?} has type {mime_type:?}, which is not accepted (accepted: {})",
                ALLOWED_TYPES.join(", ")
            ),
            Refusal::Mismatch { filename, mime_type } => {
                format!("file {filename:?} says it is {mime_type:?}, but its bytes are not")
            }
        }
    }
}

/// The type a part declared, as compared: its essence, lower case (`Text/Plain; charset=utf-8` is
/// `text/plain`).
pub fn essence(content_type: &str) -> String {
    content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase()
}

/// Whether a file of `mime_type` (an essence) with `bytes` may be stored: an accepted type, at
/// most `max` bytes, and an image's bytes starting with its type's magic number.
pub fn check_file(filename: &str, mime_type: &str, bytes: &[u8], max: usize) -> Result<(), Refusal> {
    if bytes.len() > max {
        return Err(Refusal::TooLarge { filename: filename.into(), max });
    }
    if !ALLOWED_TYPES.contains(&mime_type) {
        return Err(Refusal::Unsupported { filename: filename.into(), mime_type: mime_type.into() });
    }
    if is_image(mime_type) && image_type(bytes) != Some(mime_type) {
        return Err(Refusal::Mismatch { filename: filename.into(), mime_type: mime_type.into() });
    }
    Ok(())
}

/// The image type `bytes` start with the magic number of, if any of the accepted four.
pub fn image_type(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// What the model reads about an upload: one line per file, with its id for `load_image`.
pub fn upload_message(artifacts: &[Artifact]) -> String {
    let lines: Vec<String> = artifacts
        .iter()
        .map(|a| {
            let hint = if a.is_image() { format!(" (call {LOAD_IMAGE_TOOL} to see it)") } else { String::new() };
            format!(
                "The user uploaded {} ({}, {} bytes) as artifact {}{hint}.",
                a.filename, a.mime_type, a.size_bytes, a.artifact_id
            )
        })
        .collect();
    lines.join("\n")
}

/// The session's event for an upload (seed 001's shows `artifacts` and `agent_upload_message`).
pub fn upload_event(artifacts: &[Artifact], message: &str) -> Value {
    let references: Vec<Value> = artifacts.iter().map(Artifact::reference).collect();
    json!({"type": "artifact_upload", "artifacts": references, "agent_upload_message": message})
}

/// The history entry that tells the session's later turns of an upload: a user message of its
/// own exchange (the upload's first artifact id), so the budget drops it whole and a listing
/// names what made it.
pub fn upload_entry(artifacts: &[Artifact], message: &str, created_at: &str) -> HistoryEntry {
    let first = artifacts.first().map(|a| a.artifact_id.as_str()).unwrap_or_default();
    HistoryEntry {
        seq: 0,
        id: format!("msg_{first}"),
        exchange: first.to_string(),
        role: "user".into(),
        content: Some(message.to_string()),
        tool_calls: vec![],
        tool_call_id: None,
        reasoning: None,
        created_at: created_at.to_string(),
    }
}

/// The built-in tool's OpenAI function spec, offering the session's image artifacts by id.
pub fn load_image_spec(image_ids: &[String]) -> Option<Value> {
    if image_ids.is_empty() {
        return None;
    }
    Some(json!({"type": "function", "function": {
        "name": LOAD_IMAGE_TOOL,
        "description": "Loads an image the user uploaded into the conversation, so you can see it.",
        "parameters": {"type": "object", "properties": {
            "artifact_id": {"type": "string", "enum": image_ids, "description": "The image artifact to load"},
            "detail": {"type": "string", "enum": ["auto", "low", "high"],
                "description": "How closely to look (default auto)"}},
            "required": ["artifact_id"]}}}))
}

/// A `load_image` call's arguments, checked against the session's artifacts: the image and the
/// detail asked for, or what the model is told instead.
pub fn check_load(arguments: &Value, artifacts: &[Artifact]) -> Result<(Artifact, ImageDetail), String> {
    let id = arguments["artifact_id"].as_str().unwrap_or_default();
    let detail = match arguments.get("detail").and_then(Value::as_str) {
        None => ImageDetail::Auto,
        Some(d) => ImageDetail::parse(d).ok_or_else(|| format!("detail {d:?} is not one of auto, low, high"))?,
    };
    let Some(found) = artifacts.iter().find(|a| a.artifact_id == id) else {
        return Err(format!("artifact_id {id:?} names no artifact of this session"));
    };
    if !found.is_image() {
        return Err(format!("artifact {id} is {}, not an image", found.mime_type));
    }
    Ok((found.clone(), detail))
}

/// The image was put into the conversation (seed 001's event: `artifact_id`, `detail`).
pub fn image_load_event(artifact_id: &str, detail: ImageDetail, message_id: &str) -> Value {
    json!({"type": "image_load", "artifact_id": artifact_id, "detail": detail.as_str(), "message_id": message_id})
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

    fn art(id: &str, mime: &str) -> Artifact {
        Artifact {
            artifact_id: id.into(),
            filename: "f".into(),
            mime_type: mime.into(),
            size_bytes: 3,
            created_at: "t".into(),
            tenant: None,
        }
    }

    #[test]
    fn ids_have_one_shape() {
        let id = new_artifact_id();
        assert!(is_artifact_id(&id), "{id}");
        assert_ne!(id, new_artifact_id());
        for bad in ["art_", "art_xyz", "exec_0123456789abcdef0123456789abcdef", "art_0123456789ABCDEF0123456789abcdef"]
        {
            assert!(!is_artifact_id(bad), "{bad}");
        }
    }

    #[test]
    fn a_file_is_taken_by_its_type_size_and_an_images_bytes() {
        assert_eq!(check_file("a.png", "image/png", PNG, 100), Ok(()));
        assert_eq!(check_file("a.txt", "text/plain", b"hello", 100), Ok(()));
        let big = check_file("big.txt", "text/plain", &[b'x'; 101], 100).unwrap_err();
        assert!(matches!(big, Refusal::TooLarge { max: 100, .. }));
        assert!(big.message().contains("big.txt"));
        let exe = check_file("a.exe", "application/x-msdownload", b"MZ", 100).unwrap_err();
        assert!(exe.message().contains("application/x-msdownload"), "{}", exe.message());
        let lying = check_file("a.png", "image/png", b"GIF89a....", 100).unwrap_err();
        assert!(matches!(lying, Refusal::Mismatch { .. }));
        assert_eq!(essence("Text/Plain; charset=utf-8"), "text/plain");
    }

    #[test]
    fn a_filename_keeps_its_last_part_only() {
        assert_eq!(clean_filename("report.pdf").as_deref(), Some("report.pdf"));
        assert_eq!(clean_filename("../../etc/passwd").as_deref(), Some("passwd"));
        assert_eq!(clean_filename("C:\\Users\\me\\a b.png").as_deref(), Some("a b.png"));
        assert_eq!(clean_filename("x\ny.txt").as_deref(), Some("xy.txt"));
        assert_eq!(clean_filename("dir/"), None);
        assert_eq!(clean_filename(".."), None);
    }

    #[test]
    fn magic_numbers_name_the_four_image_types() {
        assert_eq!(image_type(PNG), Some("image/png"));
        assert_eq!(image_type(&[0xFF, 0xD8, 0xFF, 0xE0]), Some("image/jpeg"));
        assert_eq!(image_type(b"GIF87a"), Some("image/gif"));
        assert_eq!(image_type(b"RIFF\0\0\0\0WEBPVP8 "), Some("image/webp"));
        assert_eq!(image_type(b"%PDF-1.7"), None);
    }

    #[test]
    fn the_note_the_event_and_the_history_entry_name_every_file() {
        let files = [art("art_1", "image/png"), art("art_2", "text/plain")];
        let note = upload_message(&files);
        assert!(note.contains("art_1 (call load_image to see it)") && note.contains("art_2."), "{note}");
        let event = upload_event(&files, &note);
        assert_eq!(
            event["artifacts"][1],
            json!({"artifact_id": "art_2", "filename": "f", "mime_type": "text/plain", "size_bytes": 3})
        );
        let entry = upload_entry(&files, &note, "t");
        assert_eq!((entry.role.as_str(), entry.exchange.as_str()), ("user", "art_1"));
        assert_eq!(entry.to_message().content.as_deref(), Some(note.as_str()));
    }

    #[test]
    fn load_image_offers_and_takes_only_the_sessions_images() {
        assert_eq!(load_image_spec(&[]), None);
        let spec = load_image_spec(&["art_1".into()]).unwrap();
        assert_eq!(spec["function"]["parameters"]["properties"]["artifact_id"]["enum"], json!(["art_1"]));
        let files = [art("art_1", "image/png"), art("art_2", "text/plain")];
        let (found, detail) = check_load(&json!({"artifact_id": "art_1", "detail": "high"}), &files).unwrap();
        assert_eq!((found.artifact_id.as_str(), detail), ("art_1", ImageDetail::High));
        assert_eq!(check_load(&json!({"artifact_id": "art_1"}), &files).unwrap().1, ImageDetail::Auto);
        assert!(check_load(&json!({"artifact_id": "art_2"}), &files).unwrap_err().contains("not an image"));
        assert!(check_load(&json!({"artifact_id": "art_9"}), &files).unwrap_err().contains("no artifact"));
        assert!(check_load(&json!({"artifact_id": "art_1", "detail": "max"}), &files).is_err());
        let event = image_load_event("art_1", ImageDetail::Low, "msg_a");
        assert_eq!((event["artifact_id"].as_str(), event["detail"].as_str()), (Some("art_1"), Some("low")));
    }
}

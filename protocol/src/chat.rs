//! Chat messages as an OpenAI-compatible model reads and writes them: a bottom module, shared by
//! a turn's state, the session history and compaction.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Images the message shows the model (a user message): references only. The bytes live in
    /// the artifact store, and the worker reads them into the request it builds, so a turn's
    /// state in Redis never holds them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<ImageRef>,
    /// The model's reasoning behind this answer, kept only for an agent that asks to have it
    /// replayed (`replay_reasoning`); sent back as `reasoning_content`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

/// An image artifact a message shows, and how closely the model should look.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageRef {
    pub artifact_id: String,
    pub mime_type: String,
    pub detail: ImageDetail,
}

/// OpenAI's `image_url.detail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageDetail {
    Auto,
    Low,
    High,
}

impl ImageDetail {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(ImageDetail::Auto),
            "low" => Some(ImageDetail::Low),
            "high" => Some(ImageDetail::High),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ImageDetail::Auto => "auto",
            ImageDetail::Low => "low",
            ImageDetail::High => "high",
        }
    }
}

impl Message {
    pub fn text(role: &str, content: &str) -> Self {
        Message {
            role: role.into(),
            content: Some(content.into()),
            tool_calls: vec![],
            tool_call_id: None,
            images: vec![],
            reasoning: None,
        }
    }

    /// The OpenAI chat-completions form of this message, its images left out (see
    /// `to_openai_with_images`).
    pub fn to_openai(&self) -> Value {
        let mut m = json!({"role": self.role, "content": self.content});
        if let Some(reasoning) = &self.reasoning {
            m["reasoning_content"] = json!(reasoning);
        }
        if !self.tool_calls.is_empty() {
            m["tool_calls"] = self
                .tool_calls
                .iter()
                .map(
                    |c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}),
                )
                .collect();
        }
        if let Some(id) = &self.tool_call_id {
            m["tool_call_id"] = json!(id);
        }
        m
    }

    /// The OpenAI form with the message's images as content parts: its text, then one
    /// `image_url` part per image whose data URL `data_urls` holds (by place; an image without
    /// one is left out).
    pub fn to_openai_with_images(&self, data_urls: &[Option<String>]) -> Value {
        let mut m = self.to_openai();
        if self.images.is_empty() {
            return m;
        }
        let mut parts = Vec::new();
        if let Some(text) = self.content.as_deref().filter(|t| !t.is_empty()) {
            parts.push(json!({"type": "text", "text": text}));
        }
        for (image, url) in self.images.iter().zip(data_urls) {
            if let Some(url) = url {
                parts.push(json!({"type": "image_url", "image_url": {"url": url, "detail": image.detail.as_str()}}));
            }
        }
        m["content"] = Value::Array(parts);
        m
    }
}

/// A `data:` URL of `bytes` of type `mime_type`, as an `image_url` part carries an image.
pub fn data_url(mime_type: &str, bytes: &[u8]) -> String {
    use base64::Engine;
    format!("data:{mime_type};base64,{}", base64::engine::general_purpose::STANDARD.encode(bytes))
}

/// A tool call the model made: arguments as the raw JSON text the model produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_become_content_parts_only_when_resolved() {
        let mut m = Message::text("user", "[image art_1 loaded]");
        assert_eq!(m.to_openai_with_images(&[]), m.to_openai(), "no images: the plain form");
        m.images.push(ImageRef {
            artifact_id: "art_1".into(),
            mime_type: "image/png".into(),
            detail: ImageDetail::Low,
        });
        assert_eq!(m.to_openai()["content"], "[image art_1 loaded]", "unresolved: the text alone");
        let url = data_url("image/png", b"png");
        assert_eq!(url, "data:image/png;base64,cG5n");
        let sent = m.to_openai_with_images(&[Some(url.clone())]);
        assert_eq!(sent["content"][0], json!({"type": "text", "text": "[image art_1 loaded]"}));
        assert_eq!(sent["content"][1], json!({"type": "image_url", "image_url": {"url": url, "detail": "low"}}));
        let stored = serde_json::to_value(&m).unwrap();
        assert_eq!(stored["images"][0]["artifact_id"], "art_1", "a reference, never the bytes");
        assert!(!serde_json::to_string(&Message::text("user", "x")).unwrap().contains("images"));
    }
}

//! Seed 001's surfaces: who submits an input (its `surface_description`'s `type` and `id`), which
//! surfaces listen to a session now (requests whose answer is still streaming), and what the
//! model is told of them when an input asks (`include`). The `(type, id)` pair is the surface: two
//! open streams of one pair are one surface to the model.

use serde_json::{json, Value};

use crate::agent_session::InputPart;
use crate::turn::InputMessage;

/// How long a listener counts after its stream last refreshed it: a dispatcher that dies with the
/// stream open stops counting its listener within this.
pub const LISTENER_TTL_MS: u64 = 30_000;
/// How often an open stream refreshes its listener, well within `LISTENER_TTL_MS`: a refresh may
/// come this late after the last chunk, and a slow Redis write must still land in time.
pub const LISTENER_REFRESH_MS: u64 = 10_000;

/// The longest `type` or `id` a surface may have.
const MAX_LABEL_BYTES: usize = 128;

/// A surface: its kind (`slack`, `gchat`, `api`, or any label) and its id within that kind (may
/// be empty).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Surface {
    pub kind: String,
    pub id: String,
}

impl Surface {
    /// The surface a description names: a caller that omits `type` is an `api` surface.
    pub fn described(kind: Option<&str>, id: Option<&str>) -> Surface {
        let kind = kind.filter(|k| !k.is_empty()).unwrap_or("api");
        Surface { kind: kind.to_string(), id: id.unwrap_or_default().to_string() }
    }

    /// How the model reads it: `slack:C1`, or the kind alone without an id.
    pub fn label(&self) -> String {
        if self.id.is_empty() {
            self.kind.clone()
        } else {
            format!("{}:{}", self.kind, self.id)
        }
    }

    /// One open stream's entry in the session's listeners: the surface and the stream's own
    /// token, so a stream that ends removes its entry and not another stream's of the same surface.
    pub fn listener_entry(&self, stream: &str) -> String {
        json!([self.kind, self.id, stream]).to_string()
    }

    /// The surface of a listener entry; an entry of another shape is none.
    pub fn of_listener_entry(entry: &str) -> Option<Surface> {
        let v: Value = serde_json::from_str(entry).ok()?;
        let (kind, id) = (v.get(0)?.as_str()?, v.get(1)?.as_str()?);
        Some(Surface { kind: kind.to_string(), id: id.to_string() })
    }
}

/// Whether a description's `type` or `id` (`field`) can be shown to the model as it is: short,
/// with no control characters (a line break would let a label pass for another line of the note).
pub fn check_label(field: &str, value: Option<&str>) -> Result<(), String> {
    let Some(value) = value else { return Ok(()) };
    if value.len() > MAX_LABEL_BYTES {
        return Err(format!("surface_description.{field} is longer than {MAX_LABEL_BYTES} bytes"));
    }
    if value.chars().any(char::is_control) {
        return Err(format!("surface_description.{field} holds a control character"));
    }
    Ok(())
}

/// The surfaces listening now: those of the live listener entries, and `own` (the input's own
/// surface when its answer streams, counted even before its stream registered); each surface once,
/// in a stable order.
pub fn listening(entries: &[String], own: Option<Surface>) -> Vec<Surface> {
    let mut surfaces: Vec<Surface> = entries.iter().filter_map(|e| Surface::of_listener_entry(e)).chain(own).collect();
    surfaces.sort();
    surfaces.dedup();
    surfaces
}

/// What the model is told of the listeners: `[surfaces listening: slack:C1, api]`, or `none`.
pub fn listeners_note(listening: &[Surface]) -> String {
    let labels: Vec<String> = listening.iter().map(Surface::label).collect();
    let named = if labels.is_empty() { "none".to_string() } else { labels.join(", ") };
    format!("[surfaces listening: {named}]")
}

/// The turn's messages for an input's parts, each a user message; a `note` (the listeners, when
/// the input asked) goes before the first part's text, so the roles the model sees stay those of
/// a plain input (some chat templates refuse a system message after the first, or two user
/// messages in a row).
pub fn input_messages(parts: &[InputPart], note: Option<&str>) -> Vec<InputMessage> {
    parts
        .iter()
        .enumerate()
        .map(|(i, part)| {
            let content = match note.filter(|_| i == 0) {
                Some(note) => format!("{note}\n{}", part.for_model()),
                None => part.for_model(),
            };
            InputMessage { role: "user".into(), content }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn surface(kind: &str, id: &str) -> Surface {
        Surface { kind: kind.into(), id: id.into() }
    }

    #[test]
    fn a_description_without_a_type_is_an_api_surface() {
        assert_eq!(Surface::described(None, None), surface("api", ""));
        assert_eq!(Surface::described(Some(""), Some("x")), surface("api", "x"));
        assert_eq!(Surface::described(Some("slack"), Some("C1")).label(), "slack:C1");
        assert_eq!(Surface::described(None, None).label(), "api");
    }

    #[test]
    fn streams_of_one_surface_are_one_listener_and_the_own_surface_counts() {
        let slack = surface("slack", "C1");
        let entries = vec![
            slack.listener_entry("a"),
            slack.listener_entry("b"),
            surface("gchat", "G").listener_entry("c"),
            "not an entry".to_string(),
        ];
        assert_eq!(Surface::of_listener_entry(&entries[0]), Some(slack.clone()));
        assert_ne!(entries[0], entries[1], "each stream has its own entry");
        let heard = listening(&entries, Some(Surface::described(None, None)));
        assert_eq!(heard, [surface("api", ""), surface("gchat", "G"), slack.clone()]);
        assert_eq!(listening(&entries[..2], Some(slack.clone())), [slack]);
    }

    #[test]
    fn the_note_names_each_listener_or_none() {
        assert_eq!(
            listeners_note(&[surface("slack", "C1"), surface("api", "")]),
            "[surfaces listening: slack:C1, api]"
        );
        assert_eq!(listeners_note(&[]), "[surfaces listening: none]");
    }

    #[test]
    fn the_note_goes_before_the_first_parts_text_and_nothing_without_one() {
        let parts = [InputPart::Text("hi".into()), InputPart::Skill("s".into(), "body".into())];
        let told = input_messages(&parts, Some("[surfaces listening: api]"));
        let contents: Vec<&str> = told.iter().map(|m| m.content.as_str()).collect();
        assert_eq!(contents, ["[surfaces listening: api]\nhi", "[skill s]\nbody"]);
        assert!(told.iter().all(|m| m.role == "user"));
        let plain = input_messages(&parts, None);
        assert_eq!(plain[0].content, "hi");
    }

    #[test]
    fn a_label_is_short_and_one_line() {
        assert_eq!(check_label("type", Some("slack")), Ok(()));
        assert_eq!(check_label("id", None), Ok(()));
        assert!(check_label("id", Some("a\nb")).unwrap_err().contains("surface_description.id"));
        assert!(check_label("type", Some(&"x".repeat(129))).unwrap_err().contains("longer"));
    }
}

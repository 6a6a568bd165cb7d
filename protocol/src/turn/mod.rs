//! Agent turns as plain data and functions, one module per concern: the `POST /v1/turns` input
//! (`input`), the turn's persisted state (`state`), the seed's streaming events and their SSE wire
//! format (`events`), and the assembly of an OpenAI-compatible response into whole messages
//! (`completion`). Everything is re-exported here, so a caller names `turn::TurnState`.

mod completion;
mod events;
mod input;
mod state;

pub use completion::*;
pub use events::*;
pub use input::*;
pub use state::*;

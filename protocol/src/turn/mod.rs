//! Agent turns as plain data and functions, one module per concern: the `POST /v1/turns` input
//! (`input`), the turn's persisted state (`state`), the seed's streaming events and their SSE wire
//! format (`events`), the assembly of an OpenAI-compatible response into whole messages
//! (`completion`), and whether a prompt fits its model's window (`context`). Everything is re-exported here, so a caller names `turn::TurnState`.

mod completion;
mod context;
mod events;
mod input;
mod state;

pub use completion::*;
pub use context::*;
pub use events::*;
pub use input::*;
pub use state::*;

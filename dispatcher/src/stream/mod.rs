//! Session streams below the routes: one reader per session shared by all its listeners
//! (`hub.rs`), woken by the announcement of each appended event (no stream polls Redis), a
//! listener's SSE body (`listener.rs`), where a request starts reading (`request.rs`) and a seed
//! 001 streaming request's surface as a listener (`surface.rs`). The routes that serve them and
//! the stream tokens are `crate::routes::stream`.

mod follow;
mod hub;
mod listener;
mod request;
mod surface;

pub(crate) use follow::{Awaited, Follow, Window};
pub use hub::StreamHub;
pub(crate) use hub::Subscription;
pub(crate) use listener::Listener;
pub(crate) use request::{parse as parse_request, Start, StreamId};
pub(crate) use surface::Listening;

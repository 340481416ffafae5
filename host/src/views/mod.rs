//! What the operator looks at: `conduit top` (a live terminal view) and `conduit web` (a local
//! web view). Both are clients of the management API and nothing else: they never open the
//! store or the registry, so what they show is what the daemon answers, and their cost to the
//! daemon is that of its index-backed pages (`GET /v1/overview` and the paged lists).
//!
//! `fmt.rs` is how both write figures for people; `top/` and `web/` import it and not each
//! other.

pub mod fmt;
pub mod top;
pub mod web;

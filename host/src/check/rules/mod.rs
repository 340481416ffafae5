//! The rules of `conduit ext check`, one module per group; their stable ids are in `ids.rs`,
//! what they share in `common.rs`.
//!
//! Each rule is one async function that returns a [`RuleResult`]; it never panics on what the
//! package does, and every wait in it has a timeout. A failure says what was wrong and, in
//! `fix`, what the author should change, in terms of the protocol (`docs/protocol.md`).

pub(crate) mod common;
pub(crate) mod flow;
pub(crate) mod handshake;
pub(crate) mod ids;
pub(crate) mod lifecycle;
pub(crate) mod lines;
pub(crate) mod methods;
pub(crate) mod shapes;

pub use ids::RULES;
pub(crate) use ids::*;

//! conduit's host side, as libraries the `conduit` binary is a thin layer over.
//!
//! One module per concern; this file only lists them. Only the binary (`main.rs`, `cli/`)
//! installs tracing subscribers, prints, and turns errors into exit codes.

pub mod api;
pub mod check;
pub mod client;
pub mod core;
pub mod daemon;
pub mod doctor;
pub mod error_chain;
pub mod manifest;
pub mod packages;
pub mod retention;
pub mod service;
pub mod state_dir;
pub mod telemetry;
pub mod views;

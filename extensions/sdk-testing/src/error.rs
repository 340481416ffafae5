//! What a kit call reports: the extension's own protocol error, the deadline the kit applied,
//! or a protocol rule the extension broke, named as `conduit ext check` names it.
//!
//! A leaf: the scripted host and the artifact store both build these, and it knows neither.
//!
//! Invariant: a [`KitError::Rule`] always carries one of [`rules`]' ids, which are the ids of
//! `conduit ext check`'s report (`conduit ext check --list-rules`), so a failing kit test and a
//! failing check point at the same rule and the same section of `docs/protocol.md`.

use std::time::Duration;

use conduit_protocol::{ErrorCode, RpcError};

/// A rule of the protocol: its id in `conduit ext check`'s report and its section of
/// `docs/protocol.md`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    pub id: &'static str,
    pub section: &'static str,
}

/// The rules a kit test can see broken (ids as `conduit ext check` reports them).
pub mod rules {
    use crate::error::Rule;

    /// `initialize` is answered in time with a well-formed result.
    pub const HANDSHAKE: Rule = Rule {
        id: "handshake",
        section: "§4, §4.2",
    };
    /// The version answered is one the host offered.
    pub const VERSION: Rule = Rule {
        id: "version",
        section: "§4.3, §16",
    };
    /// The handshake declares exactly what the manifest says.
    pub const CAPABILITIES_MATCH: Rule = Rule {
        id: "capabilities-match-manifest",
        section: "§4.2, §16",
    };
    /// Every request is answered, with a result of the method's shape; every artifact stream
    /// keeps the rules of §8.
    pub const DECLARED_METHODS: Rule = Rule {
        id: "declared-methods-answer",
        section: "§6, §8",
    };
    /// A cancelled request is answered (`cancelled`, or its result if it was already done).
    pub const CANCELLATION: Rule = Rule {
        id: "cancellation",
        section: "§9",
    };
    /// `shutdown` is answered `{}` and the session ends.
    pub const SHUTDOWN: Rule = Rule {
        id: "shutdown",
        section: "§5",
    };
}

/// Why a call through the scripted host did not give the result the test asked for.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KitError {
    /// The extension answered with an error object: a protocol error (`invalid_params`,
    /// `method_not_found`, `cancelled`, …) or one of its own.
    #[error("`{method}` was answered with an error: {error}")]
    Answered { method: String, error: RpcError },
    /// No answer within the deadline the kit applied (as the host does, docs/protocol.md §11):
    /// the kit reported `deadline_exceeded` (-32002) and sent `$/cancel`.
    #[error(
        "`{method}`: deadline_exceeded (-32002): no answer within {deadline:?}; the kit sent `$/cancel` as the host does (docs/protocol.md §11)"
    )]
    DeadlineExceeded { method: String, deadline: Duration },
    /// The extension broke a rule of the protocol.
    #[error("rule `{}` (docs/protocol.md {}) broken: {detail}", rule.id, rule.section)]
    Rule { rule: Rule, detail: String },
}

impl KitError {
    pub(crate) fn rule(rule: Rule, detail: impl Into<String>) -> Self {
        KitError::Rule {
            rule,
            detail: detail.into(),
        }
    }

    /// The error code the host would see: the extension's own, `deadline_exceeded` for a
    /// deadline, none for a broken rule.
    pub fn code(&self) -> Option<i32> {
        match self {
            KitError::Answered { error, .. } => Some(error.code),
            KitError::DeadlineExceeded { .. } => Some(ErrorCode::DeadlineExceeded.number()),
            KitError::Rule { .. } => None,
        }
    }

    /// Whether the failure carries `code`.
    pub fn is(&self, code: ErrorCode) -> bool {
        self.code() == Some(code.number())
    }

    /// The id of the rule broken (as `conduit ext check` names it), if that is the failure.
    pub fn rule_id(&self) -> Option<&'static str> {
        match self {
            KitError::Rule { rule, .. } => Some(rule.id),
            _ => None,
        }
    }

    /// The error object the extension answered, if it answered one.
    pub fn rpc_error(&self) -> Option<&RpcError> {
        match self {
            KitError::Answered { error, .. } => Some(error),
            _ => None,
        }
    }
}

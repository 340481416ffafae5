//! What asking to end a record by hand did: a timer deleted, a wait cancelled, a Work closed.
//! Ended records are kept with when (and why) they ended, never erased.
//!
//! A leaf: the record modules return it; it knows none of them.

/// The outcome of ending a record, with the record as it is now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended<T> {
    /// Ended now.
    Now(T),
    /// It had been ended by hand before; nothing changed.
    Already(T),
    /// Its state forbids it (a satisfied wait, a Work finished by the host): nothing changed.
    Refused(T),
}

impl<T> Ended<T> {
    /// The record, whatever the outcome.
    pub fn record(&self) -> &T {
        match self {
            Ended::Now(r) | Ended::Already(r) | Ended::Refused(r) => r,
        }
    }
}

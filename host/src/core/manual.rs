//! What an operator ends by hand, on `Core`: delete a timer, cancel a wait, close a Work
//! (`conduit timers delete`, `waits cancel`, `work close`; `POST /v1/timers/{id}/delete`,
//! `/v1/waits/{id}/cancel`, `/v1/work/{id}/close`). Each is one write transaction; the record
//! is kept with when it ended (and, for a Work, why), never erased.
//!
//! Nothing here calls an extension: a deleted timer simply never comes due, a cancelled wait
//! is no longer offered to its filter, a closed Work takes no more inputs (its key opens a new
//! one).

use std::sync::Arc;

use conduit_store::{Ended, StoreError, Timer, Wait, WorkRecord};

use super::shared::Core;

impl Core {
    /// Delete timer `id`: it stops for good and is kept, marked deleted.
    pub async fn delete_timer(
        self: &Arc<Self>,
        id: i64,
    ) -> Result<Option<Ended<Timer>>, StoreError> {
        let now = conduit_supervisor::now_ms();
        self.write(move |tx| tx.delete_timer(id, now)).await
    }

    /// Cancel wait `id` while it is active; it is kept, `cancelled`.
    pub async fn cancel_wait(self: &Arc<Self>, id: i64) -> Result<Option<Ended<Wait>>, StoreError> {
        let now = conduit_supervisor::now_ms();
        self.write(move |tx| tx.cancel_wait(id, now)).await
    }

    /// Close Work `id` while it is unfinished; it is kept, `done`, with `reason`.
    pub async fn close_work(
        self: &Arc<Self>,
        id: i64,
        reason: Option<String>,
    ) -> Result<Option<Ended<WorkRecord>>, StoreError> {
        let now = conduit_supervisor::now_ms();
        self.write(move |tx| tx.close_work(id, reason.as_deref(), now))
            .await
    }
}

//! When the adapter should call `poll_push` / `poll_pull` next.

use crate::outbox_policy::next_send_at;
use crate::engine::Engine;
use crate::records::Millis;

impl Engine {
    /// The earliest time (never before `now`) at which `poll_push` or `poll_pull` may return
    /// something, or `None` when nothing is waiting (or offline: reconnecting wakes the engine).
    /// Responses and pages are events the adapter waits for anyway, so an in-flight push or an
    /// active run contributes nothing.
    pub fn next_wake(&self, now: Millis) -> Option<Millis> {
        if !self.online {
            return None;
        }
        let push = if self.push.in_flight.is_some() { None } else { self.next_push_at(now) };
        let pull = self.pull.due_at();
        let held = self.health.storage_hold_until.unwrap_or(Millis::MIN);
        push.into_iter().chain(pull).min().map(|at| at.max(now).max(held))
    }

    /// The earliest time a unit becomes sendable (the outbox policy's `next_send_at`).
    fn next_push_at(&self, now: Millis) -> Option<Millis> {
        next_send_at(self.outbox.units().map(|u| self.unit_state(&u, now)), now)
    }
}

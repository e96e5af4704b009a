//! When the adapter should call `poll_push` / `poll_pull` next.

use crate::delivery::UnitState;
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

    /// The earliest time a unit becomes sendable: the first ready one is now; held units wake
    /// at their window's end; the first blocked one wakes at its retry time and hides the rest.
    fn next_push_at(&self, now: Millis) -> Option<Millis> {
        let mut earliest: Option<Millis> = None;
        for unit in self.units() {
            let at = match self.unit_state(&unit, now) {
                UnitState::Ready => now,
                UnitState::Held(until) => until,
                UnitState::Blocked(until) => {
                    earliest = Some(earliest.map_or(until, |e| e.min(until)));
                    break;
                }
            };
            earliest = Some(earliest.map_or(at, |e| e.min(at)));
            if at == now {
                break;
            }
        }
        earliest
    }
}

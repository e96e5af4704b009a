//! One delivery run of `universe-sync`: the adapter loop around the engine's universe policy.
//!
//! Pending events are read in id order, a window at a time (their metadata only); the policy picks
//! the next slice; its mutations are read as the pack wrote them and pushed; what the target
//! answered (or how the request failed) goes back through the policy and is written to the source
//! in one transaction. The run ends when nothing is due now: the outbox is empty, an event backing
//! off blocks the rest, or only events held by `apply_after` remain.

use std::time::{SystemTime, UNIX_EPOCH};

use kizuna_engine::universe::{Delivery, EventState, Update};
use serde::Serialize;

use super::source::Source;
use super::target::Target;

/// Pending events read per window.
const WINDOW: i64 = 2000;

/// What one run did (printed as a JSON line by `universe-sync`).
#[derive(Debug, Default, Clone, Serialize)]
pub struct RunReport {
    /// Push requests sent, and how many of them failed as a whole.
    pub requests: u64,
    pub failed_requests: u64,
    /// Events sent (an event sent twice counts twice).
    pub sent: u64,
    pub applied: u64,
    pub skipped: u64,
    /// Events answered DELAYED, still pending.
    pub delayed: u64,
    /// Events charged an attempt, still pending.
    pub retrying: u64,
    pub dead_lettered: u64,
    /// Acknowledged events removed by `--prune-acked`.
    pub pruned: u64,
    /// When the next pending event is due (unix ms), if one waits.
    pub next_due_ms: Option<i64>,
    /// The last failure of a request, as `CODE: message`.
    pub last_error: Option<String>,
}

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Delivers what is due now.
pub async fn run(source: &Source, target: &Target, delivery: &mut Delivery) -> Result<RunReport, String> {
    let universe = source.identity().await?;
    let mut report = RunReport::default();
    let mut after = 0;
    loop {
        let mut window = source.window(after, WINDOW).await?;
        let Some(last) = window.last().map(|e| e.id) else { break };
        let full = window.len() as i64 == WINDOW;
        loop {
            let mut ids = delivery.next_slice(&window, now_ms());
            if ids.is_empty() {
                break;
            }
            // An event answered DELAYED before goes under a fresh id (`kizuna.universe_claim`).
            for (old, new, key) in source.claim(&ids).await? {
                if let Some(e) = window.iter_mut().find(|e| e.id == old) {
                    (e.id, e.key) = (new, key);
                }
                if let Some(id) = ids.iter_mut().find(|id| **id == old) {
                    *id = new;
                }
            }
            let (sent_ids, mutations) = source.mutations(&ids).await?;
            // Events replaced by a latest-only write since the window was read are not sent.
            window.retain(|e| !ids.contains(&e.id) || sent_ids.contains(&e.id));
            if sent_ids.is_empty() {
                continue;
            }
            let sent: Vec<EventState> = window.iter().filter(|e| sent_ids.contains(&e.id)).cloned().collect();
            report.requests += 1;
            report.sent += sent.len() as u64;
            let updates = match target.push(universe, &mutations).await {
                Ok(response) => delivery.on_response(&sent, &response, now_ms()),
                Err(failure) => {
                    report.failed_requests += 1;
                    report.last_error = Some(failure.describe());
                    delivery.on_failure(&sent, &failure, now_ms())
                }
            };
            source.record(&updates).await?;
            tally(&mut report, &updates);
            apply(&mut window, &updates);
        }
        let now = now_ms();
        report.next_due_ms = match (delivery.next_send_at(&window, now), report.next_due_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // An event backing off blocks everything behind it, in this window and the next ones.
        if !full || delivery.is_blocked(&window, now) {
            break;
        }
        after = last;
    }
    Ok(report)
}

fn tally(report: &mut RunReport, updates: &[Update]) {
    for update in updates {
        match update {
            Update::Acknowledged { skipped: false, .. } => report.applied += 1,
            Update::Acknowledged { skipped: true, .. } => report.skipped += 1,
            Update::Pending { error: None, .. } => report.delayed += 1,
            Update::Pending { .. } => report.retrying += 1,
            Update::DeadLetter { .. } => report.dead_lettered += 1,
        }
    }
}

/// The window as the source now holds it: acknowledged events and dead letters leave it.
fn apply(window: &mut Vec<EventState>, updates: &[Update]) {
    for update in updates {
        match update {
            Update::Acknowledged { id, .. } | Update::DeadLetter { id, .. } => window.retain(|e| e.id != *id),
            Update::Pending { id, attempts, retry_at, error } => {
                if let Some(e) = window.iter_mut().find(|e| e.id == *id) {
                    e.attempts = *attempts;
                    e.retry_at = *retry_at;
                    e.error = error.clone();
                }
            }
        }
    }
}

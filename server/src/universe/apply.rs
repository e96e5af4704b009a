//! The target side of universe sync: counters of this gateway process's apply path, i.e. of pushes
//! whose token names a source universe (`kizuna_universe`). They are process counters, reset when
//! the process starts and kept by no one else: useful for dashboards and alerts, not a durable
//! audit log (the target's durable record is its verdict ledger and `kizuna.status()`).

use std::sync::Mutex;

use prometheus::Registry;
use serde::{Deserialize, Serialize};

use crate::figures::Family;
use crate::jwt::unix_now;
use crate::metrics::PushAnswer;

/// The apply path's figures, as `GET /kizuna/v1/universe-apply` answers them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApplyFigures {
    /// Events applied (new effects).
    pub applied: u64,
    /// Events answered `SKIPPED` (seen before, verdict pruned).
    pub skipped: u64,
    /// Events answered from the verdict ledger (`replayed`: seen before, no new effect).
    pub replayed: u64,
    /// Events answered `DELAYED`.
    pub delayed: u64,
    /// Events refused (`REJECTED`).
    pub rejected: u64,
    /// Universe requests refused as a whole (any error code).
    pub errors: u64,
    /// Unix time of the last universe push answered 200, if any.
    pub last_ok: Option<u64>,
    /// Unix time of the last refused universe request or refused event, if any.
    pub last_error: Option<u64>,
    /// What the last error was: a request's error code, or `REJECTED <reason>`.
    pub last_error_code: Option<String>,
}

/// This process's apply-path counters.
#[derive(Default)]
pub struct ApplyCounters {
    figures: Mutex<ApplyFigures>,
}

impl ApplyCounters {
    /// Counts a universe push answered 200 (the pack's answer as text).
    pub fn record_push(&self, response: &str) {
        let now = unix_now();
        let mut f = self.lock();
        for verdict in PushAnswer::parse(response) {
            if verdict.replayed {
                f.replayed += 1;
                continue;
            }
            match verdict.status.as_str() {
                "APPLIED" => f.applied += 1,
                "SKIPPED" => f.skipped += 1,
                "DELAYED" => f.delayed += 1,
                "REJECTED" => {
                    f.rejected += 1;
                    f.last_error = Some(now);
                    f.last_error_code = Some(format!("REJECTED {}", verdict.reason.as_deref().unwrap_or("UNKNOWN")));
                }
                _ => {}
            }
        }
        f.last_ok = Some(now);
    }

    /// Counts a universe request refused as a whole.
    pub fn record_error(&self, code: &str) {
        let mut f = self.lock();
        f.errors += 1;
        f.last_error = Some(unix_now());
        f.last_error_code = Some(code.to_owned());
    }

    pub fn figures(&self) -> ApplyFigures {
        self.lock().clone()
    }

    /// Adds the figures to a registry built for one rendering.
    pub fn register(&self, registry: &Registry) {
        self.figures().register(registry);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ApplyFigures> {
        // The figures stay usable even if a thread panicked while holding them.
        self.figures.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl ApplyFigures {
    /// The figures as `kizuna_process_universe_apply_*` metrics: what the gateway's `/metrics`
    /// shows, and what `universe-status --target URL --metrics` prints from a target's answer.
    pub fn register(&self, registry: &Registry) {
        let prefix = "kizuna_process_universe_apply";
        let what = "universe-sync apply path, counted by the target gateway process since it started (not durable)";
        for (name, value, help) in [
            ("applied_total", self.applied, "Events applied"),
            ("skipped_total", self.skipped, "Events answered SKIPPED"),
            ("replayed_total", self.replayed, "Events answered from the verdict ledger"),
            ("delayed_total", self.delayed, "Events answered DELAYED"),
            ("rejected_total", self.rejected, "Events refused (REJECTED)"),
            ("errors_total", self.errors, "Universe requests refused as a whole"),
        ] {
            let family = Family::new(&format!("{prefix}_{name}"), &format!("{help}: {what}."), None, true);
            family.set(None, value as f64);
            family.register(registry);
        }
        for (name, value, help) in [
            ("last_ok_timestamp_seconds", self.last_ok, "Unix time of the last universe push answered 200 (0: none yet)"),
            ("last_error_timestamp_seconds", self.last_error, "Unix time of the last refused universe request or event (0: none yet)"),
        ] {
            let family = Family::new(&format!("{prefix}_{name}"), &format!("{help}: {what}."), None, false);
            family.set(None, value.unwrap_or(0) as f64);
            family.register(registry);
        }
    }
}

//! `GET /metrics`: this process's counters (`kizuna_process_*`, reset at restart; the universe-sync
//! apply path's among them) and the durable figures of `kizuna.status()` read at scrape time
//! (`kizuna_*`, the same for every gateway), in the Prometheus text format of the `prometheus` crate.

use std::time::{Duration, Instant};

use kizuna_protocol::Reason;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use serde::Deserialize;
use serde_json::Value;

use crate::figures::{encode, label_safe, register_json, Family};
use crate::jwt::unix_now;
use crate::universe::apply::ApplyCounters;

const ALL_REASONS: [Reason; 6] = [
    Reason::DeleteWins,
    Reason::RlsDenied,
    Reason::ValidationFailed,
    Reason::ConstraintViolation,
    Reason::SchemaMismatch,
    Reason::BatchAborted,
];

/// The durable figures (`kizuna.status()`, whose counts read whole tables), read at most once per
/// `ttl` however often and however many at once scrape: a scrape costs the database a bounded
/// amount whatever the tables' size.
pub struct DurableFigures {
    ttl: Duration,
    last: tokio::sync::Mutex<Option<(Instant, Option<Value>)>>,
}

impl DurableFigures {
    pub fn new(ttl: Duration) -> DurableFigures {
        DurableFigures { ttl, last: tokio::sync::Mutex::new(None) }
    }

    /// The figures, `None` when the database did not answer. Scrapes that arrive while one read is
    /// under way wait for it and share its answer.
    pub async fn read(&self, pool: &deadpool_postgres::Pool) -> Option<Value> {
        let mut last = self.last.lock().await;
        if let Some((at, figures)) = last.as_ref() {
            if at.elapsed() < self.ttl {
                return figures.clone();
            }
        }
        let figures = match pool.get().await {
            Ok(client) => crate::db::status(&client).await.ok(),
            Err(_) => None,
        };
        *last = Some((Instant::now(), figures.clone()));
        figures
    }
}

/// This process's counters, registered in a `prometheus` registry of their own.
pub struct Metrics {
    registry: Registry,
    push_requests: IntCounter,
    applied: IntCounter,
    replayed: IntCounter,
    skipped: IntCounter,
    delayed: IntCounter,
    rejected: IntCounterVec,
    errors: IntCounterVec,
    pull_pages: IntCounter,
    expired_cursors: IntCounter,
    wakes: IntCounter,
    wake_clients: IntGauge,
    last_ok: IntGauge,
    last_error: IntGauge,
    /// The universe-sync apply path: pushes whose token names a source universe.
    pub universe: ApplyCounters,
}

impl Default for Metrics {
    fn default() -> Metrics {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("a valid metric name");
            registry.register(Box::new(c.clone())).expect("registered once");
            c
        };
        let labelled = |name: &str, help: &str, label: &str| {
            let c = IntCounterVec::new(Opts::new(name, help), &[label]).expect("a valid metric name");
            registry.register(Box::new(c.clone())).expect("registered once");
            c
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("a valid metric name");
            registry.register(Box::new(g.clone())).expect("registered once");
            g
        };
        let metrics = Metrics {
            push_requests: counter("kizuna_process_push_requests_total", "Push requests answered 200 by this process."),
            applied: counter("kizuna_process_applied_total", "Mutations applied (new effects) through this process."),
            replayed: counter("kizuna_process_replayed_total", "Mutations answered from the verdict ledger (replayed: true)."),
            skipped: counter("kizuna_process_skipped_total", "Mutations answered SKIPPED (pruned, at or below the watermark)."),
            delayed: counter("kizuna_process_delayed_total", "Mutations answered DELAYED (apply_after in the future)."),
            rejected: labelled("kizuna_process_rejected_total", "Mutations answered REJECTED, by reason.", "reason"),
            errors: labelled("kizuna_process_request_errors_total", "Whole requests refused, by error code.", "code"),
            pull_pages: counter("kizuna_process_pull_pages_total", "Pull pages served by this process."),
            expired_cursors: counter("kizuna_process_expired_cursors_total", "Pull pages served with lifecycle CHECKPOINT_EXPIRED."),
            wakes: counter("kizuna_process_wakes_total", "Wake notifications received from the database."),
            wake_clients: gauge("kizuna_process_wake_clients", "Wake (SSE) streams open on this process."),
            last_ok: gauge("kizuna_process_last_ok_timestamp_seconds", "Unix time of the last successful push or pull (0: none yet)."),
            last_error: gauge("kizuna_process_last_error_timestamp_seconds", "Unix time of the last refused request (0: none yet)."),
            universe: ApplyCounters::default(),
            registry,
        };
        // Every reason is shown from the start, at 0, so that rates work before the first rejection.
        for reason in ALL_REASONS {
            metrics.rejected.with_label_values(&[reason.as_str()]);
        }
        metrics
    }
}

/// The fields of a push answer that are counted; rows and messages are skipped unparsed.
#[derive(Deserialize)]
pub struct PushAnswer {
    #[serde(default)]
    pub verdicts: Vec<VerdictBrief>,
}

#[derive(Deserialize)]
pub struct VerdictBrief {
    pub status: String,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub replayed: bool,
}

impl PushAnswer {
    pub fn parse(response: &str) -> Vec<VerdictBrief> {
        serde_json::from_str::<PushAnswer>(response).map_or_else(|_| Vec::new(), |a| a.verdicts)
    }
}

impl Metrics {
    /// Counts the verdicts of a successful push (the pack's answer as text). A replayed verdict
    /// counts as replayed only: it had no new effect, whatever status it repeats.
    pub fn record_push(&self, response: &str) {
        self.push_requests.inc();
        for verdict in PushAnswer::parse(response) {
            if verdict.replayed {
                self.replayed.inc();
                continue;
            }
            match verdict.status.as_str() {
                "APPLIED" => self.applied.inc(),
                "SKIPPED" => self.skipped.inc(),
                "DELAYED" => self.delayed.inc(),
                "REJECTED" => {
                    let reason = label_safe(verdict.reason.as_deref().unwrap_or("UNKNOWN"));
                    self.rejected.with_label_values(&[reason.as_str()]).inc();
                }
                _ => {}
            }
        }
        self.last_ok.set(unix_now() as i64);
    }

    pub fn record_pull(&self, page: &str) {
        #[derive(Deserialize)]
        struct Page {
            #[serde(default)]
            lifecycle: Option<String>,
        }
        self.pull_pages.inc();
        let lifecycle = serde_json::from_str::<Page>(page).ok().and_then(|p| p.lifecycle);
        if lifecycle.as_deref() == Some("CHECKPOINT_EXPIRED") {
            self.expired_cursors.inc();
        }
        self.last_ok.set(unix_now() as i64);
    }

    pub fn record_error(&self, code: &str) {
        self.errors.with_label_values(&[label_safe(code).as_str()]).inc();
        self.last_error.set(unix_now() as i64);
    }

    pub fn wake_client_connected(&self) {
        self.wake_clients.inc();
    }

    pub fn wake_client_gone(&self) {
        self.wake_clients.dec();
    }

    pub fn record_wake(&self) {
        self.wakes.inc();
    }

    /// The Prometheus text exposition. `status` is `kizuna.status()`, or `None` when the database
    /// did not answer (then `kizuna_up` is 0 and no durable figure is shown).
    pub fn render(&self, status: Option<&Value>) -> String {
        let scrape = Registry::new();
        self.universe.register(&scrape);
        let up = Family::new("kizuna_up", "1 when kizuna.status() answered this scrape.", None, false);
        up.set(None, f64::from(u8::from(status.is_some())));
        up.register(&scrape);
        if let Some(status) = status {
            register_json(&scrape, "kizuna_", status, "Durable figure from kizuna.status():");
        }
        encode(&[&self.registry, &scrape])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_verdicts_and_renders_durable_figures() {
        let m = Metrics::default();
        m.record_push(&json!({"verdicts": [
            {"status": "APPLIED", "replayed": false},
            {"status": "APPLIED", "replayed": true},
            {"status": "REJECTED", "reason": "RLS_DENIED", "replayed": false},
            {"status": "DELAYED", "replayed": false}
        ]}).to_string());
        m.record_pull(&json!({"lifecycle": "CHECKPOINT_EXPIRED"}).to_string());
        m.record_error("KZA01");
        let text = m.render(Some(&json!({"ledger_size": 2, "horizon": 9, "rejected_total": {"RLS_DENIED": 7}, "epoch": "ab12"})));
        for line in [
            "kizuna_process_applied_total 1",
            "kizuna_process_replayed_total 1",
            "kizuna_process_delayed_total 1",
            "kizuna_process_rejected_total{reason=\"DELETE_WINS\"} 0",
            "kizuna_process_rejected_total{reason=\"RLS_DENIED\"} 1",
            "kizuna_process_request_errors_total{code=\"KZA01\"} 1",
            "kizuna_process_pull_pages_total 1",
            "kizuna_process_expired_cursors_total 1",
            "kizuna_ledger_size 2",
            "kizuna_horizon 9",
            "kizuna_rejected_total{reason=\"RLS_DENIED\"} 7",
            "# TYPE kizuna_rejected_total counter",
            "# TYPE kizuna_horizon gauge",
            "kizuna_up 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        assert!(!text.contains("kizuna_epoch"));
    }
}

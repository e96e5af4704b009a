//! `GET /metrics`: this process's counters (`kizuna_process_*`, reset at restart) and the durable
//! figures of `kizuna.status()` read at scrape time (`kizuna_*`, the same for every gateway).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kizuna_protocol::Reason;
use serde::Deserialize;
use serde_json::Value;

use crate::jwt::unix_now;

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

#[derive(Default)]
pub struct Metrics {
    applied: AtomicU64,
    replayed: AtomicU64,
    skipped: AtomicU64,
    delayed: AtomicU64,
    rejected: Mutex<BTreeMap<String, u64>>,
    errors: Mutex<BTreeMap<String, u64>>,
    push_requests: AtomicU64,
    pull_pages: AtomicU64,
    expired_cursors: AtomicU64,
    last_ok: AtomicU64,
    last_error: AtomicU64,
    wake_clients: AtomicU64,
    wakes: AtomicU64,
}

impl Metrics {
    /// Counts the verdicts of a successful push (the pack's answer as text). A replayed verdict
    /// counts as replayed only: it had no new effect, whatever status it repeats.
    pub fn record_push(&self, response: &str) {
        /// Just the fields counted; rows and messages are skipped unparsed.
        #[derive(Deserialize)]
        struct Answer {
            #[serde(default)]
            verdicts: Vec<Brief>,
        }
        #[derive(Deserialize)]
        struct Brief {
            status: String,
            #[serde(default)]
            reason: Option<String>,
            #[serde(default)]
            replayed: bool,
        }
        self.push_requests.fetch_add(1, Relaxed);
        let verdicts = serde_json::from_str::<Answer>(response).map_or_else(|_| Vec::new(), |a| a.verdicts);
        for verdict in verdicts {
            if verdict.replayed {
                self.replayed.fetch_add(1, Relaxed);
                continue;
            }
            match verdict.status.as_str() {
                "APPLIED" => bump(&self.applied),
                "SKIPPED" => bump(&self.skipped),
                "DELAYED" => bump(&self.delayed),
                "REJECTED" => {
                    let reason = verdict.reason.as_deref().unwrap_or("UNKNOWN");
                    *lock(&self.rejected).entry(label_safe(reason)).or_default() += 1;
                }
                _ => {}
            }
        }
        self.last_ok.store(unix_now(), Relaxed);
    }

    pub fn record_pull(&self, page: &str) {
        #[derive(Deserialize)]
        struct Page {
            #[serde(default)]
            lifecycle: Option<String>,
        }
        self.pull_pages.fetch_add(1, Relaxed);
        let lifecycle = serde_json::from_str::<Page>(page).ok().and_then(|p| p.lifecycle);
        if lifecycle.as_deref() == Some("CHECKPOINT_EXPIRED") {
            self.expired_cursors.fetch_add(1, Relaxed);
        }
        self.last_ok.store(unix_now(), Relaxed);
    }

    pub fn record_error(&self, code: &str) {
        *lock(&self.errors).entry(label_safe(code)).or_default() += 1;
        self.last_error.store(unix_now(), Relaxed);
    }

    pub fn wake_client_connected(&self) {
        bump(&self.wake_clients);
    }

    pub fn wake_client_gone(&self) {
        self.wake_clients.fetch_sub(1, Relaxed);
    }

    pub fn record_wake(&self) {
        bump(&self.wakes);
    }

    /// The Prometheus text exposition. `status` is `kizuna.status()`, or `None` when the database
    /// did not answer (then `kizuna_up` is 0 and no durable figure is shown).
    pub fn render(&self, status: Option<&Value>) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}\n"
            );
        };
        counter(
            &mut out,
            "kizuna_process_push_requests_total",
            "Push requests answered 200 by this process.",
            self.push_requests.load(Relaxed),
        );
        counter(
            &mut out,
            "kizuna_process_applied_total",
            "Mutations applied (new effects) through this process.",
            self.applied.load(Relaxed),
        );
        counter(
            &mut out,
            "kizuna_process_replayed_total",
            "Mutations answered from the verdict ledger (replayed: true).",
            self.replayed.load(Relaxed),
        );
        counter(
            &mut out,
            "kizuna_process_skipped_total",
            "Mutations answered SKIPPED (pruned, at or below the watermark).",
            self.skipped.load(Relaxed),
        );
        counter(
            &mut out,
            "kizuna_process_delayed_total",
            "Mutations answered DELAYED (apply_after in the future).",
            self.delayed.load(Relaxed),
        );
        // Every reason is shown from the start, at 0, so that rates work before the first rejection.
        let mut rejected = lock(&self.rejected).clone();
        for reason in ALL_REASONS {
            rejected.entry(reason.as_str().to_owned()).or_default();
        }
        labelled(
            &mut out,
            "kizuna_process_rejected_total",
            "Mutations answered REJECTED, by reason.",
            "reason",
            &rejected,
        );
        labelled(
            &mut out,
            "kizuna_process_request_errors_total",
            "Whole requests refused, by error code.",
            "code",
            &lock(&self.errors),
        );
        counter(
            &mut out,
            "kizuna_process_pull_pages_total",
            "Pull pages served by this process.",
            self.pull_pages.load(Relaxed),
        );
        counter(
            &mut out,
            "kizuna_process_expired_cursors_total",
            "Pull pages served with lifecycle CHECKPOINT_EXPIRED.",
            self.expired_cursors.load(Relaxed),
        );
        counter(
            &mut out,
            "kizuna_process_wakes_total",
            "Wake notifications received from the database.",
            self.wakes.load(Relaxed),
        );
        let gauge = |out: &mut String, name: &str, help: &str, value: String| {
            let _ = write!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}\n"
            );
        };
        gauge(
            &mut out,
            "kizuna_process_wake_clients",
            "Wake (SSE) streams open on this process.",
            self.wake_clients.load(Relaxed).to_string(),
        );
        gauge(
            &mut out,
            "kizuna_process_last_ok_timestamp_seconds",
            "Unix time of the last successful push or pull (0: none yet).",
            self.last_ok.load(Relaxed).to_string(),
        );
        gauge(
            &mut out,
            "kizuna_process_last_error_timestamp_seconds",
            "Unix time of the last refused request (0: none yet).",
            self.last_error.load(Relaxed).to_string(),
        );
        gauge(
            &mut out,
            "kizuna_up",
            "1 when kizuna.status() answered this scrape.",
            u8::from(status.is_some()).to_string(),
        );
        if let Some(status) = status {
            durable_figures(&mut out, status);
        }
        out
    }
}

/// Every number (or boolean) in `kizuna.status()` becomes a metric named after its key, so new
/// figures in the pack show up without a gateway change: `{"ledger_size": 3}` → `kizuna_ledger_size 3`.
/// An object of numbers becomes one labelled family: `{"rejected_total": {"RLS_DENIED": 2}}` →
/// `kizuna_rejected_total{reason="RLS_DENIED"} 2`. Keys ending in `_total` are counters (they
/// survive restarts, being durable); the rest are gauges. Text values (times, epoch) are left out.
fn durable_figures(out: &mut String, status: &Value) {
    let Value::Object(fields) = status else {
        return;
    };
    for (key, value) in fields {
        let name = format!("kizuna_{}", metric_name_safe(key));
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        let header = format!(
            "# HELP {name} Durable figure {key} from kizuna.status().\n# TYPE {name} {kind}\n"
        );
        match value {
            Value::Object(members) => {
                let label = if key.contains("rejected") {
                    "reason"
                } else {
                    "key"
                };
                out.push_str(&header);
                for (member, value) in members {
                    if let Some(number) = as_number(value) {
                        let _ =
                            writeln!(out, "{name}{{{label}=\"{}\"}} {number}", label_safe(member));
                    }
                }
            }
            value => {
                if let Some(number) = as_number(value) {
                    let _ = writeln!(out, "{header}{name} {number}");
                }
            }
        }
    }
}

fn as_number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        _ => None,
    }
}

fn labelled(out: &mut String, name: &str, help: &str, label: &str, values: &BTreeMap<String, u64>) {
    let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} counter\n");
    for (value, count) in values {
        let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {count}");
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Relaxed);
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A counter map stays usable even if a thread panicked while holding it.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Label values come from the pack (reasons, SQLSTATEs), but are escaped all the same.
fn label_safe(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(64)
        .collect()
}

fn metric_name_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
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

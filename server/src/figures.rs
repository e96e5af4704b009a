//! Prometheus exposition of figures that arrive as JSON (the durable figures of `kizuna.status()`,
//! the universe outbox's `kizuna.universe_status()`, a target's apply counters), built with the
//! `prometheus` crate: one registry per rendering, encoded in the text format (0.0.4).

use prometheus::{CounterVec, GaugeVec, Opts, Registry, TextEncoder};
use serde_json::Value;

/// Every number (or boolean) of `figures` becomes a metric named `prefix` + its key, so new figures
/// in the pack show up without a gateway change: `{"ledger_size": 3}` → `kizuna_ledger_size 3`. An
/// object of numbers becomes one labelled family: `{"rejected_total": {"RLS_DENIED": 2}}` →
/// `kizuna_rejected_total{reason="RLS_DENIED"} 2` (label `reason` for keys naming rejections, `key`
/// otherwise). Keys ending in `_total` are counters (durable ones survive restarts); the rest are
/// gauges. Text values (times, ids) are left out.
pub fn register_json(registry: &Registry, prefix: &str, figures: &Value, help: &str) {
    let Value::Object(fields) = figures else {
        return;
    };
    for (key, value) in fields {
        let name = format!("{prefix}{}", metric_name_safe(key));
        let counter = name.ends_with("_total");
        let help = format!("{help} {key}.");
        match value {
            Value::Object(members) => {
                let label = if key.contains("rejected") { "reason" } else { "key" };
                let family = Family::new(&name, &help, Some(label), counter);
                for (member, value) in members {
                    if let Some(number) = as_number(value) {
                        family.set(Some(&label_safe(member)), number);
                    }
                }
                family.register(registry);
            }
            value => {
                if let Some(number) = as_number(value) {
                    let family = Family::new(&name, &help, None, counter);
                    family.set(None, number);
                    family.register(registry);
                }
            }
        }
    }
}

/// One metric family whose values are given, not counted: a gauge, or a counter whose value comes
/// from elsewhere (a durable total, another process's count). The registry it goes into is built
/// for one rendering, so a fresh counter raised by the value shows exactly that value.
pub enum Family {
    Counter(CounterVec),
    Gauge(GaugeVec),
}

impl Family {
    pub fn new(name: &str, help: &str, label: Option<&str>, counter: bool) -> Family {
        let opts = Opts::new(name, help);
        let labels: Vec<&str> = label.into_iter().collect();
        let broken = "metric and label names come from metric_name_safe";
        if counter {
            Family::Counter(CounterVec::new(opts, &labels).expect(broken))
        } else {
            Family::Gauge(GaugeVec::new(opts, &labels).expect(broken))
        }
    }

    /// Sets the value (of the member `label`, for a labelled family). A counter never goes below 0.
    pub fn set(&self, label: Option<&str>, value: f64) {
        let labels: Vec<&str> = label.into_iter().collect();
        match self {
            Family::Counter(vec) => vec.with_label_values(&labels).inc_by(value.max(0.0)),
            Family::Gauge(vec) => vec.with_label_values(&labels).set(value),
        }
    }

    pub fn register(self, registry: &Registry) {
        let _ = match self {
            Family::Counter(vec) => registry.register(Box::new(vec)),
            Family::Gauge(vec) => registry.register(Box::new(vec)),
        };
    }
}

/// The text exposition of every family of `registries`, in order.
pub fn encode(registries: &[&Registry]) -> String {
    let encoder = TextEncoder::new();
    let mut out = String::new();
    for registry in registries {
        let _ = encoder.encode_utf8(&registry.gather(), &mut out);
    }
    out
}

fn as_number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        _ => None,
    }
}

/// Label values come from the pack (reasons, SQLSTATEs), but are cut to a safe alphabet all the same.
pub fn label_safe(s: &str) -> String {
    s.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_').take(64).collect()
}

pub fn metric_name_safe(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect()
}

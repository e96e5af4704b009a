//! Tunables, with the defaults the docs promise.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::outbox_policy::{Charge, DelayWindow, RetryPolicy};
use crate::records::Millis;

/// Engine configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// Most mutations in one push request (an atomic batch larger than this still goes whole).
    /// 256 by default: a backlog goes in a quarter of the requests and commits that 64 took
    /// (10,000 writes pushed in slices of 64 spent about a third of their time on what each
    /// request pays once), and the server's default `max_batch_size` of 500 stays above it.
    pub max_slice: usize,
    /// Consecutive permanent failures a lone write or atomic batch may take before it is
    /// dead-lettered.
    pub max_permanent_failures: u32,
    /// First backoff step; also the least wait after a `DELAYED` answer.
    pub retry_base_ms: Millis,
    /// Backoff cap.
    pub retry_max_ms: Millis,
    /// Entries per pull page asked for.
    pub pull_limit: u32,
    /// Scheduled pull period when no wake-up arrives.
    pub pull_interval_ms: Millis,
    /// Buckets to pull.
    pub buckets: Vec<String>,
    /// Tables whose writes coalesce latest-only by default.
    pub latest_only_tables: BTreeSet<String>,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            max_slice: 256,
            max_permanent_failures: 5,
            retry_base_ms: 1000,
            retry_max_ms: 60_000,
            pull_limit: 1000,
            pull_interval_ms: 30_000,
            buckets: Vec::new(),
            latest_only_tables: BTreeSet::new(),
        }
    }
}

impl Config {
    /// The outbox policy of the browser client: only permanent refusals are charged, at most
    /// `max_permanent_failures` in a row; delay windows are held locally.
    pub fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            retry_base_ms: self.retry_base_ms,
            retry_max_ms: self.retry_max_ms,
            charge: Charge::PermanentOnly,
            permanent_budget: self.max_permanent_failures,
            delay_window: DelayWindow::HoldLocally,
        }
    }
}

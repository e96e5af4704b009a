//! What one device did and saw, in the same form whether the device is the native engine or the
//! real client in a browser: its writes and how each ended, the verdicts and commits it heard in
//! order, and every read of what it showed. The checks (checks.rs) read only this.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use kizuna_engine::protocol::{Reason, Row};
use kizuna_engine::OutboxEntry;
use serde_json::Value;
use uuid::Uuid;

/// How the history names a row: `table/pk`.
pub fn row_name(table: &str, pk: &str) -> String {
    format!("{table}/{pk}")
}

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// How a mutation ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Applied at this commit number (`None`: SKIPPED, its commit unknown).
    Applied(Option<i64>),
    Rejected(Reason),
    DeadLettered,
    /// Replaced in the outbox by a newer latest-only write to its key before it was sent.
    Coalesced,
}

/// When something happened on a device, in its own order: a page of the browser client numbers
/// what it hears from 0, so a moment is (page, number); a native client has one page. Something a
/// page heard as it went away may reach the history after the next page's first events, and is
/// still before all of them.
pub type At = (u64, u64);

/// A verdict or a commit, in the order the device heard them. A verdict carries the buckets the
/// device followed when it heard it: a row it places outside them is not kept.
#[derive(Debug, Clone)]
pub enum Heard {
    /// `bucket`: where the server placed the row.
    /// `buckets`: the sets of buckets the device may have decided it under (see `Record::applied`).
    Applied { id: Uuid, seq: Option<i64>, bucket: Option<String>, buckets: Vec<Vec<String>> },
    /// A refusal: the row becomes the server's row (`None`: none may be shown).
    Rejected { table: String, pk: String, server_row: Option<Row>, buckets: Vec<Vec<String>> },
    Committed { horizon: i64 },
}

/// One read of everything the device showed of the checker's tables, at one moment.
#[derive(Debug, Clone)]
pub struct Read {
    /// When it read: what was heard before then is in what it read.
    pub at: At,
    /// The committed checkpoint it read on.
    pub horizon: i64,
    /// The bucket set of that checkpoint: what its rows are the server's state of. It differs from
    /// `buckets` between a change of the app's buckets and the pull that brings the new set.
    pub checkpoint_buckets: Vec<String>,
    /// The buckets the device follows (a verdict for a row outside them leaves no row).
    pub buckets: Vec<String>,
    /// The visible rows, by `table/pk`.
    pub rows: BTreeMap<String, Value>,
    /// The writes still pending, in issue order.
    pub pending: Vec<OutboxEntry>,
}

pub struct Record {
    pub name: String,
    pub user: String,
    /// The buckets the device follows now.
    pub buckets: Vec<String>,
    /// Every mutation the device made, as last seen pending, by id.
    pub writes: BTreeMap<Uuid, OutboxEntry>,
    pub outcomes: BTreeMap<Uuid, Outcome>,
    /// Verdicts and commits, as they reached the history, each with when the device heard it.
    pub heard: Vec<(At, Heard)>,
    pub reads: Vec<Read>,
    /// Violations seen while running (read-your-writes at write time, a write's watermark).
    pub violations: Vec<String>,
    /// What happened, line by line with the time in microseconds: writes, mutations sent and
    /// their verdicts, entries pulled, commits, reloads. Printed for the keys of a violation.
    pub trace: Vec<(i64, String)>,
    pub ops: u64,
}

impl Record {
    pub fn new(name: String, user: String, buckets: Vec<String>) -> Record {
        Record {
            name,
            user,
            buckets,
            writes: BTreeMap::new(),
            outcomes: BTreeMap::new(),
            heard: Vec::new(),
            reads: Vec::new(),
            violations: Vec::new(),
            trace: Vec::new(),
            ops: 0,
        }
    }

    pub fn note(&mut self, line: String) {
        let micros = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64);
        self.trace.push((micros, format!("{} {line}", self.name)));
    }

    /// A verdict: APPLIED (or SKIPPED, with no commit number) at `seq`. A write commits after the
    /// read watermark it was made on (writes follow reads). `kept_from`: heard as a browser page
    /// opened, it may be one the page before kept and did not tell, decided under the buckets that
    /// page followed (or under `buckets`, when it is the new page's own).
    pub fn applied(&mut self, at: At, id: Uuid, seq: Option<i64>, bucket: Option<String>, kept_from: Option<&[String]>) {
        if let (Some(entry), Some(seq)) = (self.writes.get(&id), seq) {
            if seq <= entry.read_seq {
                self.violations.push(format!(
                    "{}: write {} committed at {seq}, not after the read watermark {} it was made on",
                    self.name, entry.seq, entry.read_seq
                ));
            }
        }
        self.outcomes.insert(id, Outcome::Applied(seq));
        self.heard.push((at, Heard::Applied { id, seq, bucket, buckets: self.bucket_sets(kept_from) }));
    }

    /// A refusal; `kept_from` as for `applied`.
    pub fn rejected(&mut self, at: At, entry: &OutboxEntry, reason: Reason, server_row: Option<Row>, kept_from: Option<&[String]>) {
        self.outcomes.insert(entry.id, Outcome::Rejected(reason));
        self.heard.push((at, Heard::Rejected { table: entry.table.clone(), pk: entry.pk.clone(), server_row, buckets: self.bucket_sets(kept_from) }));
    }

    /// The bucket sets a verdict heard now may have been decided under.
    fn bucket_sets(&self, kept_from: Option<&[String]>) -> Vec<Vec<String>> {
        kept_from.map(<[String]>::to_vec).into_iter().chain([self.buckets.clone()]).collect()
    }

    /// A checkpoint committed: the read position never goes back.
    pub fn committed(&mut self, at: At, horizon: i64) {
        let before = self.horizon();
        if horizon < before {
            self.violations.push(format!("{}: the checkpoint went back from {before} to {horizon}", self.name));
        }
        self.heard.push((at, Heard::Committed { horizon }));
    }

    /// The horizon of the last checkpoint heard committed (0: none yet).
    pub fn horizon(&self) -> i64 {
        self.heard.iter().rev().find_map(|(_, h)| if let Heard::Committed { horizon } = h { Some(*horizon) } else { None }).unwrap_or(0)
    }
}

impl Record {
    /// What the device did and heard, in one line.
    pub fn summary(&self) -> String {
        let count = |f: &dyn Fn(&Outcome) -> bool| self.outcomes.values().filter(|o| f(o)).count();
        let commits = self.heard.iter().filter(|(_, h)| matches!(h, Heard::Committed { .. })).count();
        format!(
            "{}: {} writes ({} applied, {} refused, {} dead-lettered, {} coalesced), {} commits, {} reads, last horizon {}",
            self.name,
            self.writes.len(),
            count(&|o| matches!(o, Outcome::Applied(_))),
            count(&|o| matches!(o, Outcome::Rejected(_))),
            count(&|o| matches!(o, Outcome::DeadLettered)),
            count(&|o| matches!(o, Outcome::Coalesced)),
            commits,
            self.reads.len(),
            self.horizon()
        )
    }
}

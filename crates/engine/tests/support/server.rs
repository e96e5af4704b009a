//! A simulated Kizuna server: a verdict ledger (idempotency), a numbered change log served as
//! paged pulls with a fixed horizon per run, and knobs for every failure the tests need.

use std::collections::{BTreeMap, HashMap};

use kizuna_engine::Failure;
use kizuna_engine::protocol::{
    Conflict, Entry, Lifecycle, Mutation, Op, PullPage, PullRequest, PushRequest, PushResponse, Reason, Row, Verdict,
    VerdictStatus, codes,
};
use kizuna_engine::util::apply_op;
use uuid::Uuid;

#[derive(Debug, Clone)]
pub struct LogEntry {
    pub seq: i64,
    pub table: String,
    pub pk: String,
    pub row: Option<Row>,
}

#[derive(Debug, Default)]
pub struct SimServer {
    /// Server clock minus client clock, for `DELAYED` answers the client did not expect.
    pub clock_skew_ms: i64,
    pub log: Vec<LogEntry>,
    pub next_seq: i64,
    pub ledger: HashMap<Uuid, Verdict>,
    /// How many times each mutation's effect was applied (exactly-once checks).
    pub effects: HashMap<Uuid, u32>,
    /// `client_seq` of each applied mutation, in apply order.
    pub applied_order: Vec<i64>,
    /// `client_seq`s of every push request received, in order.
    pub requests: Vec<Vec<i64>>,
    /// Any request carrying a mutation for this pk fails as a whole with (status, code).
    pub poison: BTreeMap<String, (u16, String)>,
    /// Mutations for this pk are refused with this reason.
    pub reject: BTreeMap<String, Reason>,
    pub max_batch_size: Option<usize>,
    /// The next push commits but its answer is lost.
    pub lose_next_ack: bool,
    /// Runs that started from a committed cursor below this sequence number expire.
    pub expire_below: Option<i64>,
    /// Cursors name the epoch they were issued in; another epoch answers SERVER_RESET.
    pub epoch: u32,
    /// Attached to the next closing page.
    pub conflicts: Vec<Conflict>,
    /// The ledger was pruned up to here: an unknown id at or below it answers SKIPPED.
    pub pruned_seq: i64,
    pub pulls: u32,
}

impl SimServer {
    pub fn new() -> SimServer {
        SimServer { next_seq: 1, ..SimServer::default() }
    }

    pub fn row(&self, table: &str, pk: &str) -> Option<Row> {
        self.log.iter().rev().find(|e| e.table == table && e.pk == pk).and_then(|e| e.row.clone())
    }

    /// The reaper pruned every recorded verdict (the effects stay).
    pub fn prune_ledger(&mut self) {
        self.pruned_seq = self.requests.iter().flatten().copied().max().unwrap_or(0).max(self.pruned_seq);
        self.ledger.clear();
    }

    pub fn horizon(&self) -> i64 {
        self.next_seq - 1
    }

    /// A write made elsewhere (another device, psql).
    pub fn remote_write(&mut self, table: &str, pk: &str, op: Op, columns: Option<Row>) -> i64 {
        let row = apply_op(self.row(table, pk), op, columns.as_ref());
        self.append(table, pk, row)
    }

    fn append(&mut self, table: &str, pk: &str, row: Option<Row>) -> i64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.log.push(LogEntry { seq, table: table.into(), pk: pk.into(), row });
        seq
    }

    pub fn sends(&self) -> usize {
        self.requests.len()
    }

    pub fn push(&mut self, now: i64, request: PushRequest) -> Result<PushResponse, Failure> {
        self.requests.push(request.mutations.iter().map(|m| m.client_seq).collect());
        for m in &request.mutations {
            if let Some((status, code)) = self.poison.get(&m.pk) {
                return Err(Failure { status: Some(*status), code: code.clone(), message: format!("poisoned {}", m.pk) });
            }
        }
        if let Some(max) = self.max_batch_size {
            if request.mutations.len() > max {
                return Err(Failure { status: Some(400), code: codes::BATCH_TOO_LARGE.into(), message: "too many".into() });
            }
        }
        let server_now = now + self.clock_skew_ms;
        let mut verdicts = Vec::new();
        let mut i = 0;
        while i < request.mutations.len() {
            // One atomic group: a lone mutation, or the run of members sharing a batch id.
            let batch = request.mutations[i].batch;
            let mut j = i + 1;
            while batch.is_some() && j < request.mutations.len() && request.mutations[j].batch == batch {
                j += 1;
            }
            verdicts.extend(self.judge_group(server_now, &request.mutations[i..j]));
            i = j;
        }
        let response = PushResponse { verdicts, last_mutation_id: request.mutations.iter().map(|m| m.client_seq).max().unwrap_or(0) };
        if self.lose_next_ack {
            self.lose_next_ack = false;
            return Err(Failure { status: None, code: codes::NETWORK.into(), message: "connection reset".into() });
        }
        Ok(response)
    }

    fn judge_group(&mut self, server_now: i64, group: &[Mutation]) -> Vec<Verdict> {
        // Replays first: a recorded verdict is returned as is, with no new effect.
        if group.iter().all(|m| self.ledger.contains_key(&m.id)) {
            return group.iter().map(|m| Verdict { replayed: true, ..self.ledger[&m.id].clone() }).collect();
        }
        if group.iter().all(|m| m.client_seq <= self.pruned_seq) {
            return group.iter().map(|m| verdict(m.id, VerdictStatus::Skipped, None, None, None)).collect();
        }
        if group.iter().any(|m| m.apply_after.as_deref().map(parse_rfc3339).is_some_and(|t| t > server_now)) {
            return group.iter().map(|m| verdict(m.id, VerdictStatus::Delayed, None, None, None)).collect();
        }
        if let Some(culprit) = group.iter().find(|m| self.reject.contains_key(&m.pk)) {
            let verdicts: Vec<Verdict> = group
                .iter()
                .map(|m| {
                    let reason = if m.id == culprit.id { self.reject[&m.pk] } else { Reason::BatchAborted };
                    verdict(m.id, VerdictStatus::Rejected, None, Some(reason), self.row(&m.table, &m.pk))
                })
                .collect();
            for v in &verdicts {
                self.ledger.insert(v.id, v.clone());
            }
            return verdicts;
        }
        let mut out = Vec::new();
        for m in group {
            let row = apply_op(self.row(&m.table, &m.pk), m.op, m.columns.as_ref());
            let seq = self.append(&m.table, &m.pk, row);
            *self.effects.entry(m.id).or_default() += 1;
            self.applied_order.push(m.client_seq);
            let v = verdict(m.id, VerdictStatus::Applied, Some(seq), None, None);
            self.ledger.insert(m.id, v.clone());
            out.push(v);
        }
        out
    }

    pub fn pull(&mut self, request: &PullRequest) -> PullPage {
        self.pulls += 1;
        let (start, horizon, offset, epoch) = match request.cursor.as_deref() {
            None => (0, self.horizon(), 0, self.epoch),
            Some(c) => {
                let parts: Vec<i64> = c.trim_start_matches("v1:").split(':').map(|p| p.parse().unwrap()).collect();
                match parts.as_slice() {
                    [e, h] => (*h, self.horizon(), 0, *e as u32),
                    [e, s, h, o] => (*s, *h, *o as usize, *e as u32),
                    _ => panic!("bad cursor {c}"),
                }
            }
        };
        let lifecycle = if epoch != self.epoch {
            Some(Lifecycle::ServerReset)
        } else if start > 0 && self.expire_below.is_some_and(|floor| start < floor) {
            // Judged by the run's starting checkpoint, also between pages; a run from null (start 0) always completes.
            Some(Lifecycle::CheckpointExpired)
        } else {
            None
        };
        if let Some(signal) = lifecycle {
            return PullPage { entries: vec![], cursor: String::new(), done: false, horizon, lifecycle: Some(signal), conflicts: None, total: None };
        }
        // The snapshot at `horizon`: the last state of each key changed in (start, horizon].
        let mut latest: BTreeMap<(String, String), &LogEntry> = BTreeMap::new();
        for e in self.log.iter().filter(|e| e.seq > start && e.seq <= horizon) {
            latest.insert((e.table.clone(), e.pk.clone()), e);
        }
        let mut all: Vec<&LogEntry> = latest.into_values().collect();
        all.sort_by_key(|e| e.seq);
        let page: Vec<Entry> = all
            .iter()
            .skip(offset)
            .take(request.limit as usize)
            .map(|e| Entry {
                seq: e.seq,
                table: e.table.clone(),
                pk: e.pk.clone(),
                bucket: "b".into(),
                deleted: e.row.is_none(),
                row: e.row.clone(),
            })
            .collect();
        let reached = offset + page.len();
        let done = reached >= all.len();
        let cursor = if done { format!("v1:{}:{}", self.epoch, horizon) } else { format!("v1:{}:{}:{}:{}", self.epoch, start, horizon, reached) };
        let conflicts = if done && !self.conflicts.is_empty() { Some(std::mem::take(&mut self.conflicts)) } else { None };
        // A run's first page counts the run, as the pack does (kizuna.run_total).
        let total = (offset == 0).then_some(all.len() as u64);
        PullPage { entries: page, cursor, done, horizon, lifecycle: None, conflicts, total }
    }
}

fn verdict(id: Uuid, status: VerdictStatus, seq: Option<i64>, reason: Option<Reason>, server_row: Option<Row>) -> Verdict {
    Verdict { id, status, seq, reason, bucket: None, pk: None, message: None, server_row, replayed: false, server_row_text: None }
}

/// Reads the `YYYY-MM-DDTHH:MM:SS.mmmZ` the engine writes.
pub fn parse_rfc3339(s: &str) -> i64 {
    let n = |r: std::ops::Range<usize>| s[r].parse::<i64>().unwrap();
    let (y, m, d) = (n(0..4), n(5..7), n(8..10));
    let (h, mi, sec, ms) = (n(11..13), n(14..16), n(17..19), n(20..23));
    // Howard Hinnant's days_from_civil.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    ((days * 24 + h) * 60 + mi) * 60_000 + sec * 1000 + ms
}

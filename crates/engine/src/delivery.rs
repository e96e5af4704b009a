//! Push: which writes go out next, in which slice (verdicts: `verdicts.rs`; whole-request
//! failures, retries and narrowing: `push_failures.rs`).
//!
//! ## Order
//! A request carries delivery units (a lone write, or every member of one atomic batch, never
//! split) in issue order. A unit whose `retry_at` lies ahead blocks everything behind it, which
//! keeps a device's writes in the order it made them (monotonic writes); only a dead letter lets
//! a later write pass an earlier one.
//!
//! One request is in flight, and at most one more *ahead* of its answer: once the server has
//! begun to answer the first with success, its writes are committed (an answer's status follows
//! its transaction's commit), so the next slice may go while the first answer is still being read
//! and settled, and the server still receives the writes in issue order ([`Engine::poll_push_ahead`]).
//!
//! Units holding a delay window (`apply_after` set) are the exception: they are skipped while
//! held instead of blocking. The window asks for the write to apply later than the writes
//! made after it, and the server judges `apply_after` per mutation (`DELAYED`) anyway, so
//! blocking on it would only stall the queue without adding an ordering guarantee.
//!
//! ## Narrowing
//! A permanent refusal of a slice of several units names no culprit, so nothing is charged.
//! The slice width is narrowed instead and the next slice goes out at once: halved on `KZP02`
//! (too many mutations), cut to the head unit on any other permanent code. The narrowed width
//! (`Meta::slice_limit`, persisted) stays until a dead letter is recorded or the outbox
//! drains: widening again after each success would resend the culprit in a wide slice and
//! restart the search, while keeping it makes the `KZP02` search logarithmic. Once the
//! culprit goes alone, it owns its budget: five consecutive permanent refusals dead-letter it.

use kizuna_protocol::{Mutation, PROTOCOL_VERSION, PushRequest};

use crate::engine::Engine;
use crate::outbox_policy::{next_slice, Timing, UnitState};
use crate::records::{Millis, OutboxEntry};
use crate::transaction::{StoreOp, Transaction};
use crate::wire_time::rfc3339;

/// The push in flight, if any, and the one sent ahead of its answer.
#[derive(Debug, Default)]
pub(crate) struct PushState {
    /// The request whose answer comes next.
    pub in_flight: Option<InFlight>,
    /// The request sent after `in_flight` began to answer with success; it answers after it.
    pub ahead: Option<InFlight>,
    /// Consecutive failed push requests: the backoff exponent for retryable failures.
    pub streak: u32,
}

/// What was sent, by delivery unit.
#[derive(Debug, Clone)]
pub(crate) struct InFlight {
    pub units: Vec<Vec<i64>>,
}

impl InFlight {
    pub(crate) fn seqs(&self) -> impl Iterator<Item = i64> + '_ {
        self.units.iter().flatten().copied()
    }
}

impl PushState {
    /// The request an answer (or a failure) belongs to: the one in flight, with the one sent
    /// ahead of it moving up to be answered next.
    pub(crate) fn take_answered(&mut self) -> Option<InFlight> {
        let answered = self.in_flight.take();
        self.in_flight = self.ahead.take();
        answered
    }

    /// Nothing in flight any more: what was sent goes again, under the same ids.
    pub(crate) fn forget(&mut self) {
        self.in_flight = None;
        self.ahead = None;
    }
}

impl Engine {
    /// The next push request, if one is due: never while one is in flight or offline. The slice's
    /// entries are marked `sent` with one more attempt. The transaction writes the mark of the
    /// latest-only entries, the only ones a later write may coalesce into; persist it before
    /// sending, so that a reload cannot coalesce away a write the server may hold. The others'
    /// marks are written with their next change (a refusal, a retry) or leave with them when they
    /// are applied: rewriting every entry of every slice cost the push one more store transaction
    /// of the slice's whole size, and a reload during the request only forgets one attempt count.
    pub fn poll_push(&mut self, now: Millis) -> Option<(PushRequest, Transaction)> {
        let units = self.due_slice(now)?;
        let (request, tx, sent) = self.send(units);
        self.push.in_flight = Some(sent);
        Some((request, tx))
    }

    /// `poll_push` when the due slice writes nothing before it goes (it holds no latest-only
    /// entry): an adapter may send it without a store transaction first, even while the previous
    /// answer's step is still being written. `None`, and nothing marked, when no slice is due or
    /// the due one would write. The slice is worked out once (it walks the whole outbox).
    pub fn poll_push_unwritten(&mut self, now: Millis) -> Option<PushRequest> {
        let units = self.due_slice(now)?;
        if !self.writes_nothing_first(&units) {
            return None;
        }
        let (request, _, sent) = self.send(units);
        self.push.in_flight = Some(sent);
        Some(request)
    }

    /// The next slice while one is in flight, to send once that one's answer has begun with a
    /// success status and before it is read: its writes are then committed on the server, so this
    /// slice reaches it after them, as issue order asks. Only a slice that writes nothing first
    /// (as `poll_push_unwritten`), and only one ahead at a time. `None`, and nothing marked,
    /// otherwise. The adapter must take the answers in the order the requests went: the one in
    /// flight, then this one.
    pub fn poll_push_ahead(&mut self, now: Millis) -> Option<PushRequest> {
        let front = self.push.in_flight.as_ref()?;
        if self.push.ahead.is_some() || !self.online || self.storage_held(now) {
            return None;
        }
        let sent = crate::order::set_of(front.seqs());
        let units = self.next_slice(now, &sent);
        if units.is_empty() || !self.writes_nothing_first(&units) {
            return None;
        }
        let (request, _, sent) = self.send(units);
        self.push.ahead = Some(sent);
        Some(request)
    }

    /// True when sending `units` writes no mark first (they hold no latest-only entry).
    fn writes_nothing_first(&self, units: &[Vec<i64>]) -> bool {
        units.iter().flatten().all(|seq| self.outbox.get(seq).is_some_and(|e| !e.latest_only))
    }

    /// Marks `units` sent: their request, the marks that must be written first, and what is then
    /// in flight.
    fn send(&mut self, units: Vec<Vec<i64>>) -> (PushRequest, Transaction, InFlight) {
        let mut tx = Transaction::default();
        let mut mutations = Vec::new();
        for seq in units.iter().flatten() {
            let entry = self.outbox.get_mut(seq).expect("slice entries are live");
            entry.sent = true;
            entry.attempts += 1;
            mutations.push(to_mutation(entry));
            if entry.latest_only {
                tx.ops.push(StoreOp::PutOutbox(entry.clone()));
            }
        }
        let request = PushRequest { protocol: PROTOCOL_VERSION, client_id: self.meta.client_id, mutations };
        (request, tx, InFlight { units })
    }

    /// Whether `poll_push` would return a slice at `now`, as far as this engine's state knows: a
    /// timer that fired for a pull need not open a store transaction to learn there is nothing to
    /// push (another tab's write this engine has not heard of yet goes when its news arrives).
    pub fn push_due(&self, now: Millis) -> bool {
        self.due_slice(now).is_some()
    }

    /// The slice to send at `now`, if a push may go: never while one is in flight or offline.
    fn due_slice(&self, now: Millis) -> Option<Vec<Vec<i64>>> {
        if !self.online || self.push.in_flight.is_some() || self.storage_held(now) {
            return None;
        }
        Some(self.next_slice(now, &Default::default())).filter(|units| !units.is_empty())
    }

    /// The app asked to sync now: writes waiting out the backoff of a retryable failure (the
    /// network, a 5xx) are due again at once. Delay windows still hold, and so does the backoff of
    /// a write the server refused: its dead-letter budget is charged at the timers' pace (about
    /// 1 + 2 + 4 + 8 s by default) however often the app calls `sync()`.
    pub fn request_push(&mut self) {
        for entry in self.outbox.values_mut() {
            if entry.apply_after.is_none() && entry.permanent_failures == 0 {
                entry.retry_at = None;
            }
        }
    }

    /// The current slice width: `Config::max_slice`, or the narrowed width while a permanent
    /// failure is being isolated.
    pub fn slice_limit(&self) -> usize {
        let max = self.config.max_slice.max(1);
        self.meta.slice_limit.map_or(max, |n| (n as usize).clamp(1, max))
    }

    /// Where a delivery unit stands at `now`, by the outbox policy.
    pub(crate) fn unit_state(&self, unit: &[i64], now: Millis) -> UnitState {
        let timings = unit.iter().map(|s| &self.outbox[s]).map(|e| Timing { apply_after: e.apply_after, retry_at: e.retry_at, failed: e.last_error.is_some() });
        self.config.retry_policy().unit_state(timings, now)
    }

    /// Units for the next request: ready units in issue order up to the slice width (at least
    /// one unit, so a batch wider than the limit still goes whole), skipping held ones and those
    /// already `sent` in flight, and stopping at the first blocked one.
    fn next_slice(&self, now: Millis, sent: &std::collections::BTreeSet<i64>) -> Vec<Vec<i64>> {
        let mut read: Vec<Option<Vec<i64>>> = Vec::new();
        let judged = self.outbox.units().filter(|unit| !unit.iter().any(|seq| sent.contains(seq))).map(|unit| {
            let judged = (unit.len(), self.unit_state(&unit, now));
            read.push(Some(unit));
            judged
        });
        let picked = next_slice(judged, self.slice_limit());
        picked.into_iter().filter_map(|i| read[i].take()).collect()
    }
}

/// The wire form of an entry.
fn to_mutation(entry: &OutboxEntry) -> Mutation {
    Mutation {
        id: entry.id,
        client_seq: entry.seq,
        table: entry.table.clone(),
        pk: entry.pk.clone(),
        op: entry.op,
        columns: entry.columns.clone(),
        hlc: Some(entry.hlc.clone()),
        read_seq: entry.read_seq,
        batch: entry.batch,
        apply_after: entry.apply_after.map(rfc3339),
    }
}

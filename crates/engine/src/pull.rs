//! Pull runs: one at a time, pages staged until the closing page, lifecycle restarts.
//!
//! A run starts from the committed cursor (`null` before the first commit or when
//! rehydrating). Pages with `done: false` go to `staging`; the page with `done: true` yields
//! a [`CommitPlan`](crate::CommitPlan) the adapter executes in one IndexedDB transaction. A run
//! cut off anywhere (failure, refused page, reload) leaves the committed rows and cursor as
//! they were; the next run starts over from the committed cursor.
//!
//! The committed cursor never moves backwards: a page whose horizon is below the committed
//! horizon (or below an earlier page of the same run) is refused and the run abandoned. The
//! one exception is a rehydrate after `SERVER_RESET`: the server's history was replaced, so
//! the new snapshot's horizon stands on its own (the seed's "a rehydrate replaces the
//! expired local snapshot instead of continuing its old history").

use kizuna_protocol::{Conflict, ErrorClass, Lifecycle, PROTOCOL_VERSION, PullPage, PullRequest};

use crate::backoff;
use crate::commit::{ClosingEntries, CommitPlan};
use crate::engine::Engine;
use crate::inputs::Failure;
use crate::records::Millis;
use crate::transaction::{Event, StoreOp, Transaction};

/// What to do with a page.
#[derive(Debug)]
pub enum PullStep {
    /// Persist the page to staging (with a progress event), then send `next`.
    Stage {
        /// `PutStaging` (preceded by `ClearStaging` on a run's first page) and `PullProgress`.
        tx: Transaction,
        /// The request for the next page.
        next: PullRequest,
    },
    /// The run reached `done: true`: execute the plan in one IndexedDB transaction.
    Commit(CommitPlan),
    /// A lifecycle signal: apply `tx` (the announcement and `ClearStaging`), then send `next`,
    /// which pulls from `null` in rehydrate mode.
    Restart {
        /// `ClearStaging` and `CheckpointExpired` / `ServerReset`.
        tx: Transaction,
        /// The first request of the rehydrating run.
        next: PullRequest,
    },
    /// The page was refused (its horizon would move the checkpoint backwards, a repeated
    /// lifecycle signal) or no run was waiting for it. The run is over; apply `tx`
    /// (`ClearStaging` and a `PullFailed` event); the engine retries after a backoff.
    Abandoned {
        /// `ClearStaging` and `PullFailed`, or nothing for a page nobody waited for.
        tx: Transaction,
    },
}

/// What the engine reads of a page: all of it but its entries, and how many there are.
#[derive(Debug, Clone, PartialEq)]
pub struct PageHead {
    /// `PullPage::cursor`.
    pub cursor: String,
    /// `PullPage::done`.
    pub done: bool,
    /// `PullPage::horizon`.
    pub horizon: i64,
    /// `PullPage::lifecycle`.
    pub lifecycle: Option<Lifecycle>,
    /// `PullPage::conflicts`.
    pub conflicts: Option<Vec<Conflict>>,
    /// `PullPage::total`.
    pub total: Option<u64>,
    /// How many entries the page holds.
    pub entries: usize,
}

impl PageHead {
    /// The head of a decoded page.
    pub fn of(page: &PullPage) -> PageHead {
        PageHead {
            cursor: page.cursor.clone(),
            done: page.done,
            horizon: page.horizon,
            lifecycle: page.lifecycle,
            conflicts: page.conflicts.clone(),
            total: page.total,
            entries: page.entries.len(),
        }
    }
}

/// A page's entries: decoded, or still the text of the page.
enum PageBody {
    Decoded(PullPage),
    Text(String),
}

/// Pull scheduling and the run in progress.
#[derive(Debug)]
pub(crate) struct PullState {
    /// A wake-up, `request_pull` or reconnect asked for a pull.
    pub requested: bool,
    /// `request_pull` asked: ignore the failure backoff.
    pub forced: bool,
    /// When the periodic pull is next due (`None`: now).
    pub next_scheduled_at: Option<Millis>,
    /// Backoff after a failed run.
    pub retry_at: Option<Millis>,
    /// Consecutive failed runs.
    pub streak: u32,
    pub run: Option<PullRun>,
}

/// The run in progress.
#[derive(Debug, Clone)]
pub(crate) struct PullRun {
    /// The lifecycle signal that made this a rehydrating run from `null`.
    pub rehydrate: Option<Lifecycle>,
    /// The configured bucket set differs from the checkpoint's: this run from `null` replaces
    /// the local snapshot with the new set's (added buckets backfilled, removed ones gone).
    pub buckets_changed: bool,
    /// Whether this run started from `null`.
    pub from_null: bool,
    pub pages: u32,
    pub entries: u64,
    /// What the run's first page said it holds (the server's count; see `PullPage::total`).
    pub total: Option<u64>,
    pub horizon: Option<i64>,
    /// The horizon of the run's first page: its entries up to it are the state at that snapshot,
    /// each key's once; a key written while the run goes on comes again above it.
    pub first_horizon: Option<i64>,
    pub conflicts: Vec<Conflict>,
    /// The closing page arrived; the plan is with the adapter.
    pub committing: bool,
}

impl PullState {
    pub(crate) fn new() -> PullState {
        PullState { requested: true, forced: false, next_scheduled_at: None, retry_at: None, streak: 0, run: None }
    }

    /// When the next run may start, if no run is active.
    pub(crate) fn due_at(&self) -> Option<Millis> {
        if self.run.is_some() {
            return None;
        }
        if self.forced {
            return Some(Millis::MIN);
        }
        let backoff = self.retry_at.unwrap_or(Millis::MIN);
        let wanted = if self.requested { Millis::MIN } else { self.next_scheduled_at.unwrap_or(Millis::MIN) };
        Some(wanted.max(backoff))
    }
}

impl Engine {
    /// Starts a pull run when one is due (first start, reconnect, `wake`, `request_pull`, the
    /// interval, a backoff that ran out) and none is in progress; `None` while offline.
    pub fn poll_pull(&mut self, now: Millis) -> Option<PullRequest> {
        if !self.online || self.storage_held(now) || self.pull.due_at()? > now {
            return None;
        }
        self.pull.requested = false;
        self.pull.forced = false;
        let held = self.meta.checkpoint.buckets.as_ref();
        let buckets_changed =
            self.meta.checkpoint.cursor.is_some() && held.is_some_and(|held| *held != self.bucket_set());
        let cursor = if buckets_changed { None } else { self.meta.checkpoint.cursor.clone() };
        self.pull.run = Some(PullRun {
            rehydrate: None,
            buckets_changed,
            from_null: cursor.is_none(),
            pages: 0,
            entries: 0,
            total: None,
            horizon: None,
            first_horizon: None,
            conflicts: Vec::new(),
            committing: false,
        });
        Some(self.pull_request(cursor))
    }

    /// A server wake-up hint: pull soon (still after a failure backoff).
    pub fn wake(&mut self) {
        self.pull.requested = true;
    }

    /// The app asked to sync now: pull at the next `poll_pull`, ignoring the failure backoff.
    pub fn request_pull(&mut self) {
        self.pull.requested = true;
        self.pull.forced = true;
    }

    /// Handles one page of the run in progress.
    pub fn on_pull_page(&mut self, now: Millis, page: PullPage) -> PullStep {
        let head = PageHead::of(&page);
        self.take_page(now, head, PageBody::Decoded(page))
    }

    /// Handles a page whose entries are left as the JSON text the page came in (`head` is the rest
    /// of it): the browser adapter stages an answer as it came, where decoding every row only to
    /// encode it again was most of what a first sync's pages phase spent in wasm. A closing page's
    /// text goes to the commit plan, whose adapter places its entries as a staged page's
    /// (`CommitPlan::take_closing_text`); a lifecycle signal is read from `head` alone.
    pub fn on_pull_page_text(&mut self, now: Millis, head: PageHead, text: String) -> PullStep {
        self.take_page(now, head, PageBody::Text(text))
    }

    fn take_page(&mut self, now: Millis, head: PageHead, body: PageBody) -> PullStep {
        let Some(run) = self.pull.run.as_mut().filter(|r| !r.committing) else {
            return PullStep::Abandoned { tx: Transaction::default() };
        };
        if let Some(signal) = head.lifecycle {
            if run.from_null {
                // A run from null cannot expire; the server is confused. Back off, do not loop.
                let message = format!("{} on a run from the beginning", signal.as_str());
                return PullStep::Abandoned { tx: self.abandon_run(now, signal.as_str(), &message, true) };
            }
            *run = PullRun {
                rehydrate: Some(signal),
                buckets_changed: run.buckets_changed,
                from_null: true,
                pages: 0,
                entries: 0,
                total: None,
                horizon: None,
                first_horizon: None,
                conflicts: Vec::new(),
                committing: false,
            };
            let event = match signal {
                Lifecycle::CheckpointExpired => Event::CheckpointExpired,
                Lifecycle::ServerReset => Event::ServerReset,
            };
            let tx = Transaction { ops: vec![StoreOp::ClearStaging], events: vec![event] };
            return PullStep::Restart { tx, next: self.pull_request(None) };
        }

        let committed = self.meta.checkpoint.horizon;
        let floor = match run.rehydrate {
            Some(Lifecycle::ServerReset) => run.horizon.unwrap_or(i64::MIN),
            _ => run.horizon.unwrap_or(i64::MIN).max(committed),
        };
        if head.horizon < floor {
            let message = format!("page horizon {} is below {}; the checkpoint never moves backwards", head.horizon, floor);
            return PullStep::Abandoned { tx: self.abandon_run(now, "CURSOR_REGRESSION", &message, true) };
        }

        let page_no = run.pages;
        run.pages += 1;
        run.entries += head.entries as u64;
        if page_no == 0 {
            run.total = head.total;
            run.first_horizon = Some(head.horizon);
        }
        run.horizon = Some(head.horizon);
        run.conflicts.extend(head.conflicts.into_iter().flatten());
        if head.done {
            run.committing = true;
            let run = run.clone();
            let closing = match body {
                PageBody::Decoded(page) => ClosingEntries::Decoded(page.entries),
                PageBody::Text(text) => ClosingEntries::Text(text),
            };
            return PullStep::Commit(CommitPlan::new(self, run, head.cursor, head.horizon, closing));
        }
        let staged = match body {
            PageBody::Decoded(page) => StoreOp::PutStaging { page_no, page },
            PageBody::Text(text) => StoreOp::PutStagingText { page_no, text },
        };
        // The horizon advances with the run, so more may arrive than the first page counted.
        let progress = Event::PullProgress { pages: run.pages, entries: run.entries, total: run.total.map(|t| t.max(run.entries)) };
        let next = self.pull_request(Some(head.cursor));
        let mut ops = Vec::new();
        if page_no == 0 {
            // Pages of an earlier, abandoned run (a reload mid-run) must not be read back.
            ops.push(StoreOp::ClearStaging);
        }
        ops.push(staged);
        PullStep::Stage { tx: Transaction { ops, events: vec![progress] }, next }
    }

    /// The request of the page after one with `head`, as taking that page would give it, while a
    /// run is in progress and the page goes on to another (not done, no lifecycle signal): the
    /// adapter may send it before it takes the page, and use its answer when the step's `next` is
    /// the same request.
    pub fn next_page_request(&self, head: &PageHead) -> Option<PullRequest> {
        let running = self.pull.run.as_ref().is_some_and(|r| !r.committing);
        (running && !head.done && head.lifecycle.is_none()).then(|| self.pull_request(Some(head.cursor.clone())))
    }

    /// The run in progress failed (request failure, or the adapter could not apply its commit).
    /// Committed rows and cursor stay as they were; staging is cleared; a new run is tried after
    /// a backoff.
    pub fn on_pull_failure(&mut self, now: Millis, failure: Failure) -> Transaction {
        if self.pull.run.is_none() {
            return Transaction::default();
        }
        let retryable = ErrorClass::of(failure.status, Some(&failure.code)).is_retryable();
        self.abandon_run(now, &failure.code, &failure.message, retryable)
    }

    fn abandon_run(&mut self, now: Millis, code: &str, message: &str, retryable: bool) -> Transaction {
        self.pull.run = None;
        self.pull.requested = true;
        self.pull.streak += 1;
        let wait = backoff::delay(self.pull.streak, self.config.retry_base_ms, self.config.retry_max_ms, &mut self.prng);
        self.pull.retry_at = Some(now.saturating_add(wait));
        self.note_failure(format!("{code}: {message}"));
        Transaction {
            ops: vec![StoreOp::ClearStaging],
            events: vec![Event::PullFailed { code: code.into(), message: message.into(), retryable }],
        }
    }

    /// The configured buckets as a checkpoint records them: sorted, without repeats.
    pub(crate) fn bucket_set(&self) -> Vec<String> {
        let mut set = self.config.buckets.clone();
        crate::order::sort(&mut set);
        set.dedup();
        set
    }

    pub(crate) fn pull_request(&self, cursor: Option<String>) -> PullRequest {
        PullRequest {
            protocol: PROTOCOL_VERSION,
            client_id: self.meta.client_id,
            cursor,
            buckets: self.config.buckets.clone(),
            limit: self.config.pull_limit,
        }
    }

    /// Closes the run after its commit was applied: the next periodic pull is an interval away.
    pub(crate) fn end_run_committed(&mut self, now: Millis) {
        self.pull.run = None;
        self.pull.streak = 0;
        self.pull.retry_at = None;
        self.pull.next_scheduled_at = Some(now.saturating_add(self.config.pull_interval_ms));
        self.note_success(now);
    }
}

//! Pull runs: staging, the commit at the closing boundary, rebase, rehydrate, monotonic cursor.

mod support;

use kizuna_engine::protocol::{Conflict, Op, codes};
use kizuna_engine::util::Prng;
use kizuna_engine::{ChangeOrigin, Config, Event, Failure, PageHead, PullStep, RowKey, RowRecord, StoreOp};
use serde_json::json;
use support::*;

fn small_pages() -> Config {
    Config { pull_limit: 10, ..Config::default() }
}

fn seed_server(h: &mut Harness, n: usize) {
    for i in 0..n {
        h.server.remote_write("todos", &format!("{i:03}"), Op::Upsert, Some(row(json!({"i": i}))));
    }
}

/// Pages with done:false are staged with progress events; nothing is visible until the
/// closing page; the commit writes the rows, the checkpoint and clears staging in one
/// transaction; Change(Remote) names the keys.
#[test]
fn pages_are_staged_then_committed_at_the_closing_boundary() {
    let mut h = Harness::new(small_pages());
    seed_server(&mut h, 25);
    let mut request = h.engine.poll_pull(h.now).unwrap();
    assert_eq!(request.cursor, None);
    assert!(h.engine.poll_pull(h.now).is_none(), "one run at a time");
    let mut staged = 0;
    let plan = loop {
        match h.engine.on_pull_page(h.now, h.server.pull(&request)) {
            PullStep::Stage { tx, next } => {
                h.store.apply(tx);
                staged += 1;
                assert!(h.store.rows.is_empty(), "nothing visible mid-run");
                assert_eq!(h.engine.checkpoint().cursor, None);
                request = next;
            }
            PullStep::Commit(plan) => break plan,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!((staged, plan.staged_pages(), h.store.staging.len()), (2, 2, 2));
    h.commit(plan);
    assert_eq!(h.store.rows.len(), 25);
    assert!(h.store.staging.is_empty());
    assert_eq!(h.engine.checkpoint().horizon, 25);
    assert_eq!(h.engine.checkpoint().committed_at, Some(h.now));
    assert_eq!(h.store.meta.as_ref().unwrap().checkpoint, *h.engine.checkpoint());
    let events = h.events();
    let progress: Vec<_> = events.iter().filter_map(|e| if let Event::PullProgress { pages, entries, total } = e { Some((*pages, *entries, *total)) } else { None }).collect();
    assert_eq!(progress, vec![(1, 10, Some(25)), (2, 20, Some(25)), (3, 25, Some(25))], "a total from the first page; 100% at the close");
    assert!(events.iter().any(|e| matches!(e, Event::Change { keys, origin: ChangeOrigin::Remote, .. } if keys.len() == 25)));
    assert!(matches!(events.last(), Some(Event::Checkpoint { horizon: 25, .. })));
}

/// A run cut off after page 2 leaves rows and cursor exactly as they were; the next run starts
/// over from the committed cursor after a backoff.
#[test]
fn an_interrupted_run_leaves_committed_state_untouched() {
    let mut h = Harness::new(small_pages());
    seed_server(&mut h, 5);
    assert!(h.pull_step());
    let (rows, checkpoint) = (h.store.rows.clone(), h.engine.checkpoint().clone());
    seed_server(&mut h, 40);
    h.engine.request_pull();
    let mut request = h.engine.poll_pull(h.now).unwrap();
    for _ in 0..2 {
        let PullStep::Stage { tx, next } = h.engine.on_pull_page(h.now, h.server.pull(&request)) else { panic!() };
        h.store.apply(tx);
        request = next;
    }
    let tx = h.engine.on_pull_failure(h.now, Failure { status: None, code: codes::NETWORK.into(), message: "lost".into() });
    h.store.apply(tx);
    assert_eq!(h.store.rows, rows);
    assert_eq!(*h.engine.checkpoint(), checkpoint);
    assert!(h.store.staging.is_empty());
    assert!(h.engine.poll_pull(h.now).is_none(), "backing off");
    assert_eq!(h.engine.health(h.now).failure_streak, 1);
    h.now += 2_000;
    let request = h.engine.poll_pull(h.now).unwrap();
    assert_eq!(request.cursor, checkpoint.cursor, "starts over from the committed cursor");
}

/// The closing page may hold exactly `limit` entries; it still commits.
#[test]
fn a_closing_page_of_exactly_limit_entries_commits() {
    let mut h = Harness::new(small_pages());
    seed_server(&mut h, 10);
    let request = h.engine.poll_pull(h.now).unwrap();
    let page = h.server.pull(&request);
    assert_eq!((page.entries.len(), page.done), (10, true));
    let PullStep::Commit(plan) = h.engine.on_pull_page(h.now, page) else { panic!() };
    assert_eq!(plan.staged_pages(), 0);
    h.commit(plan);
    assert_eq!(h.store.rows.len(), 10);
}

/// Rebase: a pending edit survives a checkpoint that changes another column of the same row,
/// and both show; the base holds the server's row.
#[test]
fn pending_edit_and_remote_change_to_another_column_both_show() {
    let mut h = Harness::new(Config::default());
    h.server.remote_write("todos", "1", Op::Upsert, Some(row(json!({"title": "a", "done": false}))));
    assert!(h.pull_step());
    h.write("todos", "1", Op::Patch, Some(json!({"title": "mine"})));
    h.server.remote_write("todos", "1", Op::Patch, Some(row(json!({"done": true}))));
    h.engine.request_pull();
    assert!(h.pull_step());
    let rec = &h.store.rows[&RowKey::new("todos", "1")];
    assert_eq!(rec.base, Some(row(json!({"title": "a", "done": true}))));
    assert_eq!(rec.visible, Some(row(json!({"title": "mine", "done": true}))));
    // A remote delete under a pending patch: the patch stays visible over no base.
    h.server.remote_write("todos", "1", Op::Delete, None);
    h.engine.request_pull();
    assert!(h.pull_step());
    let rec = &h.store.rows[&RowKey::new("todos", "1")];
    assert_eq!((rec.base.clone(), rec.visible.clone()), (None, Some(row(json!({"title": "mine"})))));
    // Tombstones with nothing pending remove the row.
    h.server.remote_write("todos", "2", Op::Upsert, Some(row(json!({}))));
    h.engine.request_pull();
    assert!(h.pull_step());
    h.server.remote_write("todos", "2", Op::Delete, None);
    h.engine.request_pull();
    assert!(h.pull_step());
    assert!(!h.store.rows.contains_key(&RowKey::new("todos", "2")));
}

/// CHECKPOINT_EXPIRED: announced, staging cleared, pulled from null in rehydrate mode; the
/// commit clears the rows, writes the snapshot, re-materializes pending-only keys from the
/// outbox (unsent edits stay) and says Rehydrated. The outbox is intact.
#[test]
fn rehydrate_replaces_the_snapshot_and_keeps_the_outbox() {
    let mut h = Harness::new(small_pages());
    seed_server(&mut h, 15);
    assert!(h.pull_step());
    h.write("todos", "003", Op::Patch, Some(json!({"mine": true})));
    h.write("todos", "local", Op::Upsert, Some(json!({"draft": 1})));
    let outbox = h.store.outbox.clone();
    h.server.remote_write("todos", "000", Op::Delete, None);
    for i in 100..110 {
        h.server.remote_write("todos", &i.to_string(), Op::Upsert, Some(row(json!({"i": i}))));
    }
    h.server.expire_below = Some(h.server.horizon());
    h.events();
    h.engine.request_pull();
    assert!(h.pull_step());
    let events = h.events();
    assert!(matches!(events.first(), Some(Event::CheckpointExpired)));
    assert!(matches!(events.last(), Some(Event::Rehydrated { horizon: 26 })), "{events:?}");
    assert_eq!(h.store.outbox, outbox, "outbox kept");
    assert_eq!(h.engine.checkpoint().horizon, 26);
    assert!(!h.store.rows.contains_key(&RowKey::new("todos", "000")), "rows gone from the server are gone");
    assert_eq!(h.store.visible("todos", "003"), Some(json!({"i": 3, "mine": true})));
    assert_eq!(h.store.visible("todos", "local"), Some(json!({"draft": 1})));
    assert_eq!(h.store.rows.len(), 25, "14 + 10 server rows + the local-only one");
    h.drain(60_000);
    assert_eq!(h.server.row("todos", "local"), Some(row(json!({"draft": 1}))));
}

/// SERVER_RESET (the second lifecycle signal): the server's history was replaced, so the
/// rehydrate may commit a horizon below the old one.
#[test]
fn server_reset_rehydrates_even_to_a_lower_horizon() {
    let mut h = Harness::new(Config::default());
    seed_server(&mut h, 30);
    assert!(h.pull_step());
    h.server = SimServer::new();
    h.server.epoch = 7;
    seed_server(&mut h, 3);
    h.engine.request_pull();
    assert!(h.pull_step());
    assert_eq!(h.engine.checkpoint().horizon, 3);
    let events = h.events();
    assert!(events.iter().any(|e| matches!(e, Event::ServerReset)));
    assert!(events.iter().any(|e| matches!(e, Event::Rehydrated { horizon: 3 })));
    assert_eq!(h.store.rows.len(), 3);
}

/// Conflicts attached to pages reach the app as one event after the commit.
#[test]
fn conflicts_arrive_after_the_commit() {
    let mut h = Harness::new(Config::default());
    seed_server(&mut h, 2);
    h.server.conflicts = vec![Conflict {
        table: "todos".into(),
        pk: "000".into(),
        column: "i".into(),
        loser: json!(9),
        winner: json!(0),
        loser_seq: None,
        winner_seq: 1,
        loser_by: None,
    }];
    assert!(h.pull_step());
    let events = h.events();
    let at = events.iter().position(|e| matches!(e, Event::Conflicts(c) if c.len() == 1)).expect("conflicts");
    let change = events.iter().position(|e| matches!(e, Event::Change { .. })).unwrap();
    assert!(change < at);
}

/// A page whose horizon is below the committed one is refused: the run is abandoned and the
/// checkpoint stays.
#[test]
fn a_page_below_the_committed_horizon_is_refused() {
    let mut h = Harness::new(Config::default());
    seed_server(&mut h, 5);
    assert!(h.pull_step());
    h.engine.request_pull();
    let request = h.engine.poll_pull(h.now).unwrap();
    let mut page = h.server.pull(&request);
    page.horizon = 3;
    let PullStep::Abandoned { tx } = h.engine.on_pull_page(h.now, page) else { panic!() };
    assert!(matches!(&tx.events[..], [Event::PullFailed { code, .. }] if code == "CURSOR_REGRESSION"));
    assert_eq!(h.engine.checkpoint().horizon, 5);
}

/// Randomized: server writes, pulls of random page sizes, failures between pages, stale pages
/// from a lagging replica (lower horizon) and expiries, driven by the seeded PRNG. The committed
/// horizon never decreases, and once quiet the local rows equal the server's.
#[test]
fn the_cursor_never_regresses_over_random_pulls() {
    for seed in 1..=20u64 {
        let mut rng = Prng::new(seed);
        let mut h = Harness::with_seed(Config { pull_limit: 1 + rng.below_or_eq(7) as u32, ..Config::default() }, seed);
        let mut last_horizon = 0;
        for _ in 0..60 {
            for _ in 0..rng.below_or_eq(6) {
                let pk = format!("{}", rng.below_or_eq(30));
                if rng.below_or_eq(5) == 0 {
                    h.server.remote_write("t", &pk, Op::Delete, None);
                } else {
                    h.server.remote_write("t", &pk, Op::Patch, Some(row(json!({"v": rng.below_or_eq(1000)}))));
                }
            }
            if rng.below_or_eq(10) == 0 {
                h.server.expire_below = Some(h.server.horizon());
            }
            h.engine.request_pull();
            let Some(mut request) = h.engine.poll_pull(h.now) else { panic!("forced pull") };
            loop {
                let mut page = h.server.pull(&request);
                if rng.below_or_eq(8) == 0 {
                    page.horizon = rng.below_or_eq(page.horizon.max(0)); // a lagging replica
                }
                if rng.below_or_eq(8) == 0 {
                    let tx = h.engine.on_pull_failure(h.now, Failure { status: Some(503), code: "X".into(), message: "".into() });
                    h.store.apply(tx);
                    break;
                }
                match h.engine.on_pull_page(h.now, page) {
                    PullStep::Stage { tx, next } | PullStep::Restart { tx, next } => {
                        h.store.apply(tx);
                        request = next;
                    }
                    PullStep::Commit(plan) => {
                        h.commit(plan);
                        break;
                    }
                    PullStep::Abandoned { tx } => {
                        h.store.apply(tx);
                        break;
                    }
                }
            }
            h.server.expire_below = None;
            let horizon = h.engine.checkpoint().horizon;
            assert!(horizon >= last_horizon, "seed {seed}: {horizon} < {last_horizon}");
            assert_eq!(h.store.meta.as_ref().unwrap().checkpoint.horizon, horizon);
            last_horizon = horizon;
            h.now += 1_000;
        }
        // Quiet: a clean pull converges on the server's rows.
        h.now += 120_000;
        h.engine.request_pull();
        assert!(h.pull_step());
        assert_eq!(h.engine.checkpoint().horizon, h.server.horizon(), "seed {seed}");
        for pk in 0..=30 {
            let pk = pk.to_string();
            assert_eq!(
                h.store.rows.get(&RowKey::new("t", &pk)).and_then(|r| r.visible.clone()),
                h.server.row("t", &pk),
                "seed {seed} pk {pk}"
            );
        }
    }
}

/// The progress events of `events`, as (pages, entries, total).
fn progress_of(events: &[Event]) -> Vec<(u32, u64, Option<u64>)> {
    events.iter().filter_map(|e| if let Event::PullProgress { pages, entries, total } = e { Some((*pages, *entries, *total)) } else { None }).collect()
}

/// Runs one pull to its commit, letting `edit` change each page (by its 0-based number) first.
fn pull_run_with(h: &mut Harness, mut edit: impl FnMut(usize, &mut kizuna_engine::protocol::PullPage)) {
    let mut request = h.engine.poll_pull(h.now).unwrap();
    for page_no in 0.. {
        let mut page = h.server.pull(&request);
        edit(page_no, &mut page);
        match h.engine.on_pull_page(h.now, page) {
            PullStep::Stage { tx, next } => {
                h.store.apply(tx);
                request = next;
            }
            PullStep::Commit(plan) => return h.commit(plan),
            other => panic!("{other:?}"),
        }
    }
}

/// The horizon advances during a run, so a run may deliver more than its first page counted:
/// progress never reports a total below what arrived, a total on a later page is not the run's,
/// and the closing page says total = entries.
#[test]
fn progress_total_is_never_below_the_entries_delivered() {
    let mut h = Harness::new(small_pages());
    seed_server(&mut h, 25);
    pull_run_with(&mut h, |page_no, page| {
        page.total = match page_no {
            0 => Some(12), // as if 13 entries arrived after the first page was counted
            1 => Some(999),
            _ => page.total,
        }
    });
    assert_eq!(progress_of(&h.events()), vec![(1, 10, Some(12)), (2, 20, Some(20)), (3, 25, Some(25))]);
}

/// A server that gives no total (an older pack, or past its count cap): no total until the
/// closing page, which still ends at 100%.
#[test]
fn without_a_server_total_only_the_closing_page_has_one() {
    let mut h = Harness::new(small_pages());
    seed_server(&mut h, 25);
    pull_run_with(&mut h, |_, page| page.total = None);
    assert_eq!(progress_of(&h.events()), vec![(1, 10, None), (2, 20, None), (3, 25, Some(25))]);
}

/// A run restarted by a lifecycle signal (here between two pages) counts afresh: pages,
/// entries and total come from the rehydrating run alone.
#[test]
fn a_restarted_run_counts_its_progress_afresh() {
    let mut h = Harness::new(small_pages());
    seed_server(&mut h, 15);
    assert!(h.pull_step());
    for i in 100..125 {
        h.server.remote_write("todos", &i.to_string(), Op::Upsert, Some(row(json!({"i": i}))));
    }
    h.events();
    h.engine.request_pull();
    let request = h.engine.poll_pull(h.now).unwrap();
    let PullStep::Stage { tx, next } = h.engine.on_pull_page(h.now, h.server.pull(&request)) else { panic!("a first page") };
    h.store.apply(tx);
    assert_eq!(progress_of(&h.events()), vec![(1, 10, Some(25))], "the run from the checkpoint counts what changed");
    h.server.expire_below = Some(h.server.horizon());
    let PullStep::Restart { tx, next: mut request } = h.engine.on_pull_page(h.now, h.server.pull(&next)) else { panic!("a restart") };
    h.store.apply(tx);
    let plan = loop {
        match h.engine.on_pull_page(h.now, h.server.pull(&request)) {
            PullStep::Stage { tx, next } => {
                h.store.apply(tx);
                request = next;
            }
            PullStep::Commit(plan) => break plan,
            other => panic!("{other:?}"),
        }
    };
    h.commit(plan);
    let events = h.events();
    assert!(matches!(events.first(), Some(Event::CheckpointExpired)));
    assert_eq!(progress_of(&events), vec![(1, 10, Some(40)), (2, 20, Some(40)), (3, 30, Some(40)), (4, 40, Some(40))]);
}

/// A run that brings nothing (an idle app's poll) says nothing of progress.
#[test]
fn an_empty_run_reports_no_progress() {
    let mut h = Harness::new(Config::default());
    assert!(h.pull_step());
    let events = h.events();
    assert!(events.iter().any(|e| matches!(e, Event::Checkpoint { .. })), "the run committed");
    assert_eq!(progress_of(&events), vec![]);
}

/// A run of one page (the first page closes it) reports 100% at once.
#[test]
fn a_one_page_run_reports_its_total() {
    let mut h = Harness::new(Config::default());
    seed_server(&mut h, 5);
    assert!(h.pull_step());
    assert_eq!(progress_of(&h.events()), vec![(1, 5, Some(5))]);
}

/// A large run names at most `LISTED_CHANGES` keys in its change event, and the tables of the
/// rest: the event, and what the run holds to build it, do not grow with the rows.
#[test]
fn a_large_run_names_its_changed_tables_past_the_listed_keys() {
    let mut h = Harness::new(Config { pull_limit: 5_000, ..Config::default() });
    seed_server(&mut h, kizuna_engine::LISTED_CHANGES + 5);
    while h.pull_step() {}
    let change = h.events().into_iter().find_map(|e| match e {
        Event::Change { keys, tables, .. } => Some((keys.len(), tables)),
        _ => None,
    });
    assert_eq!(change, Some((kizuna_engine::LISTED_CHANGES, vec!["todos".to_string()])));
    assert_eq!(h.store.rows.len(), kizuna_engine::LISTED_CHANGES + 5, "every row is stored all the same");
}

/// Pages handed over as their text (as the browser adapter hands every answer over) commit the
/// same rows, checkpoint and events as the same pages decoded, the closing page included: the
/// text is staged as it came, and the closing page's entries are placed as a staged page's.
#[test]
fn pages_handed_over_as_text_commit_what_decoded_pages_commit() {
    let run = |as_text: bool, closing_as_text: bool| {
        let mut h = Harness::new(small_pages());
        seed_server(&mut h, 25);
        h.write("todos", "003", Op::Patch, Some(json!({"mine": true})));
        // On the closing page, which the smaller pages put last: a pending key and a plain one.
        h.write("todos", "024", Op::Patch, Some(json!({"mine": true})));
        assert!(h.pull_step_with(|engine, now, page| {
            if !as_text || (page.done && !closing_as_text) {
                return engine.on_pull_page(now, page);
            }
            let head = PageHead::of(&page);
            let step = engine.on_pull_page_text(now, head, serde_json::to_string(&page).unwrap());
            if let PullStep::Stage { tx, .. } = &step {
                assert!(tx.ops.iter().any(|op| matches!(op, StoreOp::PutStagingText { .. })), "staged as its text");
            }
            step
        }));
        (h.store.rows.clone(), h.engine.checkpoint().clone(), h.events())
    };
    let (decoded_rows, decoded_checkpoint, decoded_events) = run(false, false);
    assert_eq!(decoded_rows.len(), 25);
    assert!(decoded_checkpoint.cursor.is_some());
    let mine = |rows: &std::collections::BTreeMap<RowKey, RowRecord>, pk: &str| {
        rows[&RowKey::new("todos", pk)].visible.as_ref().and_then(|v| v.get("mine").cloned())
    };
    assert_eq!(mine(&decoded_rows, "024"), Some(json!(true)), "the closing page's pending edit is replayed");
    for closing_as_text in [false, true] {
        let (rows, checkpoint, events) = run(true, closing_as_text);
        assert_eq!(rows, decoded_rows, "closing page as text: {closing_as_text}");
        assert_eq!(checkpoint, decoded_checkpoint);
        assert_eq!(events, decoded_events);
    }
}

/// The request of the next page, as the adapter sends it before it takes a page
/// (`next_page_request`), is the request taking the page gives; a closing page, or one with a
/// lifecycle signal, has none, and neither has any page outside a run.
#[test]
fn the_next_page_is_asked_for_as_taking_this_one_would_ask() {
    let mut h = Harness::new(small_pages());
    seed_server(&mut h, 25);
    let (mut staged, mut closing) = (0, 0);
    assert!(h.pull_step_with(|engine, now, page| {
        let head = PageHead::of(&page);
        let ahead = engine.next_page_request(&head);
        let mut signalled = head.clone();
        signalled.lifecycle = Some(kizuna_engine::protocol::Lifecycle::CheckpointExpired);
        assert_eq!(engine.next_page_request(&signalled), None);
        let step = engine.on_pull_page(now, page);
        match &step {
            PullStep::Stage { next, .. } => {
                assert_eq!(ahead.as_ref(), Some(next));
                staged += 1;
            }
            PullStep::Commit(_) => {
                assert_eq!(ahead, None);
                closing += 1;
            }
            other => panic!("{other:?}"),
        }
        step
    }));
    assert!(staged >= 2 && closing == 1, "{staged} staged pages, {closing} closing");
    let head = PageHead { cursor: "c".into(), done: false, horizon: 1, lifecycle: None, conflicts: None, total: None, entries: 0 };
    assert_eq!(h.engine.next_page_request(&head), None, "no run in progress");
}

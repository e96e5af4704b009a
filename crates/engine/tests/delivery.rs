//! Push delivery: issue order, atomic batches, verdicts, delay windows, backoff, the
//! dead-letter budget and narrowing.
//!
//! Sends measured (server requests, slice of 64 lone writes, one poisoned write, budget 5):
//! * `KZP02` (halving), poisoned write at position 1: 12 sends; at 37: 14; at 64: 17.
//!   Bound: at most 2·log2(64) + 5 charged + 1 for the rest = 18.
//! * Any other permanent code (head cut, `KZP04`), poisoned at 37: 43 sends
//!   (1 wide + 36 lone heads + 5 charged + 1 for the remaining 27).
//!
//! In every case each of the other 63 writes is applied exactly once.

mod support;

use kizuna_engine::protocol::{Op, Reason, codes};
use kizuna_engine::util::backoff_ceiling;
use kizuna_engine::{ChangeOrigin, Config, Event, Failure, LocalWrite};
use serde_json::json;
use support::*;

fn network() -> Failure {
    Failure { status: None, code: codes::NETWORK.into(), message: "offline".into() }
}

/// Writes go out in issue order, in slices of at most max_slice, one request at a time.
#[test]
fn issue_order_and_slice_width() {
    let mut h = Harness::new(Config { max_slice: 64, ..Config::default() });
    for i in 0..200 {
        h.write("todos", &i.to_string(), Op::Upsert, Some(json!({"i": i})));
    }
    let (_, tx) = h.engine.poll_push(h.now).unwrap();
    h.store.apply(tx);
    assert!(h.engine.poll_push(h.now).is_none(), "one push in flight at a time");
    let _ = h.engine.on_push_failure(h.now, network());
    h.now += 120_000;
    h.drain(600_000);
    assert_eq!(h.server.applied_order, (1..=200).collect::<Vec<i64>>());
    let widths: Vec<usize> = h.server.requests.iter().map(Vec::len).collect();
    assert_eq!(widths, vec![64, 64, 64, 8], "the failed first request never reached the server");
    assert_eq!(h.engine.status().applied, 200);
}

/// An atomic batch is never split: not by the slice width, not by narrowing; a batch wider
/// than the slice goes whole; a permanent failure of a lone batch is charged to the batch and
/// dead-letters all of its members together.
#[test]
fn atomic_batch_is_never_split() {
    let mut h = Harness::new(Config { max_slice: 4, ..Config::default() });
    for i in 0..3 {
        h.write("t", &format!("l{i}"), Op::Upsert, Some(json!({})));
    }
    h.write_all((0..3).map(|i| lw("t", &format!("b{i}"), Op::Upsert, Some(json!({})))).collect()).unwrap();
    h.write("t", "l3", Op::Upsert, Some(json!({})));
    h.write_all((0..6).map(|i| lw("t", &format!("w{i}"), Op::Upsert, Some(json!({})))).collect()).unwrap();
    h.drain(60_000);
    assert_eq!(h.server.requests, vec![vec![1, 2, 3], vec![4, 5, 6, 7], vec![8, 9, 10, 11, 12, 13]]);

    // Halving on KZP02 keeps batches whole: the server takes at most 2 mutations.
    h.server.max_batch_size = Some(2);
    h.server.requests.clear();
    h.write("t", "x0", Op::Upsert, Some(json!({})));
    h.write_all((0..2).map(|i| lw("t", &format!("y{i}"), Op::Upsert, Some(json!({})))).collect()).unwrap();
    h.write("t", "x1", Op::Upsert, Some(json!({})));
    h.drain(60_000);
    assert_eq!(h.server.requests, vec![vec![14, 15, 16, 17], vec![14], vec![15, 16], vec![17]]);

    // A lone batch the server refuses permanently is charged and dies whole.
    h.server.max_batch_size = Some(1);
    h.write_all((0..2).map(|i| lw("t", &format!("z{i}"), Op::Upsert, Some(json!({})))).collect()).unwrap();
    h.write("t", "after", Op::Upsert, Some(json!({})));
    h.drain(600_000);
    assert_eq!(h.engine.dead_letters().iter().map(|d| d.entry.seq).collect::<Vec<_>>(), vec![18, 19]);
    assert_eq!(h.server.row("t", "after"), Some(row(json!({}))));
    assert!(h.server.requests.iter().all(|r| !(r.contains(&18) ^ r.contains(&19))), "never split");
}

/// APPLIED and SKIPPED acknowledge; a lost acknowledgement is retried with the same id and the
/// replayed verdict is handled exactly like the original: one effect, counted once.
#[test]
fn lost_ack_retry_gives_one_effect() {
    let mut h = Harness::new(Config::default());
    h.write("todos", "1", Op::Upsert, Some(json!({"a": 1})));
    h.server.lose_next_ack = true;
    assert!(h.push_step());
    assert_eq!(h.engine.status().pending, 1);
    let entry = h.engine.outbox().find(|e| e.seq == 1).cloned().expect("still pending");
    assert_eq!((entry.sent, entry.attempts, entry.permanent_failures), (true, 1, 0));
    h.drain(60_000);
    assert_eq!(h.server.effects.values().copied().collect::<Vec<_>>(), vec![1]);
    assert_eq!(h.engine.status().applied, 1);
    let applied: Vec<_> = h.events().into_iter().filter(|e| matches!(e, Event::Applied { .. })).collect();
    assert_eq!(applied.len(), 1);
}

/// REJECTED: base = server_row, visible = server_row with the still-pending writes for the
/// key replayed on top; Rejected and Change(Compensation) events. A null server_row with
/// nothing pending removes the row.
#[test]
fn rejection_compensates_with_pending_writes_replayed() {
    let mut h = Harness::new(Config::default());
    h.server.remote_write("todos", "1", Op::Upsert, Some(row(json!({"title": "srv", "done": false}))));
    assert!(h.pull_step());
    h.server.reject.insert("1".into(), Reason::ValidationFailed);

    h.write("todos", "1", Op::Patch, Some(json!({"title": "mine"})));
    let (request, tx) = h.engine.poll_push(h.now).unwrap();
    h.store.apply(tx);
    h.write("todos", "1", Op::Patch, Some(json!({"done": true}))); // made while the first is in flight
    assert_eq!(h.store.visible("todos", "1"), Some(json!({"title": "mine", "done": true})));
    h.events();
    let response = h.server.push(h.now, request).unwrap();
    let tx = h.engine.on_push_response(h.now, response);
    h.store.apply(tx);

    let rec = &h.store.rows[&kizuna_engine::RowKey::new("todos", "1")];
    assert_eq!(rec.base, Some(row(json!({"title": "srv", "done": false}))));
    assert_eq!(rec.visible, Some(row(json!({"title": "srv", "done": true}))));
    let events = h.events();
    assert!(events.iter().any(|e| matches!(e, Event::Rejected { reason: Reason::ValidationFailed, server_row: Some(_), mutation, .. } if mutation.seq == 1)));
    assert!(events.iter().any(|e| matches!(e, Event::Change { origin: ChangeOrigin::Compensation, .. })));
    assert_eq!(h.engine.status().rejected, 1);

    // A refusal with a null row and nothing pending: the row disappears.
    h.server.reject.insert("2".into(), Reason::RlsDenied);
    h.write("todos", "2", Op::Upsert, Some(json!({"title": "secret"})));
    h.server.reject.remove("1");
    h.drain(60_000);
    assert_eq!(h.store.visible("todos", "2"), None);
    assert_eq!(h.server.row("todos", "1"), Some(row(json!({"title": "srv", "done": true}))));
}

/// A refusal whose server row the client could not decode (`server_row_text`: nested too deep
/// for wasm): the write settles as refused, the other writes of the slice settle too, the base
/// stays what the last pull brought (the write's own effect compensated away), a pull is asked
/// for, and the event carries the row's text.
#[test]
fn a_refusal_with_a_server_row_too_deep_to_decode_settles_on_the_base_and_asks_a_pull() {
    let mut h = Harness::new(Config::default());
    h.server.remote_write("todos", "1", Op::Upsert, Some(row(json!({"title": "srv"}))));
    assert!(h.pull_step());
    h.server.reject.insert("1".into(), Reason::ValidationFailed);
    h.write("todos", "1", Op::Patch, Some(json!({"title": "mine"})));
    h.write("todos", "2", Op::Upsert, Some(json!({"title": "other"})));
    let (request, tx) = h.engine.poll_push(h.now).unwrap();
    h.store.apply(tx);
    h.events();
    let mut response = h.server.push(h.now, request).unwrap();
    let refused = &mut response.verdicts[0];
    refused.server_row_text = Some(r#"{"id":"1","title":[[["deep"]]]}"#.into());
    refused.server_row = None;
    let tx = h.engine.on_push_response(h.now, response);
    h.store.apply(tx);

    assert_eq!(h.engine.outbox().count(), 0, "both writes settled");
    assert_eq!(h.store.visible("todos", "1"), Some(json!({"title": "srv"})), "the base as pulled");
    assert_eq!(h.store.visible("todos", "2"), Some(json!({"title": "other"})));
    assert!(h.engine.poll_pull(h.now).is_some(), "a pull says what the row is now");
    let events = h.events();
    assert!(events.iter().any(|e| matches!(e, Event::Rejected { server_row: None, server_row_text: Some(text), .. } if text.contains("deep"))));
}

/// Delay windows: a held write is not sent and does not block the writes behind it; a
/// DELAYED answer (server clock behind) keeps it pending with retry_at = max(apply_after,
/// now + retry_base) and counts neither an attempt nor a failure.
#[test]
fn delay_windows_hold_without_blocking_and_delayed_is_not_an_attempt() {
    let mut h = Harness::new(Config::default());
    let apply_after = h.now + 10_000;
    h.write_all(vec![LocalWrite { apply_after: Some(apply_after), ..lw("t", "later", Op::Upsert, Some(json!({"v": 1}))) }]).unwrap();
    h.write("t", "now", Op::Upsert, Some(json!({"v": 2})));
    assert!(h.push_step());
    assert_eq!(h.server.requests, vec![vec![2]], "the held write is skipped, not blocking");
    assert!(!h.push_step());
    assert!(h.pull_step());
    assert_eq!(h.engine.next_wake(h.now), Some(apply_after), "wakes when the window ends");

    h.server.clock_skew_ms = -1_500; // the server thinks it is still early
    h.now = apply_after;
    assert!(h.push_step());
    let entry = h.store.outbox[&1].clone();
    assert_eq!((entry.attempts, entry.permanent_failures, entry.last_error.clone()), (0, 0, None));
    assert_eq!(entry.retry_at, Some(h.now + 1_000));
    assert_eq!(h.engine.status().delayed, 1);
    assert_eq!(h.engine.health(h.now).failure_streak, 0);
    assert!(!h.push_step(), "held until retry_at");
    h.drain(60_000); // DELAYED once more at +1 s (the server is 1.5 s behind), applied at +2 s
    assert_eq!(h.engine.status().delayed, 2);
    assert_eq!(h.server.applied_order, vec![2, 1]);
    assert_eq!(h.engine.health(h.now).failure_streak, 0);
}

/// Retryable failures: attempts grow, the budget is untouched, retry_at = now + a jittered
/// backoff within [d/2, d] where d doubles from retry_base up to the retry_max cap;
/// failure_streak counts; PushFailed(retryable) each time.
#[test]
fn backoff_grows_with_jitter_and_caps() {
    let config = Config::default();
    let mut h = Harness::new(config.clone());
    h.write("t", "1", Op::Upsert, Some(json!({})));
    let mut waits = Vec::new();
    for n in 1..=12u32 {
        let (_, tx) = h.engine.poll_push(h.now).expect("due");
        h.store.apply(tx);
        let tx = h.engine.on_push_failure(h.now, network());
        assert!(tx.events.iter().any(|e| matches!(e, Event::PushFailed { retryable: true, .. })));
        h.store.apply(tx);
        let e = h.store.outbox[&1].clone();
        let wait = e.retry_at.unwrap() - h.now;
        let d = backoff_ceiling(n, config.retry_base_ms, config.retry_max_ms);
        assert!(d / 2 <= wait && wait <= d, "failure {n}: {wait} not in [{}, {d}]", d / 2);
        assert!(wait <= config.retry_max_ms);
        assert_eq!((e.attempts, e.permanent_failures), (n, 0));
        assert!(h.engine.poll_push(h.now + wait - 1).is_none(), "nothing before retry_at");
        assert_eq!(h.engine.health(h.now).failure_streak, n);
        waits.push(wait);
        h.now += wait;
    }
    assert_eq!(backoff_ceiling(7, 1000, 60_000), 60_000, "cap reached by the 7th failure");
    assert!(waits[..6].windows(2).all(|w| w[1] * 4 > w[0] * 2), "growth: each ceiling doubles");
    assert!(waits[6..].iter().all(|&w| (30_000..=60_000).contains(&w)));
    // Jitter really varies (not a constant fraction of the ceiling).
    let spread: std::collections::BTreeSet<_> = waits[6..].iter().collect();
    assert!(spread.len() > 1);
    h.drain(120_000);
    assert_eq!(h.engine.health(h.now).failure_streak, 0);
    assert_eq!(h.engine.status().dead_letters, 0, "retryable failures never dead-letter");
}

/// The 5-failure budget: a poisoned lone write (KZP04) is tried alone five times with backoff
/// (blocking the queue: issue order), then dead-lettered with its local effect compensated,
/// and the writes behind it land, each once.
#[test]
fn five_permanent_failures_dead_letter_while_later_writes_land() {
    let mut h = Harness::new(Config::default());
    h.server.remote_write("t", "p", Op::Upsert, Some(row(json!({"v": "server"}))));
    assert!(h.pull_step());
    h.server.poison.insert("p".into(), (400, codes::ROW_TOO_LARGE.into()));
    h.write("t", "p", Op::Patch, Some(json!({"v": "huge"})));
    for i in 0..3 {
        h.write("t", &format!("ok{i}"), Op::Upsert, Some(json!({})));
    }
    assert_eq!(h.store.visible("t", "p"), Some(json!({"v": "huge"})));
    h.drain(600_000);
    // 1 wide (not charged, narrowed to the head) + 5 charged alone + 1 for the rest.
    assert_eq!(h.server.sends(), 7);
    assert_eq!(h.server.requests[1..6], vec![vec![1]; 5]);
    assert_eq!(h.server.requests[6], vec![2, 3, 4]);
    let dead = h.engine.dead_letters().to_vec();
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].entry.seq, dead[0].entry.permanent_failures, dead[0].entry.attempts), (1, 5, 6));
    assert!(dead[0].error.starts_with("KZP04"));
    assert_eq!(h.store.dead.len(), 1);
    assert_eq!(h.store.visible("t", "p"), Some(json!({"v": "server"})), "local effect compensated");
    assert!(h.events().iter().any(|e| matches!(e, Event::DeadLetter { entry, .. } if entry.seq == 1)));
    assert_eq!(h.server.effects.len(), 3);
    assert!(h.server.effects.values().all(|&n| n == 1));
    assert_eq!(h.engine.meta().slice_limit, None, "narrowing reset by the dead letter");
    assert_eq!(h.engine.status().dead_lettered, 1);

    // Requeue: a NEW seq and id with a fresh budget; it lands once the server accepts it.
    h.server.poison.clear();
    let tx = h.engine.requeue_dead(h.now, 1).unwrap();
    h.store.apply(tx);
    assert_eq!(h.store.visible("t", "p"), Some(json!({"v": "huge"})));
    let requeued = h.store.outbox.values().next().unwrap().clone();
    assert_eq!((requeued.seq, requeued.permanent_failures, requeued.attempts, requeued.sent), (5, 0, 0, false));
    assert_ne!(requeued.id, dead[0].entry.id);
    assert!(h.engine.dead_letters().is_empty());
    h.drain(60_000);
    assert_eq!(h.server.row("t", "p"), Some(row(json!({"v": "huge"}))));
}

/// Discarding a dead letter drops it and restores the visible row from base + pending.
#[test]
fn discard_dead_restores_the_visible_row() {
    let mut h = Harness::new(Config { max_permanent_failures: 2, ..Config::default() });
    h.server.poison.insert("p".into(), (400, codes::MALFORMED.into()));
    h.write("t", "p", Op::Upsert, Some(json!({"v": 1})));
    h.drain(600_000);
    assert_eq!(h.engine.dead_letters().len(), 1);
    assert_eq!(h.store.visible("t", "p"), None);
    h.write("t", "p", Op::Patch, Some(json!({"w": 2})));
    let tx = h.engine.discard_dead(1).unwrap();
    h.store.apply(tx);
    assert!(h.store.dead.is_empty());
    assert_eq!(h.store.visible("t", "p"), Some(json!({"w": 2})));
    assert_eq!(h.engine.discard_dead(1).unwrap_err().code, "NOT_FOUND");
}

/// Runs a slice of 64 lone writes with one poisoned write at `poisoned` (1-based) that makes
/// any request carrying it fail with `code`; returns the number of sends.
fn narrowing_sends(poisoned: usize, code: &str) -> usize {
    let mut h = Harness::new(Config::default());
    for i in 1..=64 {
        h.write("t", &format!("w{i}"), Op::Upsert, Some(json!({"i": i})));
    }
    h.server.poison.insert(format!("w{poisoned}"), (400, code.into()));
    h.drain(3_600_000);
    let dead: Vec<i64> = h.engine.dead_letters().iter().map(|d| d.entry.seq).collect();
    assert_eq!(dead, vec![poisoned as i64], "the search converged on the poisoned write");
    assert_eq!(h.server.effects.len(), 63);
    assert!(h.server.effects.values().all(|&n| n == 1), "every other write landed exactly once");
    let mut order = h.server.applied_order.clone();
    order.sort();
    assert_eq!(order, h.server.applied_order, "issue order kept");
    // The poisoned write was charged only when alone: exactly 5 lone sends.
    assert_eq!(h.server.requests.iter().filter(|r| **r == vec![poisoned as i64]).count(), 5);
    h.server.sends()
}

/// KZP02 halves a wide slice: a logarithmic number of sends (see the module docs).
#[test]
fn kzp02_narrowing_halves_to_the_poisoned_write() {
    let sends: Vec<usize> = [1, 37, 64].iter().map(|&p| narrowing_sends(p, codes::BATCH_TOO_LARGE)).collect();
    assert_eq!(sends, vec![12, 14, 17]);
    assert!(sends.iter().all(|&s| s <= 2 * 6 + 5 + 1));
}

/// A body over the gateway's limit (413 KZG01) halves the slice the same way: a smaller request
/// is what the server asks for.
#[test]
fn kzg01_narrowing_halves_too() {
    assert_eq!(narrowing_sends(37, codes::BODY_TOO_LARGE), 14);
}

/// Any other permanent code cuts the slice to its head write, which then walks the queue; a 4xx
/// the client has no name for (PostgREST's 400 for a NUL in a string) is one of them.
#[test]
fn other_permanent_codes_cut_to_the_head_write() {
    assert_eq!(narrowing_sends(37, codes::ROW_TOO_LARGE), 43);
    assert_eq!(narrowing_sends(37, "22P05"), 43);
}

/// Narrowing is persisted: a reload in the middle of the search continues at the narrowed width.
#[test]
fn narrowed_width_survives_reload() {
    let mut h = Harness::new(Config::default());
    for i in 1..=64 {
        h.write("t", &format!("w{i}"), Op::Upsert, Some(json!({})));
    }
    h.server.poison.insert("w40".into(), (400, codes::BATCH_TOO_LARGE.into()));
    assert!(h.push_step());
    assert_eq!(h.engine.slice_limit(), 32);
    h.reload();
    assert_eq!(h.engine.slice_limit(), 32);
    assert!(h.push_step());
    assert_eq!(h.server.requests[1].len(), 32);
}

/// A reload in the middle of everything loses nothing: a push in flight when the tab closes
/// is resent with the same ids (replayed verdicts, one effect), a poisoned write keeps the
/// budget it used, and the dead letter and its compensated row survive.
#[test]
fn a_reload_mid_delivery_loses_nothing() {
    let mut h = Harness::new(Config::default());
    h.server.poison.insert("p".into(), (400, codes::MALFORMED.into()));
    for i in 0..3 {
        h.write("t", &format!("a{i}"), Op::Upsert, Some(json!({"i": i})));
    }
    // The tab closes after the server committed but before the answer was applied.
    let (request, tx) = h.engine.poll_push(h.now).unwrap();
    h.store.apply(tx);
    h.server.push(h.now, request).unwrap();
    h.reload();
    h.write("t", "p", Op::Upsert, Some(json!({"bad": true})));
    h.write("t", "after", Op::Upsert, Some(json!({})));
    // Two charged failures, then another reload.
    h.run_until(600_000, |h| h.store.outbox.values().any(|e| e.permanent_failures == 2));
    h.reload();
    h.drain(3_600_000);
    assert!(h.server.effects.values().all(|&n| n == 1));
    assert_eq!(h.server.effects.len(), 4, "a0..a2 and `after`");
    assert_eq!(h.engine.status().applied, 4);
    assert_eq!(h.engine.dead_letters().len(), 1);
    assert_eq!(h.engine.dead_letters()[0].entry.permanent_failures, 5, "the budget survived the reload");
    assert_eq!(h.store.visible("t", "p"), None);
    h.reload();
    assert_eq!(h.engine.dead_letters().len(), 1);
    let tx = h.engine.discard_dead(h.engine.dead_letters()[0].entry.seq).unwrap();
    h.store.apply(tx);
    assert!(h.store.dead.is_empty());
}

/// Offline: nothing is polled and nothing to wake for; back online a pull is due at once.
/// Health reports in-flight, the last error and the last success.
#[test]
fn online_state_and_health() {
    let mut h = Harness::new(Config::default());
    assert!(h.pull_step());
    assert_eq!(h.engine.health(h.now).last_success_at, Some(h.now));
    h.engine.set_online(false);
    h.write("t", "1", Op::Upsert, Some(json!({})));
    assert!(h.engine.poll_push(h.now).is_none());
    assert_eq!(h.engine.next_wake(h.now), None);
    h.engine.set_online(true);
    assert_eq!(h.engine.next_wake(h.now), Some(h.now));
    let (_, tx) = h.engine.poll_push(h.now).unwrap();
    h.store.apply(tx);
    let health = h.engine.health(h.now);
    assert!(health.in_flight && health.online);
    let tx = h.engine.on_push_failure(h.now, Failure { status: Some(503), code: "PGRST000".into(), message: "down".into() });
    h.store.apply(tx);
    let health = h.engine.health(h.now);
    assert_eq!((health.failure_streak, health.last_error.as_deref(), health.in_flight), (1, Some("PGRST000: down"), false));
    assert_eq!(h.engine.status().retrying, 1);
}

/// The answer to a push is lost and a pull runs before the retry: the pulled row already holds
/// the write and whatever came after it. The replayed verdict must not lay the old write over it
/// again, or the local row would stay wrong until the row changes once more.
#[test]
fn a_late_acknowledgement_never_overwrites_a_newer_pulled_row() {
    let mut h = Harness::new(Config::default());
    assert!(h.pull_step());
    h.write("todos", "1", Op::Upsert, Some(json!({"title": "mine", "done": false})));
    h.server.lose_next_ack = true;
    assert!(h.push_step());
    h.server.remote_write("todos", "1", Op::Patch, Some(row(json!({"title": "theirs"}))));
    h.engine.request_pull();
    assert!(h.pull_step());
    assert_eq!(h.store.visible("todos", "1"), Some(json!({"title": "mine", "done": false})), "still pending: read your writes");

    h.engine.request_push();
    assert!(h.push_step(), "sync() retries at once");
    assert_eq!(h.engine.status().pending, 0);
    assert_eq!(h.store.visible("todos", "1"), Some(json!({"title": "theirs", "done": false})), "the server's row, as pulled");
    assert_eq!(h.server.effects.values().sum::<u32>(), 1);
}

/// SKIPPED names no commit: the write is acknowledged, and a pull brings the row as it is now.
#[test]
fn a_skipped_write_is_acknowledged_and_the_row_is_pulled_again() {
    let mut h = Harness::new(Config::default());
    assert!(h.pull_step());
    h.write("todos", "1", Op::Upsert, Some(json!({"title": "once"})));
    h.server.lose_next_ack = true;
    assert!(h.push_step());
    h.server.prune_ledger();
    h.server.remote_write("todos", "1", Op::Patch, Some(row(json!({"title": "later"}))));
    h.engine.request_push();
    assert!(h.push_step());
    assert_eq!((h.engine.status().pending, h.engine.status().skipped), (0, 1));
    assert_eq!(h.server.effects.values().sum::<u32>(), 1, "never a second effect");
    assert!(h.pull_step(), "a pull is due after a SKIPPED verdict");
    assert_eq!(h.store.visible("todos", "1"), Some(json!({"title": "later"})));
}

/// A pull that succeeds does not hide a push that keeps failing.
#[test]
fn the_failure_streak_counts_push_failures_across_successful_pulls() {
    let mut h = Harness::new(Config::default());
    assert!(h.pull_step());
    h.server.poison.insert("bad".into(), (400, codes::MALFORMED.into()));
    h.write("todos", "bad", Op::Upsert, Some(json!({})));
    for n in 1..=3 {
        h.now += 60_000; // past the refusal's backoff, which sync() does not skip
        h.engine.request_push();
        assert!(h.push_step());
        h.engine.request_pull();
        assert!(h.pull_step());
        assert_eq!(h.engine.health(h.now).failure_streak, n, "after {n} refusals and as many good pulls");
    }
}

/// The store refused a step and the adapter rebuilt the engine: nothing goes out before a backoff
/// that grows with each refusal in a row, and a success clears it.
#[test]
fn after_a_store_failure_requests_wait_out_a_growing_backoff() {
    let mut h = Harness::new(Config::default());
    h.write("todos", "1", Op::Upsert, Some(json!({"a": 1})));
    h.reload();
    h.engine.after_storage_failure(h.now, 1, "STORAGE_FAILED: quota".into());
    assert!(h.engine.poll_push(h.now).is_none() && h.engine.poll_pull(h.now).is_none(), "held");
    let first = h.engine.next_wake(h.now).unwrap();
    assert!(first > h.now);
    assert_eq!(h.engine.health(h.now).failure_streak, 1);

    h.reload();
    h.engine.after_storage_failure(h.now, 4, "STORAGE_FAILED: quota".into());
    assert!(h.engine.next_wake(h.now).unwrap() - h.now >= (first - h.now), "the hold grows");
    h.now = h.engine.next_wake(h.now).unwrap();
    h.drain(120_000);
    assert_eq!(h.engine.health(h.now).failure_streak, 0);
}

/// sync() retries a write in a retryable backoff at once, but a write the server refused waits out
/// its backoff whoever asks: five quick sync() calls do not spend its budget (issue 8.5).
#[test]
fn quick_syncs_never_spend_a_refused_writes_budget() {
    let mut h = Harness::new(Config::default());
    assert!(h.pull_step());
    h.server.poison.insert("bad".into(), (400, codes::MALFORMED.into()));
    h.write("todos", "bad", Op::Upsert, Some(json!({})));
    assert!(h.push_step(), "the first attempt");
    for _ in 0..5 {
        h.now += 10;
        h.engine.request_push();
        assert!(!h.push_step(), "held by the refusal's backoff");
    }
    assert!(h.engine.dead_letters().is_empty());
    assert_eq!(h.engine.outbox().next().unwrap().permanent_failures, 1);
    // The timers' pace still dead-letters it after five refusals.
    h.drain(3_600_000);
    assert_eq!(h.engine.dead_letters().len(), 1);
}

/// `push_due` says what `poll_push` would do, so a timer that fired for a pull can skip the
/// push's store transaction: nothing queued, a write held by its delay window, a push in flight,
/// offline: not due; a write ready: due.
#[test]
fn push_due_answers_as_poll_push_would() {
    let mut h = Harness::new(Config::default());
    assert!(!h.engine.push_due(h.now), "an empty outbox");
    h.write_all(vec![LocalWrite { apply_after: Some(h.now + 5_000), ..lw("t", "later", Op::Upsert, Some(json!({"v": 1}))) }]).unwrap();
    assert!(!h.engine.push_due(h.now), "held by its delay window");
    h.write("t", "now", Op::Upsert, Some(json!({"v": 2})));
    assert!(h.engine.push_due(h.now));
    h.engine.set_online(false);
    assert!(!h.engine.push_due(h.now), "offline");
    h.engine.set_online(true);
    let (_, tx) = h.engine.poll_push(h.now).unwrap();
    h.store.apply(tx);
    assert!(!h.engine.push_due(h.now), "one push in flight at a time");
    assert!(h.engine.poll_push(h.now).is_none());
}

/// `poll_push_unwritten` sends what `poll_push` would, when that writes nothing first: a slice
/// holding a latest-only entry (whose `sent` mark must be durable before it goes) is left for
/// `poll_push`, with nothing marked; a plain slice goes, in flight like any other.
#[test]
fn a_slice_that_must_write_first_is_not_polled_unwritten() {
    let mut h = Harness::new(Config::default());
    assert!(h.engine.poll_push_unwritten(h.now).is_none(), "nothing queued");
    h.write_all(vec![LocalWrite { latest_only: Some(true), ..lw("t", "cursor", Op::Upsert, Some(json!({"v": 1}))) }]).unwrap();
    assert!(h.engine.poll_push_unwritten(h.now).is_none(), "a latest-only entry");
    assert!(h.engine.push_due(h.now), "still due, and not in flight");
    let (request, tx) = h.engine.poll_push(h.now).unwrap();
    assert_eq!(request.mutations.len(), 1);
    assert_eq!(tx.ops.len(), 1, "its mark is written before it goes");

    let mut h = Harness::new(Config::default());
    h.write("t", "a", Op::Upsert, Some(json!({"v": 1})));
    h.write("t", "b", Op::Upsert, Some(json!({"v": 2})));
    let request = h.engine.poll_push_unwritten(h.now).unwrap();
    assert_eq!(request.mutations.iter().map(|m| m.pk.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    assert!(!h.engine.push_due(h.now), "in flight");
    assert!(h.engine.poll_push_unwritten(h.now).is_none());
}

/// A verdict naming the key in the server's spelling (`pk`: the mutation sent an upper-case uuid)
/// moves the row there: merged into the row stored under that spelling (read in the answer's step),
/// with the writes still pending on it; nothing stays under the spelling sent, which no pull would
/// ever update or remove (a second row of the same key).
#[test]
fn a_verdict_in_another_spelling_of_the_key_moves_the_row_and_its_pending_writes_there() {
    let (lower, upper) = ("0a0b0c0d-1e2f-4a4b-8c8d-9e9fa0a1b2c3", "0A0B0C0D-1E2F-4A4B-8C8D-9E9FA0A1B2C3");
    let mut h = Harness::new(Config::default());
    h.server.remote_write("todos", lower, Op::Upsert, Some(row(json!({"title": "srv", "done": false}))));
    assert!(h.pull_step());
    h.reload(); // the pulled row is in the store only, as after a reload

    h.write("todos", upper, Op::Patch, Some(json!({"title": "mine"})));
    let (request, tx) = h.engine.poll_push(h.now).unwrap();
    h.store.apply(tx);
    h.write("todos", upper, Op::Patch, Some(json!({"done": true}))); // made while the first is in flight
    h.events();
    let mut response = h.server.push(h.now, request).unwrap();
    response.verdicts[0].pk = Some(lower.into());
    let keys = h.engine.respelled_keys(&response);
    assert_eq!(keys, [kizuna_engine::RowKey::new("todos", lower)]);
    h.engine.remember_respelled(&keys, &h.store.rows_of(&keys));
    let tx = h.engine.on_push_response(h.now, response);
    h.store.apply(tx);

    assert_eq!(h.store.visible("todos", upper), None, "nothing is left under the spelling sent");
    let rec = &h.store.rows[&kizuna_engine::RowKey::new("todos", lower)];
    assert_eq!(rec.base, Some(row(json!({"title": "mine", "done": false}))), "the applied patch, over the row stored there");
    assert_eq!(rec.visible, Some(row(json!({"title": "mine", "done": true}))), "the write still pending, replayed on it");
    let pending: Vec<&str> = h.store.outbox.values().map(|e| e.pk.as_str()).collect();
    assert_eq!(pending, [lower], "the pending write names the server's spelling");
    let changed: Vec<String> = h
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Change { keys, .. } => Some(keys.into_iter().map(|k| k.pk)),
            _ => None,
        })
        .flatten()
        .collect();
    assert!(changed.contains(&upper.to_string()) && changed.contains(&lower.to_string()), "{changed:?}");
}

/// A write whose delay window has passed and whose push then failed blocks what was written after
/// it until its backoff ends, as any other failed write does: its backoff was read as part of its
/// window, it was held alone, and a later write of the same key went first (the server then kept
/// the older value).
#[test]
fn a_due_delayed_write_that_failed_blocks_the_writes_behind_it() {
    let mut h = Harness::new(Config::default());
    let mut early = lw("todos", "k", Op::Upsert, Some(json!({"title": "first"})));
    early.apply_after = Some(h.now - 1_000);
    h.write_all(vec![early]).unwrap();
    let (_request, tx) = h.engine.poll_push(h.now).expect("due");
    h.store.apply(tx);
    let tx = h.engine.on_push_failure(h.now, network());
    h.store.apply(tx);
    h.write("todos", "k", Op::Upsert, Some(json!({"title": "second"})));
    assert!(h.engine.poll_push(h.now).is_none(), "the later write waits behind the failed one");
    h.drain(120_000);
    assert_eq!(h.server.row("todos", "k"), Some(row(json!({"title": "second"}))), "applied in the order written");
}

/// A slice sent ahead (the one in flight began to answer with success) holds the writes after
/// the ones in flight, never the same ones, one ahead at a time; answers are taken in the order
/// the requests went, and the server applies every write once, in issue order.
#[test]
fn a_slice_sent_ahead_follows_the_one_in_flight_and_is_answered_after_it() {
    let mut h = Harness::new(Config { max_slice: 2, ..Config::default() });
    assert!(h.engine.poll_push_ahead(h.now).is_none(), "nothing in flight to go ahead of");
    for (pk, v) in [("a", 1), ("b", 1), ("a", 2), ("c", 1), ("a", 3)] {
        h.write("t", pk, Op::Upsert, Some(json!({"v": v})));
    }
    let (first, tx) = h.engine.poll_push(h.now).unwrap();
    h.store.apply(tx);
    let first_answer = h.server.push(h.now, first).unwrap();
    let ahead = h.engine.poll_push_ahead(h.now).unwrap();
    assert_eq!(ahead.mutations.iter().map(|m| m.client_seq).collect::<Vec<_>>(), [3, 4], "the next writes, not the ones in flight");
    assert!(h.engine.poll_push_ahead(h.now).is_none(), "one ahead at a time");
    assert!(h.engine.poll_push(h.now).is_none() && !h.engine.push_due(h.now));
    let ahead_answer = h.server.push(h.now, ahead).unwrap();

    let keys: Vec<String> = h.engine.in_flight_keys().into_iter().map(|k| k.pk).collect();
    assert_eq!(keys, ["a", "b"], "the first answer settles the first slice's keys");
    let tx = h.engine.on_push_response(h.now, first_answer);
    h.store.apply(tx);
    let keys: Vec<String> = h.engine.in_flight_keys().into_iter().map(|k| k.pk).collect();
    assert_eq!(keys, ["a", "c"], "then the slice that went ahead is the one in flight");
    let tx = h.engine.on_push_response(h.now, ahead_answer);
    h.store.apply(tx);
    assert_eq!(h.engine.outbox().map(|e| e.seq).collect::<Vec<_>>(), [5]);
    h.drain(60_000);
    assert_eq!(h.server.applied_order, [1, 2, 3, 4, 5]);
    assert_eq!(h.server.row("t", "a"), Some(row(json!({"v": 3}))));
    assert_eq!(h.store.visible("t", "a"), Some(json!({"v": 3})));
    assert_eq!(h.engine.status().applied, 5);
}

/// A slice that must write its marks first (a latest-only entry) is not sent ahead; offline,
/// nothing goes ahead either. A takeover forgets both requests: their writes go again.
#[test]
fn a_slice_that_must_write_first_does_not_go_ahead_and_a_takeover_forgets_both() {
    let mut h = Harness::new(Config { max_slice: 1, ..Config::default() });
    h.write("t", "a", Op::Upsert, Some(json!({"v": 1})));
    h.write_all(vec![LocalWrite { latest_only: Some(true), ..lw("t", "cursor", Op::Upsert, Some(json!({"v": 1}))) }]).unwrap();
    h.write("t", "b", Op::Upsert, Some(json!({"v": 1})));
    let (_, tx) = h.engine.poll_push(h.now).unwrap();
    h.store.apply(tx);
    assert!(h.engine.poll_push_ahead(h.now).is_none(), "the latest-only entry's mark is written before it goes");
    assert_eq!(h.engine.outbox().filter(|e| e.sent).count(), 1, "nothing marked");

    let mut h = Harness::new(Config { max_slice: 1, ..Config::default() });
    h.write("t", "a", Op::Upsert, Some(json!({"v": 1})));
    h.write("t", "b", Op::Upsert, Some(json!({"v": 1})));
    let (_, tx) = h.engine.poll_push(h.now).unwrap();
    h.store.apply(tx);
    h.engine.set_online(false);
    assert!(h.engine.poll_push_ahead(h.now).is_none(), "offline");
    h.engine.set_online(true);
    assert!(h.engine.poll_push_ahead(h.now).is_some());
    h.engine.take_over();
    assert!(h.engine.in_flight_keys().is_empty());
    h.drain(60_000);
    assert_eq!(h.server.applied_order, [1, 2], "both sent again, applied once each");
}

/// The first answer fails after the slice ahead went (its body was cut off, its writes committed):
/// the slice ahead's answer is let go as well, since taking a later write's verdict before an
/// earlier one's would show the earlier, still pending, over it. Both slices go again in order under
/// their ids; the server answers them from its ledger: one effect each, the last write the row.
#[test]
fn a_failed_answer_lets_the_answer_ahead_of_it_go_and_both_go_again_in_order() {
    let mut h = Harness::new(Config { max_slice: 2, ..Config::default() });
    for (pk, v) in [("a", 1), ("b", 1), ("a", 2), ("b", 2)] {
        h.write("t", pk, Op::Upsert, Some(json!({"v": v})));
    }
    let (first, tx) = h.engine.poll_push(h.now).unwrap();
    h.store.apply(tx);
    let _committed = h.server.push(h.now, first).unwrap();
    let ahead = h.engine.poll_push_ahead(h.now).unwrap();
    let ahead_answer = h.server.push(h.now, ahead).unwrap();
    let tx = h.engine.on_push_failure(h.now, network());
    h.store.apply(tx);
    let tx = h.engine.on_push_response(h.now, ahead_answer);
    assert!(tx.ops.is_empty(), "the answer ahead is not taken");
    h.store.apply(tx);
    assert_eq!(h.engine.outbox().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert_eq!(h.store.visible("t", "a"), Some(json!({"v": 2})), "the row still shows the last write");
    h.now += 120_000;
    h.drain(600_000);
    assert_eq!(h.server.applied_order, [1, 2, 3, 4], "one effect each");
    assert!(h.engine.outbox().next().is_none());
    assert_eq!(h.store.visible("t", "a"), Some(json!({"v": 2})));
    assert_eq!(h.engine.status().applied, 4);
}

//! Local writes: entries, sequence numbers, HLCs, validation, latest-only coalescing.

mod support;

use std::collections::BTreeSet;

use kizuna_engine::protocol::Op;
use kizuna_engine::{ChangeOrigin, Config, Event, LocalWrite, StoreOp};
use serde_json::json;
use support::*;

fn latest_only_config() -> Config {
    Config { latest_only_tables: BTreeSet::from(["profiles".to_string()]), ..Config::default() }
}

/// A write stores the visible row, its entry and the advanced meta in one transaction, and
/// says Change(Local); the entry carries the committed horizon as read_seq and an HLC.
#[test]
fn a_write_is_one_transaction_with_row_entry_and_meta() {
    let mut h = Harness::new(Config::default());
    let current = Default::default();
    let tx = h.engine.write(h.now, vec![lw("todos", "1", Op::Upsert, Some(json!({"title": "a"})))], &current).unwrap();
    assert!(matches!(tx.ops.as_slice(), [StoreOp::PutOutbox(_), StoreOp::PutRow(_), StoreOp::PutMeta(_)]));
    assert!(matches!(&tx.events[..], [Event::Change { origin: ChangeOrigin::Local, .. }]));
    let StoreOp::PutOutbox(entry) = &tx.ops[0] else { unreachable!() };
    assert_eq!((entry.seq, entry.read_seq, entry.sent, entry.attempts), (1, 0, false, 0));
    assert_eq!(entry.hlc, format!("{:013}-0000-{}", h.now, h.engine.meta().client_id));
    let StoreOp::PutMeta(meta) = &tx.ops[2] else { unreachable!() };
    assert_eq!(meta.next_seq, 2);
    h.store.apply(tx);
    assert_eq!(h.store.visible("todos", "1"), Some(json!({"title": "a"})));
}

/// Invalid input is refused and changes nothing (no seq consumed).
#[test]
fn invalid_writes_change_nothing() {
    let mut h = Harness::new(Config::default());
    for bad in [
        vec![],
        vec![lw("", "1", Op::Delete, None)],
        vec![lw("t", "", Op::Delete, None)],
        vec![lw("t", "1", Op::Patch, None)],
        vec![lw("t", "1", Op::Upsert, None)],
        vec![lw("t", "1", Op::Delete, Some(json!({"a": 1})))],
        vec![lw("t", "1", Op::Upsert, Some(json!({"a": 1}))), lw("t", "2", Op::Patch, None)],
        // A delay to a time the wire's RFC 3339 text cannot name (before year 1, after 9999).
        vec![LocalWrite { apply_after: Some(-62_135_596_800_001), ..lw("t", "1", Op::Delete, None) }],
        vec![LocalWrite { apply_after: Some(253_402_300_800_000), ..lw("t", "1", Op::Delete, None) }],
        vec![LocalWrite { apply_after: Some(i64::MIN), ..lw("t", "1", Op::Delete, None) }],
    ] {
        let err = h.write_all(bad).unwrap_err();
        assert_eq!(err.code, "INVALID_ARGUMENT");
    }
    assert_eq!(h.engine.meta().next_seq, 1);
    assert_eq!(h.engine.status().pending, 0);
}

/// Latest-only coalescing: a newer unsent write to the same key absorbs the pending one when one
/// write does the same as both: patches merge into a patch or upsert, upserts into an upsert, a
/// delete replaces anything. Pairs without such an equivalent stay apart.
#[test]
fn coalescing_merges_what_one_write_can_carry_and_keeps_the_rest_apart() {
    let mut h = Harness::new(latest_only_config());
    h.write("profiles", "u1", Op::Patch, Some(json!({"name": "A"})));
    let current = h.store.rows.iter().map(|(k, r)| (k.clone(), r.clone())).collect();
    let tx = h.engine.write(h.now, vec![lw("profiles", "u1", Op::Patch, Some(json!({"bio": "B"})))], &current).unwrap();
    assert!(tx.ops.contains(&StoreOp::DeleteOutbox(1)), "the replaced entry leaves in the same transaction");
    h.store.apply(tx);
    let pending: Vec<_> = h.store.outbox.values().cloned().collect();
    assert_eq!(pending.len(), 1);
    assert_eq!((pending[0].seq, pending[0].op), (2, Op::Patch));
    assert_eq!(pending[0].columns, Some(row(json!({"name": "A", "bio": "B"}))));
    assert_eq!(h.store.visible("profiles", "u1"), Some(json!({"name": "A", "bio": "B"})));

    // An upsert after a patch would create a row the patch could not: both stay. Later writes
    // merge into the upsert.
    h.write("profiles", "u1", Op::Upsert, Some(json!({"name": "C"})));
    h.write("profiles", "u1", Op::Patch, Some(json!({"bio": "D"})));
    h.write("profiles", "u1", Op::Upsert, Some(json!({"age": 3})));
    let pending: Vec<_> = h.store.outbox.values().cloned().collect();
    assert_eq!(pending.len(), 2, "{pending:?}");
    assert_eq!((pending[1].op, pending[1].columns.clone()), (Op::Upsert, Some(row(json!({"name": "C", "bio": "D", "age": 3})))));
    assert_eq!(h.store.visible("profiles", "u1"), Some(json!({"name": "C", "bio": "D", "age": 3})));

    h.write("profiles", "u1", Op::Delete, None);
    let pending: Vec<_> = h.store.outbox.values().cloned().collect();
    assert_eq!((pending.len(), pending[1].op, pending[1].seq), (2, Op::Delete, 6));
    assert_eq!(h.store.visible("profiles", "u1"), None);

    // A patch or an upsert after a pending delete has no single-write equivalent: they stay.
    h.write("profiles", "u1", Op::Upsert, Some(json!({"bio": "E"})));
    assert_eq!(h.store.outbox.len(), 3);
    h.drain(60_000);
    assert_eq!(h.server.row("profiles", "u1"), Some(row(json!({"bio": "E"}))));
}

/// An entry already sent is never replaced: the server may hold it already.
#[test]
fn coalescing_never_replaces_a_sent_entry() {
    let mut h = Harness::new(latest_only_config());
    h.write("profiles", "u1", Op::Patch, Some(json!({"name": "A"})));
    let (request, tx) = h.engine.poll_push(h.now).unwrap();
    h.store.apply(tx);
    h.write("profiles", "u1", Op::Patch, Some(json!({"name": "B"})));
    assert_eq!(h.store.outbox.len(), 2, "the in-flight entry stays; the new one queues behind it");
    let response = h.server.push(h.now, request).unwrap();
    let tx = h.engine.on_push_response(h.now, response);
    h.store.apply(tx);
    // A third write now coalesces with the second (unsent) one only.
    h.write("profiles", "u1", Op::Patch, Some(json!({"bio": "x"})));
    assert_eq!(h.store.outbox.len(), 1);
    h.drain(60_000);
    assert_eq!(h.server.row("profiles", "u1"), Some(row(json!({"name": "B", "bio": "x"}))));
    assert_eq!(h.server.applied_order, vec![1, 3]);
}

/// A latest-only entry's `sent` mark is written before its request goes out, so a reload while
/// the answer is lost still never coalesces into it; a plain entry's send writes nothing (only
/// latest-only entries are ever coalesced into).
#[test]
fn a_sent_mark_survives_a_reload_where_coalescing_could_read_it() {
    let mut h = Harness::new(latest_only_config());
    h.write("profiles", "u1", Op::Patch, Some(json!({"name": "A"})));
    h.write("todos", "t1", Op::Upsert, Some(json!({"title": "x"})));
    let (request, tx) = h.engine.poll_push(h.now).unwrap();
    assert_eq!(request.mutations.len(), 2);
    let marked: Vec<i64> = tx.ops.iter().filter_map(|op| match op { StoreOp::PutOutbox(e) => Some(e.seq), _ => None }).collect();
    assert_eq!(marked, vec![1], "only the latest-only entry's mark is written");
    h.store.apply(tx);
    h.server.push(h.now, request).unwrap(); // applied, the answer lost with the tab
    h.reload();
    h.write("profiles", "u1", Op::Patch, Some(json!({"name": "B"})));
    assert_eq!(h.store.outbox.len(), 3, "the reloaded tab queues behind the sent entry instead of replacing it");
    h.drain(60_000);
    assert_eq!(h.server.row("profiles", "u1"), Some(row(json!({"name": "B"}))));
}

/// Coalescing is opt-in (table config or per-write override), needs both writes latest-only,
/// and never crosses an atomic batch.
#[test]
fn coalescing_is_opt_in_and_never_crosses_batches() {
    let mut h = Harness::new(latest_only_config());
    h.write("todos", "1", Op::Patch, Some(json!({"a": 1})));
    h.write("todos", "1", Op::Patch, Some(json!({"b": 2})));
    assert_eq!(h.store.outbox.len(), 2, "plain table: every write is delivered");

    let mut w = lw("todos", "2", Op::Patch, Some(json!({"a": 1})));
    w.latest_only = Some(true);
    h.write_all(vec![w.clone()]).unwrap();
    w.columns = Some(row(json!({"b": 2})));
    h.write_all(vec![w]).unwrap();
    assert_eq!(h.store.outbox.len(), 3, "per-write override coalesces");

    let mut opt_out = lw("profiles", "p", Op::Patch, Some(json!({"a": 1})));
    opt_out.latest_only = Some(false);
    h.write_all(vec![opt_out]).unwrap();
    h.write("profiles", "p", Op::Patch, Some(json!({"b": 2})));
    assert_eq!(h.store.outbox.len(), 5, "the older write opted out, so it is kept");

    h.write_all(vec![lw("profiles", "q", Op::Patch, Some(json!({"a": 1}))), lw("profiles", "r", Op::Patch, Some(json!({"a": 1})))]).unwrap();
    h.write("profiles", "q", Op::Patch, Some(json!({"b": 2})));
    assert_eq!(h.store.outbox.len(), 8, "a batch member is never swallowed");
    h.write_all(vec![lw("profiles", "q", Op::Patch, Some(json!({"c": 3}))), lw("profiles", "s", Op::Patch, Some(json!({"a": 1})))]).unwrap();
    assert_eq!(h.store.outbox.len(), 10, "a batch member never swallows");
}

/// Sequence numbers never repeat: prune everything, reload from storage, write again.
/// Ids stay unique and the HLC stays monotonic even when the clock steps back and the
/// adapter passes the same seed again.
#[test]
fn sequence_numbers_survive_pruning_and_reload() {
    let mut h = Harness::new(Config::default());
    for i in 0..3 {
        h.write("todos", &i.to_string(), Op::Upsert, Some(json!({"i": i})));
    }
    h.drain(60_000);
    assert!(h.store.outbox.is_empty(), "every entry acknowledged and pruned");
    let ids_before: BTreeSet<_> = h.server.ledger.keys().copied().collect();
    let last_hlc = h.store.meta.as_ref().unwrap().hlc_last.clone().unwrap();

    h.seed = h.seed.wrapping_sub(1000); // the adapter even reuses the seed
    h.reload();
    h.now -= 3_600_000; // and the wall clock stepped back an hour
    h.write("todos", "9", Op::Upsert, Some(json!({"i": 9})));
    let entry = h.store.outbox.values().next().unwrap().clone();
    assert_eq!(entry.seq, 4);
    assert!(!ids_before.contains(&entry.id));
    assert!(entry.hlc > last_hlc, "{} > {}", entry.hlc, last_hlc);
    h.drain(60_000);
    assert_eq!(h.server.applied_order, vec![1, 2, 3, 4]);
}

/// Writes follow reads: read_seq is the committed checkpoint's horizon at write time.
#[test]
fn read_seq_is_the_committed_horizon() {
    let mut h = Harness::new(Config::default());
    h.server.remote_write("todos", "x", Op::Upsert, Some(row(json!({"a": 1}))));
    h.server.remote_write("todos", "y", Op::Upsert, Some(row(json!({"a": 1}))));
    assert!(h.pull_step());
    assert_eq!(h.engine.checkpoint().horizon, 2);
    h.write("todos", "z", Op::Upsert, Some(json!({"a": 1})));
    assert_eq!(h.store.outbox.values().next().unwrap().read_seq, 2);
}

/// The browser takes a small write before its keys' stored records are read and settles it once
/// they are (`Engine::settle_unread`): what it stores then is what a write that read first stores,
/// for a stored key with other columns and a pending write, a key never stored, a delete, and a
/// batch writing one key twice; whether the engine holds the key's row (its own earlier write) or
/// not (after a reload). A row the engine held as stored is not put twice.
#[test]
fn a_write_settled_after_its_reads_stores_what_a_write_that_read_first_stores() {
    let cases: Vec<Vec<LocalWrite>> = vec![
        vec![lw("todos", "stored", Op::Patch, Some(json!({"done": true})))],
        vec![lw("todos", "stored", Op::Upsert, Some(json!({"title": "b"})))],
        vec![lw("todos", "stored", Op::Delete, None)],
        vec![lw("todos", "new", Op::Upsert, Some(json!({"title": "n"})))],
        vec![
            lw("todos", "stored", Op::Patch, Some(json!({"a": 1}))),
            lw("todos", "new", Op::Delete, None),
            lw("todos", "stored", Op::Patch, Some(json!({"b": 2}))),
        ],
    ];
    for reload in [true, false] {
        for writes in &cases {
            let [mut read_first, mut unread] = [0, 1].map(|_| {
                let mut h = Harness::new(Config::default());
                h.server.remote_write("todos", "stored", Op::Upsert, Some(row(json!({"title": "a", "done": false}))));
                assert!(h.pull_step());
                h.write("todos", "stored", Op::Patch, Some(json!({"note": "pending"})));
                if reload {
                    // As the browser loads: no rows; the steps read those they need.
                    h.engine = kizuna_engine::Engine::new(h.config.clone(), h.store.load_cold(), h.seed);
                }
                h
            });
            let current = read_first.store.current(writes);
            let tx = read_first.engine.write(read_first.now, writes.clone(), &current).unwrap();
            read_first.store.apply(tx);

            let tx = unread.engine.write(unread.now, writes.clone(), &Default::default()).unwrap();
            let again = unread.engine.settle_unread(&tx, &current, false);
            if !reload {
                assert!(again.is_empty(), "the held rows were the stored ones: {again:?}");
            }
            unread.store.apply(tx);
            for op in again {
                unread.store.apply_op(op);
            }
            assert_eq!(unread.store.rows, read_first.store.rows, "{writes:?}, reload {reload}");
            assert_eq!(unread.store.outbox, read_first.store.outbox);
            // And the engine holds what was stored: a later write over it agrees too.
            let next = vec![lw("todos", "stored", Op::Patch, Some(json!({"c": 3})))];
            for h in [&mut read_first, &mut unread] {
                let tx = h.engine.write(h.now, next.clone(), &Default::default()).unwrap();
                h.store.apply(tx);
            }
            assert_eq!(unread.store.rows, read_first.store.rows);
        }
    }
    // A new declaration of indexes: every record the step wrote is put again.
    let mut h = Harness::new(Config::default());
    let writes = vec![lw("todos", "x", Op::Upsert, Some(json!({"t": 1}))), lw("todos", "y", Op::Delete, None)];
    let tx = h.engine.write(h.now, writes, &Default::default()).unwrap();
    let again = h.engine.settle_unread(&tx, &Default::default(), true);
    assert!(matches!(again.as_slice(), [StoreOp::PutRow(x), StoreOp::DeleteRow(y)] if x.pk == "x" && y.pk == "y"), "{again:?}");
}

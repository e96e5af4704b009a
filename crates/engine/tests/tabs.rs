//! Several engines over one store, as tabs of one browser share one IndexedDB database: each
//! adopts what the others made durable before it steps (the adapter does so inside the step's own
//! transaction), so sequence numbers stay unique and in issue order, and the leader's push in
//! flight survives another tab's writes.

mod support;

use std::collections::BTreeSet;

use kizuna_engine::protocol::Op;
use kizuna_engine::{Config, Engine};
use serde_json::json;
use support::*;

/// A second tab over the harness's store.
fn second_tab(h: &Harness) -> Engine {
    Engine::new(h.config.clone(), h.store.load(), 7)
}

fn write_in(engine: &mut Engine, store: &mut SimStore, now: i64, table: &str, pk: &str, columns: serde_json::Value) {
    engine.adopt(store.load());
    let writes = vec![lw(table, pk, Op::Upsert, Some(columns))];
    let current = store.current(&writes);
    let tx = engine.write(now, writes, &current).expect("valid write");
    store.apply(tx);
}

#[test]
fn writes_from_several_tabs_get_one_sequence_in_commit_order() {
    let mut h = Harness::new(Config::default());
    let mut other = second_tab(&h);
    let now = h.now;
    for i in 0..5 {
        h.engine.adopt(h.store.load());
        h.write("todos", &format!("a{i}"), Op::Upsert, Some(json!({"title": "from a"})));
        write_in(&mut other, &mut h.store, now, "todos", &format!("b{i}"), json!({"title": "from b"}));
    }
    let seqs: Vec<i64> = h.store.outbox.keys().copied().collect();
    assert_eq!(seqs, (1..=10).collect::<Vec<_>>());
    let pks: Vec<&str> = h.store.outbox.values().map(|e| e.pk.as_str()).collect();
    assert_eq!(pks, ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3", "a4", "b4"]);
}

/// The leader sends a slice; another tab writes (also latest-only, to the same key) while it is
/// on the wire; the leader adopts that write and the verdicts still settle the sent entries, and
/// the other tab's write goes in the next push. Nothing is lost or sent twice.
#[test]
fn a_push_in_flight_survives_another_tabs_write() {
    let config = Config { latest_only_tables: BTreeSet::from(["profiles".to_string()]), ..Config::default() };
    let mut h = Harness::new(config);
    h.write("profiles", "u1", Op::Upsert, Some(json!({"name": "A"})));
    let (request, tx) = h.engine.poll_push(h.now).expect("due");
    h.store.apply(tx);
    let mut other = second_tab(&h);
    let now = h.now;
    write_in(&mut other, &mut h.store, now, "profiles", "u1", json!({"name": "B"}));
    assert_eq!(h.store.outbox.len(), 2, "a sent entry is never coalesced away");

    h.engine.adopt(h.store.load());
    let response = h.server.push(h.now, request).expect("answered");
    let tx = h.engine.on_push_response(h.now, response);
    h.store.apply(tx);
    assert_eq!(h.store.outbox.len(), 1);
    assert!(h.push_step());
    assert!(h.store.outbox.is_empty());
    assert_eq!(h.server.row("profiles", "u1").map(serde_json::Value::Object), Some(json!({"name": "B"})));
    assert_eq!(h.server.sends(), 2);
}

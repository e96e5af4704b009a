//! Column last-writer-wins in both modes, and the conflict journal (on per table, off by default).

mod support;

use serde_json::{json, Value};
use support::db::{clocked, mutation, now_ms, pull_run, push_request, statuses, Caller, TestDb};

const ALICE: &str = "a11ce000-0000-4000-8000-000000000001";
const PHONE: &str = "c0000000-0000-4000-8000-0000000000a1";
const LAPTOP: &str = "c0000000-0000-4000-8000-0000000000a2";

/// An owned table like todos, registered with the given options.
async fn owned_table(db: &TestDb, name: &str, options: &str) {
    db.owned_table(name, "id text primary key, title text, body text", options).await;
}

fn with(mut m: Value, field: &str, value: Value) -> Value {
    m[field] = value;
    m
}

fn bucket() -> String {
    format!("user:{ALICE}")
}

#[tokio::test]
async fn arrival_mode_later_arrival_holds_a_column_and_different_columns_both_survive() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    db.push(&alice, push_request(PHONE, vec![mutation(1, "todos", "t1", "upsert", json!({"title": "v0"}))])).await.unwrap();
    let seen = pull_run(db.client(), &alice, PHONE, None, &[&bucket()], 100).await.unwrap();

    // Both devices edited offline from the same checkpoint; the laptop's write arrives last.
    let phone = db.push(&alice, push_request(PHONE, vec![
        with(mutation(2, "todos", "t1", "patch", json!({"title": "phone", "done": true})), "read_seq", json!(seen.horizon)),
    ])).await.unwrap();
    let laptop = db.push(&alice, push_request(LAPTOP, vec![
        with(mutation(1, "todos", "t1", "patch", json!({"title": "laptop", "note": "n"})), "read_seq", json!(seen.horizon)),
    ])).await.unwrap();
    assert_eq!(statuses(&phone), ["APPLIED"]);
    assert_eq!(statuses(&laptop), ["APPLIED"]);
    assert!(laptop["verdicts"][0]["seq"].as_i64() > phone["verdicts"][0]["seq"].as_i64());

    let row: Value = db.one("select to_jsonb(t) from public.todos t where id = 't1'").await;
    assert_eq!((row["title"].clone(), row["done"].clone(), row["note"].clone()), (json!("laptop"), json!(true), json!("n")));

    // The journal is off for todos: nothing recorded, nothing attached.
    let run = pull_run(db.client(), &alice, PHONE, Some(&seen.checkpoint), &[&bucket()], 100).await.unwrap();
    assert!(run.conflicts.is_empty());
    assert_eq!(db.one::<i64>("select count(*) from kizuna.conflicts").await, 0);
    assert_eq!(run.entries[0]["row"]["title"], "laptop");
}

#[tokio::test]
async fn arrival_mode_journal_keeps_the_value_a_stale_writer_overwrote() {
    let db = TestDb::new().await;
    owned_table(&db, "docs", ", journal => true").await;
    let alice = Caller::user(ALICE);
    db.push(&alice, push_request(PHONE, vec![mutation(1, "docs", "d1", "upsert", json!({"title": "v0", "body": "b0"}))])).await.unwrap();
    let seen = pull_run(db.client(), &alice, PHONE, None, &[&bucket()], 100).await.unwrap();

    let phone = db.push(&alice, push_request(PHONE, vec![
        with(mutation(2, "docs", "d1", "patch", json!({"title": "phone"})), "read_seq", json!(seen.horizon)),
    ])).await.unwrap();
    // The laptop never saw the phone's title: its write wins (arrival) and the phone's value is journaled.
    let laptop = db.push(&alice, push_request(LAPTOP, vec![
        with(mutation(1, "docs", "d1", "patch", json!({"title": "laptop", "body": "b0"})), "read_seq", json!(seen.horizon)),
    ])).await.unwrap();
    assert_eq!(db.one::<String>("select title from public.docs").await, "laptop");

    let run = pull_run(db.client(), &alice, PHONE, Some(&seen.checkpoint), &[&bucket()], 100).await.unwrap();
    assert_eq!(run.conflicts.len(), 1, "only the contested column that changed hands: {:?}", run.conflicts);
    let c = &run.conflicts[0];
    assert_eq!((c["table"].clone(), c["pk"].clone(), c["column"].clone()), (json!("docs"), json!("d1"), json!("title")));
    assert_eq!((c["loser"].clone(), c["winner"].clone()), (json!("phone"), json!("laptop")));
    assert_eq!(c["loser_seq"], phone["verdicts"][0]["seq"]);
    assert_eq!(c["winner_seq"], laptop["verdicts"][0]["seq"]);
    assert_eq!(c["loser_by"], ALICE);

    // A writer who had seen the value overwrites it without a conflict.
    let fresh = pull_run(db.client(), &alice, LAPTOP, None, &[&bucket()], 100).await.unwrap();
    assert!(fresh.conflicts.is_empty(), "a device starting from nothing is told of no earlier conflict: {:?}", fresh.conflicts);
    db.push(&alice, push_request(LAPTOP, vec![
        with(mutation(2, "docs", "d1", "patch", json!({"title": "edited"})), "read_seq", json!(fresh.horizon)),
    ])).await.unwrap();
    assert_eq!(db.one::<i64>("select count(*) from kizuna.conflicts").await, 1);
}

#[tokio::test]
async fn a_device_overwriting_its_own_value_above_its_checkpoint_is_no_conflict() {
    let db = TestDb::new().await;
    owned_table(&db, "docs", ", journal => true").await;
    let alice = Caller::user(ALICE);
    // The phone creates a card and edits it before any pull brought its own insert back: the edit
    // is made on checkpoint 0, below the insert, yet the phone has seen the value it overwrites.
    let insert = db.push(&alice, push_request(PHONE, vec![mutation(1, "docs", "d1", "upsert", json!({"title": "draft", "body": "b"}))])).await.unwrap();
    let edit = db.push(&alice, push_request(PHONE, vec![
        with(mutation(2, "docs", "d1", "patch", json!({"title": "final"})), "read_seq", json!(0)),
    ])).await.unwrap();
    assert_eq!(statuses(&edit), ["APPLIED"]);
    assert!(edit["verdicts"][0]["seq"].as_i64() > insert["verdicts"][0]["seq"].as_i64());
    assert_eq!(db.one::<i64>("select count(*) from kizuna.conflicts").await, 0, "a device's own value is no conflict");

    // The laptop, same user, did not see the phone's title: that one is a conflict.
    db.push(&alice, push_request(LAPTOP, vec![
        with(mutation(1, "docs", "d1", "patch", json!({"title": "laptop"})), "read_seq", json!(0)),
    ])).await.unwrap();
    let journal: Value = db.one("select jsonb_agg(jsonb_build_object('loser', loser, 'winner', winner)) from kizuna.conflicts").await;
    assert_eq!(journal, json!([{"loser": "final", "winner": "laptop"}]));
    // A plain SQL write is no device's: a device overwriting it unseen journals it.
    db.exec("update public.docs set body = 'from sql' where id = 'd1'").await;
    db.push(&alice, push_request(PHONE, vec![
        with(mutation(3, "docs", "d1", "patch", json!({"body": "phone"})), "read_seq", json!(0)),
    ])).await.unwrap();
    assert_eq!(db.one::<i64>("select count(*) from kizuna.conflicts").await, 2);
}

#[tokio::test]
async fn hlc_mode_orders_each_column_by_the_clamped_origin_clock() {
    let db = TestDb::new().await;
    owned_table(&db, "notes", ", conflict_mode => 'hlc', journal => true").await;
    db.exec("update kizuna.settings set hlc_max_skew = '2 seconds'").await;
    let alice = Caller::user(ALICE);
    let now_ms = now_ms();

    // Arrival order: newer clock first, then an older one on the same column and a fresh column.
    let newer = clocked(mutation(1, "notes", "n1", "upsert", json!({"title": "newer"})), now_ms - 1_000, 0, "phone");
    let older = clocked(mutation(1, "notes", "n1", "patch", json!({"title": "older", "body": "body"})), now_ms - 5_000, 0, "laptop");
    db.push(&alice, push_request(PHONE, vec![newer])).await.unwrap();
    let response = db.push(&alice, push_request(LAPTOP, vec![older])).await.unwrap();
    assert_eq!(statuses(&response), ["APPLIED"], "the write is accepted; its older column loses");
    let row: Value = db.one("select to_jsonb(t) from public.notes t").await;
    assert_eq!((row["title"].clone(), row["body"].clone()), (json!("newer"), json!("body")));
    let journal: Value = db.one("select jsonb_agg(jsonb_build_object('loser', loser, 'winner', winner, 'col', col)) from kizuna.conflicts").await;
    assert_eq!(journal, json!([{"col": "title", "loser": "older", "winner": "newer"}]));

    // A clock far in the future is clamped to server time plus the skew, so it cannot hold a
    // column forever: a later write a little past the window still wins.
    let future = clocked(mutation(2, "notes", "n1", "patch", json!({"title": "from 2100"})), 4_102_444_800_000, 0, "phone");
    db.push(&alice, push_request(PHONE, vec![future])).await.unwrap();
    assert_eq!(db.one::<String>("select title from public.notes").await, "from 2100");
    let later = clocked(mutation(2, "notes", "n1", "patch", json!({"title": "honest"})), now_ms + 60_000, 9999, "laptop");
    db.push(&alice, push_request(LAPTOP, vec![later])).await.unwrap();
    assert_eq!(db.one::<String>("select title from public.notes").await, "honest");

    // A plain SQL write is stamped with server time at its commit, and takes part in the order:
    // an edit made offline before it loses the column to it.
    db.exec("update public.notes set body = 'from a job'").await;
    let stale = clocked(mutation(3, "notes", "n1", "patch", json!({"body": "offline"})), now_ms - 500, 0, "phone");
    db.push(&alice, push_request(PHONE, vec![stale])).await.unwrap();
    assert_eq!(db.one::<String>("select body from public.notes").await, "from a job");
}

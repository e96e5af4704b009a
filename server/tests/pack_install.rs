//! Installing the pack: idempotent, in file order, and what it provides around the entry points
//! (wake-ups at commit, durable status figures, the example table).

mod support;

use std::time::Duration;

use futures_util::{stream, StreamExt};
use serde_json::{json, Value};
use support::db::{clocked, mutation, now_ms, pull_run, push_request, statuses, Caller, TestDb};
use tokio_postgres::{AsyncMessage, NoTls};

const ALICE: &str = "a11ce000-0000-4000-8000-000000000001";
const DEVICE: &str = "c0000000-0000-4000-8000-0000000000a1";

#[tokio::test]
async fn installing_twice_changes_nothing_and_follows_the_sql_directory() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    let first = db.push(&alice, push_request(DEVICE, vec![mutation(1, "todos", "t1", "upsert", json!({"title": "a"}))])).await.unwrap();
    assert_eq!(statuses(&first), ["APPLIED"]);
    let epoch: Value = db.one("select to_jsonb(epoch) from kizuna.state").await;

    db.reinstall().await;
    db.reinstall().await;
    db.exec(include_str!("../sql/examples/todos.sql")).await;

    // Same server history, same data, and the pack still works.
    assert_eq!(db.one::<Value>("select to_jsonb(epoch) from kizuna.state").await, epoch);
    assert_eq!(db.one::<i64>("select count(*) from public.todos").await, 1);
    let again = db.push(&alice, push_request(DEVICE, vec![mutation(2, "todos", "t2", "upsert", json!({"title": "b"}))])).await.unwrap();
    assert_eq!(statuses(&again), ["APPLIED"]);

    // The installer applies exactly the files of server/sql, in lexical order (as psql -f would).
    let mut on_disk: Vec<String> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/sql"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".sql"))
        .collect();
    on_disk.sort();
    assert_eq!(TestDb::pack_files(), on_disk);
}

#[tokio::test]
async fn a_committed_change_wakes_listeners_with_the_horizon_and_no_row_data() {
    let db = TestDb::with_todos().await;
    let (listener, mut conn) = tokio_postgres::connect(db.url(), NoTls).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut messages = stream::poll_fn(move |cx| conn.poll_message(cx));
    tokio::spawn(async move {
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notification(n) = message {
                let _ = tx.send((n.channel().to_string(), n.payload().to_string()));
            }
        }
    });
    listener.batch_execute("listen kizuna_wake").await.unwrap();

    // A rolled-back write wakes nobody.
    db.exec("begin; insert into public.todos (id, owner, title) values ('gone', gen_random_uuid(), 'secret'); rollback").await;
    // A plain SQL write, committed, wakes with the new horizon only.
    db.exec("insert into public.todos (id, owner, title) values ('w1', gen_random_uuid(), 'secret title')").await;
    let (channel, payload) = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.unwrap().unwrap();
    assert_eq!(channel, "kizuna_wake");
    let horizon: i64 = db.one("select kizuna.horizon()").await;
    assert_eq!(serde_json::from_str::<Value>(&payload).unwrap(), json!({"horizon": horizon}));
    assert!(!payload.contains("secret") && !payload.contains("w1"));
    assert!(tokio::time::timeout(Duration::from_millis(200), rx.recv()).await.is_err(), "one wake per commit");
}

#[tokio::test]
async fn status_reports_durable_figures() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    let ok = mutation(1, "todos", "t1", "upsert", json!({"title": "a"}));
    let bad = mutation(2, "todos", "t2", "upsert", json!({"nope": 1}));
    db.push(&alice, push_request(DEVICE, vec![ok.clone(), bad])).await.unwrap();
    db.push(&alice, push_request(DEVICE, vec![ok])).await.unwrap();
    db.exec("delete from public.todos where id = 't1'").await;

    let status = db.status().await;
    assert_eq!(status["applied_total"], 1);
    assert_eq!(status["replayed_total"], 1);
    assert_eq!(status["rejected_total"], json!({"SCHEMA_MISMATCH": 1}));
    assert_eq!(status["ledger_size"], 2);
    assert_eq!(status["tombstones"], 1);
    assert_eq!(status["clients"], 1);
    assert_eq!(status["low_watermark"], 0);
    assert_eq!(status["horizon"], db.one::<i64>("select kizuna.horizon()").await);
    assert!(status["epoch"].as_str().unwrap().len() == 16);
}

#[tokio::test]
async fn registering_a_table_again_enters_its_rows_again_only_when_its_key_or_buckets_changed() {
    let db = TestDb::new().await;
    db.exec(
        "create table public.items (id text primary key, bucket text not null, note text);
         insert into public.items select 'i' || g, 'b' || (g % 2), 'n' from generate_series(1, 20) g;
         select kizuna.register_table('public.items', bucket => 'bucket');",
    )
    .await;
    let log = "select jsonb_agg(jsonb_build_object('pk', pk, 'bucket', bucket, 'seq', seq, 'deleted', deleted) order by pk, bucket) from kizuna.changes where tbl = 'items'";
    let entered: Value = db.one(log).await;
    assert_eq!(entered.as_array().map(Vec::len), Some(20));

    // The app's setup SQL runs again at every start: same key, same buckets, a new setting.
    db.exec("select kizuna.register_table('public.items', bucket => 'bucket', max_batch_size => 7)").await;
    assert_eq!(db.one::<Value>(log).await, entered, "the log is left as it was");
    assert_eq!(db.one::<i32>("select max_batch_size from kizuna.synced_tables where name = 'items'").await, 7);
    db.exec("update public.items set note = 'x' where id = 'i1'").await;
    assert!(db.one::<i64>("select seq from kizuna.changes where tbl = 'items' and pk = 'i1'").await > 0, "the triggers still number writes");

    // Another bucket expression: every row enters its new bucket, and leaves its old one.
    db.exec("select kizuna.register_table('public.items', bucket => $$'all'$$)").await;
    assert_eq!(db.one::<i64>("select count(*) from kizuna.changes where tbl = 'items' and bucket = 'all' and not deleted").await, 20);
    assert_eq!(db.one::<i64>("select count(*) from kizuna.changes where tbl = 'items' and bucket <> 'all' and deleted").await, 20);
}

/// Upgrading from a pack that spelled keys by the writing session's settings: a timestamptz key
/// entered as a Tokyo session spelled it is entered again in its one spelling, and the old
/// spelling becomes a tombstone, so a device that held the row under it drops it at its next pull
/// and holds the row once. Tables whose keys follow no setting are not scanned.
#[tokio::test]
async fn an_upgrade_respells_keys_an_older_pack_spelled_by_a_sessions_settings() {
    let db = TestDb::new().await;
    db.owned_table("stamps", "at timestamptz primary key, label text", "").await;
    db.owned_table("notes", "id text primary key, label text", "").await;
    db.exec(&format!(
        "insert into public.stamps values ('2026-12-07 01:00+00', 'a', '{ALICE}');
         insert into public.notes values ('n1', 'a', '{ALICE}');"
    ))
    .await;
    // As a pack before version 12 left the log after a write from a session in Tokyo (in a
    // transaction of its own: the fence enters a transaction's changes as it commits).
    db.exec("update kizuna.changes set pk = '2026-12-07 10:00:00+09' where tbl = 'stamps';
             update kizuna.synced_tables set compiled_version = 11;")
        .await;
    let alice = Caller::user(ALICE);
    let buckets = [format!("user:{ALICE}")];
    let buckets: Vec<&str> = buckets.iter().map(String::as_str).collect();
    let before = pull_run(db.client(), &alice, DEVICE, None, &buckets, 100).await.unwrap();
    let notes_log = "select jsonb_agg(to_jsonb(c) order by seq) from kizuna.changes c where tbl = 'notes'";
    let notes_before: Value = db.one(notes_log).await;

    let (seen, checkpoint) = entries_after_reinstall(&db, &alice, &buckets, &before.checkpoint, "pk").await;
    assert_eq!(seen, [("2026-12-07 01:00:00+00".to_string(), false), ("2026-12-07 10:00:00+09".to_string(), true)]);
    assert_eq!(db.one::<Value>(notes_log).await, notes_before, "a text key is left as it was");
    let (again, _) = entries_after_reinstall(&db, &alice, &buckets, &checkpoint, "pk").await;
    assert!(again.is_empty(), "entered once: {again:?}");
}

/// Upgrading from such a pack keeps the row's per-column versions (kept under the key's old
/// spelling, they ordered no write after the upgrade): an edit made offline before the row's
/// last write still loses the column to it, as it did before the upgrade.
#[tokio::test]
async fn an_upgrade_keeps_the_column_clocks_of_a_key_an_older_pack_spelled_by_a_sessions_settings() {
    let db = TestDb::new().await;
    db.owned_table("stamps", "at timestamptz primary key, label text", ", conflict_mode => 'hlc'").await;
    let alice = Caller::user(ALICE);
    let now_ms = now_ms();
    let write = |seq: i64, op: &str, label: &str, ms: i64| {
        clocked(mutation(seq, "stamps", "2026-12-07 01:00:00+00", op, json!({"at": "2026-12-07 01:00:00+00", "label": label})), ms, 0, "phone")
    };
    let newer = db.push(&alice, push_request(DEVICE, vec![write(1, "upsert", "newer", now_ms - 1_000)])).await.unwrap();
    assert_eq!(statuses(&newer), ["APPLIED"]);
    // As a pack before version 12 left the log and the versions after a write from Tokyo.
    db.exec("update kizuna.changes set pk = '2026-12-07 10:00:00+09' where tbl = 'stamps';
             update kizuna.column_versions set pk = '2026-12-07 10:00:00+09' where tbl = 'stamps';
             update kizuna.synced_tables set compiled_version = 11;")
        .await;
    db.reinstall().await;

    let older = db.push(&alice, push_request(DEVICE, vec![write(2, "patch", "older", now_ms - 5_000)])).await.unwrap();
    assert_eq!(statuses(&older), ["APPLIED"], "the write is accepted; its older column loses");
    assert_eq!(db.one::<String>("select label from public.stamps").await, "newer");
    assert_eq!(
        db.one::<Vec<String>>("select array_agg(distinct pk) from kizuna.column_versions where tbl = 'stamps'").await,
        ["2026-12-07 01:00:00+00"],
        "kept under the one spelling"
    );
}

/// Installs the pack again, then pulls from `checkpoint`: each entry as its `field` and whether it
/// is a tombstone, sorted, and the run's checkpoint.
async fn entries_after_reinstall(db: &TestDb, caller: &Caller, buckets: &[&str], checkpoint: &str, field: &str) -> (Vec<(String, bool)>, String) {
    db.reinstall().await;
    let run = pull_run(db.client(), caller, DEVICE, Some(checkpoint), buckets, 100).await.unwrap();
    let mut seen: Vec<(String, bool)> =
        run.entries.iter().map(|e| (e[field].as_str().unwrap().to_string(), e["deleted"] == json!(true))).collect();
    seen.sort();
    (seen, run.checkpoint)
}

/// Installing this pack over one that ran bucket expressions under the writing session's settings
/// moves a row that such a session put in another bucket into the one its expression gives under
/// fixed settings: the device subscribed to the day the row is in gets it, the other loses it.
/// Once: installing again enters nothing.
#[tokio::test]
async fn an_upgrade_moves_a_row_an_older_pack_bucketed_by_a_sessions_settings() {
    let db = TestDb::new().await;
    db.owned_table("notes", "id text primary key, label text", "").await;
    db.exec(&format!(
        "create table public.shifts (id text primary key, at timestamptz, owner uuid not null default auth.uid());
         grant select on public.shifts to authenticated;
         select kizuna.register_table('public.shifts', bucket => $$'day:' || to_char(at, 'YYYY-MM-DD')$$);
         insert into public.shifts values ('s1', '2026-12-07 20:00+00', '{ALICE}');
         insert into public.notes values ('n1', 'a', '{ALICE}');"
    ))
    .await;
    // As a pack before version 13 left the log after the row was written from a session in Tokyo.
    db.exec("update kizuna.changes set bucket = 'day:2026-12-08' where tbl = 'shifts';
             update kizuna.synced_tables set compiled_version = 12;")
        .await;
    let alice = Caller::user(ALICE);
    let buckets = ["day:2026-12-07", "day:2026-12-08"];
    let before = pull_run(db.client(), &alice, DEVICE, None, &buckets, 100).await.unwrap();
    let notes_log = "select jsonb_agg(to_jsonb(c) order by seq) from kizuna.changes c where tbl = 'notes'";
    let notes_before: Value = db.one(notes_log).await;

    let (seen, checkpoint) = entries_after_reinstall(&db, &alice, &buckets, &before.checkpoint, "bucket").await;
    assert_eq!(seen, [("day:2026-12-07".to_string(), false), ("day:2026-12-08".to_string(), true)]);
    assert_eq!(db.one::<Value>(notes_log).await, notes_before, "a table whose bucket follows no setting is left as it was");
    let (again, _) = entries_after_reinstall(&db, &alice, &buckets, &checkpoint, "bucket").await;
    assert!(again.is_empty(), "entered once: {again:?}");
}

/// Installing again (every gateway start does) waits for no write in flight: ADD COLUMN IF NOT
/// EXISTS and CREATE INDEX IF NOT EXISTS locked each of the pack's tables even with nothing to
/// do, one after another in one transaction, and a push committing meanwhile deadlocked with
/// the install: the gateway did not start (the history checker's restarts, about 1 in 40).
#[tokio::test]
async fn installing_again_waits_for_no_write_in_flight() {
    let db = TestDb::with_todos().await;
    let writer = db.connect().await;
    writer
        .batch_execute(
            "begin;
             lock table kizuna.settings, kizuna.state, kizuna.commits, kizuna.synced_tables, kizuna.pending,
                        kizuna.announcing, kizuna.changes, kizuna.column_versions, kizuna.ledger, kizuna.conflicts,
                        kizuna.tx_marker, kizuna.clients, kizuna.universe_events, kizuna.universe_pending,
                        kizuna.universe_marker
               in row exclusive mode;",
        )
        .await
        .unwrap();
    db.exec("set lock_timeout = '3s'").await;
    db.reinstall().await;
    db.exec("reset lock_timeout").await;
    writer.batch_execute("commit").await.unwrap();
}

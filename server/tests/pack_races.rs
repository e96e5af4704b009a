//! Races between the reaper, the entry points and plain-SQL writers, each forced into the order
//! that used to go wrong by holding a lock that one side then waits on.

mod support;

use serde_json::{json, Value};
use support::db::{call_as, clocked, mutation, now_ms, pull_request, pull_run, push_request, statuses, Caller, TestDb};

const ALICE: &str = "a11ce000-0000-4000-8000-000000000001";
const BOB: &str = "b0b00000-0000-4000-8000-000000000002";
const DEVICE: &str = "c0000000-0000-4000-8000-0000000000a1";
const FENCE_LOCK: i64 = 7583421590113001;

/// Waits until at least `n` other backends of this database wait on a lock.
async fn until_blocked(db: &TestDb, n: i64) {
    for _ in 0..1000 {
        let waiting: i64 = db
            .one("select count(*) from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'")
            .await;
        if waiting >= n {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("{n} backends never blocked");
}

#[tokio::test]
async fn a_tombstone_reaped_while_its_page_is_collected_expires_the_run() {
    let db = TestDb::new().await;
    // Rendering the row 'slow' waits for advisory lock 4242, which the test holds: the pull stops
    // between reading the low watermark and scanning for the tombstone behind 'slow'.
    db.exec(&format!(
        "create function public.pause_on(id text) returns boolean language plpgsql as $$
         begin
           if id = 'slow' then perform pg_advisory_lock(4242); perform pg_advisory_unlock(4242); end if;
           return true;
         end $$;
         create table public.items (id text primary key, owner uuid not null);
         alter table public.items enable row level security;
         create policy items_own on public.items for all
           using (owner = auth.uid() and public.pause_on(id)) with check (owner = auth.uid());
         grant all on public.items to authenticated;
         select kizuna.register_table('public.items', bucket => $$'items'$$);
         insert into public.items values ('first', '{ALICE}');"
    ))
    .await;
    let alice = Caller::user(ALICE);
    let start = pull_run(db.client(), &alice, DEVICE, None, &["items"], 1).await.unwrap();
    db.exec(&format!("insert into public.items values ('slow', '{ALICE}')")).await;
    db.exec(&format!("insert into public.items values ('hidden', '{BOB}')")).await;
    db.exec(&format!("insert into public.items values ('gone', '{ALICE}')")).await;
    db.exec("delete from public.items where id = 'gone'").await;

    let holder = db.connect().await;
    holder.batch_execute("select pg_advisory_lock(4242)").await.unwrap();
    let puller = db.connect().await;
    let request = pull_request(DEVICE, Some(&start.checkpoint), &["items"], 1);
    let page = tokio::spawn(async move { call_as(&puller, &alice, "kizuna_pull", request).await });
    until_blocked(&db, 1).await;
    let reaped: Value = db.one("select kizuna.reap(tombstone_retention => '0')").await;
    assert_eq!(reaped["tombstones_pruned"], 1, "{reaped}");
    holder.batch_execute("select pg_advisory_unlock(4242)").await.unwrap();

    // The page reads one snapshot (REPEATABLE READ, as the gateway runs pulls), taken before the
    // reap: it still sees the tombstone. So either it closes the run with the delete in it, or the
    // run goes on and its next page, judged by the run's start, expires. Never a run closed past a
    // delete it did not deliver.
    let page = page.await.unwrap().unwrap();
    let delivered_delete = |p: &Value| {
        p["entries"].as_array().unwrap().iter().any(|e| e["pk"] == "gone" && e["deleted"] == true)
    };
    if page["lifecycle"] == "CHECKPOINT_EXPIRED" {
        return;
    }
    if page["done"] == true {
        assert!(delivered_delete(&page), "closed past a delete it did not deliver: {page}");
        return;
    }
    let next = pull_request(DEVICE, page["cursor"].as_str(), &["items"], 1);
    let next = call_as(db.client(), &Caller::user(ALICE), "kizuna_pull", next).await.unwrap();
    assert!(
        next["lifecycle"] == "CHECKPOINT_EXPIRED" || delivered_delete(&next),
        "a page that could not see the delete must not close the run: {page} then {next}"
    );
}

#[tokio::test]
async fn the_reaper_and_a_push_of_the_client_it_prunes_do_not_deadlock() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    db.push(&alice, push_request(DEVICE, vec![mutation(1, "todos", "t1", "upsert", json!({"title": "one"}))])).await.unwrap();

    // While the fence lock is held, the reaper starts first and the push second; then both go on.
    let holder = db.connect().await;
    holder.batch_execute(&format!("select pg_advisory_lock({FENCE_LOCK})")).await.unwrap();
    let reaper = db.connect().await;
    let reap = tokio::spawn(async move { reaper.query_one("select kizuna.reap(ledger_retention => '0')", &[]).await.map(|_| ()) });
    until_blocked(&db, 1).await;
    let pusher = db.connect().await;
    let push = tokio::spawn(async move {
        call_as(&pusher, &alice, "kizuna_push",
                push_request(DEVICE, vec![mutation(2, "todos", "t2", "upsert", json!({"title": "two"}))])).await
    });
    until_blocked(&db, 2).await;
    holder.batch_execute(&format!("select pg_advisory_unlock({FENCE_LOCK})")).await.unwrap();

    reap.await.unwrap().expect("the reaper finishes");
    let response = push.await.unwrap().expect("the push finishes");
    assert_eq!(statuses(&response), ["APPLIED"]);
    assert_eq!(db.one::<i64>("select count(*) from public.todos").await, 2);
}

#[tokio::test]
async fn a_repeatable_read_writer_commits_after_another_synced_commit() {
    let db = TestDb::new().await;
    db.exec(
        "create table public.items (id text primary key);
         grant select on public.items to authenticated;
         select kizuna.register_table('public.items', bucket => $$'items'$$);",
    )
    .await;
    let strict = db.connect().await;
    strict.batch_execute("begin isolation level repeatable read; select count(*) from public.items").await.unwrap();
    db.exec("insert into public.items values ('other')").await;
    strict
        .batch_execute("insert into public.items values ('mine'); commit")
        .await
        .expect("numbering a commit never conflicts with another transaction's number");

    let run = pull_run(db.client(), &Caller::user(ALICE), DEVICE, None, &["items"], 10).await.unwrap();
    let mut keys: Vec<&str> = run.entries.iter().map(|e| e["pk"].as_str().unwrap()).collect();
    keys.sort();
    assert_eq!(keys, ["mine", "other"]);
}

#[tokio::test]
async fn in_hlc_mode_a_push_waits_for_a_plain_sql_write_before_ordering_columns() {
    let db = TestDb::new().await;
    db.owned_table("docs", "id text primary key, body text", ", conflict_mode => 'hlc'").await;
    let alice = Caller::user(ALICE);
    let now_ms = now_ms();
    let first = clocked(mutation(1, "docs", "d1", "upsert", json!({"body": "v0"})), now_ms - 20_000, 0, "device");
    db.push(&alice, push_request(DEVICE, vec![first])).await.unwrap();

    // A job edits the row in plain SQL and commits while a push of an edit made offline five
    // seconds ago waits for the row: the job's commit is the later clock.
    let job = db.connect().await;
    job.batch_execute("begin; update public.docs set body = 'job' where id = 'd1'").await.unwrap();
    let pusher = db.connect().await;
    let offline = clocked(mutation(2, "docs", "d1", "patch", json!({"body": "offline"})), now_ms - 5_000, 0, "device");
    let push = tokio::spawn(async move { call_as(&pusher, &alice, "kizuna_push", push_request(DEVICE, vec![offline])).await });
    until_blocked(&db, 1).await;
    job.batch_execute("commit").await.unwrap();

    assert_eq!(statuses(&push.await.unwrap().unwrap()), ["APPLIED"]);
    assert_eq!(db.one::<String>("select body from public.docs where id = 'd1'").await, "job",
               "the older clock loses the column, though its push arrived last");
}

/// An upsert that waits for a row another transaction is deleting, and goes on once that delete
/// commits (READ COMMITTED), must not bring the key back: it found no row and inserted one, with
/// only its own columns (the title gone), answered APPLIED, while a write to a deleted key is
/// DELETE_WINS. In an atomic batch (the per-mutation path) and in a run written by one statement.
#[tokio::test]
async fn an_upsert_that_waited_for_a_concurrent_delete_does_not_bring_the_key_back() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    let todos: Vec<Value> = (1..=4).map(|i| mutation(i, "todos", &format!("k{i}"), "upsert", json!({"title": format!("title {i}")}))).collect();
    assert_eq!(statuses(&db.push(&alice, push_request(DEVICE, todos)).await.unwrap()), ["APPLIED"; 4]);
    pull_run(db.client(), &alice, DEVICE, None, &[&format!("user:{ALICE}")], 10).await.unwrap();

    let mut seq = 4;
    for (deleted, keys, expected) in [
        ("k1", vec!["k1"], vec!["REJECTED:DELETE_WINS"]),
        ("k3", vec!["k2", "k3", "k4"], vec!["APPLIED", "REJECTED:DELETE_WINS", "APPLIED"]),
    ] {
        let deleter = db.connect().await;
        deleter.batch_execute(&format!("begin; delete from public.todos where id = '{deleted}'")).await.unwrap();
        let alone = keys.len() == 1;
        let writes: Vec<Value> = keys
            .iter()
            .map(|k| {
                seq += 1;
                let mut m = mutation(seq, "todos", k, "upsert", json!({"done": true}));
                if alone {
                    m["batch"] = json!(uuid::Uuid::new_v4().to_string());
                }
                m
            })
            .collect();
        let pusher = db.connect().await;
        let caller = alice.clone();
        let push = tokio::spawn(async move { call_as(&pusher, &caller, "kizuna_push", push_request(DEVICE, writes)).await });
        until_blocked(&db, 1).await;
        deleter.batch_execute("commit").await.unwrap();
        let response = push.await.unwrap().expect("the push finishes");
        assert_eq!(statuses(&response), expected, "{response}");
        let left: i64 = db.one(&format!("select count(*) from public.todos where id = '{deleted}'")).await;
        assert_eq!(left, 0, "{deleted} stays deleted");
    }
    let titles: Value = db.one("select jsonb_agg(title order by id) from public.todos").await;
    assert_eq!(titles, json!(["title 2", "title 4"]));
}

//! Paged pull: order, the closing page at exactly `limit`, CHECKPOINT_EXPIRED (also between pages),
//! SERVER_RESET and unparseable cursors.

mod support;

use serde_json::{json, Value};
use support::db::{mutation, pull_request, pull_run, push_request, statuses, Caller, TestDb};

const ALICE: &str = "a11ce000-0000-4000-8000-000000000001";
const DEVICE: &str = "c0000000-0000-4000-8000-0000000000a1";

fn bucket() -> String {
    format!("user:{ALICE}")
}

/// Pushes `m` as `alice` and asserts it is applied inside a 5 s statement timeout: it did not wait
/// for another transaction (`why` says which).
async fn applied_within_five_seconds(db: &TestDb, alice: &Caller, m: Value, why: &str) {
    db.exec("set statement_timeout = '5s'").await;
    let pushed = db.push(alice, push_request(DEVICE, vec![m])).await;
    db.exec("reset statement_timeout").await;
    assert_eq!(statuses(&pushed.expect(why)), ["APPLIED"]);
}

async fn six_rows(db: &TestDb, alice: &Caller) {
    let first: Vec<Value> = ["b", "a", "c"].iter().enumerate()
        .map(|(i, k)| mutation(i as i64 + 1, "todos", k, "upsert", json!({"title": k}))).collect();
    db.push(alice, push_request(DEVICE, first)).await.unwrap();
    let second: Vec<Value> = ["f", "e", "d"].iter().enumerate()
        .map(|(i, k)| mutation(i as i64 + 4, "todos", k, "upsert", json!({"title": k}))).collect();
    db.push(alice, push_request(DEVICE, second)).await.unwrap();
}

#[tokio::test]
async fn pages_come_in_seq_table_pk_order_and_the_closing_page_may_hold_exactly_limit() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    six_rows(&db, &alice).await;
    let b = bucket();

    let p1 = db.pull(&alice, pull_request(DEVICE, None, &[&b], 3)).await.unwrap();
    assert_eq!(p1["done"], false);
    let p2 = db.pull(&alice, pull_request(DEVICE, p1["cursor"].as_str(), &[&b], 3)).await.unwrap();
    assert_eq!(p2["done"], true, "the page that reaches the end says so, even at exactly limit");
    assert_eq!(p2["entries"].as_array().unwrap().len(), 3);
    let order: Vec<(i64, String)> = [&p1, &p2].iter()
        .flat_map(|p| p["entries"].as_array().unwrap().iter()
            .map(|e| (e["seq"].as_i64().unwrap(), e["pk"].as_str().unwrap().to_string())))
        .collect();
    let pks: Vec<&str> = order.iter().map(|(_, k)| k.as_str()).collect();
    assert_eq!(pks, ["a", "b", "c", "d", "e", "f"]);
    assert!(order.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(p1["horizon"], p2["horizon"]);

    // From the closing checkpoint, nothing new: one empty closing page.
    let p3 = db.pull(&alice, pull_request(DEVICE, p2["cursor"].as_str(), &[&b], 3)).await.unwrap();
    assert_eq!((p3["done"].clone(), p3["entries"].clone()), (json!(true), json!([])));
    // One page of exactly limit from null.
    let whole = db.pull(&alice, pull_request(DEVICE, None, &[&b], 6)).await.unwrap();
    assert_eq!((whole["done"].clone(), whole["entries"].as_array().unwrap().len()), (json!(true), 6));
}

#[tokio::test]
async fn checkpoint_expired_is_judged_by_the_run_start_also_between_pages() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    six_rows(&db, &alice).await;
    let b = bucket();
    let first = pull_run(db.client(), &alice, DEVICE, None, &[&b], 100).await.unwrap();

    // After the checkpoint: deletes (tombstones) and new rows.
    db.push(&alice, push_request(DEVICE, vec![mutation(7, "todos", "a", "delete", Value::Null),
                                              mutation(8, "todos", "g", "upsert", json!({"title": "g"})),
                                              mutation(9, "todos", "h", "upsert", json!({"title": "h"}))])).await.unwrap();
    let page = db.pull(&alice, pull_request(DEVICE, Some(&first.checkpoint), &[&b], 1)).await.unwrap();
    assert_eq!(page["done"], false);
    assert!(page["lifecycle"].is_null());

    // The reaper prunes the tombstone: the run that started before it expires between pages.
    db.exec("update kizuna.settings set tombstone_retention = '0'").await;
    let reaped: Value = db.one("select kizuna.reap()").await;
    assert_eq!(reaped["tombstones_pruned"], 1);
    let next = db.pull(&alice, pull_request(DEVICE, page["cursor"].as_str(), &[&b], 1)).await.unwrap();
    assert_eq!(next["lifecycle"], "CHECKPOINT_EXPIRED");
    assert_eq!(next["entries"], json!([]));
    let again = db.pull(&alice, pull_request(DEVICE, Some(&first.checkpoint), &[&b], 100)).await.unwrap();
    assert_eq!(again["lifecycle"], "CHECKPOINT_EXPIRED");

    // A run from the beginning always completes, page by page, and its checkpoint is good.
    let rehydrated = pull_run(db.client(), &alice, DEVICE, None, &[&b], 2).await.unwrap();
    let mut pks: Vec<&str> = rehydrated.entries.iter().map(|e| e["pk"].as_str().unwrap()).collect();
    pks.sort();
    assert_eq!(pks, ["b", "c", "d", "e", "f", "g", "h"]);
    let after = pull_run(db.client(), &alice, DEVICE, Some(&rehydrated.checkpoint), &[&b], 2).await;
    assert!(after.is_ok(), "{:?}", after.err());
    assert_eq!(db.status().await["low_watermark"], reaped["low_watermark"]);
}

#[tokio::test]
async fn another_epoch_is_a_server_reset_and_a_garbled_cursor_is_malformed() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    six_rows(&db, &alice).await;
    let b = bucket();
    let run = pull_run(db.client(), &alice, DEVICE, None, &[&b], 100).await.unwrap();
    assert!(run.checkpoint.starts_with("kz1."));

    for garbled in ["", "kz1", "kz2.0123456789abcdef.1", "kz1.0123456789abcdef.x", "kz1.0123456789abcdef.1.2.3.zz.00.00",
                    "'; drop table todos; --"] {
        let err = db.pull(&alice, pull_request(DEVICE, Some(garbled), &[&b], 10)).await.unwrap_err();
        assert_eq!(err.code, "KZP01", "{garbled:?}");
    }
    for bad in [json!({"protocol": 1, "client_id": DEVICE, "cursor": null, "buckets": "all", "limit": 10}),
                json!({"protocol": 1, "client_id": DEVICE, "cursor": null, "buckets": [], "limit": 0}),
                json!({"protocol": 1, "client_id": DEVICE, "cursor": 5, "buckets": [], "limit": 10})] {
        assert_eq!(db.pull(&alice, bad).await.unwrap_err().code, "KZP01");
    }
    assert_eq!(db.pull(&alice, json!({"protocol": 9, "client_id": DEVICE, "cursor": null, "buckets": [], "limit": 1}))
                 .await.unwrap_err().code, "KZP03");

    // A cursor from beyond this server's history (a restored backup) or another epoch.
    let epoch = run.checkpoint.split('.').nth(1).unwrap();
    let beyond = format!("kz1.{epoch}.{}", run.horizon + 1000);
    let page = db.pull(&alice, pull_request(DEVICE, Some(&beyond), &[&b], 10)).await.unwrap();
    assert_eq!(page["lifecycle"], "SERVER_RESET");
    db.exec("select kizuna.new_epoch()").await;
    let page = db.pull(&alice, pull_request(DEVICE, Some(&run.checkpoint), &[&b], 10)).await.unwrap();
    assert_eq!(page["lifecycle"], "SERVER_RESET");
    assert_eq!(page["done"], true);
    // Following the signal: rehydrate from null.
    let fresh = pull_run(db.client(), &alice, DEVICE, None, &[&b], 10).await.unwrap();
    assert_eq!(fresh.entries.len(), 6);
    assert_ne!(fresh.checkpoint.split('.').nth(1).unwrap(), epoch);
}

/// A run's first page says how many entries the run holds, as the caller sees them: another
/// user's rows in the same requested bucket are neither counted nor delivered; later pages carry
/// no total; a run from a checkpoint counts only what changed since.
#[tokio::test]
async fn the_first_page_counts_the_run_as_the_caller_sees_it() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    six_rows(&db, &alice).await;
    let b = bucket();
    // Rows in alice's bucket that only their owner may read: written in SQL as a stranger's.
    db.client().batch_execute(&format!(
        "insert into public.todos (id, owner, title) select 'hidden-' || g, 'b0b00000-0000-4000-8000-000000000002', 'x' from generate_series(1, 4) g;
         update kizuna.changes set bucket = 'user:{ALICE}' where pk like 'hidden-%';")).await.unwrap();

    let p1 = db.pull(&alice, pull_request(DEVICE, None, &[&b], 4)).await.unwrap();
    assert_eq!(p1["total"], json!(6), "six visible entries; the four hidden ones are not counted: {p1}");
    let p2 = db.pull(&alice, pull_request(DEVICE, p1["cursor"].as_str(), &[&b], 4)).await.unwrap();
    assert_eq!(p2["done"], true);
    assert!(p2.get("total").is_none(), "only the first page counts");
    let delivered = p1["entries"].as_array().unwrap().len() + p2["entries"].as_array().unwrap().len();
    assert_eq!(delivered, 6);

    let mutation_7 = mutation(7, "todos", "g", "upsert", json!({"title": "g"}));
    db.push(&alice, push_request(DEVICE, vec![mutation_7])).await.unwrap();
    let next = db.pull(&alice, pull_request(DEVICE, p2["cursor"].as_str(), &[&b], 4)).await.unwrap();
    assert_eq!((next["total"].clone(), next["entries"].as_array().unwrap().len()), (json!(1), 1));

    // A run of more than 200 pages of the request's limit is not counted: a `limit: 1` page counts
    // at most 200 entries, whatever the buckets hold.
    let rows: Vec<Value> = (0..200).map(|i| mutation(8 + i, "todos", &format!("m{i}"), "upsert", json!({"title": "m"}))).collect();
    db.push(&alice, push_request(DEVICE, rows)).await.unwrap();
    let small = db.pull(&alice, pull_request(DEVICE, None, &[&b], 1)).await.unwrap();
    assert_eq!(small["total"], Value::Null, "207 entries are more than 200 pages of one");
    let paged = db.pull(&alice, pull_request(DEVICE, None, &[&b], 2)).await.unwrap();
    assert_eq!(paged["total"], json!(207));

    db.client().batch_execute("update kizuna.settings set max_progress_count = 3").await.unwrap();
    let capped = db.pull(&alice, pull_request(DEVICE, None, &[&b], 4)).await.unwrap();
    assert_eq!(capped["total"], Value::Null, "past max_progress_count the total is unknown");

    // A first page that closes its run holds the whole run, so it says its own length and counts
    // nothing: with the count turned off too, and for an idle poll.
    db.client().batch_execute("update kizuna.settings set max_progress_count = 0").await.unwrap();
    let whole = db.pull(&alice, pull_request(DEVICE, None, &[&b], 1000)).await.unwrap();
    assert_eq!((whole["total"].clone(), whole["entries"].as_array().unwrap().len(), whole["done"].clone()), (json!(207), 207, json!(true)));
    let idle = db.pull(&alice, pull_request(DEVICE, whole["cursor"].as_str(), &[&b], 1000)).await.unwrap();
    assert_eq!((idle["total"].clone(), idle["done"].clone()), (json!(0), json!(true)), "{idle}");
}

/// The total is the run counted at its first page's horizon; commits during the run move it
/// either way, and the client reports max(total, entries), then total = entries at the close.
/// Here a row already paged is written again (delivered twice), a row not yet paged is written
/// (delivered once, in its new state), a new row arrives (one more) and a row not yet paged is
/// deleted (its row is not delivered, its tombstone is: the run cannot tell a key it has not paged
/// from one it has, so it sends every delete made while it ran): 6 counted, 8 delivered.
#[tokio::test]
async fn writes_during_a_run_move_what_it_delivers_from_the_first_page_total() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    six_rows(&db, &alice).await;
    let b = bucket();

    let p1 = db.pull(&alice, pull_request(DEVICE, None, &[&b], 2)).await.unwrap();
    assert_eq!(p1["total"], json!(6), "{p1}");
    let first: Vec<&str> = p1["entries"].as_array().unwrap().iter().map(|e| e["pk"].as_str().unwrap()).collect();
    assert_eq!(first, ["a", "b"], "one push is one seq, then pk order");
    db.push(&alice, push_request(DEVICE, vec![
        mutation(7, "todos", "a", "upsert", json!({"title": "a2"})),
        mutation(8, "todos", "f", "upsert", json!({"title": "f2"})),
        mutation(9, "todos", "g", "upsert", json!({"title": "g"})),
        mutation(10, "todos", "d", "delete", Value::Null),
    ])).await.unwrap();

    let rest = pull_run(db.client(), &alice, DEVICE, p1["cursor"].as_str(), &[&b], 2).await.unwrap();
    let delivered = 2 + rest.entries.len();
    assert_eq!(delivered, 8, "{:?}", rest.entries);
    let live = |e: &&Value| e["deleted"] != true;
    let mut keys: Vec<&str> = p1["entries"].as_array().unwrap().iter().chain(rest.entries.iter()).filter(live)
        .map(|e| e["pk"].as_str().unwrap()).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys, ["a", "b", "c", "e", "f", "g"], "d was deleted before its page");
    let tombstones: Vec<&str> = rest.entries.iter().filter(|e| e["deleted"] == true).map(|e| e["pk"].as_str().unwrap()).collect();
    assert_eq!(tombstones, ["d"]);

    // A run from the closing checkpoint counts exactly what it then delivers.
    db.push(&alice, push_request(DEVICE, vec![mutation(11, "todos", "c", "delete", Value::Null)])).await.unwrap();
    let p = db.pull(&alice, pull_request(DEVICE, Some(&rest.checkpoint), &[&b], 2)).await.unwrap();
    assert_eq!((p["total"].clone(), p["entries"].as_array().unwrap().len(), p["done"].clone()), (json!(1), 1, json!(true)));
    assert_eq!(p["entries"][0]["deleted"], true, "a tombstone is counted for a run from a checkpoint");
}

#[tokio::test]
async fn pages_of_large_rows_end_by_their_bytes_and_the_run_still_brings_every_row_once() {
    let db = TestDb::new().await;
    db.owned_table("docs", "id text primary key, body text", "").await;
    db.owned_table("sheets", "id text primary key, body text", "").await;
    let alice = Caller::user(ALICE);
    let bob = Caller::user("b0b00000-0000-4000-8000-000000000002");
    // Pages of about 40 KB: rows of about 6 KB in two tables, bob's rows (hidden from alice)
    // between them, and a row of 60 KB, larger than a page, which goes alone.
    db.exec("update kizuna.settings set max_page_bytes = 40000").await;
    let mut mine = vec![];
    for i in 0..30 {
        let body = format!("{i:02}").repeat(if i == 17 { 30_000 } else { 3_000 });
        let table = if i % 3 == 0 { "sheets" } else { "docs" };
        let id = format!("k{i:02}");
        db.push(&alice, push_request(DEVICE, vec![mutation(i + 1, table, &id, "upsert", json!({"body": body}))])).await.unwrap();
        mine.push((table.to_string(), id, body));
        let bobs = push_request("c0000000-0000-4000-8000-0000000000b1", vec![mutation(i + 1, "docs", &format!("b{i:02}"), "upsert", json!({"body": "x".repeat(6_000)}))]);
        db.push(&bob, bobs).await.unwrap();
    }
    // Two deletes: a tombstone costs a page next to nothing.
    db.push(&alice, push_request(DEVICE, vec![mutation(31, "docs", "k01", "delete", Value::Null), mutation(32, "docs", "k02", "delete", Value::Null)])).await.unwrap();

    let buckets = [format!("user:{ALICE}"), format!("user:{}", "b0b00000-0000-4000-8000-000000000002")];
    let buckets: Vec<&str> = buckets.iter().map(String::as_str).collect();
    let mut cursor: Option<String> = None;
    let mut delivered: Vec<(String, String, Option<String>)> = vec![];
    let mut pages = 0;
    loop {
        let page = db.pull(&alice, pull_request(DEVICE, cursor.as_deref(), &buckets, 1000)).await.unwrap();
        pages += 1;
        let entries = page["entries"].as_array().unwrap();
        let bytes: usize = entries.iter().map(|e| e["row"].to_string().len()).sum();
        assert!(entries.len() == 1 || bytes <= 40_000, "a page of {} entries holds {bytes} bytes", entries.len());
        for e in entries {
            let body = e["row"]["body"].as_str().map(str::to_string);
            delivered.push((e["table"].as_str().unwrap().into(), e["pk"].as_str().unwrap().into(), body));
        }
        cursor = Some(page["cursor"].as_str().unwrap().to_string());
        if page["done"] == json!(true) {
            break;
        }
        assert!(pages < 100, "the run moves on");
    }
    let expected: Vec<(String, String, Option<String>)> = {
        let mut rows: Vec<_> = mine.into_iter().filter(|(_, id, _)| id != "k01" && id != "k02").map(|(t, id, b)| (t, id, Some(b))).collect();
        rows.sort_by(|a, b| a.1.cmp(&b.1));
        rows
    };
    let mut got = delivered.clone();
    got.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(got.len(), expected.len(), "every row once, none of bob's: {:?}", delivered.iter().map(|d| &d.1).collect::<Vec<_>>());
    assert_eq!(got, expected);
    assert!(pages >= 5, "about 210 KB in pages of 40 KB: {pages} pages");
    // The same run through the helper (one page at a time, in a transaction each) agrees.
    let run = pull_run(db.client(), &alice, DEVICE, None, &buckets, 1000).await.unwrap();
    assert_eq!(run.entries.len(), expected.len());
    assert_eq!(run.pages, pages);
}

#[tokio::test]
async fn writes_made_in_a_replication_session_reach_clients_like_any_other() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    six_rows(&db, &alice).await;
    let first = pull_run(db.client(), &alice, DEVICE, None, &[&bucket()], 100).await.unwrap();
    assert_eq!(first.entries.len(), 6);
    // A logical replication subscriber applies its changes with session_replication_role =
    // replica (so do restores that disable triggers): ordinary triggers do not fire there, and the
    // change log never heard of these writes.
    let replica = db.connect().await;
    replica
        .batch_execute(&format!(
            "set session_replication_role = replica;
             insert into public.todos (id, owner, title) values ('g', '{ALICE}', 'replicated');
             update public.todos set title = 'renamed' where id = 'a';
             delete from public.todos where id = 'b';"
        ))
        .await
        .unwrap();
    let err = replica.batch_execute("truncate public.todos").await.expect_err("a truncate would bypass sync");
    assert!(err.to_string().contains("truncate") || err.as_db_error().is_some(), "{err}");
    let run = pull_run(db.client(), &alice, DEVICE, Some(&first.checkpoint), &[&bucket()], 100).await.unwrap();
    let got: Vec<(String, Value)> = run.entries.iter()
        .map(|e| (e["pk"].as_str().unwrap().to_string(), if e["deleted"] == json!(true) { json!("deleted") } else { e["row"]["title"].clone() }))
        .collect();
    let mut got = got;
    got.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(got, [("a".into(), json!("renamed")), ("b".into(), json!("deleted")), ("g".into(), json!("replicated"))]);
    // A device's first sync has them too.
    let fresh = pull_run(db.client(), &alice, "c0000000-0000-4000-8000-0000000000a9", None, &[&bucket()], 100).await.unwrap();
    assert_eq!(fresh.entries.len(), 6);
}

/// A migration that adds a column with a default fires no trigger, so a device that had the rows
/// kept them without it, for as long as no row changed. Registering the table again (an app's setup
/// runs it at every start) finds its columns changed and announces every row again: the next pull
/// from the device's checkpoint brings each row as it is now. With no change of columns, it brings
/// nothing.
#[tokio::test]
async fn a_table_registered_again_after_a_migration_changed_its_columns_brings_every_row_again() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    six_rows(&db, &alice).await;
    let b = bucket();
    let register = "select kizuna.register_table('public.todos', bucket => $$'user:' || owner$$, gate => 'public.todos_gate(text, jsonb)')";
    let run = pull_run(db.client(), &alice, DEVICE, None, &[&b], 10).await.unwrap();
    assert_eq!(run.entries.len(), 6);

    db.exec(register).await;
    let again = pull_run(db.client(), &alice, DEVICE, Some(&run.checkpoint), &[&b], 10).await.unwrap();
    assert_eq!(again.entries.len(), 0, "nothing changed: {:?}", again.entries);

    db.exec(&format!("alter table public.todos add column color text not null default 'red'; {register}")).await;
    let after = pull_run(db.client(), &alice, DEVICE, Some(&again.checkpoint), &[&b], 10).await.unwrap();
    let rows: Vec<(String, Value)> = after.entries.iter().map(|e| (e["pk"].as_str().unwrap().to_string(), e["row"]["color"].clone())).collect();
    assert_eq!(rows.len(), 6, "{:?}", after.entries);
    assert!(rows.iter().all(|(_, color)| color == "red"), "{rows:?}");

    // Once: the next registration finds the columns as they were at the last one.
    db.exec(register).await;
    let last = pull_run(db.client(), &alice, DEVICE, Some(&after.checkpoint), &[&b], 10).await.unwrap();
    assert_eq!(last.entries.len(), 0, "{:?}", last.entries);

    // A renamed key column: registered with its new name, the rows come again under it.
    db.exec("alter table public.todos rename column id to todo_id").await;
    db.exec(register).await;
    let renamed = pull_run(db.client(), &alice, DEVICE, Some(&last.checkpoint), &[&b], 10).await.unwrap();
    assert_eq!(renamed.entries.len(), 6, "{:?}", renamed.entries);
    assert!(renamed.entries.iter().all(|e| e["row"]["todo_id"] == e["pk"] && e["row"].get("id").is_none()), "{:?}", renamed.entries);
}

#[tokio::test]
async fn a_migration_of_a_synced_table_reaches_every_device_without_registering_it_again() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    six_rows(&db, &alice).await;
    let b = bucket();
    let run = pull_run(db.client(), &alice, DEVICE, None, &[&b], 10).await.unwrap();
    assert_eq!(run.entries.len(), 6);

    // An index changes no column: nothing to bring.
    db.exec("create index todos_title on public.todos (title)").await;
    let quiet = pull_run(db.client(), &alice, DEVICE, Some(&run.checkpoint), &[&b], 10).await.unwrap();
    assert_eq!(quiet.entries.len(), 0, "{:?}", quiet.entries);

    // A column added with a default, in the operator's own migration: the pack's event trigger takes
    // it up as the ALTER commits, and every row comes again with it.
    db.exec("alter table public.todos add column color text not null default 'red'").await;
    let after = pull_run(db.client(), &alice, DEVICE, Some(&quiet.checkpoint), &[&b], 10).await.unwrap();
    assert_eq!(after.entries.len(), 6, "{:?}", after.entries);
    assert!(after.entries.iter().all(|e| e["row"]["color"] == "red"), "{:?}", after.entries);

    // A retyped column changes how every value is spelt: devices get the new spellings.
    db.exec("alter table public.todos alter column position type numeric(10, 2)").await;
    let retyped = pull_run(db.client(), &alice, DEVICE, Some(&after.checkpoint), &[&b], 10).await.unwrap();
    assert_eq!(retyped.entries.len(), 6, "{:?}", retyped.entries);

    // Registering it again at the app's next start finds nothing new to announce.
    db.exec("select kizuna.register_table('public.todos', bucket => $$'user:' || owner$$, gate => 'public.todos_gate(text, jsonb)')").await;
    let again = pull_run(db.client(), &alice, DEVICE, Some(&retyped.checkpoint), &[&b], 10).await.unwrap();
    assert_eq!(again.entries.len(), 0, "{:?}", again.entries);

    // A migration the registration cannot follow (the bucket's column renamed) is not refused: the
    // operator's ALTER commits, and pushes wait for the table to be registered again.
    db.exec("alter table public.todos rename column owner to owned_by").await;
    let refused = db.push(&alice, push_request(DEVICE, vec![mutation(7, "todos", "g", "upsert", json!({"title": "g"}))])).await;
    let err = refused.expect_err("the table no longer matches its registration");
    assert_eq!(err.code, "55000", "the server's fault, retried: {}", err.message);
    assert!(err.message.contains("register it again"), "{}", err.message);
}

#[tokio::test]
async fn a_migration_holds_no_other_commit_until_its_own_transaction_commits() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    six_rows(&db, &alice).await;
    db.owned_table("notes", "id text primary key, body text", "").await;
    let b = bucket();
    let run = pull_run(db.client(), &alice, DEVICE, None, &[&b], 10).await.unwrap();
    assert_eq!(run.entries.len(), 6);

    // A migration file's transaction: the ALTER, then more work before its COMMIT.
    let migration = db.connect().await;
    migration.batch_execute("begin; alter table public.todos add column color text not null default 'red'").await.unwrap();

    // Meanwhile a device's push to another synced table commits: it does not wait for the
    // migration (with the fence lock taken at the ALTER, it waited until the migration ended).
    applied_within_five_seconds(&db, &alice, mutation(7, "notes", "n1", "upsert", json!({"body": "hi"})), "the push commits while the migration is open").await;

    migration.batch_execute("commit").await.unwrap();
    let after = pull_run(db.client(), &alice, DEVICE, Some(&run.checkpoint), &[&b], 10).await.unwrap();
    let todos: Vec<&Value> = after.entries.iter().filter(|e| e["table"] == "todos").collect();
    assert_eq!(todos.len(), 6, "{:?}", after.entries);
    assert!(todos.iter().all(|e| e["row"]["color"] == "red"), "{:?}", after.entries);
    // Numbered as the migration committed, after the push that committed first.
    let note_seq = after.entries.iter().find(|e| e["table"] == "notes").expect("the note")["seq"].as_i64().unwrap();
    assert!(todos.iter().all(|e| e["seq"].as_i64().unwrap() > note_seq), "{:?}", after.entries);
}

/// A table registered inside a migration's transaction is numbered as that transaction commits,
/// as a migration is: meanwhile other synced commits go on (with the number drawn at the call,
/// they waited until the migration ended). So is a registration again with a new bucket
/// expression, whose tombstones land at its commit too.
#[tokio::test]
async fn registering_a_table_holds_no_other_commit_until_its_own_transaction_commits() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    six_rows(&db, &alice).await;
    let b = bucket();
    let run = pull_run(db.client(), &alice, DEVICE, None, &[&b], 10).await.unwrap();

    let migration = db.connect().await;
    migration.batch_execute(&format!(
        "begin;
         create table public.cards (id text primary key, body text, owner uuid not null);
         alter table public.cards enable row level security;
         create policy own on public.cards using (owner = auth.uid()) with check (owner = auth.uid());
         grant select, insert, update, delete on public.cards to authenticated;
         insert into public.cards select 'c' || g, 'x', '{ALICE}' from generate_series(1, 3) g;
         select kizuna.register_table('public.cards', bucket => $$'user:' || owner$$);
         update public.cards set body = 'y' where id = 'c3';"
    )).await.unwrap();
    applied_within_five_seconds(&db, &alice, mutation(7, "todos", "g", "upsert", json!({"title": "g"})), "the push commits while the registration is open").await;
    migration.batch_execute("commit").await.unwrap();

    let after = pull_run(db.client(), &alice, DEVICE, Some(&run.checkpoint), &[&b], 10).await.unwrap();
    let seq_of = |e: &Value| e["seq"].as_i64().unwrap();
    let pushed_seq = seq_of(after.entries.iter().find(|e| e["table"] == "todos").expect("the pushed row"));
    let cards: Vec<&Value> = after.entries.iter().filter(|e| e["table"] == "cards").collect();
    assert_eq!(cards.len(), 3, "{:?}", after.entries);
    assert!(cards.iter().all(|e| seq_of(e) > pushed_seq), "{:?}", after.entries);
    let bodies: Vec<&Value> = cards.iter().map(|e| &e["row"]["body"]).collect();
    assert_eq!(bodies, [&json!("x"), &json!("x"), &json!("y")]);

    // Again, with a bucket expression that moves c1 out of alice's bucket.
    migration.batch_execute(
        "begin;
         select kizuna.register_table('public.cards', bucket => $$case when id = 'c1' then 'elsewhere' else 'user:' || owner end$$);"
    ).await.unwrap();
    applied_within_five_seconds(&db, &alice, mutation(8, "todos", "h", "upsert", json!({"title": "h"})), "the push commits while the registration is open").await;
    migration.batch_execute("commit").await.unwrap();

    let again = pull_run(db.client(), &alice, DEVICE, Some(&after.checkpoint), &[&b], 10).await.unwrap();
    let pushed_seq = seq_of(again.entries.iter().find(|e| e["table"] == "todos").expect("the pushed row"));
    let gone = again.entries.iter().find(|e| e["table"] == "cards" && e["pk"] == "c1").expect("c1's tombstone");
    assert_eq!((gone["deleted"].clone(), seq_of(gone) > pushed_seq), (json!(true), true), "{:?}", again.entries);
    // No entry is left with the number a registration writes before its commit.
    let unnumbered: i64 = db.one("select count(*) from kizuna.changes where seq < 0 or entered_seq < 0").await;
    assert_eq!(unnumbered, 0);
}

/// One pull page as the gateway runs it, and whether its transaction was given a transaction id
/// (anything written, a row lock included, takes one, and its commit then waits for a WAL flush).
async fn pull_and_whether_it_wrote(db: &TestDb, caller: &Caller, request: Value) -> (Value, bool) {
    let client = db.client();
    client.batch_execute("begin isolation level repeatable read").await.unwrap();
    client.batch_execute(&format!("set local role {}", caller.role)).await.unwrap();
    client.execute("select set_config('request.jwt.claims', $1, true)", &[&caller.claims.to_string()]).await.unwrap();
    let row = client.query_one("select public.kizuna_pull($1::text::jsonb), txid_current_if_assigned() is not null",
                               &[&request.to_string()]).await.unwrap();
    client.batch_execute("commit").await.unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn a_poll_that_finds_nothing_new_writes_nothing() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    six_rows(&db, &alice).await;
    let b = bucket();
    let (run, wrote) = pull_and_whether_it_wrote(&db, &alice, pull_request(DEVICE, None, &[&b], 100)).await;
    assert_eq!((run["done"].clone(), run["entries"].as_array().unwrap().len()), (json!(true), 6));
    assert!(wrote, "the run that completes records what it served (the DELETE_WINS rule)");
    let served = "select served_to from kizuna.client_buckets";
    assert_eq!(db.one::<i64>(served).await, run["horizon"].as_i64().unwrap());

    // Idle polls from the closing checkpoint, as a client's timer sends them: no write at all.
    let mut cursor = run["cursor"].as_str().unwrap().to_owned();
    for _ in 0..3 {
        let (page, wrote) = pull_and_whether_it_wrote(&db, &alice, pull_request(DEVICE, Some(&cursor), &[&b], 100)).await;
        assert_eq!((page["done"].clone(), page["entries"].clone()), (json!(true), json!([])));
        assert!(!wrote, "an idle poll wrote (a row version, a lock): every client's timer would cost a WAL flush");
        cursor = page["cursor"].as_str().unwrap().to_owned();
    }
    // Another bucket in the same poll (never served to this client) is recorded, once.
    let other = "team:none";
    let (_, wrote) = pull_and_whether_it_wrote(&db, &alice, pull_request(DEVICE, Some(&cursor), &[&b, other], 100)).await;
    assert!(wrote, "a bucket the client had not been served is recorded");
    assert_eq!(db.one::<i64>("select count(*) from kizuna.client_buckets").await, 2);
    let (_, wrote) = pull_and_whether_it_wrote(&db, &alice, pull_request(DEVICE, Some(&cursor), &[&b, other], 100)).await;
    assert!(!wrote);

    // A poll that brings something new records the new horizon.
    db.push(&alice, push_request(DEVICE, vec![mutation(7, "todos", "g", "upsert", json!({"title": "g"}))])).await.unwrap();
    let (page, wrote) = pull_and_whether_it_wrote(&db, &alice, pull_request(DEVICE, Some(&cursor), &[&b], 100)).await;
    assert_eq!(page["entries"].as_array().unwrap().len(), 1);
    assert!(wrote);
    assert_eq!(db.one::<i64>(&format!("{served} where bucket = '{b}'")).await, page["horizon"].as_i64().unwrap());
    // A first sync again (a rehydration, from null) over buckets already served at this horizon:
    // `joined` is already 0, so nothing to write either.
    let (_, wrote) = pull_and_whether_it_wrote(&db, &alice, pull_request(DEVICE, None, &[&b], 100)).await;
    assert!(!wrote, "a rehydration at the served horizon of a complete view writes nothing");
}

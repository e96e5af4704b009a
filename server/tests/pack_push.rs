//! Push: whole-request errors, the per-mutation rejections with server_row, atomic batches,
//! delay windows and bad input. Each refusal writes nothing.

mod support;

use serde_json::{json, Value};
use support::db::{call_raw_as, mutation, push_request, statuses, Caller, TestDb};

const ALICE: &str = "a11ce000-0000-4000-8000-000000000001";
const DEVICE: &str = "c0000000-0000-4000-8000-0000000000a1";
const OTHER_DEVICE: &str = "c0000000-0000-4000-8000-0000000000a2";

/// What a refused request must leave untouched.
async fn footprint(db: &TestDb) -> Value {
    db.one(
        "select jsonb_build_object('todos', (select count(*) from public.todos),
                                   'ledger', (select count(*) from kizuna.ledger),
                                   'changes', (select count(*) from kizuna.changes),
                                   'horizon', kizuna.horizon())",
    )
    .await
}

#[tokio::test]
async fn whole_request_errors_are_coded_and_write_nothing() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    db.exec("select kizuna.register_table('public.todos', bucket => $$'user:' || owner$$, max_batch_size => 3,
                                          gate => 'public.todos_gate(text, jsonb)')").await;
    let before = footprint(&db).await;
    let ok = |seq: i64| mutation(seq, "todos", &format!("t{seq}"), "upsert", json!({"title": "x"}));

    // KZP02: more mutations than the table's max_batch_size.
    let err = db.push(&alice, push_request(DEVICE, (1..=4).map(ok).collect())).await.unwrap_err();
    assert_eq!(err.code, "KZP02", "{err:?}");
    // KZP03: another protocol version.
    let mut req = push_request(DEVICE, vec![ok(1)]);
    req["protocol"] = json!(2);
    assert_eq!(db.push(&alice, req).await.unwrap_err().code, "KZP03");
    // KZP04: a row larger than max_row_bytes, even after valid mutations.
    db.exec("update kizuna.settings set max_row_bytes = 1000").await;
    let big = mutation(2, "todos", "big", "upsert", json!({"note": "n".repeat(2000)}));
    assert_eq!(db.push(&alice, push_request(DEVICE, vec![ok(1), big])).await.unwrap_err().code, "KZP04");
    // KZP01: shapes and types.
    let malformed = [
        json!([]),
        json!({"protocol": 1, "client_id": DEVICE}),
        json!({"protocol": "1", "client_id": DEVICE, "mutations": []}),
        json!({"protocol": 1, "client_id": "not-a-uuid", "mutations": []}),
        push_request(DEVICE, vec![json!({"id": "x"})]),
        push_request(DEVICE, vec![{ let mut m = ok(1); m["client_seq"] = json!("1"); m }]),
        push_request(DEVICE, vec![{ let mut m = ok(1); m["op"] = json!("drop"); m }]),
        push_request(DEVICE, vec![{ let mut m = ok(1); m["columns"] = json!([1, 2]); m }]),
        push_request(DEVICE, vec![{ let mut m = ok(1); m["apply_after"] = json!("tomorrow"); m }]),
        push_request(DEVICE, vec![{ let mut m = ok(1); m["hlc"] = json!("yesterday"); m }]),
        push_request(DEVICE, vec![{ let mut m = ok(1); m["read_seq"] = json!(1.5); m }]),
    ];
    for request in malformed {
        let err = db.push(&alice, request.clone()).await.unwrap_err();
        assert_eq!(err.code, "KZP01", "{request} -> {err:?}");
    }
    // Not JSON at all: PostgreSQL's own invalid_text_representation (the gateway answers 400 first).
    let err = call_raw_as(db.client(), &alice, "kizuna_push", "{\"protocol\": 1,").await.unwrap_err();
    assert_eq!(err.code, "22P02");
    // A client id that belongs to another user.
    db.push(&Caller::user("b0b00000-0000-4000-8000-000000000002"), push_request(DEVICE, vec![])).await.unwrap();
    let before_taken = footprint(&db).await;
    assert_eq!(db.push(&alice, push_request(DEVICE, vec![ok(1)])).await.unwrap_err().code, "KZP01");
    assert_eq!(footprint(&db).await, before_taken);
    assert_eq!(before["todos"], before_taken["todos"]);
    assert_eq!(before["ledger"], before_taken["ledger"]);
}

#[tokio::test]
async fn unknown_names_and_hostile_identifiers_are_schema_mismatches_that_write_nothing() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    let hostile = [
        mutation(1, "todos; drop table public.todos; --", "t1", "upsert", json!({"title": "x"})),
        mutation(2, "pg_authid", "t1", "upsert", json!({"title": "x"})),
        mutation(3, "public.todos", "t1", "upsert", json!({"title": "x"})),
        mutation(4, "todos", "t1", "upsert", json!({"title\" = 'x'; drop table public.todos; --": "x"})),
        mutation(5, "todos", "t1", "upsert", json!({"nope": 1})),
        mutation(6, "todos", "t1", "upsert", json!({"done": "not a boolean"})),
        mutation(7, "todos", "t1", "upsert", json!({"position": {"x": 1}})),
        mutation(8, "todos", "t1", "upsert", json!({"id": "another key"})),
    ];
    let response = db.push(&alice, push_request(DEVICE, hostile.to_vec())).await.unwrap();
    assert_eq!(statuses(&response), vec!["REJECTED:SCHEMA_MISMATCH"; 8]);
    assert!(response["verdicts"].as_array().unwrap().iter().all(|v| v["server_row"].is_null()));
    assert_eq!(db.one::<i64>("select count(*) from public.todos").await, 0);
    assert_eq!(db.one::<i64>("select count(*) from kizuna.changes").await, 0);

    // A hostile key is only ever a value.
    let key = "'); delete from public.todos; --";
    let response = db.push(&alice, push_request(DEVICE, vec![mutation(9, "todos", key, "upsert", json!({"title": "ok"}))])).await.unwrap();
    assert_eq!(statuses(&response), ["APPLIED"]);
    assert_eq!(db.one::<String>("select id from public.todos").await, key);
}

#[tokio::test]
async fn each_rejection_carries_the_row_as_the_caller_sees_it() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    db.push(&alice, push_request(DEVICE, vec![mutation(1, "todos", "t1", "upsert", json!({"title": "kept"}))])).await.unwrap();
    db.exec("create unique index todos_position on public.todos (position)").await;
    db.push(&alice, push_request(DEVICE, vec![mutation(2, "todos", "t2", "upsert", json!({"position": 1.0}))])).await.unwrap();

    let response = db
        .push(&alice, push_request(DEVICE, vec![
            mutation(3, "todos", "t1", "patch", json!({"title": "t".repeat(201)})),
            mutation(4, "todos", "t1", "patch", json!({"title": null})),
            mutation(5, "todos", "t1", "patch", json!({"position": 1.0})),
            mutation(6, "todos", "t1", "patch", json!({"done": true})),
        ]))
        .await
        .unwrap();
    assert_eq!(statuses(&response), ["REJECTED:VALIDATION_FAILED", "REJECTED:CONSTRAINT_VIOLATION",
                                     "REJECTED:CONSTRAINT_VIOLATION", "APPLIED"]);
    for v in &response["verdicts"].as_array().unwrap()[..3] {
        assert_eq!(v["server_row"]["title"], "kept");
        assert_eq!(v["server_row"]["done"], false, "the row as it was when refused");
    }
    // Patch never creates a row; the unknown key answers like a hidden one.
    let response = db.push(&alice, push_request(DEVICE, vec![mutation(7, "todos", "nobody", "patch", json!({"done": true}))])).await.unwrap();
    assert_eq!(statuses(&response), ["REJECTED:RLS_DENIED"]);
    assert!(response["verdicts"][0]["server_row"].is_null());
    assert_eq!(response["last_mutation_id"], 7);
}

#[tokio::test]
async fn an_atomic_batch_is_all_or_nothing_and_a_plain_slice_is_not() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    let batch = uuid::Uuid::new_v4().to_string();
    let members = |seq: i64, batch: Option<&str>| {
        let mut ms = vec![
            mutation(seq, "todos", "b1", "upsert", json!({"title": "one"})),
            mutation(seq + 1, "todos", "b2", "upsert", json!({"title": "x".repeat(300)})),
            mutation(seq + 2, "todos", "b3", "upsert", json!({"title": "three"})),
        ];
        if let Some(b) = batch {
            ms.iter_mut().for_each(|m| m["batch"] = json!(b));
        }
        ms
    };
    let response = db.push(&alice, push_request(DEVICE, members(1, Some(&batch)))).await.unwrap();
    assert_eq!(statuses(&response), ["REJECTED:BATCH_ABORTED", "REJECTED:VALIDATION_FAILED", "REJECTED:BATCH_ABORTED"]);
    assert_eq!(db.one::<i64>("select count(*) from public.todos").await, 0);

    let response = db.push(&alice, push_request(DEVICE, members(4, None))).await.unwrap();
    assert_eq!(statuses(&response), ["APPLIED", "REJECTED:VALIDATION_FAILED", "APPLIED"]);
    assert_eq!(db.one::<i64>("select count(*) from public.todos").await, 2);
}

#[tokio::test]
async fn a_future_apply_after_is_delayed_and_stores_nothing() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    let mut later = mutation(1, "todos", "d1", "upsert", json!({"title": "later"}));
    later["apply_after"] = json!("2999-01-01T00:00:00Z");
    let now = mutation(2, "todos", "d2", "upsert", json!({"title": "now"}));
    let response = db.push(&alice, push_request(DEVICE, vec![later.clone(), now])).await.unwrap();
    assert_eq!(statuses(&response), ["DELAYED", "APPLIED"]);
    assert_eq!(db.one::<i64>("select count(*) from public.todos where id = 'd1'").await, 0);
    assert_eq!(db.one::<i64>("select count(*) from kizuna.ledger").await, 1, "nothing stored for DELAYED");

    // Resent once due, after a later write applied: it applies (it was never SKIPPED).
    later["apply_after"] = json!("2000-01-01T00:00:00Z");
    let response = db.push(&alice, push_request(DEVICE, vec![later])).await.unwrap();
    assert_eq!(statuses(&response), ["APPLIED"]);
    assert_eq!(db.one::<i64>("select count(*) from public.todos where id = 'd1'").await, 1);
}

#[tokio::test]
async fn a_key_sent_in_another_spelling_is_the_same_key() {
    let db = TestDb::new().await;
    db.owned_table("tags", "id uuid primary key, label text", "").await;
    let alice = Caller::user(ALICE);
    let bucket = format!("user:{ALICE}");
    let key = "0a0b0c0d-1e2f-4a4b-8c8d-9e9fa0a1b2c3";
    let shouted = key.to_uppercase();
    let r = db.push(&alice, push_request(DEVICE, vec![mutation(1, "tags", key, "upsert", json!({"label": "x"}))])).await.unwrap();
    assert_eq!(statuses(&r), ["APPLIED"]);
    let run = support::db::pull_run(db.client(), &alice, DEVICE, None, &[&bucket], 10).await.unwrap();
    let r = db.push(&alice, push_request(DEVICE, vec![mutation(2, "tags", &shouted, "delete", Value::Null)])).await.unwrap();
    assert_eq!(statuses(&r), ["APPLIED"], "the upper-case spelling names the same row");
    assert_eq!(db.one::<i64>("select count(*) from public.tags").await, 0);

    let mut again = mutation(3, "tags", &shouted, "upsert", json!({"label": "back"}));
    again["read_seq"] = json!(run.horizon);
    let r = db.push(&alice, push_request(DEVICE, vec![again])).await.unwrap();
    assert_eq!(statuses(&r), ["REJECTED:DELETE_WINS"], "another spelling never resurrects a deleted key");
    assert_eq!(db.one::<i64>("select count(*) from public.tags").await, 0);

    let r = db.push(&alice, push_request(DEVICE, vec![mutation(4, "tags", "not-a-uuid", "upsert", json!({"label": "y"}))])).await.unwrap();
    assert_eq!(statuses(&r), ["REJECTED:SCHEMA_MISMATCH"]);

    // The row's own key column in the upper-case spelling too (it was refused as differing from
    // the key); a column naming another key still is.
    let other = "1a0b0c0d-1e2f-4a4b-8c8d-9e9fa0a1b2c3";
    let r = db
        .push(&alice, push_request(DEVICE, vec![
            mutation(5, "tags", &other.to_uppercase(), "upsert", json!({"id": other.to_uppercase(), "label": "z"})),
            mutation(6, "tags", other, "upsert", json!({"id": key, "label": "w"})),
            mutation(7, "tags", other, "upsert", json!({"id": "not-a-uuid", "label": "w"})),
        ]))
        .await
        .unwrap();
    assert_eq!(statuses(&r), ["APPLIED", "REJECTED:SCHEMA_MISMATCH", "REJECTED:SCHEMA_MISMATCH"]);
    assert_eq!(db.one::<String>(&format!("select label from public.tags where id = '{other}'")).await, "z");
}

/// A verdict names the key in its one spelling when the write sent another, applied alone, in a run,
/// refused with the server's row, or replayed: the writer moves its row there, or a pull would
/// bring the row under the lower-case key beside the device's own (two rows of one key).
#[tokio::test]
async fn a_verdict_names_the_key_in_its_one_spelling_when_it_was_sent_in_another() {
    let db = TestDb::new().await;
    db.owned_table("tags", "id uuid primary key, label text check (label <> 'refused')", "").await;
    let alice = Caller::user(ALICE);
    let keys: Vec<String> = (0..4).map(|i| format!("{i}a0b0c0d-1e2f-4a4b-8c8d-9e9fa0a1b2c3")).collect();
    let upsert = |seq: i64, key: &str, label: &str| mutation(seq, "tags", key, "upsert", json!({"label": label}));

    let alone = upsert(1, &keys[0].to_uppercase(), "a");
    let r = db.push(&alice, push_request(DEVICE, vec![alone.clone()])).await.unwrap();
    assert_eq!(statuses(&r), ["APPLIED"]);
    assert_eq!(r["verdicts"][0]["pk"], keys[0].as_str(), "{r}");

    // A run the pack writes in one statement: each verdict its own key; a lower-case one names none.
    let run = vec![upsert(2, &keys[1].to_uppercase(), "b"), upsert(3, &keys[2], "c"), upsert(4, &keys[3].to_uppercase(), "d")];
    let r = db.push(&alice, push_request(DEVICE, run)).await.unwrap();
    assert_eq!(statuses(&r), ["APPLIED", "APPLIED", "APPLIED"]);
    let pks: Vec<&Value> = r["verdicts"].as_array().unwrap().iter().map(|v| &v["pk"]).collect();
    assert_eq!(pks, [&json!(keys[1]), &Value::Null, &json!(keys[3])], "{r}");

    // Refused, with the server's row: the key of that row.
    let r = db.push(&alice, push_request(DEVICE, vec![upsert(5, &keys[1].to_uppercase(), "refused")])).await.unwrap();
    assert_eq!(statuses(&r), ["REJECTED:CONSTRAINT_VIOLATION"]);
    assert_eq!((&r["verdicts"][0]["pk"], &r["verdicts"][0]["server_row"]["label"]), (&json!(keys[1]), &json!("b")), "{r}");

    // Replayed from the ledger: the same verdict, the key with it.
    let r = db.push(&alice, push_request(DEVICE, vec![alone])).await.unwrap();
    assert_eq!((&r["verdicts"][0]["replayed"], &r["verdicts"][0]["pk"]), (&json!(true), &json!(keys[0])), "{r}");
    assert_eq!(db.one::<i64>("select count(*) from public.tags").await, 4);

    // A key whose JSON rendering differs from its text (a timestamp): applied or refused, the
    // verdict names it as the change log, and so every pull, does (a refusal named it as the row
    // renders it, a key no pull serves, and the device moved its row there).
    db.owned_table("stamps", "at timestamptz primary key, label text check (label <> 'refused')", "").await;
    let sent = "2024-01-01T00:00:00Z";
    let r = db.push(&alice, push_request(DEVICE, vec![mutation(6, "stamps", sent, "upsert", json!({"label": "a"}))])).await.unwrap();
    let logged: String = db.one("select pk from kizuna.changes where tbl = 'stamps'").await;
    assert_eq!((statuses(&r), &r["verdicts"][0]["pk"]), (vec!["APPLIED".to_string()], &json!(logged)), "{r}");
    let r = db.push(&alice, push_request(DEVICE, vec![mutation(7, "stamps", sent, "upsert", json!({"label": "refused"}))])).await.unwrap();
    assert_eq!((statuses(&r), &r["verdicts"][0]["pk"]), (vec!["REJECTED:CONSTRAINT_VIOLATION".to_string()], &json!(logged)), "{r}");
}

/// A key whose equality is coarser than its text (numeric 1.0 = 1.00, citext 'Ann' = 'ann') is named
/// as the row that holds it spells it: a write in another spelling lands on that row, and its
/// verdict names the row's key, the one the change log and so every pull name. The verdict named
/// the key as written, and the writer kept a row under it that no pull ever brought or removed,
/// beside the one pulled under the row's spelling.
#[tokio::test]
async fn a_key_equal_to_a_stored_key_in_another_spelling_is_named_as_its_row_spells_it() {
    let db = TestDb::new().await;
    db.owned_table("prices", "id numeric primary key, label text check (label <> 'refused')", "").await;
    let alice = Caller::user(ALICE);
    let upsert = |seq: i64, key: &str, label: &str| mutation(seq, "prices", key, "upsert", json!({"label": label}));
    let pks = |r: &Value| r["verdicts"].as_array().unwrap().iter().map(|v| v["pk"].clone()).collect::<Vec<Value>>();
    let logged = || db.one::<Value>("select jsonb_agg(pk order by pk) from kizuna.changes where tbl = 'prices'");

    let r = db.push(&alice, push_request(DEVICE, vec![upsert(1, "1.0", "a")])).await.unwrap();
    assert_eq!((statuses(&r), pks(&r)), (vec!["APPLIED".to_string()], vec![Value::Null]), "{r}");
    let r = db.push(&alice, push_request(DEVICE, vec![upsert(2, "1.00", "b")])).await.unwrap();
    assert_eq!((statuses(&r), pks(&r)), (vec!["APPLIED".to_string()], vec![json!("1.0")]), "{r}");
    assert_eq!(db.one::<String>("select label from public.prices where id = 1").await, "b");
    assert_eq!(logged().await, json!(["1.0"]));

    // Several in one request, a patch and a new key among them.
    let r = db
        .push(&alice, push_request(DEVICE, vec![
            upsert(3, "01.000", "c"),
            mutation(4, "prices", "1", "patch", json!({"label": "d"})),
            upsert(5, "2.50", "e"),
        ]))
        .await
        .unwrap();
    assert_eq!(statuses(&r), ["APPLIED", "APPLIED", "APPLIED"], "{r}");
    assert_eq!(pks(&r), [json!("1.0"), json!("1.0"), Value::Null], "{r}");

    // Refused, with the server's row: the row's key.
    let r = db.push(&alice, push_request(DEVICE, vec![upsert(6, "1.0000", "refused")])).await.unwrap();
    assert_eq!(statuses(&r), ["REJECTED:CONSTRAINT_VIOLATION"]);
    assert_eq!((&r["verdicts"][0]["pk"], &r["verdicts"][0]["server_row"]["label"]), (&json!("1.0"), &json!("d")), "{r}");

    // The key column named too, in the key's spelling; then a delete in a third spelling.
    let r = db.push(&alice, push_request(DEVICE, vec![mutation(7, "prices", "2.5", "upsert", json!({"id": "2.5", "label": "f"}))])).await.unwrap();
    assert_eq!((statuses(&r), pks(&r)), (vec!["APPLIED".to_string()], vec![json!("2.50")]), "{r}");
    let r = db.push(&alice, push_request(DEVICE, vec![mutation(8, "prices", "2.5000", "delete", Value::Null)])).await.unwrap();
    assert_eq!((statuses(&r), pks(&r)), (vec!["APPLIED".to_string()], vec![json!("2.50")]), "{r}");
    assert_eq!(db.one::<i64>("select count(*) from public.prices").await, 1);
    assert_eq!(logged().await, json!(["1.0", "2.50"]), "one key per row in the change log");

    // citext: case does not tell keys apart.
    db.exec("create extension if not exists citext").await;
    db.owned_table("handles", "id citext primary key, label text", "").await;
    let r = db.push(&alice, push_request(DEVICE, vec![mutation(9, "handles", "Ann", "upsert", json!({"label": "x"}))])).await.unwrap();
    assert_eq!(pks(&r), [Value::Null], "{r}");
    let r = db.push(&alice, push_request(DEVICE, vec![mutation(10, "handles", "ANN", "upsert", json!({"label": "y"}))])).await.unwrap();
    assert_eq!((statuses(&r), pks(&r)), (vec!["APPLIED".to_string()], vec![json!("Ann")]), "{r}");
    assert_eq!(db.one::<Value>("select jsonb_agg(jsonb_build_array(id, label)) from public.handles").await, json!([["Ann", "y"]]));
}

/// Delete wins across spellings: a key of coarser equality than its text, deleted in one spelling,
/// is found deleted in every other. Before, the change log was read by the key's text, so an
/// upsert of `1.00` after the delete of `1.0` was applied and the row came back.
#[tokio::test]
async fn a_key_deleted_in_one_spelling_stays_deleted_in_another() {
    let db = TestDb::new().await;
    db.exec("create extension if not exists citext").await;
    db.owned_table("prices", "id numeric primary key, label text", "").await;
    db.owned_table("handles", "id citext primary key, label text", "").await;
    let alice = Caller::user(ALICE);
    let bucket = format!("user:{ALICE}");
    let pks = |r: &Value| r["verdicts"].as_array().unwrap().iter().map(|v| v["pk"].clone()).collect::<Vec<Value>>();
    let upsert = |seq: i64, table: &str, key: &str| mutation(seq, table, key, "upsert", json!({"label": "x"}));
    let r = db.push(&alice, push_request(DEVICE, vec![upsert(1, "prices", "1.0"), upsert(2, "handles", "Ann")])).await.unwrap();
    assert_eq!(statuses(&r), ["APPLIED", "APPLIED"], "{r}");
    let run = support::db::pull_run(db.client(), &alice, DEVICE, None, &[&bucket], 10).await.unwrap();
    let r = db
        .push(&alice, push_request(DEVICE, vec![mutation(3, "prices", "1.0", "delete", Value::Null), mutation(4, "handles", "Ann", "delete", Value::Null)]))
        .await
        .unwrap();
    assert_eq!(statuses(&r), ["APPLIED", "APPLIED"], "{r}");

    // Written again in other spellings, by the device that had the rows: the delete wins, and the
    // verdict names the key as the change log does.
    let again = |seq: i64, table: &str, key: &str| {
        let mut m = upsert(seq, table, key);
        m["read_seq"] = json!(run.horizon);
        m
    };
    let r = db.push(&alice, push_request(DEVICE, vec![again(5, "prices", "1.00"), again(6, "handles", "ANN")])).await.unwrap();
    assert_eq!(statuses(&r), ["REJECTED:DELETE_WINS", "REJECTED:DELETE_WINS"], "{r}");
    assert_eq!(pks(&r), [json!("1.0"), json!("Ann")], "{r}");
    // By another device, which never had them: refused too, as any write to a deleted key is.
    let r = db.push(&alice, push_request(OTHER_DEVICE, vec![upsert(1, "prices", "01"), upsert(2, "handles", "aNN")])).await.unwrap();
    assert_eq!(statuses(&r), ["REJECTED:RLS_DENIED", "REJECTED:RLS_DENIED"], "{r}");
    assert_eq!(db.one::<i64>("select (select count(*) from public.prices) + (select count(*) from public.handles)").await, 0);

    // A key equal to no deleted one is created as written.
    let r = db.push(&alice, push_request(DEVICE, vec![upsert(7, "prices", "2.50")])).await.unwrap();
    assert_eq!((statuses(&r), pks(&r)), (vec!["APPLIED".to_string()], vec![Value::Null]), "{r}");
    // Plain SQL may create a deleted key again; a push in yet another spelling lands on that row.
    db.exec("insert into public.prices (id, owner, label) values (1.000, 'a11ce000-0000-4000-8000-000000000001', 'sql')").await;
    let r = db.push(&alice, push_request(DEVICE, vec![upsert(8, "prices", "1")])).await.unwrap();
    assert_eq!((statuses(&r), pks(&r)), (vec!["APPLIED".to_string()], vec![json!("1.000")]), "{r}");
    assert_eq!(db.one::<Value>("select jsonb_agg(jsonb_build_array(id::text, label) order by id) from public.prices").await, json!([["1.000", "x"], ["2.50", "x"]]));
}

/// A migration that changes a synced key column's type (integer to bigint, numeric to text) keeps
/// the table writable, by push and plain SQL alike, in a session that wrote to it before (every
/// pooled connection of the gateway). The capture trigger's cached plans had the old type: every
/// later write failed "type of parameter 23 (bigint) does not match that when preparing the plan
/// (integer)". And the index of a coarse key's tombstones cast every deleted key to the old type:
/// a delete of `abc` failed at commit with "invalid input syntax for type numeric".
#[tokio::test]
async fn a_synced_key_column_given_another_type_keeps_its_table_writable() {
    let db = TestDb::new().await;
    // Columns named as the compiled row reader names its row and its columns: the key is read
    // beside them all the same.
    db.owned_table("counters", "id integer primary key, label text, kz_row text, kz_cols text", "").await;
    db.owned_table("prices", "id numeric primary key, label text", "").await;
    // Universe sync's capture reads the key as the sync's does.
    db.exec("select kizuna.register_universe_table('public.counters')").await;
    let alice = Caller::user(ALICE);
    let write = |seq: i64, table: &str, key: &str, op: &str| {
        mutation(seq, table, key, op, if op == "delete" { Value::Null } else { json!({"label": "x"}) })
    };
    let r = db
        .push(&alice, push_request(DEVICE, vec![write(1, "counters", "1", "upsert"), write(2, "counters", "2", "upsert"), write(3, "prices", "1.0", "upsert")]))
        .await
        .unwrap();
    assert_eq!(statuses(&r), ["APPLIED", "APPLIED", "APPLIED"], "{r}");
    let r = db.push(&alice, push_request(DEVICE, vec![write(4, "counters", "2", "delete"), write(5, "prices", "1.0", "delete")])).await.unwrap();
    assert_eq!(statuses(&r), ["APPLIED", "APPLIED"], "{r}");

    db.exec("alter table public.counters alter column id type bigint; alter table public.prices alter column id type text").await;
    let r = db
        .push(
            &alice,
            push_request(
                DEVICE,
                vec![
                    write(6, "counters", "5000000000", "upsert"),
                    write(7, "counters", "1", "patch"),
                    write(8, "counters", "1", "delete"),
                    write(9, "prices", "abc", "upsert"),
                    write(10, "prices", "xyz", "upsert"),
                ],
            ),
        )
        .await
        .unwrap();
    assert_eq!(statuses(&r), ["APPLIED", "APPLIED", "APPLIED", "APPLIED", "APPLIED"], "{r}");
    let r = db.push(&alice, push_request(DEVICE, vec![write(11, "prices", "abc", "delete")])).await.unwrap();
    assert_eq!(statuses(&r), ["APPLIED"], "{r}");
    db.exec("delete from public.prices where id = 'xyz'; insert into public.counters (id, owner) values (7000000000, 'a11ce000-0000-4000-8000-000000000001')").await;
    assert_eq!(db.one::<Value>("select jsonb_agg(id order by id) from public.counters").await, json!([5000000000i64, 7000000000i64]));
    assert_eq!(db.one::<i64>("select count(*) from public.prices").await, 0);
    assert_eq!(
        db.one::<Value>("select jsonb_agg(jsonb_build_array(pk, op) order by id) from kizuna.universe_events").await,
        json!([["1", "upsert"], ["2", "upsert"], ["2", "delete"], ["5000000000", "upsert"], ["1", "upsert"], ["1", "delete"], ["7000000000", "upsert"]])
    );
    // Every change reached the log, so every device hears of it.
    assert_eq!(
        db.one::<Value>("select jsonb_agg(jsonb_build_array(tbl, pk, deleted) order by tbl, pk) from kizuna.changes").await,
        json!([
            ["counters", "1", true], ["counters", "2", true], ["counters", "5000000000", false], ["counters", "7000000000", false],
            ["prices", "1.0", true], ["prices", "abc", true], ["prices", "xyz", true]
        ])
    );
}

/// A synced table whose bucket column was renamed no longer matches its registration: a push to
/// it fails as the server's fault (retried, nothing lost) with words that say what to do, until
/// the table is registered again; then the same writes apply. They were refused as
/// SCHEMA_MISMATCH, a verdict the client settles by dropping the write. A renamed key column is
/// followed as the migration commits: the key is the same attribute under another name.
#[tokio::test]
async fn a_push_to_a_table_whose_key_or_bucket_column_was_renamed_waits_for_it_to_be_registered_again() {
    let db = TestDb::new().await;
    db.owned_table("counters", "id integer primary key, label text", "").await;
    let alice = Caller::user(ALICE);
    let bucket = format!("user:{ALICE}");
    let upsert = |seq: i64, key: &str| mutation(seq, "counters", key, "upsert", json!({"label": "x"}));
    let r = db.push(&alice, push_request(DEVICE, vec![upsert(1, "1")])).await.unwrap();
    assert_eq!(statuses(&r), ["APPLIED"], "{r}");

    db.exec("alter table public.counters rename column id to counter_id").await;
    let r = db.push(&alice, push_request(DEVICE, vec![upsert(2, "2")])).await.unwrap();
    assert_eq!(statuses(&r), ["APPLIED"], "the renamed key is followed: {r}");
    let run = support::db::pull_run(db.client(), &alice, DEVICE, None, &[&bucket], 10).await.unwrap();
    let keys: Vec<(Value, Value)> = run.entries.iter().map(|e| (e["pk"].clone(), e["row"]["counter_id"].clone())).collect();
    assert_eq!(keys, [(json!("1"), json!(1)), (json!("2"), json!(2))]);

    db.exec("alter table public.counters rename column owner to owner_id").await;
    let e = db.push(&alice, push_request(DEVICE, vec![upsert(3, "3")])).await.unwrap_err();
    assert_eq!(e.code, "55000", "{e:?}");
    assert!(e.message.contains("kizuna.register_table"), "{e:?}");
    assert_eq!(db.one::<i64>("select count(*) from public.counters").await, 2);
    db.exec("select kizuna.register_table('public.counters', bucket => $$'user:' || owner_id$$)").await;
    let r = db.push(&alice, push_request(DEVICE, vec![upsert(3, "3")])).await.unwrap();
    assert_eq!(statuses(&r), ["APPLIED"], "{r}");
    assert_eq!(
        db.one::<Value>("select jsonb_agg(jsonb_build_array(pk, bucket, deleted) order by pk) from kizuna.changes").await,
        json!([["1", format!("user:{ALICE}"), false], ["2", format!("user:{ALICE}"), false], ["3", format!("user:{ALICE}"), false]])
    );

    // The key column dropped (a new one made the key): nothing to follow, it waits as above.
    db.exec("alter table public.counters add column k text; update public.counters set k = counter_id::text;
             alter table public.counters drop column counter_id; alter table public.counters add primary key (k)").await;
    let e = db.push(&alice, push_request(DEVICE, vec![upsert(4, "4")])).await.unwrap_err();
    assert_eq!(e.code, "55000", "{e:?}");
    db.exec("select kizuna.register_table('public.counters', bucket => $$'user:' || owner_id$$)").await;
    let r = db.push(&alice, push_request(DEVICE, vec![upsert(4, "4")])).await.unwrap();
    assert_eq!(statuses(&r), ["APPLIED"], "{r}");

    // A table dropped outright is no table to wait for: its writes are refused, and pulls go on.
    db.exec("drop table public.counters cascade").await;
    let r = db.push(&alice, push_request(DEVICE, vec![upsert(5, "5")])).await.unwrap();
    assert_eq!(statuses(&r), ["REJECTED:SCHEMA_MISMATCH"], "{r}");
    assert!(support::db::pull_run(db.client(), &alice, DEVICE, None, &[&bucket], 10).await.is_ok());
    // A table of the same name takes its place: registering it was refused, the name taken.
    db.exec(&format!(
        "create table public.counters (id integer primary key, label text, owner uuid not null default auth.uid());
         insert into public.counters (id, owner) values (3, '{ALICE}');
         grant select, insert, update, delete on public.counters to authenticated;
         select kizuna.register_table('public.counters', bucket => $$'user:' || owner$$);"
    ))
    .await;
    let r = db.push(&alice, push_request(DEVICE, vec![upsert(6, "9")])).await.unwrap();
    assert_eq!(statuses(&r), ["APPLIED"], "{r}");
    assert_eq!(
        db.one::<Value>("select jsonb_agg(jsonb_build_array(pk, deleted) order by pk) from kizuna.changes").await,
        json!([["1", true], ["2", true], ["3", false], ["4", true], ["9", false]])
    );
}

/// A key longer or finer than its column holds names no row: the wire's text key is cast to the
/// column's type without its length or precision (an explicit cast to `varchar(8)` cut it to its
/// first eight characters, and a delete of one key removed another row), alone and in a run of
/// deletes applied set-based.
#[tokio::test]
async fn a_key_longer_than_its_column_names_no_other_row() {
    let db = TestDb::new().await;
    db.owned_table("codes", "id varchar(8) primary key, label text", "").await;
    db.owned_table("prices", "id numeric(6, 2) primary key, label text", "").await;
    let alice = Caller::user(ALICE);
    let r = db
        .push(&alice, push_request(DEVICE, vec![mutation(1, "codes", "abcdefgh", "upsert", json!({"label": "kept"})), mutation(2, "prices", "1.01", "upsert", json!({"label": "kept"}))]))
        .await
        .unwrap();
    assert_eq!(statuses(&r), ["APPLIED", "APPLIED"]);
    let r = db.push(&alice, push_request(DEVICE, vec![mutation(3, "codes", "abcdefghXYZ", "delete", Value::Null), mutation(4, "prices", "1.005", "delete", Value::Null)])).await.unwrap();
    assert_eq!(r["verdicts"].as_array().unwrap().len(), 2, "{r}");
    let deletes: Vec<Value> = (0..6).map(|i| mutation(5 + i, "codes", &format!("abcdefgh{i}"), "delete", Value::Null)).collect();
    let r = db.push(&alice, push_request(DEVICE, deletes)).await.unwrap();
    assert_eq!(r["verdicts"].as_array().unwrap().len(), 6, "{r}");
    let r = db.push(&alice, push_request(DEVICE, vec![mutation(11, "codes", "abcdefghXYZ", "patch", json!({"label": "changed"}))])).await.unwrap();
    assert_eq!(r["verdicts"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(db.one::<String>("select label from public.codes where id = 'abcdefgh'").await, "kept");
    assert_eq!(db.one::<String>("select label from public.prices where id = 1.01").await, "kept");
}

#[tokio::test]
async fn a_gate_may_refuse_by_raising_and_a_row_one_may_read_but_not_write_comes_back() {
    let db = TestDb::with_todos().await;
    db.exec(
        "create function public.todos_strict_gate(op text, row_ jsonb) returns boolean language plpgsql as $$
         begin
           if row_ ->> 'title' = 'forbidden' then raise exception 'that title is not allowed'; end if;
           return true;
         end $$;
         update kizuna.synced_tables set gate = 'public.todos_strict_gate(text, jsonb)' where name = 'todos';
         create policy todos_select_shared on public.todos for select using (title = 'shared');",
    )
    .await;
    let (alice, bob) = (Caller::user(ALICE), Caller::user("b0b00000-0000-4000-8000-000000000002"));
    let r = db.push(&alice, push_request(DEVICE, vec![mutation(1, "todos", "t1", "upsert", json!({"title": "forbidden"}))])).await.unwrap();
    assert_eq!(statuses(&r), ["REJECTED:VALIDATION_FAILED"], "a plain RAISE in a gate is a refusal, not a server fault");
    assert_eq!(r["verdicts"][0]["message"], "that title is not allowed", "the gate's own words reach the writer");
    assert!(r["verdicts"][0]["server_row"].is_null());

    db.push(&bob, push_request("c0000000-0000-4000-8000-0000000000b1", vec![mutation(1, "todos", "shared-1", "upsert", json!({"title": "shared"}))]))
        .await
        .unwrap();
    let r = db.push(&alice, push_request(DEVICE, vec![mutation(2, "todos", "shared-1", "patch", json!({"done": true}))])).await.unwrap();
    assert_eq!(statuses(&r), ["REJECTED:RLS_DENIED"], "alice may read bob's shared row, not change it");
    assert_eq!(r["verdicts"][0]["server_row"]["title"], "shared", "the refusal shows the row as alice sees it");
    assert_eq!(r["verdicts"][0]["server_row"]["done"], false);
}

#[tokio::test]
async fn a_delete_with_columns_null_deletes_as_one_without_columns() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    let r = db.push(&alice, push_request(DEVICE, vec![mutation(1, "todos", "t1", "upsert", json!({"title": "a"}))])).await.unwrap();
    assert_eq!(statuses(&r), ["APPLIED"]);
    // JSON null where the contract says the field is optional: the same as leaving it out (this
    // failed as VALIDATION_FAILED, 22023, before: its keys were read as an object's).
    let mut delete = mutation(2, "todos", "t1", "delete", Value::Null);
    delete["columns"] = Value::Null;
    let r = db.push(&alice, push_request(DEVICE, vec![delete])).await.unwrap();
    assert_eq!(statuses(&r), ["APPLIED"], "{r}");
    assert_eq!(db.one::<i64>("select count(*) from public.todos").await, 0);
}

#[tokio::test]
async fn data_an_extension_calls_internal_error_refuses_that_write_alone() {
    // PostGIS and other C extensions raise XX000 (internal_error) for bad input: "parse error -
    // invalid geometry". It was a fault of the server: every push of the device failed with 5xx,
    // retried forever, and each write behind the bad one waited with it. A trigger raises it here.
    let db = TestDb::with_todos().await;
    db.exec(
        "create function public.todos_geometry() returns trigger language plpgsql as $$
         begin
           if new.title = 'POINT(oops)' then
             raise exception 'parse error - invalid geometry' using errcode = 'XX000';
           end if;
           return new;
         end $$;
         create trigger todos_geometry before insert or update on public.todos
           for each row execute function public.todos_geometry();",
    )
    .await;
    let alice = Caller::user(ALICE);
    let todo = |seq: i64, title: &str| mutation(seq, "todos", &format!("t{seq}"), "upsert", json!({"title": title}));
    // Alone, and amid a run the pack would write in one statement.
    let r = db.push(&alice, push_request(DEVICE, vec![todo(1, "POINT(oops)")])).await.unwrap();
    assert_eq!(statuses(&r), ["REJECTED:VALIDATION_FAILED"], "{r}");
    let r = db
        .push(&alice, push_request(DEVICE, vec![todo(2, "a"), todo(3, "b"), todo(4, "POINT(oops)"), todo(5, "c"), todo(6, "d"), todo(7, "e")]))
        .await
        .unwrap();
    assert_eq!(statuses(&r), ["APPLIED", "APPLIED", "REJECTED:VALIDATION_FAILED", "APPLIED", "APPLIED", "APPLIED"], "{r}");
    assert_eq!(db.one::<i64>("select count(*) from public.todos").await, 5);
    assert!(!r["verdicts"][2]["message"].as_str().unwrap().contains("geometry"), "no internals: {r}");
}

/// A key that is no value of its column's domain (a CHECK on the domain) is that write's refusal,
/// alone and amid a run: the key's cast raised check_violation, which escaped the mutation and
/// failed the whole request (the client then narrowed to it and charged it five times, while the
/// writes behind it waited).
#[tokio::test]
async fn a_key_its_domain_refuses_is_that_writes_refusal_alone() {
    let db = TestDb::new().await;
    db.exec("create domain public.short_code as text check (length(value) = 4)").await;
    db.owned_table("codes", "id public.short_code primary key, label text", "").await;
    let alice = Caller::user(ALICE);
    let upsert = |seq: i64, key: &str| mutation(seq, "codes", key, "upsert", json!({"label": key}));
    let r = db.push(&alice, push_request(DEVICE, vec![upsert(1, "toolong")])).await.unwrap();
    assert_eq!(statuses(&r), ["REJECTED:SCHEMA_MISMATCH"], "{r}");
    let r = db.push(&alice, push_request(DEVICE, vec![upsert(2, "abcd"), upsert(3, "toolong"), upsert(4, "efgh"), upsert(5, "ijkl")])).await.unwrap();
    assert_eq!(statuses(&r), ["APPLIED", "REJECTED:SCHEMA_MISMATCH", "APPLIED", "APPLIED"], "{r}");
    let r = db.push(&alice, push_request(DEVICE, vec![mutation(6, "codes", "abcd", "upsert", json!({"id": "toolong", "label": "x"}))])).await.unwrap();
    assert_eq!(statuses(&r), ["REJECTED:SCHEMA_MISMATCH"], "a key column its domain refuses differs from the key: {r}");
    assert_eq!(db.one::<i64>("select count(*) from public.codes").await, 3);
}

/// A key or bucket too long for the change log's index (a btree entry holds at most 2,704 bytes)
/// is that write's refusal: it failed the whole request at COMMIT, after every write of it was
/// answered APPLIED, with PostgreSQL's words naming the pack's index (as a fault of the server the
/// client resent it for ever, and every write behind it waited). Plain SQL is refused at the
/// statement, with the same words.
#[tokio::test]
async fn a_key_or_bucket_too_long_for_the_change_log_refuses_that_write_alone() {
    let db = TestDb::with_todos().await;
    db.exec("create table public.posts (id text primary key, channel text not null, body text);
             grant select, insert, update, delete on public.posts to authenticated;
             select kizuna.register_table('public.posts', bucket => $$'ch:' || channel$$);")
        .await;
    let alice = Caller::user(ALICE);
    // Random characters: what compresses would fit the index, these do not.
    let mut seed = 7u64;
    let long: String = (0..2680)
        .map(|_| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            char::from(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"[(seed >> 33) as usize % 62])
        })
        .collect();
    let r = db
        .push(&alice, push_request(DEVICE, vec![
            mutation(1, "todos", "ok-1", "upsert", json!({"title": "a"})),
            mutation(2, "todos", &long, "upsert", json!({"title": "b"})),
            mutation(3, "posts", "p1", "upsert", json!({"channel": long, "body": "c"})),
            mutation(4, "todos", "ok-2", "upsert", json!({"title": "d"})),
        ]))
        .await
        .expect("the request commits");
    assert_eq!(statuses(&r), ["APPLIED", "REJECTED:VALIDATION_FAILED", "REJECTED:VALIDATION_FAILED", "APPLIED"], "{r}");
    assert!(r["verdicts"][1]["message"].as_str().unwrap().contains("2,400 bytes"), "{r}");
    assert!(!r.to_string().contains("changes_pkey"), "no internals: {r}");
    assert_eq!(db.one::<i64>("select count(*) from public.todos").await, 2);
    let plain = db.client().batch_execute(&format!("insert into public.todos (id, owner, title) values ('{long}', '{ALICE}', 'x')")).await;
    let error = plain.expect_err("refused at the statement").as_db_error().map(|e| (e.code().code().to_owned(), e.message().to_owned()));
    assert_eq!(error, Some(("54000".into(), "a synced row's key and bucket must stay under 2,400 bytes together".into())));

    // A row stored with a long key before the check (one that compressed into the index) can still
    // be written and deleted: only a new key is checked.
    let stored = "k".repeat(3000);
    db.exec(&format!(
        "alter table public.todos disable trigger kizuna_capture;
         insert into public.todos (id, owner, title) values ('{stored}', '{ALICE}', 'old');
         alter table public.todos enable always trigger kizuna_capture;
         update public.todos set title = 'older' where id = '{stored}';
         delete from public.todos where id = '{stored}';"
    ))
    .await;
}

/// A key whose text follows a session's settings (a timestamptz: TimeZone; a date: DateStyle; an
/// interval: IntervalStyle; a float: extra_float_digits) has one spelling in the change log,
/// whichever session writes its row: plain SQL in an admin's psql set to Tokyo, a push through a
/// session set otherwise, the set-based run path. A row written under other settings was entered
/// under a second spelling of its key, and every device held it twice.
#[tokio::test]
async fn a_key_whose_text_follows_session_settings_has_one_spelling_whoever_writes_it() {
    let db = TestDb::new().await;
    // (table, key type, the key as written, the writer's settings, the key's one spelling)
    let cases = [
        ("stamps", "timestamptz", "2026-12-07 10:00+09", "set timezone = 'Asia/Tokyo'", "2026-12-07 01:00:00+00"),
        ("days", "date", "2026-12-07", "set datestyle = 'SQL, DMY'", "2026-12-07"),
        ("spans", "interval", "1 day 2 hours", "set intervalstyle = 'iso_8601'", "1 day 02:00:00"),
        ("ratios", "float8", "0.3333333333333333", "set extra_float_digits = 0", "0.3333333333333333"),
    ];
    let other_settings = db.connect().await;
    for (table, key_type, key, settings, spelled) in cases {
        db.owned_table(table, &format!("k {key_type} primary key, label text"), "").await;
        other_settings.batch_execute(&format!("reset all; {settings}")).await.unwrap();
        other_settings
            .batch_execute(&format!("insert into public.{table} (k, label, owner) values ('{key}', 'a', '{ALICE}')"))
            .await
            .unwrap();
        db.exec(&format!("update public.{table} set label = 'b'")).await;
        assert_eq!(live_keys(&db, table).await, json!([spelled]), "{key_type} written under `{settings}`, then under the defaults");
    }

    // A push through a session set to Tokyo: the verdict names the key as the change log does.
    let alice = Caller::user(ALICE);
    db.exec("set timezone = 'Asia/Tokyo'").await;
    let r = db
        .push(&alice, push_request(DEVICE, vec![mutation(1, "stamps", "2026-12-07T10:00:00+09:00", "upsert", json!({"label": "c"}))]))
        .await
        .unwrap();
    assert_eq!((statuses(&r), &r["verdicts"][0]["pk"]), (vec!["APPLIED".to_string()], &json!("2026-12-07 01:00:00+00")), "{r}");
    assert_eq!(live_keys(&db, "stamps").await, json!(["2026-12-07 01:00:00+00"]));

    // Date keys, which may go in a set-based run: pushed through a session in DateStyle 'SQL, DMY'.
    db.exec("reset timezone; set datestyle = 'SQL, DMY'").await;
    let days: Vec<Value> = (0..3).map(|i| mutation(2 + i, "days", &format!("2027-01-0{}", i + 1), "upsert", json!({"label": "d"}))).collect();
    let r = db.push(&alice, push_request(DEVICE, days)).await.unwrap();
    assert_eq!(statuses(&r), ["APPLIED", "APPLIED", "APPLIED"], "{r}");
    assert!(r["verdicts"].as_array().unwrap().iter().all(|v| v["pk"].is_null()), "each key named as sent: {r}");
    assert_eq!(live_keys(&db, "days").await, json!(["2026-12-07", "2027-01-01", "2027-01-02", "2027-01-03"]));

    // Universe sync sends the key as text to a target that reads it by its own settings: spelled
    // 07/12/2026 under DMY, a target in MDY read it as July 12.
    db.exec("create table public.events (d date primary key, title text);
             select kizuna.register_universe_table('public.events');").await;
    other_settings.batch_execute("reset all; set datestyle = 'SQL, DMY'; insert into public.events values ('2026-12-07', 'x')").await.unwrap();
    assert_eq!(db.one::<String>("select pk from kizuna.universe_events").await, "2026-12-07");
}

/// A bucket expression that renders a date or time as text puts a row in one bucket whichever
/// session writes it: plain SQL in an admin's psql set to Tokyo and `DateStyle = 'SQL, DMY'`, a
/// lone push and a set-based run through a session set so. Run as written, the expression put the
/// admin's row in the next day's bucket (`day:2026-12-08/07/12/2026`), so the devices subscribed
/// to the day it is in never heard of it, and a run's verdicts named the session's rendering.
#[tokio::test]
async fn a_bucket_that_renders_a_date_is_the_same_whoever_writes_the_row() {
    let db = TestDb::new().await;
    db.exec(
        "create table public.shifts (id text primary key, at timestamptz, d date, owner uuid not null default auth.uid());
         alter table public.shifts enable row level security;
         create policy own on public.shifts using (owner = auth.uid()) with check (owner = auth.uid());
         grant select, insert, update, delete on public.shifts to authenticated;
         select kizuna.register_table('public.shifts', bucket => $$'day:' || to_char(at, 'YYYY-MM-DD') || '/' || d::text$$);",
    )
    .await;
    let day = "day:2026-12-07/2026-12-07";
    let tokyo = "reset all; set timezone = 'Asia/Tokyo'; set datestyle = 'SQL, DMY'";
    let admin = db.connect().await;
    admin.batch_execute(tokyo).await.unwrap();
    admin
        .batch_execute(&format!("insert into public.shifts values ('admin', '2026-12-07 20:00+00', '2026-12-07', '{ALICE}')"))
        .await
        .unwrap();

    db.exec(tokyo).await;
    let alice = Caller::user(ALICE);
    let row = json!({"at": "2026-12-07T20:00:00Z", "d": "2026-12-07"});
    let lone = db.push(&alice, push_request(DEVICE, vec![mutation(1, "shifts", "lone", "upsert", row.clone())])).await.unwrap();
    let run: Vec<Value> = (0..6).map(|i| mutation(2 + i, "shifts", &format!("run{i}"), "upsert", row.clone())).collect();
    let run = db.push(&alice, push_request(DEVICE, run)).await.unwrap();
    for r in [&lone, &run] {
        assert!(r["verdicts"].as_array().unwrap().iter().all(|v| v["status"] == "APPLIED" && v["bucket"] == day), "{r}");
    }
    db.exec("reset all").await;
    let buckets: Value = db
        .one("select jsonb_agg(distinct bucket) from kizuna.changes where tbl = 'shifts' and not deleted")
        .await;
    assert_eq!(buckets, json!([day]), "every writer's row in the day it is in, rendered in UTC and ISO");
    assert_eq!(db.one::<i64>("select count(*) from kizuna.changes where tbl = 'shifts'").await, 8);

    // Which expressions pay for it: those whose text may follow a setting, read from the parse tree
    // (built-in functions and types are in no pg_depend entry). A uuid's text follows none: such a
    // table keeps the set-based push path and compiles no fixed settings.
    db.owned_table("plain_rows", "id text primary key, at timestamptz", "").await;
    let facts = "select jsonb_object_agg(s.name, jsonb_build_array(s.bucket_follows_settings, kizuna.run_ops(s)))
                   from kizuna.synced_tables s where s.name in ('shifts', 'plain_rows')";
    assert_eq!(db.one::<Value>(facts).await, json!({"shifts": [true, []], "plain_rows": [false, ["delete", "patch", "upsert"]]}));
    // An expression that only tests a timestamp counts too: any value of such a type does.
    let cases = [("'d:' || current_date", true), ("'x:' || xmlserialize(content xmlelement(name a, id) as text)", true),
                 ("case when at is null then 'none' else 'u:' || owner end", true),
                 ("'user:' || owner::text", false), ("case when id = '' then 'none' else 'u:' || upper(owner::text) end", false)];
    for (expr, follows) in cases {
        db.exec(&format!("select kizuna.register_table('public.plain_rows', bucket => $b${expr}$b$)")).await;
        let found: bool = db.one("select bucket_follows_settings from kizuna.synced_tables where name = 'plain_rows'").await;
        assert_eq!(found, follows, "{expr}");
    }
}

/// The keys of table `table`'s live entries in the change log, in order.
async fn live_keys(db: &TestDb, table: &str) -> Value {
    db.one(&format!("select coalesce(jsonb_agg(pk order by pk), '[]') from kizuna.changes where tbl = '{table}' and not deleted"))
        .await
}

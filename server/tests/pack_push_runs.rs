//! Set-based runs (server/sql/005_push_runs.sql): a slice applied in runs gives the verdicts, rows,
//! change log and ledger that the per-mutation path gives the same slice; the tables where one
//! statement could tell rows apart keep the per-mutation path; a refused row in a run leaves the
//! others applied; an id another client recorded is refused as a whole request.

mod support;

use serde_json::{json, Value};
use support::db::{mutation, pull_run, push_request, sql_as, statuses, Caller, TestDb};

const ALICE: &str = "a11ce000-0000-4000-8000-000000000001";
const BOB: &str = "b0b00000-0000-4000-8000-000000000002";
const ALICE_PHONE: &str = "c0000000-0000-4000-8000-0000000000a1";
const BOB_PHONE: &str = "c0000000-0000-4000-8000-0000000000b1";

/// The ops the pack applies in runs for a table.
async fn run_ops(db: &TestDb, table: &str) -> Vec<String> {
    let ops: Value = db.one(&format!("select to_jsonb(kizuna.run_ops(s)) from kizuna.synced_tables s where name = '{table}'")).await;
    serde_json::from_value(ops).unwrap()
}

/// Everything a push leaves behind, without what only the clock decides.
async fn footprint(db: &TestDb) -> Value {
    db.one(
        "select jsonb_build_object(
           'todos', (select jsonb_agg(to_jsonb(t) - 'updated_at' order by id) from public.todos t),
           'changes', (select jsonb_agg(jsonb_build_array(tbl, pk, bucket, seq, deleted, entered_seq, image - 'updated_at')
                                        order by tbl, pk, bucket) from kizuna.changes),
           'ledger', (select jsonb_agg(jsonb_build_array(id, client_id, client_seq, verdict) order by client_seq) from kizuna.ledger),
           'clients', (select jsonb_agg(jsonb_build_array(client_id, last_mutation_id) order by client_id) from kizuna.clients),
           'totals', (select to_jsonb(s) - 'epoch' - 'db_identity' - 'cursor_key' - 'installed_at' from kizuna.state s),
           'horizon', kizuna.horizon())",
    )
    .await
}

/// The writes of a history: alice's rows (one at position 7), bob's row, and the delete of a row
/// alice pulled (the ids are drawn once, so two databases can replay the same history).
fn seed() -> [Vec<Value>; 3] {
    [
        vec![
            mutation(1, "todos", "old", "upsert", json!({"title": "old", "position": 7})),
            mutation(2, "todos", "gone", "upsert", json!({"title": "gone"})),
        ],
        vec![mutation(1, "todos", "bobs", "upsert", json!({"title": "bob's"}))],
        vec![mutation(3, "todos", "gone", "delete", Value::Null)],
    ]
}

/// The same history in a fresh database. With `per_mutation`, a no-op statement trigger keeps the
/// table off runs.
async fn history(per_mutation: bool, [alices, bobs, delete]: &[Vec<Value>; 3]) -> TestDb {
    let db = TestDb::with_todos().await;
    db.exec("alter table public.todos add constraint position_not_negative check (position >= 0)").await;
    if per_mutation {
        db.exec(
            "create function public.noop() returns trigger language plpgsql as $$ begin return null; end $$;
             create trigger noop after insert or update or delete on public.todos for each statement execute function public.noop();",
        )
        .await;
    }
    let (alice, bob) = (Caller::user(ALICE), Caller::user(BOB));
    db.push(&alice, push_request(ALICE_PHONE, alices.clone())).await.unwrap();
    db.push(&bob, push_request(BOB_PHONE, bobs.clone())).await.unwrap();
    let bucket = format!("user:{ALICE}");
    pull_run(db.client(), &alice, ALICE_PHONE, None, &[&bucket], 100).await.unwrap();
    db.push(&alice, push_request(ALICE_PHONE, delete.clone())).await.unwrap();
    db
}

#[tokio::test]
async fn a_slice_in_runs_answers_and_writes_what_the_per_mutation_path_does() {
    let seeded = seed();
    let runs = history(false, &seeded).await;
    let single = history(true, &seeded).await;
    assert_eq!(run_ops(&runs, "todos").await, ["delete", "patch", "upsert"]);
    assert!(run_ops(&single, "todos").await.is_empty());
    assert_eq!(footprint(&runs).await, footprint(&single).await, "the same history");

    let atomic = uuid::Uuid::new_v4().to_string();
    let in_batch = |mut m: Value| {
        m["batch"] = json!(atomic);
        m
    };
    let mut later = mutation(14, "todos", "later", "upsert", json!({"title": "later"}));
    later["apply_after"] = json!("2999-01-01T00:00:00Z");
    let mut made_on_live_copy = mutation(24, "todos", "gone", "upsert", json!({"title": "back"}));
    made_on_live_copy["read_seq"] = json!(1);
    let mut slice = vec![
        seeded[0][0].clone(),
        mutation(4, "todos", "n1", "upsert", json!({"id": "n1", "title": "one", "done": false, "position": 1})),
        mutation(5, "todos", "n2", "upsert", json!({"id": "n2", "title": "two", "done": false, "position": 2})),
        mutation(6, "todos", "old", "upsert", json!({"id": "old", "title": "old, again", "done": true, "position": 7})),
        mutation(7, "todos", "n3", "upsert", json!({"id": "n3", "title": "x".repeat(300), "done": false, "position": 3})),
        mutation(8, "todos", "n4", "upsert", json!({"id": "n4", "title": "four", "done": false, "position": -4})),
        mutation(9, "todos", "bobs", "upsert", json!({"id": "bobs", "title": "mine", "done": false, "position": 5})),
        mutation(10, "todos", "n5", "upsert", json!({"id": "n5", "title": "five", "done": "maybe", "position": 5})),
        mutation(11, "todos", "n6", "upsert", json!({"id": "n6", "nope": 1})),
        mutation(12, "todos", "n1", "upsert", json!({"id": "n1", "title": "one, twice", "done": true, "position": 1})),
        later,
        in_batch(mutation(13, "todos", "b1", "upsert", json!({"title": "in a batch"}))),
        mutation(15, "todos", "n7", "upsert", json!({"id": "n7", "title": "seven", "done": false, "position": 7})),
        in_batch(mutation(16, "todos", "n2", "patch", json!({"note": "from the batch"}))),
        mutation(17, "todos", "n2", "patch", json!({"done": true})),
        mutation(18, "todos", "n7", "patch", json!({"done": true})),
        mutation(19, "todos", "nobody", "patch", json!({"done": true})),
        mutation(20, "todos", "bobs", "patch", json!({"done": true})),
        mutation(21, "todos", "n3", "delete", Value::Null),
        mutation(22, "todos", "n1", "delete", Value::Null),
        mutation(23, "todos", "n8", "upsert", json!({"id": "someone else", "title": "eight"})),
        made_on_live_copy,
        mutation(25, "todos", "gone", "patch", json!({"done": true})),
        mutation(26, "nothing", "n9", "upsert", json!({"title": "nine"})),
        mutation(27, "todos", "n7", "upsert", json!({"id": "n7", "title": "seven, twice", "done": true, "position": 7})),
    ];
    // client_seq rises through the slice after the replay of an earlier write.
    for (i, m) in slice.iter_mut().enumerate().skip(1) {
        m["client_seq"] = json!(3 + i as i64);
    }
    let alice = Caller::user(ALICE);
    let in_runs = runs.push(&alice, push_request(ALICE_PHONE, slice.clone())).await.unwrap();
    let one_by_one = single.push(&alice, push_request(ALICE_PHONE, slice)).await.unwrap();
    assert_eq!(in_runs, one_by_one, "the same answer, seq and server rows included");
    assert_eq!(
        statuses(&in_runs),
        [
            "APPLIED", "APPLIED", "APPLIED", "APPLIED", "REJECTED:VALIDATION_FAILED", "REJECTED:CONSTRAINT_VIOLATION",
            "REJECTED:RLS_DENIED", "REJECTED:SCHEMA_MISMATCH", "REJECTED:SCHEMA_MISMATCH", "APPLIED",
            "DELAYED", "APPLIED", "APPLIED", "APPLIED", "APPLIED", "APPLIED", "REJECTED:RLS_DENIED", "REJECTED:RLS_DENIED",
            "REJECTED:RLS_DENIED", "APPLIED", "REJECTED:SCHEMA_MISMATCH", "REJECTED:DELETE_WINS", "REJECTED:DELETE_WINS",
            "REJECTED:SCHEMA_MISMATCH", "APPLIED",
        ]
    );
    assert_eq!(in_runs["verdicts"][0]["replayed"], true);
    assert_eq!(in_runs["verdicts"][1]["bucket"], format!("user:{ALICE}"));
    assert_eq!(footprint(&runs).await, footprint(&single).await, "the same rows, change log, ledger and totals");
}

#[tokio::test]
async fn a_refused_row_in_a_long_run_leaves_the_others_applied() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    let slice: Vec<Value> = (1..=64)
        .map(|i| {
            let title = if i == 40 { "t".repeat(201) } else { format!("row {i}") };
            mutation(i, "todos", &format!("r{i}"), "upsert", json!({"title": title, "position": i}))
        })
        .collect();
    let response = db.push(&alice, push_request(ALICE_PHONE, slice)).await.unwrap();
    let mut expected = vec!["APPLIED".to_string(); 64];
    expected[39] = "REJECTED:VALIDATION_FAILED".into();
    assert_eq!(statuses(&response), expected);
    assert_eq!(db.one::<i64>("select count(*) from public.todos").await, 63);
    let seqs: Vec<&Value> = response["verdicts"].as_array().unwrap().iter().map(|v| &v["seq"]).filter(|s| !s.is_null()).collect();
    assert!(seqs.windows(2).all(|w| w[0] == w[1]), "one commit number for the push");
    assert_eq!(response["last_mutation_id"], 64);
}

#[tokio::test]
async fn a_gate_that_refuses_by_raising_in_a_run_refuses_that_row_in_its_own_words() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    // Immutable, so the slice goes in runs; KZV01 is the registry's documented way to say no.
    db.exec(
        "create function public.todos_words_gate(op text, row_ jsonb) returns boolean language plpgsql immutable as $$
         begin
           if row_ ->> 'title' like 'bad%' then raise exception 'a title may not start with bad' using errcode = 'KZV01'; end if;
           return true;
         end $$;
         update kizuna.synced_tables set gate = 'public.todos_words_gate(text, jsonb)' where name = 'todos';",
    )
    .await;
    assert!(run_ops(&db, "todos").await.contains(&"upsert".to_string()), "the table still takes runs");
    let slice: Vec<Value> = (1..=16)
        .map(|i| {
            let title = if i == 11 { "bad row".to_string() } else { format!("row {i}") };
            mutation(i, "todos", &format!("r{i}"), "upsert", json!({"title": title}))
        })
        .collect();
    let response = db.push(&alice, push_request(ALICE_PHONE, slice)).await.unwrap();
    let mut expected = vec!["APPLIED".to_string(); 16];
    expected[10] = "REJECTED:VALIDATION_FAILED".into();
    assert_eq!(statuses(&response), expected, "one refusal, not a failed request");
    assert_eq!(response["verdicts"][10]["message"], "a title may not start with bad");
    assert_eq!(db.one::<i64>("select count(*) from public.todos").await, 15);
}

#[tokio::test]
async fn rules_that_read_other_rows_see_the_slice_one_write_at_a_time() {
    let db = TestDb::new().await;
    // At most three rows per owner, checked by a policy that counts them.
    db.exec(
        "create table public.capped (id text primary key, owner uuid not null default auth.uid(), title text);
         alter table public.capped enable row level security;
         create policy read on public.capped for select using (owner = auth.uid());
         create policy write on public.capped for insert
           with check (owner = auth.uid() and (select count(*) from public.capped c where c.owner = auth.uid()) < 3);
         grant select, insert, update, delete on public.capped to authenticated;
         select kizuna.register_table('public.capped', bucket => $$'user:' || owner$$);",
    )
    .await;
    // Each new row is numbered after the owner's rows written before it (a BEFORE ROW trigger).
    db.owned_table("numbered", "id text primary key, title text, n integer", "").await;
    db.exec(
        "create function public.number_row() returns trigger language plpgsql as $$
         begin
           new.n := (select count(*) + 1 from public.numbered where owner = new.owner);
           return new;
         end $$;
         create trigger number_row before insert on public.numbered for each row execute function public.number_row();",
    )
    .await;
    assert!(run_ops(&db, "capped").await.is_empty(), "a policy reading the table keeps the per-mutation path");
    assert_eq!(run_ops(&db, "numbered").await, ["delete", "patch", "upsert"], "BEFORE ROW triggers run in the slice's order");

    let alice = Caller::user(ALICE);
    let capped: Vec<Value> = (1..=5).map(|i| mutation(i, "capped", &format!("c{i}"), "upsert", json!({"title": "x"}))).collect();
    let response = db.push(&alice, push_request(ALICE_PHONE, capped)).await.unwrap();
    assert_eq!(statuses(&response), ["APPLIED", "APPLIED", "APPLIED", "REJECTED:RLS_DENIED", "REJECTED:RLS_DENIED"]);

    let numbered: Vec<Value> = ["z", "a", "m", "b"]
        .iter()
        .enumerate()
        .map(|(i, k)| mutation(6 + i as i64, "numbered", k, "upsert", json!({"title": k})))
        .collect();
    let response = db.push(&alice, push_request(ALICE_PHONE, numbered)).await.unwrap();
    assert_eq!(statuses(&response), ["APPLIED"; 4]);
    let order: Value = db.one("select jsonb_agg(id order by n) from public.numbered").await;
    assert_eq!(order, json!(["z", "a", "m", "b"]), "numbered in the order written");
}

/// At most three rows per owner: a rule that reads other rows, which one statement would check
/// once for the whole run.
const CAP_THREE_ROWS_PER_OWNER: &str = "create policy cap on public.capped as restrictive for insert
   with check ((select count(*) from public.capped c where c.owner = auth.uid()) < 3)";

/// A session keeps what it worked out about a table (kizuna.run_facts) until the catalogs change:
/// a policy added from another session after this one pushed takes effect at its next push.
#[tokio::test]
async fn a_rule_added_after_a_push_keeps_the_next_slice_off_runs() {
    let db = TestDb::new().await;
    db.owned_table("capped", "id text primary key, title text", "").await;
    let alice = Caller::user(ALICE);
    let first = db.push(&alice, push_request(ALICE_PHONE, vec![mutation(1, "capped", "c1", "upsert", json!({"title": "x"}))])).await.unwrap();
    assert_eq!(statuses(&first), ["APPLIED"]);
    assert_eq!(run_ops(&db, "capped").await, ["delete", "patch", "upsert"]);

    // The rule, from another session.
    db.connect()
        .await
        .batch_execute(CAP_THREE_ROWS_PER_OWNER)
        .await
        .unwrap();
    assert!(run_ops(&db, "capped").await.is_empty());
    let slice: Vec<Value> = (2..=5).map(|i| mutation(i, "capped", &format!("c{i}"), "upsert", json!({"title": "x"}))).collect();
    let response = db.push(&alice, push_request(ALICE_PHONE, slice)).await.unwrap();
    assert_eq!(statuses(&response), ["APPLIED", "APPLIED", "REJECTED:RLS_DENIED", "REJECTED:RLS_DENIED"]);
    assert_eq!(db.one::<i64>("select count(*) from public.capped").await, 3);
}

/// What a push works out while a DDL transaction is open is not kept: the rule that transaction
/// adds takes effect at the session's next push, though the push that ran beside it drew the epoch
/// the transaction had already advanced.
#[tokio::test]
async fn a_push_beside_an_open_ddl_transaction_keeps_nothing_of_it() {
    let db = TestDb::new().await;
    db.owned_table("capped", "id text primary key, title text", "").await;
    let alice = Caller::user(ALICE);
    let pusher = std::sync::Arc::new(db.connect().await);
    let first = support::db::call_as(&pusher, &alice, "kizuna_push",
        push_request(ALICE_PHONE, vec![mutation(1, "capped", "c1", "upsert", json!({"title": "x"}))])).await.unwrap();
    assert_eq!(statuses(&first), ["APPLIED"]);

    let ddl = db.connect().await;
    ddl.batch_execute("begin").await.unwrap();
    ddl.batch_execute(CAP_THREE_ROWS_PER_OWNER).await.unwrap();
    // Works out the table's facts from the catalogs as they were, then waits for the policy's lock.
    let beside = tokio::spawn({
        let (pusher, alice) = (pusher.clone(), alice.clone());
        let request = push_request(ALICE_PHONE, vec![mutation(2, "capped", "c2", "upsert", json!({"title": "x"}))]);
        async move { support::db::call_as(&pusher, &alice, "kizuna_push", request).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    ddl.batch_execute("commit").await.unwrap();
    assert_eq!(statuses(&beside.await.unwrap().unwrap()), ["APPLIED"]);

    let slice: Vec<Value> = (3..=6).map(|i| mutation(i, "capped", &format!("c{i}"), "upsert", json!({"title": "x"}))).collect();
    let response = support::db::call_as(&pusher, &alice, "kizuna_push", push_request(ALICE_PHONE, slice)).await.unwrap();
    assert_eq!(statuses(&response), ["APPLIED", "REJECTED:RLS_DENIED", "REJECTED:RLS_DENIED", "REJECTED:RLS_DENIED"]);
    assert_eq!(db.one::<i64>("select count(*) from public.capped").await, 3);
}

#[tokio::test]
async fn tables_one_statement_could_tell_apart_keep_the_per_mutation_path() {
    let db = TestDb::new().await;
    let cases = [
        ("hlc_mode", "", ", conflict_mode => 'hlc'", vec![]),
        ("journaled", "", ", journal => true", vec![]),
        ("after_insert", "create trigger t after insert on public.after_insert for each row execute function public.noop();", "",
         vec!["delete", "patch"]),
        ("per_statement", "create trigger t before update on public.per_statement for each statement execute function public.noop();", "",
         vec!["delete"]),
        ("before_delete", "create trigger t before delete on public.before_delete for each row execute function public.noop();", "",
         vec!["patch", "upsert"]),
        ("deferred", "alter table public.deferred add constraint u unique (title) deferrable initially immediate;", "", vec![]),
        ("self_ref", "alter table public.self_ref add column parent text references public.self_ref (id);", "", vec![]),
        ("volatile_gate", "", ", gate => 'public.volatile_gate(text, jsonb)'", vec![]),
        ("counting_policy", "create policy c on public.counting_policy for update using ((select count(*) from public.counting_policy) < 10);",
         "", vec![]),
        ("volatile_default", "alter table public.volatile_default alter column title set default public.volatile_text();", "", vec![]),
    ];
    db.exec(
        "create function public.noop() returns trigger language plpgsql as $$ begin return null; end $$;
         create function public.volatile_gate(op text, row_ jsonb) returns boolean language sql volatile as 'select true';
         create function public.volatile_text() returns text language sql volatile as 'select ''x''';",
    )
    .await;
    for (name, extra, options, ops) in cases {
        db.exec(&format!(
            "create table public.{name} (id text primary key, title text, owner uuid not null default auth.uid());
             alter table public.{name} enable row level security;
             create policy own on public.{name} using (owner = (select auth.uid()));
             {extra}"
        ))
        .await;
        db.exec(&format!("select kizuna.register_table('public.{name}', bucket => $$'user:' || owner$$ {options})")).await;
        assert_eq!(run_ops(&db, name).await, ops, "{name}");
    }
    // Patches, whose order in one statement is the planner's, also stay off runs where order shows.
    db.owned_table("unique_title", "id text primary key, title text unique", "").await;
    assert_eq!(run_ops(&db, "unique_title").await, ["delete", "upsert"]);
    // A bucket that reads a table.
    db.exec(
        "create table public.lists (id text primary key, team text);
         create table public.items (id text primary key, list text);
         select kizuna.register_table('public.items', bucket => $$(select 'team:' || team from public.lists l where l.id = list)$$);",
    )
    .await;
    assert!(run_ops(&db, "items").await.is_empty());
    // A plain table like todos takes runs for every op.
    db.owned_table("plain", "id text primary key, title text", "").await;
    assert_eq!(run_ops(&db, "plain").await, ["delete", "patch", "upsert"]);
}

#[tokio::test]
async fn an_id_another_client_recorded_refuses_the_request_and_writes_nothing() {
    let db = TestDb::with_todos().await;
    let (alice, bob) = (Caller::user(ALICE), Caller::user(BOB));
    let taken = mutation(1, "todos", "b1", "upsert", json!({"title": "bob's"}));
    db.push(&bob, push_request(BOB_PHONE, vec![taken.clone()])).await.unwrap();
    let horizon: i64 = db.one("select kizuna.horizon()").await;
    let mut reused = taken.clone();
    reused["pk"] = json!("a1");
    reused["client_seq"] = json!(2);
    let request = push_request(ALICE_PHONE, vec![mutation(1, "todos", "a0", "upsert", json!({"title": "x"})), reused.clone()]);
    let err = db.push(&alice, request).await.unwrap_err();
    assert_eq!(err.code, "KZP01");
    assert!(err.message.contains(taken["id"].as_str().unwrap()), "{err:?}");
    assert_eq!(db.one::<i64>("select count(*) from public.todos").await, 1);
    assert_eq!(db.one::<i64>("select kizuna.horizon()").await, horizon);

    // Recorded by another client while this push ran: the push waits for it, then is refused whole.
    let (c1, c2) = (db.connect().await, db.connect().await);
    let mut racing = mutation(2, "todos", "b2", "upsert", json!({"title": "bob's"}));
    c1.batch_execute(&format!(
        "begin; set local role authenticated; select set_config('request.jwt.claims', '{}', true);",
        bob.claims
    ))
    .await
    .unwrap();
    c1.query_one("select public.kizuna_push($1::text::jsonb)", &[&push_request(BOB_PHONE, vec![racing.clone()]).to_string()])
        .await
        .unwrap();
    racing["pk"] = json!("a2");
    racing["client_seq"] = json!(3);
    let alice_push = tokio::spawn({
        let request = push_request(ALICE_PHONE, vec![mutation(2, "todos", "a3", "upsert", json!({"title": "x"})), racing]);
        let alice = alice.clone();
        async move { support::db::call_as(&c2, &alice, "kizuna_push", request).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!alice_push.is_finished(), "alice's push waits for bob's to end");
    c1.batch_execute("commit").await.unwrap();
    assert_eq!(alice_push.await.unwrap().unwrap_err().code, "KZP01");
    assert_eq!(db.one::<i64>("select count(*) from public.todos where owner = 'a11ce000-0000-4000-8000-000000000001'").await, 0);
}

#[tokio::test]
async fn the_new_helpers_act_only_for_the_callers_own_clients() {
    let db = TestDb::with_todos().await;
    let (alice, bob) = (Caller::user(ALICE), Caller::user(BOB));
    db.push(&alice, push_request(ALICE_PHONE, vec![mutation(1, "todos", "t1", "upsert", json!({"title": "private"}))])).await.unwrap();
    db.push(&bob, push_request(BOB_PHONE, vec![])).await.unwrap();
    for expr in [
        format!("kizuna.recorded_verdicts('{ALICE_PHONE}', '[]')"),
        format!("kizuna.deleted_keys('todos', array['t1'], '{ALICE_PHONE}')"),
    ] {
        let refused = sql_as(db.client(), &bob, &expr).await.expect_err(&expr);
        assert_eq!(refused.code, "KZP01", "{expr}: {refused:?}");
    }
}

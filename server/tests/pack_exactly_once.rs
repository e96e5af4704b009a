//! Exactly-once effect: the verdict ledger answers replays, also when the same batch arrives on two
//! connections at once, and after the ledger is pruned and the server restarts a replay is SKIPPED.

mod support;

use serde_json::{json, Value};
use support::db::{call_as, mutation, push_request, statuses, Caller, TestDb};

const ALICE: &str = "a11ce000-0000-4000-8000-000000000001";
const DEVICE: &str = "c0000000-0000-4000-8000-0000000000a1";

/// A table that counts every write the pack lets through to `todos`.
async fn count_effects(db: &TestDb) {
    db.exec(
        "create table public.effects (n bigserial primary key, id text);
         create function public.count_effect() returns trigger language plpgsql security definer as
           $$ begin insert into public.effects (id) values (coalesce(new.id, old.id)); return null; end $$;
         create trigger count_effect after insert or update or delete on public.todos
           for each row execute function public.count_effect();",
    )
    .await;
}

fn batch() -> Vec<Value> {
    let atomic = uuid::Uuid::new_v4().to_string();
    vec![
        mutation(1, "todos", "t1", "upsert", json!({"title": "one"})),
        { let mut m = mutation(2, "todos", "t2", "upsert", json!({"title": "two"})); m["batch"] = json!(atomic); m },
        { let mut m = mutation(3, "todos", "t1", "patch", json!({"done": true})); m["batch"] = json!(atomic); m },
    ]
}

#[tokio::test]
async fn a_batch_pushed_three_times_has_one_effect() {
    let db = TestDb::with_todos().await;
    count_effects(&db).await;
    let alice = Caller::user(ALICE);
    let request = push_request(DEVICE, batch());

    let first = db.push(&alice, request.clone()).await.unwrap();
    assert_eq!(statuses(&first), ["APPLIED"; 3]);
    let horizon: i64 = db.one("select kizuna.horizon()").await;
    for _ in 0..2 {
        let again = db.push(&alice, request.clone()).await.unwrap();
        for (a, b) in first["verdicts"].as_array().unwrap().iter().zip(again["verdicts"].as_array().unwrap()) {
            let mut expected = a.clone();
            expected["replayed"] = json!(true);
            assert_eq!(b, &expected, "a replay answers the recorded verdict, seq included");
        }
        assert_eq!(again["last_mutation_id"], 3);
    }
    assert_eq!(db.one::<i64>("select count(*) from public.effects").await, 3);
    assert_eq!(db.one::<i64>("select kizuna.horizon()").await, horizon, "no new commit numbered");
}

#[tokio::test]
async fn the_same_batch_on_two_connections_at_once_has_one_effect() {
    let db = TestDb::with_todos().await;
    count_effects(&db).await;
    let alice = Caller::user(ALICE);
    let request = push_request(DEVICE, batch());
    let (c1, c2) = (db.connect().await, db.connect().await);
    let (r1, r2) = tokio::join!(
        call_as(&c1, &alice, "kizuna_push", request.clone()),
        call_as(&c2, &alice, "kizuna_push", request.clone())
    );
    let (r1, r2) = (r1.unwrap(), r2.unwrap());
    let replayed = |r: &Value| r["verdicts"].as_array().unwrap().iter().filter(|v| v["replayed"] == true).count();
    assert_eq!(replayed(&r1) + replayed(&r2), 3, "one connection applied, the other replayed: {r1} {r2}");
    assert_eq!(statuses(&r1), ["APPLIED"; 3]);
    assert_eq!(statuses(&r2), ["APPLIED"; 3]);
    assert_eq!(db.one::<i64>("select count(*) from public.effects").await, 3);
}

#[tokio::test]
async fn after_pruning_and_a_restart_a_replay_is_skipped() {
    let db = TestDb::with_todos().await;
    count_effects(&db).await;
    let alice = Caller::user(ALICE);
    let request = push_request(DEVICE, batch());
    db.push(&alice, request.clone()).await.unwrap();

    db.exec("update kizuna.settings set ledger_retention = '0'").await;
    let reaped: Value = db.one("select kizuna.reap()").await;
    assert_eq!(reaped["ledger_pruned"], 3);
    assert_eq!(db.status().await["ledger_size"], 0);

    // "Restart": new connections, the pack installed again as the gateway does at start.
    db.reinstall().await;
    let fresh = db.connect().await;
    let replay = call_as(&fresh, &alice, "kizuna_push", request).await.unwrap();
    assert_eq!(statuses(&replay), ["SKIPPED"; 3]);
    assert_eq!(replay["last_mutation_id"], 3);
    assert_eq!(db.one::<i64>("select count(*) from public.effects").await, 3, "never a second effect");

    // Later writes still apply.
    let next = call_as(&fresh, &alice, "kizuna_push",
                       push_request(DEVICE, vec![mutation(4, "todos", "t3", "upsert", json!({"title": "three"}))])).await.unwrap();
    assert_eq!(statuses(&next), ["APPLIED"]);
    assert_eq!(next["last_mutation_id"], 4);
}

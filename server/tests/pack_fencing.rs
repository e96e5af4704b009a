//! Fencing under concurrency: writers (plain SQL and pushes) commit while pullers page through
//! runs. Every key is written once, so a commit numbered at or below a horizon already served would
//! never be delivered to a puller that continues from that horizon: pulling to quiescence must
//! find every key.

mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde_json::json;
use support::db::{call_as, mutation, pull_run, push_request, statuses, Caller, TestDb};

const USER: &str = "a11ce000-0000-4000-8000-000000000001";
const WRITERS: usize = 3;
const COMMITS: usize = 25;
const BUCKETS: [&str; 2] = ["even", "odd"];

#[tokio::test]
async fn pullers_racing_writers_miss_nothing_and_never_see_a_commit_below_a_served_horizon() {
    let db = TestDb::new().await;
    db.exec(
        "create table public.items (id text primary key, bucket text not null, writer int);
         grant select, insert, update, delete on public.items to authenticated;
         select kizuna.register_table('public.items', bucket => 'bucket');",
    )
    .await;
    let user = Caller::user(USER);
    let writing = Arc::new(AtomicBool::new(true));

    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let client = db.connect().await;
        writers.push(tokio::spawn(async move {
            for i in 0..COMMITS {
                // An open transaction that sleeps a little before commit: later transactions
                // overtake it, so numbering at statement time would fail this test.
                client
                    .batch_execute(&format!(
                        "begin; insert into public.items values ('sql-{w}-{i}', '{}', {w});
                         select pg_sleep(random() * 0.004); commit;",
                        BUCKETS[i % 2]
                    ))
                    .await
                    .unwrap();
            }
        }));
    }
    let pusher = {
        let client = db.connect().await;
        let user = user.clone();
        tokio::spawn(async move {
            for i in 0..COMMITS {
                let m = mutation(i as i64 + 1, "items", &format!("push-{i}"), "upsert",
                                 json!({"bucket": BUCKETS[i % 2], "writer": 99}));
                let r = call_as(&client, &user, "kizuna_push", push_request("c0000000-0000-4000-8000-0000000000a1", vec![m]))
                    .await
                    .unwrap();
                assert_eq!(statuses(&r), ["APPLIED"]);
            }
        })
    };

    let mut pullers = Vec::new();
    for p in 0..2 {
        let client = db.connect().await;
        let user = user.clone();
        let writing = writing.clone();
        pullers.push(tokio::spawn(async move {
            let device = format!("c0000000-0000-4000-8000-00000000010{p}");
            let mut seen = BTreeSet::new();
            let mut checkpoint: Option<String> = None;
            let mut served_horizon = 0;
            loop {
                let still_writing = writing.load(Ordering::SeqCst);
                let run = pull_run(&client, &user, &device, checkpoint.as_deref(), &BUCKETS, 7).await.unwrap();
                for e in &run.entries {
                    let seq = e["seq"].as_i64().unwrap();
                    assert!(seq > served_horizon, "entry {e} at or below a horizon already served ({served_horizon})");
                    assert!(seq <= run.horizon);
                    seen.insert(e["pk"].as_str().unwrap().to_string());
                }
                assert!(run.horizon >= served_horizon);
                served_horizon = run.horizon;
                checkpoint = Some(run.checkpoint);
                if !still_writing {
                    return seen;
                }
            }
        }));
    }

    for w in writers {
        w.await.unwrap();
    }
    pusher.await.unwrap();
    writing.store(false, Ordering::SeqCst);

    let expected: BTreeSet<String> = db
        .client()
        .query("select id from public.items", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(expected.len(), (WRITERS + 1) * COMMITS);
    for p in pullers {
        let seen = p.await.unwrap();
        assert_eq!(seen, expected, "a puller that pulled to quiescence has every change");
    }
}

/// A transaction that deletes or moves many synced rows commits in time linear in its rows, and
/// the log has each. The fence matched each key's events with its first event pairwise (the
/// planner counts kizuna.pending as nearly empty: every commit empties it), so deleting 50,000 rows
/// in one statement took 4.5 minutes to commit, holding the fence lock, so every other synced
/// commit, all along. Bounded by a statement timeout far above what the linear fence takes here
/// (a few seconds), far below what the pairwise one took.
#[tokio::test]
async fn a_transaction_deleting_and_moving_fifty_thousand_synced_rows_commits_within_a_minute() {
    let db = TestDb::with_todos().await;
    const OTHER: &str = "b0b00000-0000-4000-8000-000000000002";
    db.exec(&format!("insert into public.todos (id, owner, title) select 't' || g, '{USER}', 'row ' || g from generate_series(1, 50000) g")).await;
    // The fence is a deferred trigger, which COMMIT fires after the statement's timeout is off:
    // SET CONSTRAINTS fires it inside a statement. Each statement its own query: a timeout set in
    // one query of many is not armed for the later statements of that query.
    db.exec("set statement_timeout = '60s'").await;
    db.exec("begin").await;
    db.exec("delete from public.todos where id < 't3'").await;
    db.exec(&format!("update public.todos set owner = '{OTHER}' where id >= 't3'")).await;
    db.exec("set constraints all immediate").await;
    db.exec("commit").await;
    db.exec("reset statement_timeout").await;
    let moved: i64 = db.one("select count(*) from public.todos").await;
    assert!(moved > 10_000 && moved < 40_000, "{moved} rows moved");
    let log = db
        .one::<serde_json::Value>(&format!(
            "select jsonb_build_object(
               'gone', count(*) filter (where deleted and bucket = 'user:{USER}' and image is not null),
               'moved_in', count(*) filter (where not deleted and bucket = 'user:{OTHER}'),
               'moved_image', count(*) filter (where deleted and image ->> 'owner' = '{USER}' and image ->> 'title' = 'row ' || substr(pk, 2)))
             from kizuna.changes where tbl = 'todos'"
        ))
        .await;
    assert_eq!(log, json!({"gone": 50000, "moved_in": moved, "moved_image": 50000}));
}

/// The capture trigger queues the fence once per transaction (its marker row), and the marker's
/// state must follow the transaction's: a savepoint rolled back takes the marker with it, and an
/// early fence (SET CONSTRAINTS ALL IMMEDIATE, or an app's deferred trigger writing at commit
/// after the fence ran) folds and removes it. A write after either must queue the fence again,
/// or it reaches no device.
#[tokio::test]
async fn writes_after_a_rolled_back_savepoint_or_an_early_fence_still_reach_the_change_log() {
    let db = TestDb::with_todos().await;
    let row = |id: &str| format!("insert into public.todos (id, owner, title) values ('{id}', '{USER}', '{id}')");
    // A rolled-back savepoint held the transaction's first synced write.
    for statement in ["begin", "savepoint s", &row("gone"), "rollback to savepoint s", &row("kept"), &row("kept-2"), "commit"] {
        db.exec(statement).await;
    }
    // The fence fired by SET CONSTRAINTS, then more writes in the same transaction; and again.
    for statement in ["begin", &row("early"), "set constraints all immediate", &row("after-immediate"),
                      &row("after-immediate-2"), "set constraints all deferred", &row("after-deferred"), "commit"] {
        db.exec(statement).await;
    }
    // An app's deferred trigger that writes a synced row at commit, after the fence folded the rest.
    db.exec(&format!(
        "create table public.audit (n int);
         create function public.audit_writes() returns trigger language plpgsql as $$
         begin insert into public.todos (id, owner, title) values ('by-trigger-' || new.n, '{USER}', 'late'); return null; end $$;
         create constraint trigger audit_late after insert on public.audit deferrable initially deferred
           for each row execute function public.audit_writes();"
    )).await;
    for statement in ["begin", &row("before-trigger"), "insert into public.audit values (1)", "commit"] {
        db.exec(statement).await;
    }
    let logged: Vec<String> = db
        .client()
        .query("select pk from kizuna.changes where tbl = 'todos' and not deleted and seq > 0 order by pk", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(logged, ["after-deferred", "after-immediate", "after-immediate-2", "before-trigger", "by-trigger-1", "early", "kept", "kept-2"]);
    assert_eq!(db.one::<i64>("select count(*) from kizuna.pending").await, 0, "every captured change was folded");
    assert_eq!(db.one::<i64>("select count(*) from kizuna.tx_marker").await, 0);
}

//! Every committed checkpoint equals the server's state at its horizon, even when rows change while
//! the run's pages are being fetched (issue 8.3): the change log keeps one entry per key, so a
//! commit mid-run moves a not-yet-paged entry up, and a run with a fixed horizon lost it.

mod support;

use std::collections::BTreeMap;

use serde_json::{json, Value};
use support::db::{pull_run, Caller, TestDb};

const ALICE: &str = "aaaaaaaa-0000-4000-8000-00000000000a";
const DEVICE: &str = "dddddddd-0000-4000-8000-00000000000d";

fn bucket() -> String {
    format!("user:{ALICE}")
}

/// One plain-SQL commit writing `title` to todo `id` (inserting it if new); returns its commit
/// number (this test is the only writer, so the horizon right after is the commit's own number).
async fn write(db: &TestDb, id: &str, title: &str) -> i64 {
    db.exec(&format!(
        "insert into public.todos (id, owner, title) values ('{id}', '{ALICE}', '{title}')
         on conflict (id) do update set title = excluded.title"
    ))
    .await;
    db.one::<i64>("select kizuna.horizon()").await
}

/// The rows a run delivered, by key, later entries over earlier ones.
fn state_of(entries: &[Value]) -> BTreeMap<String, String> {
    let mut state = BTreeMap::new();
    for e in entries {
        let pk = e["pk"].as_str().unwrap().to_owned();
        match e["row"]["title"].as_str() {
            Some(title) => state.insert(pk, title.to_owned()),
            None => state.remove(&pk),
        };
    }
    state
}

#[tokio::test]
async fn a_row_changed_mid_run_is_in_the_checkpoint_with_the_rows_written_after_it() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    for id in ["x1", "x2", "x3"] {
        write(&db, id, id).await;
    }
    write(&db, "project", "P v1").await; // the project, read before the task was written
    write(&db, "task", "K").await;

    // Page one holds x1 and x2; then the project changes, moving its entry above the run's start.
    let first = db
        .pull(&alice, json!({"protocol": 1, "client_id": DEVICE, "cursor": null, "buckets": [bucket()], "limit": 2}))
        .await
        .unwrap();
    assert_eq!(first["done"], false);
    let moved = write(&db, "project", "P v2").await;
    let rest = pull_run(db.client(), &alice, DEVICE, first["cursor"].as_str(), &[&bucket()], 2).await.unwrap();
    let mut entries = first["entries"].as_array().unwrap().clone();
    entries.extend(rest.entries);
    let state = state_of(&entries);
    assert_eq!(rest.horizon, moved, "the closing horizon is the newest commit the run read");
    assert_eq!(state.get("project").map(String::as_str), Some("P v2"), "the task without its project: {state:?}");
    assert_eq!(state.len(), 5, "{state:?}");
}

#[tokio::test]
async fn a_run_under_a_steady_stream_of_writes_finishes_at_one_horizons_state() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    // The writer's history: each commit's number and what it wrote.
    let mut history: Vec<(i64, String, String)> = Vec::new();
    for i in 0..40 {
        let (id, title) = (format!("r{i:02}"), format!("v0-{i}"));
        history.push((write(&db, &id, &title).await, id, title));
    }
    let writer_db = db.connect().await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut log = Vec::new();
            let mut n = 1;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 400 {
                let id = format!("r{:02}", (n * 7) % 40);
                let title = format!("v{n}");
                writer_db
                    .batch_execute(&format!("update public.todos set title = '{title}' where id = '{id}'"))
                    .await
                    .unwrap();
                let seq: i64 = writer_db.query_one("select kizuna.horizon()", &[]).await.unwrap().get(0);
                log.push((seq, id, title));
                n += 1;
                tokio::time::sleep(std::time::Duration::from_millis(3)).await;
            }
            log
        })
    };
    let run = pull_run(db.client(), &alice, DEVICE, None, &[&bucket()], 3).await.unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    history.extend(writer.await.unwrap());
    assert!(run.pages > 5, "a multi-page run ({} pages)", run.pages);

    // The server's state at the run's horizon, from the writer's history.
    let mut at_horizon = BTreeMap::new();
    for (seq, id, title) in &history {
        if *seq <= run.horizon {
            at_horizon.insert(id.clone(), title.clone());
        }
    }
    assert_eq!(state_of(&run.entries), at_horizon, "the checkpoint is not the state at horizon {}", run.horizon);
}

#[tokio::test]
async fn a_row_a_run_from_null_delivered_and_a_later_commit_deleted_is_deleted_by_the_same_run() {
    let db = TestDb::with_todos().await;
    let alice = Caller::user(ALICE);
    for id in ["a1", "a2", "a3", "a4"] {
        write(&db, id, id).await;
    }
    db.exec("delete from public.todos where id = 'a4'").await; // deleted before the run: never sent

    // A new device's first page holds a1 and a2; then a1 is deleted. The run's horizon moves past
    // the delete, and the device must not keep a1 (it did: a run from null sent no tombstones).
    let first = db
        .pull(&alice, json!({"protocol": 1, "client_id": DEVICE, "cursor": null, "buckets": [bucket()], "limit": 2}))
        .await
        .unwrap();
    assert_eq!(first["done"], false);
    db.exec("delete from public.todos where id = 'a1'").await;
    let rest = pull_run(db.client(), &alice, DEVICE, first["cursor"].as_str(), &[&bucket()], 2).await.unwrap();
    let mut entries = first["entries"].as_array().unwrap().clone();
    entries.extend(rest.entries.iter().cloned());
    let state = state_of(&entries);
    assert_eq!(state.keys().collect::<Vec<_>>(), ["a2", "a3"], "the server's rows at the closing horizon: {state:?}");
    let tombstones: Vec<&str> = rest.entries.iter().filter(|e| e["deleted"] == true).map(|e| e["pk"].as_str().unwrap()).collect();
    assert_eq!(tombstones, ["a1"], "only the delete made while the run ran");
}

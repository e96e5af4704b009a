//! The consistency model against the real pack where its compacted change log and multi-bucket
//! pages could break it (issue 8): rows moving between buckets, changes of the bucket set, the
//! app's own rows in bucket queries between their verdict and the next pull, and the pace at which
//! `sync()` spends a refused write's budget.

use js_sys::Object;
use serde_json::{json, Value};
use wasm_bindgen_test::wasm_bindgen_test;

use crate::support::*;

fn card_device(user: &str, lists: &[&str]) -> Object {
    let opts = options(&format!("cards-{}", random_id()), user);
    set(&opts, "buckets", json!(lists.iter().map(|l| format!("list:{l}")).collect::<Vec<_>>()));
    opts
}

async fn card(client: &kizunasync::KizunaClient, id: &str) -> Value {
    ok(client.get("cards".into(), id.into())).await
}

#[wasm_bindgen_test]
async fn a_card_moved_between_two_pulled_lists_stays_with_its_pending_edit_and_leaves_the_old_list() {
    // The old list's name sorts after the new one's, so its tombstone comes last in the page.
    let user = random_id();
    let (new_list, old_list) = (format!("a-{}", random_id()), format!("b-{}", random_id()));
    let id = random_id();
    let mover = open(&card_device(&user, &[&new_list, &old_list])).await;
    ok(mover.put("cards".into(), id.clone().into(), to_js(&json!({"id": id, "list": old_list, "title": "card"})), None)).await;
    ok(mover.sync()).await;

    let both = open(&card_device(&user, &[&new_list, &old_list])).await;
    let only_old = open(&card_device(&user, &[&old_list])).await;
    let only_new = open(&card_device(&user, &[&new_list])).await;
    for device in [&both, &only_old, &only_new] {
        ok(device.pull()).await;
    }
    assert_eq!(card(&only_old, &id).await["title"], "card");
    assert!(card(&only_new, &id).await.is_null(), "not in the new list yet");
    // An edit on `both` that has not gone out yet while the card moves elsewhere.
    ok(both.patch("cards".into(), id.clone().into(), to_js(&json!({"notes": "mine"})), None)).await;

    ok(mover.patch("cards".into(), id.clone().into(), to_js(&json!({"list": new_list})), None)).await;
    ok(mover.sync()).await;
    for device in [&both, &only_old, &only_new] {
        ok(device.pull()).await;
    }
    let seen = card(&both, &id).await;
    assert_eq!((seen["list"].as_str(), seen["notes"].as_str()), (Some(new_list.as_str()), Some("mine")), "{seen}");
    let placed = ok(both.query("cards".into(), Some(to_js(&json!({"bucket": format!("list:{new_list}")}))))).await;
    assert_eq!(placed.as_array().map(Vec::len), Some(1), "indexed in its new list: {placed}");
    assert_eq!(card(&only_new, &id).await["list"], new_list.as_str());
    assert!(card(&only_old, &id).await.is_null(), "gone where only the old list is pulled");

    ok(both.sync()).await;
    assert_eq!(server_view_in(&user, &[&new_list], "cards", &id).await["notes"], "mine", "the pending edit landed");
    for device in [mover, both, only_old, only_new] {
        device.close();
    }
}

async fn server_view_in(user: &str, lists: &[&str], table: &str, id: &str) -> Value {
    let observer = open(&card_device(user, lists)).await;
    ok(observer.pull()).await;
    let row = ok(observer.get(table.into(), id.into())).await;
    observer.close();
    row
}

#[wasm_bindgen_test]
async fn a_new_bucket_set_brings_exactly_its_rows_and_keeps_pending_writes() {
    let user = random_id();
    let (first, second) = (random_id(), random_id());
    let name = format!("bucket-set-{}", random_id());
    let writer = open(&card_device(&user, &[&first, &second])).await;
    for (id, list) in [("c1", &first), ("c2", &second)] {
        let id = format!("{id}-{user}");
        ok(writer.put("cards".into(), id.clone().into(), to_js(&json!({"id": id, "list": list, "title": id})), None)).await;
    }
    ok(writer.sync()).await;
    writer.close();
    let (c1, c2) = (format!("c1-{user}"), format!("c2-{user}"));

    let with = |lists: &[&str]| {
        let opts = card_device(&user, lists);
        set(&opts, "name", json!(name));
        opts
    };
    let device = open(&with(&[&first])).await;
    ok(device.pull()).await;
    assert!(!card(&device, &c1).await.is_null() && card(&device, &c2).await.is_null());
    let pending = format!("p-{user}");
    ok(device.put("cards".into(), pending.clone().into(), to_js(&json!({"id": pending, "list": first, "title": "unsent"})), None)).await;
    device.close();

    // Same database, the other list only: the first list's rows go, the second's (older than the
    // checkpoint) arrive, and the unsent write stays.
    let device = open(&with(&[&second])).await;
    let events = record(&device, "rehydrated");
    ok(device.pull()).await;
    assert!(card(&device, &c1).await.is_null(), "a removed bucket's row stays");
    assert_eq!(card(&device, &c2).await["title"], c2.as_str(), "an added bucket was not backfilled");
    assert_eq!(card(&device, &pending).await["title"], "unsent", "the pending write was lost");
    assert_eq!(events.length(), 1, "a new bucket set replaces the snapshot: rehydrated");
    assert_eq!(from_js(device.get_checkpoint())["horizon"].as_i64().map(|h| h > 0), Some(true));
    // Both again: both lists' rows.
    device.close();
    let device = open(&with(&[&first, &second])).await;
    ok(device.pull()).await;
    assert!(!card(&device, &c1).await.is_null() && !card(&device, &c2).await.is_null());
    device.close();
}

#[wasm_bindgen_test]
async fn the_apps_own_new_row_stays_in_its_bucket_query_between_verdict_and_pull() {
    let user = random_id();
    let list = random_id();
    let bucket = format!("list:{list}");
    let opts = card_device(&user, &[&list]);
    set(&opts, "realtimeWakeups", json!(false)); // as on a hosted project: no wake stream
    // Pulls fail from the second on, so the push's verdict is the last word the client hears.
    let pulls = std::cell::Cell::new(0);
    let fetch = faulty_fetch(move |url, _| {
        if url.contains("kizuna_pull") {
            pulls.set(pulls.get() + 1);
            if pulls.get() > 1 {
                return Fault::Refuse;
            }
        }
        Fault::Pass
    });
    js_sys::Reflect::set(&opts, &"fetch".into(), &fetch).unwrap();
    let client = open(&opts).await;
    ok(client.pull()).await;
    let id = random_id();
    ok(client.put("cards".into(), id.clone().into(), to_js(&json!({"id": id, "list": list, "title": "mine"})), None)).await;
    let query = || client.query("cards".into(), Some(to_js(&json!({"bucket": bucket}))));
    assert_eq!(ok(query()).await.as_array().map(Vec::len), Some(1), "pending: read your writes");
    // The push's verdict arrives; the pull after it fails.
    let _ = call(client.sync()).await;
    assert_eq!(from_js(client.pending_writes()), json!([]), "acknowledged");
    let rows = ok(query()).await;
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "the acknowledged row dropped out: {rows}");
    client.close();
}

#[wasm_bindgen_test]
async fn quick_syncs_do_not_spend_a_refused_writes_budget() {
    // A title over 200 characters is refused by the todos gate... as a verdict, not a failure.
    // The budget is for whole-request refusals: a row over max_row_bytes (64 KiB) is one (KZP04).
    let user = random_id();
    let opts = options(&format!("quick-syncs-{}", random_id()), &user);
    set(&opts, "retryBaseMs", json!(2000));
    set(&opts, "retryMaxMs", json!(8000));
    let client = open(&opts).await;
    let dead = record(&client, "deadLetter");
    let id = random_id();
    ok(client.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "note": "x".repeat(70_000)})), None)).await;
    for _ in 0..6 {
        let _ = call(client.sync()).await;
    }
    assert_eq!(dead.length(), 0, "six quick sync() calls dead-lettered the write");
    let pending = from_js(client.pending_writes());
    assert_eq!(pending.as_array().map(Vec::len), Some(1), "{pending}");
    client.close();
}

/// Two tabs of one database write one after the other, the second before it has heard of the
/// first's commit. A small write is taken before its reads are answered; the second tab's finds
/// the stamp moved, is rolled back and taken again over what the first tab wrote: both writes
/// stay pending under their own numbers, and the row holds both (the second tab's step, taken on
/// its own stale outbox, would have reused the first's number and overwritten its entry).
#[wasm_bindgen_test]
async fn a_write_in_a_tab_that_has_not_heard_of_anothers_commit_keeps_both() {
    let user = random_id();
    let name = random_id();
    let first = open(&options(&name, &user)).await;
    let second = open(&options(&name, &user)).await;
    let key = random_id();
    ok(first.put("todos".into(), key.clone().into(), to_js(&json!({"id": key, "title": "first"})), None)).await;
    ok(second.patch("todos".into(), key.clone().into(), to_js(&json!({"done": true})), None)).await;
    ok(first.patch("todos".into(), key.clone().into(), to_js(&json!({"title": "first again"})), None)).await;
    let reopened = open(&options(&name, &user)).await;
    let pending = from_js(reopened.pending_writes());
    let seqs: Vec<&Value> = pending.as_array().unwrap().iter().map(|w| &w["seq"]).collect();
    assert_eq!(seqs, [&json!(1), &json!(2), &json!(3)], "{pending}");
    let row = ok(reopened.get("todos".into(), key.clone().into())).await;
    assert_eq!(row, json!({"id": key, "title": "first again", "done": true}));
    for client in [first, second, reopened] {
        client.close();
    }
}

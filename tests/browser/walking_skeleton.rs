//! A write in one browser database reaches PostgreSQL and another pulls it; a write survives the
//! client being dropped before any push, and is then pushed exactly once.

use serde_json::json;
use wasm_bindgen_test::wasm_bindgen_test;

use crate::support::*;

#[wasm_bindgen_test]
async fn a_write_in_one_database_is_read_in_another_after_both_sync() {
    let user = random_id();
    let a = open(&options(&format!("a-{}", random_id()), &user)).await;
    let b = open(&options(&format!("b-{}", random_id()), &user)).await;
    let id = random_id();

    ok(a.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": "buy milk"})), None)).await;
    assert_eq!(ok(a.get("todos".into(), id.clone().into())).await["title"], "buy milk", "a local write is visible at once");
    ok(a.sync()).await;
    assert_eq!(ok(b.get("todos".into(), id.clone().into())).await, json!(null), "b has not pulled yet");

    ok(b.sync()).await;
    let row = ok(b.get("todos".into(), id.clone().into())).await;
    assert_eq!(row["title"], "buy milk");
    assert_eq!(row["owner"], user.as_str(), "the server filled in the owner");
    let checkpoint = from_js(b.get_checkpoint());
    assert!(checkpoint["horizon"].as_i64().unwrap() > 0, "b committed a checkpoint: {checkpoint}");
    assert!(checkpoint["cursor"].is_string());
    a.close();
    b.close();
}

#[wasm_bindgen_test]
async fn a_write_survives_reopening_before_any_push_and_is_pushed_once() {
    let user = random_id();
    let name = format!("reopen-{}", random_id());
    let id = random_id();
    let first = open(&options(&name, &user)).await;
    ok(first.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": "draft"})), None)).await;
    first.close();
    drop(first);

    let second = open(&options(&name, &user)).await;
    assert_eq!(ok(second.get("todos".into(), id.clone().into())).await["title"], "draft", "the row is still there");
    let pending = from_js(second.pending_writes());
    assert_eq!(pending.as_array().map(Vec::len), Some(1), "its outbox entry is still there: {pending}");

    let report = ok(second.sync()).await;
    assert_eq!(report["pushes"], 1, "{report}");
    assert_eq!(from_js(second.pending_writes()), json!([]));
    assert_eq!(from_js(second.status())["applied"], 1);
    let again = ok(second.sync()).await;
    assert_eq!(again["pushes"], 0, "nothing is pushed twice: {again}");
    assert_eq!(server_view(&user, "todos", &id).await["title"], "draft");
    second.close();
}

#[wasm_bindgen_test]
async fn with_timers_on_a_write_reaches_another_database_without_anyone_calling_sync() {
    let user = random_id();
    let auto = |name: &str| {
        let opts = options(name, &user);
        set(&opts, "autoSync", json!(true));
        // Long enough that only a push timer and a wake-up, not the scheduled pull, can explain it.
        set(&opts, "pullIntervalMs", json!(600_000));
        opts
    };
    let a = open(&auto(&format!("auto-a-{}", random_id()))).await;
    let b = open(&auto(&format!("auto-b-{}", random_id()))).await;
    let changes = record(&b, "change");
    sleep(500).await; // b's first pull and its wake stream settle
    let id = random_id();
    ok(a.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": "on its own"})), None)).await;
    let mut waited = 0;
    while ok(b.get("todos".into(), id.clone().into())).await == json!(null) {
        waited += 100;
        assert!(waited < 15_000, "the write never reached b");
        sleep(100).await;
    }
    assert_eq!(from_js(a.pending_writes()), json!([]), "a's push timer drained the outbox");
    let remote = (0..changes.length()).map(|i| from_js(changes.get(i))).any(|c| c["origin"] == "remote");
    assert!(remote, "b announced the remote change");
    a.close();
    b.close();
}

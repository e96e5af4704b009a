//! A first sync stores its rows by the hundred (`src/chunks.rs`): every read finds each row once,
//! in key order, and a row written later (here, by a pull, by a declaration) is one row, the latest.

use indexed_db_futures::database::Database;
use indexed_db_futures::prelude::*;
use js_sys::Function;
use serde_json::{json, Value};
use wasm_bindgen::closure::Closure;
use wasm_bindgen::JsValue;
use wasm_bindgen_test::wasm_bindgen_test;

use crate::support::*;

const ROWS: usize = 250;

/// `ROWS` rows of `user` on the server, written by another device; their keys, in key order.
async fn rows_on_the_server(user: &str) -> Vec<String> {
    let writer = open(&options(&format!("chunk-writer-{}", random_id()), user)).await;
    // Keys written in an order that is not their order, in five commits of interleaved keys (each
    // commit's come in key order), so that each chunk's keys spread over the whole range.
    let mut keys: Vec<String> = (0..ROWS).map(|i| format!("{user}.{:03}", (i * 7) % ROWS)).collect();
    for commit in 0..5 {
        let writes: Vec<Value> = keys.iter().enumerate().filter(|(i, _)| i % 5 == commit)
            .map(|(i, k)| json!({"op": "upsert", "table": "todos", "pk": k, "row": {"id": k, "title": format!("row {i}"), "position": i, "done": i % 2 == 0}}))
            .collect();
        ok(writer.batch(to_js(&json!(writes)))).await;
        ok(writer.sync()).await;
    }
    writer.close();
    keys.sort();
    keys
}

/// How many records the database holds in its `rows_v2` and `chunks` stores.
async fn stored(name: &str) -> (u32, u32) {
    let db = Database::open(name).await.unwrap();
    let tx = db.transaction(["rows_v2", "chunks"]).build().unwrap();
    let count = |store: &str| tx.object_store(store).unwrap().count().primitive().unwrap();
    let (rows, chunks) = (count("rows_v2").await.unwrap(), count("chunks").await.unwrap());
    drop(tx);
    db.close();
    (rows, chunks)
}

fn ids(rows: &Value) -> Vec<String> {
    rows.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect()
}

/// The first result a watch of `filter` hands its listener.
async fn first_watched(client: &kizunasync::KizunaClient, filter: Value) -> Value {
    let (results, stop) = watched(client, "todos", to_js(&filter));
    wait_for_results(&results, 1).await;
    stop.call0(&JsValue::NULL).unwrap();
    from_js(results.get(0))
}

/// A device of a fresh user whose first sync brought `rows_on_the_server`: the user, the keys in
/// key order, the database's name and the client.
async fn first_synced() -> (String, Vec<String>, String, kizunasync::KizunaClient) {
    let user = random_id();
    let keys = rows_on_the_server(&user).await;
    let name = format!("chunked-{}", random_id());
    let reader = open(&options(&name, &user)).await;
    ok(reader.pull()).await;
    (user, keys, name, reader)
}

#[wasm_bindgen_test]
async fn a_first_sync_stores_rows_by_the_hundred_and_every_read_finds_each_once_in_key_order() {
    let (user, keys, name, reader) = first_synced().await;
    assert_eq!(stored(&name).await, (0, 3), "250 rows in three chunks, none as a record of its own");

    assert_eq!(ids(&ok(reader.list("todos".into())).await), keys);
    let bucket = json!({"bucket": format!("user:{user}")});
    assert_eq!(ids(&ok(reader.query("todos".into(), Some(to_js(&bucket)))).await), keys);
    let open_ones: Vec<String> = keys.iter().filter(|k| {
        let n: usize = k.rsplit('.').next().unwrap().parse().unwrap();
        // Row i holds key (7 i) mod 250, and done is i even.
        (0..ROWS).any(|i| (i * 7) % ROWS == n && i % 2 == 1)
    }).cloned().collect();
    assert_eq!(ids(&ok(reader.query("todos".into(), Some(to_js(&json!({"where": {"done": false}}))))).await), open_ones);
    assert_eq!(ids(&first_watched(&reader, json!({})).await), keys);
    let some = &keys[137];
    assert_eq!(ok(reader.get("todos".into(), some.clone().into())).await["id"], json!(some));
    assert_eq!(ok(reader.get("todos".into(), format!("{user}.none").into())).await, Value::Null);
    reader.close();
}

#[wasm_bindgen_test]
async fn a_chunked_row_written_here_or_changed_by_a_pull_is_one_row_the_latest() {
    let (user, keys, name, reader) = first_synced().await;
    let (put, patched, deleted) = (&keys[0], &keys[101], &keys[249]);

    // Written here: a put replaces, a patch merges over the row its chunk held, a delete removes.
    ok(reader.put("todos".into(), put.clone().into(), to_js(&json!({"id": put, "title": "put here"})), None)).await;
    let before = ok(reader.get("todos".into(), patched.clone().into())).await;
    ok(reader.patch("todos".into(), patched.clone().into(), to_js(&json!({"title": "patched here"})), None)).await;
    ok(reader.delete("todos".into(), deleted.clone().into(), None)).await;
    let patched_row = ok(reader.get("todos".into(), patched.clone().into())).await;
    assert_eq!((patched_row["title"].clone(), patched_row["position"].clone()), (json!("patched here"), before["position"].clone()));
    let listed = ok(reader.list("todos".into())).await;
    assert_eq!(ids(&listed), keys[..249].to_vec(), "each row once, the deleted one gone");
    assert_eq!(listed[0]["title"], json!("put here"));
    assert_eq!(stored(&name).await.0, 3, "the three written keys are records of their own");

    // Changed on the server by another device, then pulled: one row each, the server's.
    let other = open(&options(&format!("chunk-other-{}", random_id()), &user)).await;
    ok(other.pull()).await;
    let (changed, gone) = (&keys[50], &keys[150]);
    ok(other.patch("todos".into(), changed.clone().into(), to_js(&json!({"title": "changed there"})), None)).await;
    ok(other.delete("todos".into(), gone.clone().into(), None)).await;
    ok(other.sync()).await;
    other.close();
    ok(reader.sync()).await;
    let listed = ok(reader.list("todos".into())).await;
    let expected: Vec<String> = keys[..249].iter().filter(|k| *k != gone).cloned().collect();
    assert_eq!(ids(&listed), expected);
    let row = |k: &String| listed.as_array().unwrap().iter().find(|r| r["id"] == json!(k)).unwrap().clone();
    assert_eq!(row(changed)["title"], json!("changed there"));
    assert_eq!(row(patched)["title"], json!("patched here"));
    assert_eq!(ok(reader.get("todos".into(), gone.clone().into())).await, Value::Null);

    // Opened again with the chunked table declared: its rows leave their chunks, with tokens.
    reader.close();
    let opts = options(&name, &user);
    set(&opts, "indexes", json!({"todos": ["title"]}));
    let declared = open(&opts).await;
    assert_eq!(stored(&name).await, (248, 0));
    assert_eq!(ids(&ok(declared.query("todos".into(), Some(to_js(&json!({"where": {"title": "changed there"}}))))).await), [changed.clone()]);
    assert_eq!(ids(&ok(declared.list("todos".into())).await), expected);
    declared.close();
}

/// A first sync reads each page at its own snapshot: a row written while it runs comes again on a
/// later page, above the first page's horizon. That later copy is the row (stored as its own
/// record), not the copy the first snapshot put in a chunk. Before, both were kept, and reads
/// showed the older (the history checker's seed 116 with a browser client).
#[wasm_bindgen_test]
async fn a_row_written_while_a_first_sync_runs_shows_its_later_value_once() {
    let user = random_id();
    let keys = rows_on_the_server(&user).await;
    let writer = std::rc::Rc::new(open(&options(&format!("chunk-mid-w-{}", random_id()), &user)).await);
    ok(writer.pull()).await;
    // Written by the first of the five commits, so on the run's first page.
    let changed = keys[0].clone();
    // Before the run's second page is asked for, another device changes a row the first page brought.
    let change = {
        let (writer, changed) = (writer.clone(), changed.clone());
        Closure::<dyn FnMut() -> js_sys::Promise>::new(move || {
            let (writer, changed) = (writer.clone(), changed.clone());
            wasm_bindgen_futures::future_to_promise(async move {
                ok(writer.patch("todos".into(), changed.into(), to_js(&json!({"title": "changed mid-run"})), None)).await;
                ok(writer.sync()).await;
                Ok(JsValue::UNDEFINED)
            })
        })
        .into_js_value()
    };
    let pulls = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let fetch = Closure::<dyn Fn(JsValue, JsValue) -> js_sys::Promise>::new(move |url: JsValue, init: JsValue| {
        let global = js_sys::global();
        let real: Function = js_sys::Reflect::get(&global, &"fetch".into()).unwrap().into();
        if url.as_string().unwrap_or_default().ends_with("kizuna_pull") {
            pulls.set(pulls.get() + 1);
            if pulls.get() == 2 {
                let after = Function::new_with_args("change, real, url, init", "return change().then(() => real(url, init))");
                return after.call4(&JsValue::NULL, &change, &real, &url, &init).unwrap().into();
            }
        }
        real.call2(&global, &url, &init).unwrap().into()
    });
    let opts = options(&format!("chunk-mid-{}", random_id()), &user);
    set(&opts, "pullLimit", json!(100));
    js_sys::Reflect::set(&opts, &"fetch".into(), &fetch.into_js_value()).unwrap();
    let reader = open(&opts).await;
    ok(reader.pull()).await;
    let listed = ok(reader.list("todos".into())).await;
    assert_eq!(ids(&listed), keys, "each row once");
    let row = listed.as_array().unwrap().iter().find(|r| r["id"] == json!(changed)).unwrap();
    assert_eq!(row["title"], json!("changed mid-run"));
    assert_eq!(ok(reader.get("todos".into(), changed.clone().into())).await["title"], json!("changed mid-run"));
    reader.close();
    writer.close();
}

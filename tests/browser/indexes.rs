//! Declared equality indexes (`open({ indexes })`): a query or watch through one answers what a
//! scan of the table answers, pending writes included; a new declaration re-indexes the rows it
//! concerns at `open`; and a database stored by schema 1 (before indexes) opens with nothing lost.

use indexed_db_futures::database::Database;
use indexed_db_futures::prelude::*;
use indexed_db_futures::transaction::TransactionMode;
use indexed_db_futures::KeyPath;
use js_sys::Array;
use serde_json::{json, Value};
use wasm_bindgen::JsValue;
use wasm_bindgen_test::wasm_bindgen_test;

use crate::support::*;

/// The rows' ids without the test's prefix, sorted.
fn ids(rows: &Value) -> Vec<String> {
    let mut ids: Vec<String> =
        rows.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().rsplit('.').next().unwrap().to_owned()).collect();
    ids.sort();
    ids
}

async fn query(client: &kizunasync::KizunaClient, filter: Value) -> Vec<String> {
    ids(&ok(client.query("todos".into(), Some(to_js(&filter)))).await)
}

#[wasm_bindgen_test]
async fn a_query_through_a_declared_index_answers_what_a_scan_answers_pending_writes_included() {
    let (name, user) = (format!("idx-{}", random_id()), random_id());
    let opts = options(&name, &user);
    set(&opts, "indexes", json!({"todos": ["done", "title"]}));
    let client = open(&opts).await;
    for (i, done) in [false, true, false, true, false].into_iter().enumerate() {
        let id = format!("{user}.t{i}");
        ok(client.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": format!("todo {i}"), "done": done})), None)).await;
    }
    ok(client.sync()).await;
    // Pending: one row changes its value, one is new, one is deleted.
    let key = |k: &str| format!("{user}.{k}");
    ok(client.patch("todos".into(), key("t1").into(), to_js(&json!({"done": false})), None)).await;
    ok(client.put("todos".into(), key("t9").into(), to_js(&json!({"id": key("t9"), "title": "todo 9", "done": false})), None)).await;
    ok(client.delete("todos".into(), key("t0").into(), None)).await;

    let open_ones = query(&client, json!({"where": {"done": false}})).await;
    assert_eq!(open_ones, ["t1", "t2", "t4", "t9"]);
    assert_eq!(query(&client, json!({"where": {"title": "todo 2", "done": false}})).await, ["t2"]);
    assert_eq!(query(&client, json!({"where": {"title": "todo 2", "done": true}})).await, Vec::<String>::new());
    // "false" the string is not false the boolean.
    assert_eq!(query(&client, json!({"where": {"done": "false"}})).await, Vec::<String>::new());

    // The same database without the declaration scans, and agrees.
    client.close();
    let scanning = open(&options(&name, &user)).await;
    assert_eq!(query(&scanning, json!({"where": {"done": false}})).await, open_ones);
    scanning.close();
}

#[wasm_bindgen_test]
async fn a_new_declaration_indexes_the_rows_already_stored() {
    let (name, user) = (format!("idx-{}", random_id()), random_id());
    let client = open(&options(&name, &user)).await;
    for i in 0..5 {
        let id = format!("{user}.t{i}");
        ok(client.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": format!("todo {}", i % 2), "done": i == 3})), None)).await;
    }
    ok(client.sync()).await;
    client.close();

    let opts = options(&name, &user);
    set(&opts, "indexes", json!({"todos": ["title"]}));
    let indexed = open(&opts).await;
    assert_eq!(query(&indexed, json!({"where": {"title": "todo 1"}})).await, ["t1", "t3"]);
    indexed.close();

    set(&opts, "indexes", json!({"todos": ["done"]}));
    let again = open(&opts).await;
    assert_eq!(query(&again, json!({"where": {"done": true}})).await, ["t3"]);
    assert_eq!(query(&again, json!({"where": {"title": "todo 1"}})).await, ["t1", "t3"], "an undeclared column is scanned");
    again.close();
}

/// Two deploys of the app side by side (a tab left open across one): tabs of one database that
/// declare different indexes each find every row, whichever opened last.
#[wasm_bindgen_test]
async fn tabs_that_declare_different_indexes_each_find_every_row() {
    let (name, user) = (format!("decl-{}", random_id()), random_id());
    let declaring = options(&name, &user);
    set(&declaring, "indexes", json!({"todos": ["title"]}));
    let put = |client: &kizunasync::KizunaClient, id: &str| {
        let id = format!("{user}.{id}");
        client.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": "same"})), None)
    };
    let new = open(&declaring).await;
    ok(put(&new, "a")).await;
    // A tab of the earlier deploy, which declares nothing, opens after it, and each writes a row.
    let old = open(&options(&name, &user)).await;
    ok(put(&old, "b")).await;
    ok(put(&new, "c")).await;
    let same = json!({"where": {"title": "same"}});
    assert_eq!(query(&new, same.clone()).await, ["a", "b", "c"]);
    assert_eq!(query(&old, same.clone()).await, ["a", "b", "c"]);
    // The declaring deploy opens again (a reload): the rows the other tab wrote are found too.
    new.close();
    let reloaded = open(&declaring).await;
    ok(put(&old, "d")).await;
    assert_eq!(query(&reloaded, same.clone()).await, ["a", "b", "c", "d"]);
    assert_eq!(query(&old, same).await, ["a", "b", "c", "d"]);
    old.close();
    reloaded.close();
}

#[wasm_bindgen_test]
async fn a_bad_declaration_is_refused() {
    let opts = options(&format!("idx-{}", random_id()), &random_id());
    set(&opts, "indexes", json!({"todos": "done"}));
    let refused = call(kizunasync::KizunaClient::open(opts.into())).await.err().expect("refused");
    assert_eq!(error_code(&refused), "INVALID_ARGUMENT");
}

/// Creates database `name` with the stores of an earlier `schema` (1 or 2): the rows in `rows`
/// (schema 2: `rows_v2`, with the `eq` index of declared indexes), `outbox`, `dead`, `staging` and
/// `meta`.
pub(crate) async fn earlier_schema(name: &str, schema: u32) -> Database {
    Database::open(name)
        .with_version(schema)
        .with_on_upgrade_needed(move |_, db| {
            let rows = db.create_object_store(if schema == 1 { "rows" } else { "rows_v2" }).build()?;
            rows.create_index("table", KeyPath::One("table")).with_unique(false).build()?;
            rows.create_index("bucket", KeyPath::One("bucket")).with_unique(false).build()?;
            if schema >= 2 {
                rows.create_index("eq", KeyPath::One("eq")).with_unique(false).with_multi_entry(true).build()?;
            }
            for store in ["outbox", "dead", "staging", "meta"] {
                db.create_object_store(store).build()?;
            }
            Ok(())
        })
        .await
        .unwrap()
}

/// Writes a database as schema 1 stored it: rows (with both `base` and `visible`) in `rows`, a
/// pending write in `outbox`, the engine's `meta`.
pub(crate) async fn schema_1_database(name: &str, user: &str) {
    let db = earlier_schema(name, 1).await;
    let tx = db.transaction(["rows", "outbox", "meta"]).with_mode(TransactionMode::Readwrite).build().unwrap();
    let key = |pk: &str| -> JsValue { Array::of2(&"todos".into(), &pk.into()).into() };
    let rows = tx.object_store("rows").unwrap();
    let bucket = format!("user:{user}");
    let (old1, old2) = (format!("{user}.old1"), format!("{user}.old2"));
    let pulled = json!({"table": "todos", "pk": old1, "bucket": bucket, "base": {"id": old1, "title": "kept"}, "visible": {"id": old1, "title": "kept"}});
    let pending = json!({"table": "todos", "pk": old2, "bucket": null, "base": null, "visible": {"id": old2, "title": "pending"}});
    rows.put(to_js(&pulled)).with_key(key(&old1)).primitive().unwrap().await.unwrap();
    rows.put(to_js(&pending)).with_key(key(&old2)).primitive().unwrap().await.unwrap();
    let client_id = random_id();
    let entry = json!({"seq": 1, "id": random_id(), "table": "todos", "pk": old2, "op": "upsert",
                       "columns": {"id": old2, "title": "pending"}, "hlc": format!("{:013}-0000-{client_id}", 1_733_200_000_000i64),
                       "read_seq": 0, "batch": null, "apply_after": null, "latest_only": false, "created_at": 1733200000000i64,
                       "sent": false, "attempts": 0, "permanent_failures": 0, "retry_at": null, "last_error": null});
    tx.object_store("outbox").unwrap().put(to_js(&entry)).with_key(JsValue::from(1)).primitive().unwrap().await.unwrap();
    let meta = json!({"client_id": client_id, "next_seq": 2, "checkpoint": {"cursor": null, "horizon": 0, "committed_at": null},
                      "counters": {"applied": 0, "rejected": 0, "skipped": 0, "delayed": 0, "dead_lettered": 0},
                      "hlc_last": null, "slice_limit": null});
    tx.object_store("meta").unwrap().put(to_js(&meta)).with_key(JsValue::from("meta")).primitive().unwrap().await.unwrap();
    tx.commit().await.unwrap();
    db.close();
}

#[wasm_bindgen_test]
async fn a_database_of_schema_1_opens_with_its_rows_and_pending_writes() {
    let (name, user) = (format!("v1-{}", random_id()), random_id());
    schema_1_database(&name, &user).await;
    let opts = options(&name, &user);
    set(&opts, "indexes", json!({"todos": ["title"]}));
    let client = open(&opts).await;
    let old1 = format!("{user}.old1");
    assert_eq!(ok(client.get("todos".into(), old1.clone().into())).await, json!({"id": old1, "title": "kept"}));
    assert_eq!(query(&client, json!({"where": {"title": "pending"}})).await, ["old2"]);
    assert_eq!(ok(js_sys::Promise::resolve(&client.pending_writes())).await.as_array().map(Vec::len), Some(1));
    // The pending write still goes to the server, once.
    ok(client.sync()).await;
    assert_eq!(ok(js_sys::Promise::resolve(&client.pending_writes())).await.as_array().map(Vec::len), Some(0));
    client.close();
}

/// A new user with `count` rows `t0`, `t1`, ... on the server, written by another device.
async fn synced_rows(count: usize) -> String {
    let user = random_id();
    let writer = open(&options(&format!("writer-{}", random_id()), &user)).await;
    for i in 0..count {
        let id = format!("{user}.t{i}");
        ok(writer.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": "x"})), None)).await;
    }
    ok(writer.sync()).await;
    writer.close();
    user
}

/// A number a server writes in another form than the app's own for the same double (`5.00` from a
/// `numeric(10, 2)` column, `1e2`, `1152921504606846976` for 2^60) is one value to a query, through
/// a declared index or a scan, and to a live query as its rows change, as `===` makes it (an indexed
/// query missed the `5.00` and `1e2` rows, and a live query let the 2^60 row go when it changed).
/// The pull answers are rewritten on their way in: no synced table of the tests has such a column.
#[wasm_bindgen_test]
async fn a_number_the_server_writes_in_another_form_is_found_by_the_apps_own() {
    let user = synced_rows(3).await;
    for literal in ["5.00", "1e2", "1152921504606846976"] {
        let (filter, conditions) = (js_sys::Object::new(), js_sys::Object::new());
        js_sys::Reflect::set(&conditions, &"title".into(), &js_sys::JSON::parse(literal).unwrap()).unwrap();
        js_sys::Reflect::set(&filter, &"where".into(), &conditions).unwrap();
        for indexed in [false, true] {
            let case = format!("{literal}, indexed: {indexed}");
            let opts = options(&format!("forms-{}", random_id()), &user);
            js_sys::Reflect::set(&opts, &"fetch".into(), &titles_rewritten(&["kizuna_pull"], &format!(r#""title": {literal}"#))).unwrap();
            if indexed {
                set(&opts, "indexes", json!({"todos": ["title"]}));
            }
            let client = open(&opts).await;
            ok(client.pull()).await;
            let found = ok(client.query("todos".into(), Some(filter.clone().into()))).await;
            assert_eq!(ids(&found), ["t0", "t1", "t2"], "{case}");

            let (results, stop) = watched(&client, "todos", filter.clone().into());
            // One of the rows changes: the live query reads it again.
            ok(client.patch("todos".into(), format!("{user}.t0").into(), to_js(&json!({"done": true})), None)).await;
            wait_for_results(&results, 2).await;
            assert_eq!(results.length(), 2, "{case}: the first result and the changed row's");
            assert_eq!(ids(&from_js(results.get(1))), ["t0", "t1", "t2"], "{case}");
            stop.call0(&JsValue::NULL).unwrap();
            client.close();
        }
    }
}

/// A database whose tokens were made before numbers had one form (a server's `5.00` was stored
/// under `5.0`) has them remade at `open`, once: the app's `5` then finds those rows.
#[wasm_bindgen_test]
async fn tokens_of_the_earlier_form_are_remade_at_open() {
    let user = synced_rows(2).await;
    let name = format!("forms-{}", random_id());
    let opts = options(&name, &user);
    set(&opts, "indexes", json!({"todos": ["title"]}));
    js_sys::Reflect::set(&opts, &"fetch".into(), &titles_rewritten(&["kizuna_pull"], r#""title": 5.00"#)).unwrap();
    let client = open(&opts).await;
    ok(client.pull()).await;
    client.close();

    // As the earlier client stored it: the token of `5.00` was `5.0`, and no form was recorded.
    let db = Database::open(name.as_str()).await.unwrap();
    let tx = db.transaction(["rows_v2", "meta"]).with_mode(TransactionMode::Readwrite).build().unwrap();
    let rows = tx.object_store("rows_v2").unwrap();
    let records: Vec<JsValue> = rows.get_all::<JsValue>().primitive().unwrap().await.unwrap().map(Result::unwrap).collect();
    assert_eq!(records.len(), 2);
    for record in records {
        let mut stored = from_js(record);
        assert_eq!(stored["eq"], json!(["todos\u{1f}title\u{1f}5"]), "{stored}");
        stored["eq"] = json!(["todos\u{1f}title\u{1f}5.0"]);
        let key = Array::of2(&"todos".into(), &stored["pk"].as_str().unwrap().into());
        rows.put(to_js(&stored)).with_key(JsValue::from(key)).primitive().unwrap().await.unwrap();
    }
    tx.object_store("meta").unwrap().delete(JsValue::from("tokenForm")).primitive().unwrap().await.unwrap();
    tx.commit().await.unwrap();
    db.close();

    let reopened = open(&opts).await;
    let found = ok(reopened.query("todos".into(), Some(to_js(&json!({"where": {"title": 5}}))))).await;
    assert_eq!(ids(&found), ["t0", "t1"]);
    reopened.close();
}

//! Tabs of two versions of Kizuna on one database: an upgrade never leaves an `open()` hanging,
//! and an older client lets a newer one in and says why it stops; a database an earlier version
//! stored opens with its pending writes, its identity and its counters, and each table's rows.

use std::future::{Future, IntoFuture};

use futures_util::future::{select, Either};
use indexed_db_futures::database::Database;
use indexed_db_futures::prelude::*;
use indexed_db_futures::transaction::TransactionMode;
use js_sys::Array;
use kizunasync::KizunaClient;
use serde_json::{json, Value};
use wasm_bindgen::JsValue;
use wasm_bindgen_test::wasm_bindgen_test;

use crate::indexes::{earlier_schema, schema_1_database};
use crate::support::*;

/// What `work` gives within `ms`, or `None` when it is still pending then.
async fn within<T>(ms: i32, work: impl Future<Output = T>) -> Option<T> {
    match select(Box::pin(work), Box::pin(sleep(ms))).await {
        Either::Left((done, _)) => Some(done),
        Either::Right(_) => None,
    }
}

fn refusal(opened: Result<KizunaClient, JsValue>) -> JsValue {
    match opened {
        Ok(_) => panic!("the client opened"),
        Err(e) => e,
    }
}

#[wasm_bindgen_test]
async fn a_tab_of_an_earlier_version_holding_the_database_gets_a_coded_refusal_not_a_hang() {
    let (name, user) = (format!("held-{}", random_id()), random_id());
    schema_1_database(&name, &user).await;
    // A tab still running the version of schema 1, which never lets go of its connection.
    let held = Database::open(name.as_str()).with_version(1u32).await.unwrap();
    let opts = options(&name, &user);
    let opened = within(5_000, KizunaClient::connect(opts.clone().into())).await.expect("open() settles while another tab holds the database");
    let err = refusal(opened);
    assert_eq!(error_code(&err), "STORAGE_BLOCKED");
    assert_eq!(js_sys::Reflect::get(&err, &"retryable".into()).unwrap(), JsValue::TRUE);

    // Once that tab lets go, the database opens with its rows.
    held.close();
    let client = within(5_000, open(&opts)).await.expect("the database opens once it is let go");
    let old1 = format!("{user}.old1");
    assert_eq!(ok(client.get("todos".into(), old1.clone().into())).await, json!({"id": old1, "title": "kept"}));
    client.close();
}

#[wasm_bindgen_test]
async fn a_newer_version_opening_the_database_is_let_in_and_this_client_says_why_it_stops() {
    let (name, user) = (format!("newer-{}", random_id()), random_id());
    let opts = options(&name, &user);
    let client = open(&opts).await;
    let id = format!("{user}.a");
    ok(client.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": "before"})), None)).await;

    // A newer version of Kizuna opens the database in another tab, at a later schema.
    let upgrading = Database::open(name.as_str()).with_version(6u32).with_on_upgrade_needed(|_, _| Ok(()));
    let newer = within(5_000, upgrading.into_future()).await.expect("this client does not hold up the upgrade").unwrap();
    let err = call(client.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": "after"})), None)).await.unwrap_err();
    assert_eq!(error_code(&err), "STORAGE_UPGRADED");
    let err = call(client.get("todos".into(), id.clone().into())).await.unwrap_err();
    assert_eq!(error_code(&err), "STORAGE_UPGRADED");
    client.close();

    // This version, opened again on the upgraded database, says why it cannot.
    newer.close();
    let err = refusal(KizunaClient::connect(opts.into()).await);
    assert_eq!(error_code(&err), "STORAGE_UPGRADED");
}

/// Writes a database as schema 2 stored it: a pending write (`seq` 1) and its row, and apart from
/// the `sync` stamp, the engine's `meta` record (the next `seq` is 2, seven writes applied) and the
/// declared indexes as records of their own.
async fn schema_2_database(name: &str, user: &str) {
    let db = earlier_schema(name, 2).await;
    let tx = db.transaction(["rows_v2", "outbox", "meta"]).with_mode(TransactionMode::Readwrite).build().unwrap();
    let pk = format!("{user}.old");
    let row = json!({"table": "todos", "pk": pk, "bucket": null, "base": null, "visible": {"id": pk, "title": "pending"}});
    let key: JsValue = Array::of2(&"todos".into(), &pk.as_str().into()).into();
    tx.object_store("rows_v2").unwrap().put(to_js(&row)).with_key(key).primitive().unwrap().await.unwrap();
    let client_id = random_id();
    let entry = json!({"seq": 1, "id": random_id(), "table": "todos", "pk": pk, "op": "upsert",
                       "columns": {"id": pk, "title": "pending"}, "hlc": format!("{:013}-0000-{client_id}", 1_733_200_000_000i64),
                       "read_seq": 0, "created_at": 1733200000000i64});
    tx.object_store("outbox").unwrap().put(to_js(&entry)).with_key(JsValue::from(1)).primitive().unwrap().await.unwrap();
    let meta_store = tx.object_store("meta").unwrap();
    let meta = json!({"client_id": client_id, "next_seq": 2, "checkpoint": {"cursor": null, "horizon": 0, "committed_at": null},
                      "counters": {"applied": 7, "rejected": 0, "skipped": 0, "delayed": 0, "dead_lettered": 0},
                      "hlc_last": null, "slice_limit": null});
    for (key, record) in [("meta", meta), ("sync", json!({"version": 4, "leader": null})), ("indexes", json!({"todos": ["title"]})), ("tokenForm", json!(2))] {
        meta_store.put(to_js(&record)).with_key(JsValue::from(key)).primitive().unwrap().await.unwrap();
    }
    tx.commit().await.unwrap();
    db.close();
}

/// The `seq`s of the pending writes.
fn pending_seqs(client: &KizunaClient) -> Vec<i64> {
    from_js(client.pending_writes()).as_array().unwrap().iter().map(|e| e["seq"].as_i64().unwrap()).collect()
}

/// Schema 3 keeps the engine's `meta` record and the declared indexes in the `sync` record. A
/// database of schema 2 opens with its `meta` taken over: an open that missed it would start the
/// database afresh, with a new identity and `seq` 1 again, and the next write would take the
/// pending write's place in the outbox.
#[wasm_bindgen_test]
async fn a_database_of_schema_2_opens_with_its_pending_writes_identity_and_counters() {
    let (name, user) = (format!("v2-{}", random_id()), random_id());
    schema_2_database(&name, &user).await;
    let opts = options(&name, &user);
    let client = open(&opts).await;
    assert_eq!(pending_seqs(&client), [1]);
    assert_eq!(from_js(client.status())["applied"], 7);
    let (old, new) = (format!("{user}.old"), format!("{user}.new"));
    ok(client.put("todos".into(), new.clone().into(), to_js(&json!({"id": new, "title": "new"})), None)).await;
    assert_eq!(pending_seqs(&client), [1, 2], "the next write takes the next seq");
    client.close();

    // Opened again, it is as this version left it; both writes reach the server.
    let client = open(&opts).await;
    assert_eq!(pending_seqs(&client), [1, 2]);
    ok(client.sync()).await;
    assert_eq!(pending_seqs(&client), Vec::<i64>::new());
    assert_eq!(from_js(client.status())["applied"], 9);
    client.close();
    assert_eq!(server_view(&user, "todos", &old).await["title"], "pending");
    assert_eq!(server_view(&user, "todos", &new).await["title"], "new");
}

/// Writes a database as schema 3 stored it: rows of two tables (in `todos` one pulled and one
/// written here, pending; in `notes` one pulled), the pending write, and the `sync` record that
/// holds the engine's `meta` and the declared indexes.
async fn schema_3_database(name: &str, user: &str) {
    let db = earlier_schema(name, 3).await;
    let tx = db.transaction(["rows_v2", "outbox", "meta"]).with_mode(TransactionMode::Readwrite).build().unwrap();
    let rows = tx.object_store("rows_v2").unwrap();
    let bucket = format!("user:{user}");
    let (pulled, pending, note) = (format!("{user}.pulled"), format!("{user}.pending"), format!("{user}.note"));
    for (table, pk, bucket, row) in [
        ("todos", &pulled, json!(bucket), json!({"id": pulled, "title": "pulled"})),
        ("todos", &pending, json!(null), json!({"id": pending, "title": "pending"})),
        ("notes", &note, json!(bucket), json!({"id": note, "body": "a note"})),
    ] {
        let record = json!({"table": table, "pk": pk, "bucket": bucket, "base": if bucket.is_null() { json!(null) } else { row.clone() }, "visible": row});
        let key: JsValue = Array::of2(&table.into(), &pk.as_str().into()).into();
        rows.put(to_js(&record)).with_key(key).primitive().unwrap().await.unwrap();
    }
    let client_id = random_id();
    let entry = json!({"seq": 1, "id": random_id(), "table": "todos", "pk": pending, "op": "upsert",
                       "columns": {"id": pending, "title": "pending"}, "hlc": format!("{:013}-0000-{client_id}", 1_733_200_000_000i64),
                       "read_seq": 0, "created_at": 1733200000000i64});
    tx.object_store("outbox").unwrap().put(to_js(&entry)).with_key(JsValue::from(1)).primitive().unwrap().await.unwrap();
    let meta = json!({"client_id": client_id, "next_seq": 2, "checkpoint": {"cursor": null, "horizon": 0, "committed_at": null},
                      "counters": {"applied": 3, "rejected": 0, "skipped": 0, "delayed": 0, "dead_lettered": 0},
                      "hlc_last": null, "slice_limit": null});
    let sync = json!({"version": 4, "leader": null, "meta": meta, "indexes": {}});
    let meta_store = tx.object_store("meta").unwrap();
    for (key, record) in [("sync", sync), ("tokenForm", json!(2))] {
        meta_store.put(to_js(&record)).with_key(JsValue::from(key)).primitive().unwrap().await.unwrap();
    }
    tx.commit().await.unwrap();
    db.close();
}

/// The names of the indexes of the rows' store of database `name`, as it is now.
async fn row_indexes(name: &str) -> Vec<String> {
    let db = Database::open(name).await.unwrap();
    let tx = db.transaction("rows_v2").build().unwrap();
    let names = tx.object_store("rows_v2").unwrap().index_names().collect();
    drop(tx);
    db.close();
    names
}

/// Schema 4 reads a table's rows by their key range and drops the `table` index every row put
/// kept up for nothing. A database of schema 3 opens with each table's rows, and only its own,
/// its pending write and its counters, and without that index.
#[wasm_bindgen_test]
async fn a_database_of_schema_3_opens_with_each_tables_rows_apart_and_without_the_table_index() {
    let (name, user) = (format!("v3-{}", random_id()), random_id());
    schema_3_database(&name, &user).await;
    let client = open(&options(&name, &user)).await;
    let ids = |rows: Value| rows.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_string()).collect::<Vec<_>>();
    let (pulled, pending, note) = (format!("{user}.pulled"), format!("{user}.pending"), format!("{user}.note"));
    assert_eq!(ids(ok(client.list("todos".into())).await), [pending.clone(), pulled.clone()]);
    assert_eq!(ids(ok(client.list("notes".into())).await), [note.clone()]);
    assert_eq!(ids(ok(client.query("todos".into(), Some(to_js(&json!({"where": {"title": "pulled"}}))))).await), [pulled]);
    assert_eq!(ok(client.list("tags".into())).await, json!([]));
    assert_eq!(pending_seqs(&client), [1]);
    assert_eq!(from_js(client.status())["applied"], 3);
    client.close();
    assert_eq!(row_indexes(&name).await, ["bucket", "eq"]);

    // Opened again, the pending write reaches the server.
    let client = open(&options(&name, &user)).await;
    ok(client.sync()).await;
    assert_eq!(pending_seqs(&client), Vec::<i64>::new());
    client.close();
    assert_eq!(server_view(&user, "todos", &pending).await["title"], "pending");
}

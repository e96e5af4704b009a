//! Tabs of two versions of Kizuna on one database: an upgrade never leaves an `open()` hanging,
//! and an older client lets a newer one in and says why it stops.

use std::future::{Future, IntoFuture};

use futures_util::future::{select, Either};
use indexed_db_futures::database::Database;
use kizunasync::KizunaClient;
use serde_json::json;
use wasm_bindgen::JsValue;
use wasm_bindgen_test::wasm_bindgen_test;

use crate::indexes::schema_1_database;
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
    let upgrading = Database::open(name.as_str()).with_version(3u32).with_on_upgrade_needed(|_, _| Ok(()));
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

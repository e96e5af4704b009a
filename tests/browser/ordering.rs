//! `orderBy` and `limit` of `query` and `watch`: rows in the order of a column (synced rows and
//! pending writes alike, every type of value in one order, ties in primary-key order), at most
//! `limit` of them; a live query with a limit keeps its first rows right as rows come, go and move,
//! and is not called for a change it does not show; a bad `orderBy` or `limit` is refused.

use js_sys::{Array, Function};
use serde_json::{json, Value};
use wasm_bindgen::JsValue;
use wasm_bindgen_test::wasm_bindgen_test;

use crate::support::*;

/// The rows' ids without the test's prefix, in the order given.
fn ids(rows: &Value) -> Vec<String> {
    rows.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().rsplit('.').next().unwrap().to_owned()).collect()
}

async fn query(client: &kizunasync::KizunaClient, filter: Value) -> Vec<String> {
    ids(&ok(client.query("todos".into(), Some(to_js(&filter)))).await)
}

/// The ids of the `n`th result a listener pushed into `heard`, once it has heard exactly that many.
async fn nth_heard(heard: &Array, n: u32) -> Vec<String> {
    wait_for_results(heard, n).await;
    assert_eq!(heard.length(), n, "the listener was called {} times, not {n}", heard.length());
    ids(&from_js(heard.get(n - 1)))
}

async fn put(client: &kizunasync::KizunaClient, user: &str, k: &str, mut row: Value) {
    let id = format!("{user}.{k}");
    row["id"] = json!(id);
    ok(client.put("todos".into(), id.into(), to_js(&row), None)).await;
}

#[wasm_bindgen_test]
async fn a_query_hands_back_its_rows_in_the_order_of_a_column_and_at_most_its_limit() {
    let user = random_id();
    let opts = options(&format!("order-{}", random_id()), &user);
    set(&opts, "indexes", json!({"todos": ["done"]}));
    let client = open(&opts).await;
    // Synced rows first, then pending writes over them and beside them.
    put(&client, &user, "a", json!({"title": "a", "done": false, "position": 3})).await;
    put(&client, &user, "b", json!({"title": "b", "done": false, "position": 1})).await;
    put(&client, &user, "c", json!({"title": "c", "done": true, "position": 2})).await;
    ok(client.sync()).await;
    ok(client.patch("todos".into(), format!("{user}.a").into(), to_js(&json!({"position": 0.5})), None)).await;
    put(&client, &user, "d", json!({"title": "d", "done": false, "position": 1})).await;
    put(&client, &user, "e", json!({"title": "e", "done": false, "position": 10})).await;

    assert_eq!(query(&client, json!({"orderBy": "position"})).await, ["a", "b", "d", "c", "e"]);
    // Ties (b and d at 1) stay in primary-key order in either direction.
    assert_eq!(query(&client, json!({"orderBy": ["position", "desc"]})).await, ["e", "c", "b", "d", "a"]);
    assert_eq!(query(&client, json!({"orderBy": ["position", "asc"], "limit": 2})).await, ["a", "b"]);
    // With a condition, through the declared index.
    assert_eq!(query(&client, json!({"where": {"done": false}, "orderBy": ["position", "desc"], "limit": 3})).await, ["e", "b", "d"]);
    // Without an order, a limit takes the first rows in primary-key order.
    assert_eq!(query(&client, json!({"limit": 2})).await, ["a", "b"]);
    assert_eq!(query(&client, json!({"orderBy": "title", "limit": 100})).await, ["a", "b", "c", "d", "e"]);

    // Every type of value in one order: missing and null, false, true, numbers, strings, then
    // arrays and objects.
    let mixed = open(&options(&format!("order-mixed-{}", random_id()), &user)).await;
    for (k, value) in [("m1", json!("b")), ("m2", json!(true)), ("m3", json!(-2)), ("m4", json!({"x": 1})), ("m5", json!(null)),
                       ("m6", json!("a")), ("m7", json!(false)), ("m8", json!(7.5)), ("m9", json!([1]))] {
        put(&mixed, &user, k, json!({"title": value})).await;
    }
    put(&mixed, &user, "m0", json!({})).await;
    assert_eq!(query(&mixed, json!({"orderBy": "title"})).await, ["m0", "m5", "m7", "m2", "m3", "m8", "m6", "m1", "m9", "m4"]);
    assert_eq!(query(&mixed, json!({"orderBy": ["title", "desc"], "limit": 3})).await, ["m4", "m9", "m1"]);
    mixed.close();

    // A limit cuts where sorting every row would: the query holds only about twice its limit at a time.
    let many = open(&options(&format!("order-many-{}", random_id()), &user)).await;
    let writes: Vec<Value> = (0..40)
        .map(|i| json!({"op": "upsert", "table": "todos", "pk": format!("{user}.n{i:02}"),
                        "row": {"id": format!("{user}.n{i:02}"), "title": "n", "position": (i * 7) % 10}}))
        .collect();
    ok(many.batch(to_js(&json!(writes)))).await;
    let mut expected: Vec<(i64, String)> = (0..40).map(|i| ((i * 7) % 10, format!("n{i:02}"))).collect();
    expected.sort();
    let first: Vec<String> = expected.iter().take(7).map(|(_, k)| k.clone()).collect();
    assert_eq!(query(&many, json!({"orderBy": "position", "limit": 7})).await, first);
    let last: Vec<String> = {
        let mut desc = expected.clone();
        desc.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        desc.iter().take(5).map(|(_, k)| k.clone()).collect()
    };
    assert_eq!(query(&many, json!({"orderBy": ["position", "desc"], "limit": 5})).await, last);
    many.close();
    client.close();
}

#[wasm_bindgen_test]
async fn a_live_query_with_a_limit_keeps_its_first_rows_and_stays_quiet_about_the_others() {
    let user = random_id();
    let client = open(&options(&format!("order-watch-{}", random_id()), &user)).await;
    for (k, position) in [("a", 1), ("b", 2), ("c", 3), ("d", 4)] {
        put(&client, &user, k, json!({"title": k, "position": position})).await;
    }
    let (heard, stop) = watched(&client, "todos", to_js(&json!({"orderBy": "position", "limit": 2})));
    assert_eq!(nth_heard(&heard, 1).await, ["a", "b"]);
    // A row past the limit changes: what the app sees does not, and the listener is not called.
    ok(client.patch("todos".into(), format!("{user}.d").into(), to_js(&json!({"title": "d2"})), None)).await;
    // A row moves into the first two, another leaves them.
    ok(client.patch("todos".into(), format!("{user}.c").into(), to_js(&json!({"position": 0})), None)).await;
    assert_eq!(nth_heard(&heard, 2).await, ["c", "a"]);
    // A shown row is deleted: the next one takes its place.
    ok(client.delete("todos".into(), format!("{user}.a").into(), None)).await;
    assert_eq!(nth_heard(&heard, 3).await, ["c", "b"]);
    // A new row sorts first.
    put(&client, &user, "e", json!({"title": "e", "position": -1})).await;
    assert_eq!(nth_heard(&heard, 4).await, ["e", "c"]);
    sleep(100).await;
    assert_eq!(heard.length(), 4, "one call for each change it shows, none for the one it does not");
    stop.call0(&JsValue::NULL).unwrap();

    // Ordered without a limit: every row, in the order, after each change.
    let (all, stop) = watched(&client, "todos", to_js(&json!({"orderBy": ["position", "desc"]})));
    assert_eq!(nth_heard(&all, 1).await, ["d", "b", "c", "e"]);
    ok(client.patch("todos".into(), format!("{user}.e").into(), to_js(&json!({"position": 3})), None)).await;
    assert_eq!(nth_heard(&all, 2).await, ["d", "e", "b", "c"]);
    stop.call0(&JsValue::NULL).unwrap();
    client.close();
}

#[wasm_bindgen_test]
async fn a_bad_order_or_limit_is_refused_by_a_query_and_a_live_query() {
    let client = open(&options(&format!("order-bad-{}", random_id()), &random_id())).await;
    let bad = [
        json!({"orderBy": 5}),
        json!({"orderBy": ""}),
        json!({"orderBy": ["position"]}),
        json!({"orderBy": ["position", "up"]}),
        json!({"orderBy": ["position", "desc", "again"]}),
        json!({"orderBy": {"column": "position"}}),
        json!({"limit": 0}),
        json!({"limit": -1}),
        json!({"limit": 1.5}),
        json!({"limit": "2"}),
        json!({"order": "position"}),
    ];
    for filter in bad {
        let refused = call(client.query("todos".into(), Some(to_js(&filter)))).await.expect_err("refused");
        assert_eq!(error_code(&refused), "INVALID_ARGUMENT", "{filter}");
        let refused = client.watch("todos".into(), to_js(&filter), Function::new_no_args("").into()).expect_err("refused");
        assert_eq!(error_code(&refused), "INVALID_ARGUMENT", "{filter}");
    }
    client.close();
}

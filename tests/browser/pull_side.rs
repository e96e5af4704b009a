//! Pulls against the real server: staged runs commit at once or not at all, pending edits are
//! rebased over each checkpoint, and the cursor never moves back (the 100,000-row first sync is in tests/tabs/, seen from two tabs).

use std::cell::Cell;
use std::rc::Rc;

use js_sys::Reflect;
use serde_json::{json, Value};
use wasm_bindgen_test::wasm_bindgen_test;

use crate::support::*;

async fn write_rows(user: &str, count: usize) -> Vec<String> {
    let writer = open(&options(&format!("writer-{}", random_id()), user)).await;
    let ids: Vec<String> = (0..count).map(|_| random_id()).collect();
    for (i, id) in ids.iter().enumerate() {
        ok(writer.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": format!("row {i}"), "position": i})), None)).await;
    }
    ok(writer.sync()).await;
    writer.close();
    ids
}

/// Options of a client of `user` whose answers to `functions` reach it with every row's `"title":
/// "..."` replaced by `columns` (JSON text): values no synced table of the tests can hold.
fn titles_rewritten_options(name: &str, user: &str, functions: &[&str], columns: &str) -> js_sys::Object {
    let opts = options(&format!("{name}-{}", random_id()), user);
    Reflect::set(&opts, &"fetch".into(), &titles_rewritten(functions, columns)).unwrap();
    opts
}

/// A client of `user` pulling a row a page, its pull answers rewritten (`titles_rewritten_options`).
async fn open_with_titles_rewritten(name: &str, user: &str, columns: &str) -> kizunasync::KizunaClient {
    let opts = titles_rewritten_options(name, user, &["kizuna_pull"], columns);
    set(&opts, "pullLimit", json!(1));
    open(&opts).await
}

/// A `fetch` option that goes through `wrapper` while `on` holds, and is the browser's own after.
fn fetch_through_while(wrapper: js_sys::Function, on: Rc<Cell<bool>>) -> wasm_bindgen::JsValue {
    let choose = wasm_bindgen::closure::Closure::<dyn Fn(wasm_bindgen::JsValue, wasm_bindgen::JsValue) -> js_sys::Promise>::new(move |url: wasm_bindgen::JsValue, init: wasm_bindgen::JsValue| {
        let global = js_sys::global();
        let f: js_sys::Function = if on.get() { wrapper.clone() } else { Reflect::get(&global, &"fetch".into()).unwrap().into() };
        f.call2(&global, &url, &init).unwrap().into()
    });
    choose.into_js_value()
}

#[wasm_bindgen_test]
async fn a_run_cut_off_after_page_two_leaves_store_and_cursor_as_they_were() {
    let user = random_id();
    write_rows(&user, 3).await;
    let opts = options(&format!("cut-{}", random_id()), &user);
    set(&opts, "pullLimit", json!(2));
    let pulls = Rc::new(Cell::new(0u32));
    let cut = Rc::new(Cell::new(false));
    let (p, c) = (pulls.clone(), cut.clone());
    let fetch = faulty_fetch(move |url, _| {
        if !url.ends_with("kizuna_pull") {
            return Fault::Pass;
        }
        p.set(p.get() + 1);
        if c.get() && p.get() == 3 { Fault::Refuse } else { Fault::Pass }
    });
    Reflect::set(&opts, &"fetch".into(), &fetch).unwrap();
    let reader = open(&opts).await;
    ok(reader.pull()).await;
    let before_rows = ok(reader.list("todos".into())).await;
    let before = from_js(reader.get_checkpoint());
    assert_eq!(before_rows.as_array().unwrap().len(), 3);

    write_rows(&user, 7).await;
    pulls.set(0);
    cut.set(true);
    let err = call(reader.pull()).await.expect_err("the third page never arrives");
    assert_eq!(error_code(&err), "NETWORK");
    assert_eq!(ok(reader.list("todos".into())).await, before_rows, "no row of the cut run is visible");
    assert_eq!(from_js(reader.get_checkpoint()), before, "the cursor did not move");

    ok(reader.pull()).await;
    assert_eq!(ok(reader.list("todos".into())).await.as_array().unwrap().len(), 10, "the next run starts over and completes");
    assert!(from_js(reader.get_checkpoint())["horizon"].as_i64() > before["horizon"].as_i64());
    reader.close();
}

#[wasm_bindgen_test]
async fn a_closing_page_of_exactly_limit_entries_commits() {
    let user = random_id();
    write_rows(&user, 4).await;
    let opts = options(&format!("exact-{}", random_id()), &user);
    set(&opts, "pullLimit", json!(2));
    let pulls = Rc::new(Cell::new(0u32));
    let counted = pulls.clone();
    let fetch = faulty_fetch(move |url, _| {
        if url.ends_with("kizuna_pull") {
            counted.set(counted.get() + 1);
        }
        Fault::Pass
    });
    Reflect::set(&opts, &"fetch".into(), &fetch).unwrap();
    let reader = open(&opts).await;
    let progress = record(&reader, "pullProgress");
    let checkpoints = record(&reader, "checkpoint");
    ok(reader.pull()).await;
    assert_eq!(ok(reader.list("todos".into())).await.as_array().unwrap().len(), 4);
    assert_eq!(checkpoints.length(), 1, "one run, one commit");
    assert_eq!(pulls.get(), 2, "two full pages, the second closing the run: no empty page after it");
    assert!(progress.length() >= 1, "the first page was staged before the closing one");
    let horizon = from_js(reader.get_checkpoint())["horizon"].as_i64().unwrap();
    ok(reader.pull()).await;
    assert!(from_js(reader.get_checkpoint())["horizon"].as_i64().unwrap() >= horizon);
    reader.close();
}

#[wasm_bindgen_test]
async fn a_pending_edit_survives_a_checkpoint_that_changes_another_column() {
    let user = random_id();
    let id = random_id();
    let a = open(&options(&format!("rebase-a-{}", random_id()), &user)).await;
    let b = open(&options(&format!("rebase-b-{}", random_id()), &user)).await;
    ok(a.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": "plain", "done": false})), None)).await;
    ok(a.sync()).await;
    ok(b.sync()).await;
    ok(b.patch("todos".into(), id.clone().into(), to_js(&json!({"done": true})), None)).await;
    ok(b.sync()).await;

    ok(a.patch("todos".into(), id.clone().into(), to_js(&json!({"title": "mine"})), None)).await;
    ok(a.pull()).await;
    let row = ok(a.get("todos".into(), id.clone().into())).await;
    assert_eq!(row["title"], "mine", "the unsent edit stays on screen: {row}");
    assert_eq!(row["done"], true, "the remote column appears underneath it: {row}");
    assert_eq!(from_js(a.pending_writes()).as_array().unwrap().len(), 1);

    ok(a.sync()).await;
    let server = server_view(&user, "todos", &id).await;
    assert_eq!((server["title"].clone(), server["done"].clone()), (json!("mine"), json!(true)), "both survive: {server}");
    a.close();
    b.close();
}

#[wasm_bindgen_test]
async fn the_cursor_never_moves_back_over_random_writes_and_pulls() {
    let user = random_id();
    let writer = open(&options(&format!("rand-w-{}", random_id()), &user)).await;
    let opts = options(&format!("rand-r-{}", random_id()), &user);
    set(&opts, "pullLimit", json!(3));
    let reader = open(&opts).await;
    let mut written = 0;
    let mut last = -1i64;
    for step in 0..24 {
        if js_sys::Math::random() < 0.5 {
            let n = 1 + (js_sys::Math::random() * 4.0) as usize;
            for _ in 0..n {
                let id = random_id();
                ok(writer.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": "r"})), None)).await;
                written += 1;
            }
            ok(writer.sync()).await;
        } else {
            ok(reader.pull()).await;
        }
        let horizon = from_js(reader.get_checkpoint())["horizon"].as_i64().unwrap();
        assert!(horizon >= last, "step {step}: horizon went from {last} back to {horizon}");
        last = horizon;
    }
    ok(reader.pull()).await;
    assert_eq!(ok(reader.list("todos".into())).await.as_array().unwrap().len(), written);
    writer.close();
    reader.close();
}

#[wasm_bindgen_test]
async fn an_expired_checkpoint_is_rehydrated_with_the_outbox_intact() {
    let user = random_id();
    let ids = write_rows(&user, 3).await;
    let client = open(&options(&format!("expire-{}", random_id()), &user)).await;
    let expired = record(&client, "checkpointExpired");
    let rehydrated = record(&client, "rehydrated");
    ok(client.pull()).await;
    assert_eq!(ok(client.list("todos".into())).await.as_array().unwrap().len(), 3);

    // Another device deletes a row; the reaper then prunes its tombstone, so this client's
    // checkpoint predates the retained history and can no longer be continued.
    let other = open(&options(&format!("expire-other-{}", random_id()), &user)).await;
    ok(other.pull()).await;
    ok(other.delete("todos".into(), ids[0].clone().into(), None)).await;
    ok(other.sync()).await;
    other.close();
    let reaped = reap_all_tombstones().await;
    assert!(reaped["tombstones_pruned"].as_i64().unwrap() >= 1, "{reaped}");

    ok(client.patch("todos".into(), ids[1].clone().into(), to_js(&json!({"title": "kept"})), None)).await;
    ok(client.pull()).await;
    assert_eq!(expired.length(), 1, "the expiry was announced");
    assert_eq!(rehydrated.length(), 1, "and the rehydrate");
    let rows = ok(client.list("todos".into())).await;
    let titles: std::collections::BTreeMap<String, Value> =
        rows.as_array().unwrap().iter().map(|r| (r["id"].as_str().unwrap().to_string(), r["title"].clone())).collect();
    assert!(!titles.contains_key(&ids[0]), "the snapshot was replaced: the deleted row is gone: {rows}");
    assert_eq!(titles.get(&ids[1]), Some(&json!("kept")), "the pending edit is still on screen: {rows}");
    assert!(titles.contains_key(&ids[2]));
    assert_eq!(from_js(client.pending_writes()).as_array().unwrap().len(), 1, "the outbox is intact");

    ok(client.sync()).await;
    assert_eq!(server_view(&user, "todos", &ids[1]).await["title"], "kept");
    client.close();
}

/// Integers a JS number cannot hold, anywhere in a pulled row, arrive as `JSON.parse` reads them
/// (the nearest double), as every other JS client of the server sees them. The answer is rewritten
/// on its way in: no synced table of the tests has a column that holds such a number.
#[wasm_bindgen_test]
async fn integers_beyond_two_to_the_53_arrive_as_json_parse_reads_them() {
    let user = random_id();
    let ids = write_rows(&user, 3).await;
    // A row a page: the first two are staged before the closing page commits them.
    let client = open_with_titles_rewritten("big-integers", &user,
        r#""title": 9007199254740993, "extra": [18446744073709551615, {"n": -9007199254740993}, 7]"#).await;
    // A pending edit: this key's staged row is decoded to replay the edit over it; the others'
    // staged rows are stored from their text.
    ok(client.patch("todos".into(), ids[0].clone().into(), to_js(&json!({"done": true})), None)).await;
    ok(client.pull()).await;
    let expected = from_js(js_sys::JSON::parse("[9007199254740993, 18446744073709551615, -9007199254740993]").unwrap());
    for id in &ids {
        let row = ok(client.get("todos".into(), id.clone().into())).await;
        assert_eq!(row["title"].as_f64(), expected[0].as_f64(), "{row}");
        assert_eq!(row["extra"][0].as_f64(), expected[1].as_f64(), "{row}");
        assert_eq!(row["extra"][1]["n"].as_f64(), expected[2].as_f64(), "{row}");
        assert_eq!(row["extra"][2], json!(7), "a small integer stays as it is: {row}");
    }
    client.close();
}

/// A number beyond what a double holds (a PostgreSQL `numeric` of 10^400, which it writes as its
/// 401 digits) arrives as `JSON.parse` reads it, on whichever page of a run its row comes, closing
/// page included, and stalls nothing: the run commits and the next one brings the next row. A row
/// the client decodes (a pending edit's, to replay the edit over it; an indexed table's, for its
/// tokens) holds the largest double of that sign instead, the nearest a JSON value in wasm can hold
/// to `JSON.parse`'s ±Infinity (which failed the run, every time, before). The answer is rewritten
/// on its way in, as above.
#[wasm_bindgen_test]
async fn numbers_beyond_a_double_arrive_as_json_parse_reads_them_on_every_page() {
    let user = random_id();
    let ids = write_rows(&user, 3).await;
    let huge = format!("1{}", "0".repeat(400));
    for indexed in [false, true] {
        // A row a page: the first two are staged, the third comes on the closing page.
        let opts = titles_rewritten_options("huge-numbers", &user, &["kizuna_pull"], &format!(r#""title": 1e400, "low": [-{huge}]"#));
        set(&opts, "pullLimit", json!(1));
        if indexed {
            set(&opts, "indexes", json!({"todos": ["done"]}));
        }
        let client = open(&opts).await;
        ok(client.patch("todos".into(), ids[0].clone().into(), to_js(&json!({"done": true})), None)).await;
        ok(client.pull()).await;
        let number = |row: &wasm_bindgen::JsValue, path: &[&str]| {
            path.iter().fold(row.clone(), |v, k| Reflect::get(&v, &(*k).into()).unwrap()).as_f64()
        };
        for id in &ids {
            let row = call(client.get("todos".into(), id.clone().into())).await.unwrap();
            let (high, low) = if id == &ids[0] { (f64::MAX, -f64::MAX) } else { (f64::INFINITY, f64::NEG_INFINITY) };
            assert_eq!(number(&row, &["title"]), Some(high), "{id}, indexed: {indexed}");
            assert_eq!(number(&row, &["low", "0"]), Some(low), "{id}, indexed: {indexed}");
        }
        let later = write_rows(&user, 1).await;
        ok(client.pull()).await;
        let row = call(client.get("todos".into(), later[0].clone().into())).await.unwrap();
        assert_eq!(number(&row, &["title"]), Some(f64::INFINITY), "the next run lands too");
        client.close();
    }
}

/// A row nested deeper than a JSON value in wasm can be decoded to (128 levels: a `jsonb` value
/// written in plain SQL; the gateway refuses writes nested past 64) in a table with declared
/// indexes is stored and found by its indexed columns as any other: only those columns are read in
/// wasm (reading the whole row for its tokens failed the run, every time). The answer is rewritten
/// on its way in, as above.
#[wasm_bindgen_test]
async fn a_row_nested_past_128_levels_in_an_indexed_table_is_pulled_and_found() {
    let user = random_id();
    let ids = write_rows(&user, 2).await;
    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let opts = titles_rewritten_options("deep-rows", &user, &["kizuna_pull"], &format!(r#""title": {deep}"#));
    set(&opts, "pullLimit", json!(1));
    set(&opts, "indexes", json!({"todos": ["done", "position"]}));
    let client = open(&opts).await;
    ok(client.pull()).await;
    // Read as JS values: the test's own decoder stops at 128 levels too.
    let ids_of = |rows: wasm_bindgen::JsValue| -> Vec<String> {
        js_sys::Array::from(&rows).iter().map(|r| Reflect::get(&r, &"id".into()).unwrap().as_string().unwrap()).collect()
    };
    let found = call(client.query("todos".into(), Some(to_js(&json!({"where": {"done": false}}))))).await.unwrap();
    let mut found = ids_of(found);
    found.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(found, expected);
    let second = call(client.query("todos".into(), Some(to_js(&json!({"where": {"position": 1}}))))).await.unwrap();
    assert_eq!(ids_of(second), vec![ids[1].clone()]);
    let row = call(client.get("todos".into(), ids[0].clone().into())).await.unwrap();
    let title = js_sys::JSON::stringify(&Reflect::get(&row, &"title".into()).unwrap()).unwrap();
    assert_eq!(String::from(title), deep, "the row as JSON.parse reads it");
    client.close();
}

/// A row nested 500 levels deep (a `jsonb` value written in plain SQL) is read in wasm wherever the
/// client must read it: to write over it, to replay a pending write over it as a run commits, and
/// as a refusal's server row. serde_json stops at 128 levels by default, and each of these failed
/// every time (the refusal's answer was resent for ever, holding back every write behind it). A
/// debug build, whose stack frames are the largest, decodes at this depth. The answers are
/// rewritten on their way in.
#[wasm_bindgen_test]
async fn a_row_nested_500_levels_deep_is_written_over_rebased_and_restored() {
    let user = random_id();
    let ids = write_rows(&user, 2).await;
    let deep = format!("{}1{}", "[".repeat(500), "]".repeat(500));
    let opts = titles_rewritten_options("deep-writes", &user, &["kizuna_pull", "kizuna_push"], &format!(r#""title": {deep}"#));
    let client = open(&opts).await;
    ok(client.pull()).await;
    // Written over: the stored row is read first.
    ok(client.patch("todos".into(), ids[0].clone().into(), to_js(&json!({"done": true})), None)).await;
    // Pending while a run brings the row again: the write is replayed over it.
    let writer = open(&options(&format!("deep-writer-{}", random_id()), &user)).await;
    ok(writer.patch("todos".into(), ids[0].clone().into(), to_js(&json!({"position": 7})), None)).await;
    ok(writer.sync()).await;
    writer.close();
    ok(client.pull()).await;
    // Refused by the title gate: the answer carries the server's row.
    ok(client.patch("todos".into(), ids[1].clone().into(), to_js(&json!({"title": "x".repeat(300)})), None)).await;
    ok(client.sync()).await;
    assert_eq!(from_js(client.pending_writes()), json!([]), "every write settled");
    assert_eq!(from_js(client.dead_letters()), json!([]));
    let column = |row: &wasm_bindgen::JsValue, name: &str| Reflect::get(row, &name.into()).unwrap();
    let first = call(client.get("todos".into(), ids[0].clone().into())).await.unwrap();
    assert_eq!(String::from(js_sys::JSON::stringify(&column(&first, "title")).unwrap()), deep);
    assert_eq!((column(&first, "done").as_bool(), column(&first, "position").as_f64()), (Some(true), Some(7.0)));
    let second = call(client.get("todos".into(), ids[1].clone().into())).await.unwrap();
    assert_eq!(String::from(js_sys::JSON::stringify(&column(&second, "title")).unwrap()), deep, "the server's row is back");
    assert_eq!(server_view(&user, "todos", &ids[0]).await["done"], true);
    client.close();
}

/// A refusal whose server row nests deeper than wasm decodes (600 levels: a `jsonb` value written
/// in plain SQL; the push answers are rewritten on their way in) settles with the slice: the other
/// write is applied, the refused one leaves the row as the last pull brought it, and the
/// `rejected` event carries the server's row as `JSON.parse` reads it. Before, the answer failed
/// as `NETWORK` each time it was resent, and both writes stayed pending for ever.
#[wasm_bindgen_test]
async fn a_refusal_whose_server_row_nests_past_what_wasm_decodes_holds_back_no_write() {
    let user = random_id();
    let ids = write_rows(&user, 2).await;
    let deep = format!("{}1{}", "[".repeat(600), "]".repeat(600));
    let opts = titles_rewritten_options("deep-refusal", &user, &["kizuna_push"], &format!(r#""title": {deep}"#));
    let client = open(&opts).await;
    ok(client.pull()).await;
    let title = ok(client.get("todos".into(), ids[1].clone().into())).await["title"].clone();
    let rejected = record(&client, "rejected");
    // Refused by the title gate (over 200 characters), then a write the server takes.
    ok(client.patch("todos".into(), ids[1].clone().into(), to_js(&json!({"title": "x".repeat(300)})), None)).await;
    ok(client.patch("todos".into(), ids[0].clone().into(), to_js(&json!({"done": true})), None)).await;
    let report = ok(client.sync()).await;
    assert_eq!(report["pushError"], Value::Null, "{report}");
    assert_eq!(from_js(client.pending_writes()), json!([]), "every write settled");
    assert_eq!(from_js(client.dead_letters()), json!([]));
    assert_eq!(rejected.length(), 1);
    let event = rejected.get(0);
    let server_row = Reflect::get(&event, &"serverRow".into()).unwrap();
    let column = |row: &wasm_bindgen::JsValue, name: &str| Reflect::get(row, &name.into()).unwrap();
    assert_eq!(String::from(js_sys::JSON::stringify(&column(&server_row, "title")).unwrap()), deep, "the server's row, as the answer spelled it");
    assert_eq!(from_js(Reflect::get(&event, &"reason".into()).unwrap()), json!("VALIDATION_FAILED"));
    assert_eq!(ok(client.get("todos".into(), ids[1].clone().into())).await["title"], title, "the row as the last pull brought it");
    assert_eq!(server_view(&user, "todos", &ids[0]).await["done"], true);
    client.close();
}

/// A run of many pages commits its staged rows as the closing page's: a key with a pending edit
/// keeps the edit over the server's row, the declared index finds staged rows as a scan does, and
/// a later run's staged tombstones remove their rows.
#[wasm_bindgen_test]
async fn staged_pages_commit_like_the_closing_one_edits_indexes_and_tombstones_included() {
    let user = random_id();
    let writer = open(&options(&format!("staged-w-{}", random_id()), &user)).await;
    let ids: Vec<String> = (0..6).map(|i| format!("{user}.s{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        ok(writer.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": format!("row {i}"), "done": false})), None)).await;
    }
    ok(writer.sync()).await;

    let name = format!("staged-r-{}", random_id());
    let opts = options(&name, &user);
    set(&opts, "pullLimit", json!(2));
    set(&opts, "indexes", json!({"todos": ["done"]}));
    let reader = open(&opts).await;
    // Pending when the run commits: its key's row comes in a staged page.
    ok(reader.patch("todos".into(), ids[0].clone().into(), to_js(&json!({"title": "mine"})), None)).await;
    ok(reader.pull()).await;
    let listed = ok(reader.list("todos".into())).await;
    assert_eq!(listed.as_array().unwrap().len(), 6, "{listed}");
    let first = ok(reader.get("todos".into(), ids[0].clone().into())).await;
    assert_eq!((first["title"].clone(), first["done"].clone()), (json!("mine"), json!(false)), "{first}");
    let second = ok(reader.get("todos".into(), ids[1].clone().into())).await;
    assert_eq!((second["title"].clone(), second["done"].clone()), (json!("row 1"), json!(false)), "{second}");

    // Two deleted, three done, the first left alone: five entries, in three pages again.
    for id in &ids[4..6] {
        ok(writer.delete("todos".into(), id.clone().into(), None)).await;
    }
    for id in &ids[1..4] {
        ok(writer.patch("todos".into(), id.clone().into(), to_js(&json!({"done": true})), None)).await;
    }
    ok(writer.sync()).await;
    writer.close();
    ok(reader.pull()).await;
    let short = |rows: &Value| {
        let mut ids: Vec<String> = rows.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().rsplit('.').next().unwrap().to_owned()).collect();
        ids.sort();
        ids
    };
    assert_eq!(short(&ok(reader.list("todos".into())).await), ["s0", "s1", "s2", "s3"]);
    let done = short(&ok(reader.query("todos".into(), Some(to_js(&json!({"where": {"done": true}}))))).await);
    assert_eq!(done, ["s1", "s2", "s3"], "through the declared index");
    let open_ones = short(&ok(reader.query("todos".into(), Some(to_js(&json!({"where": {"done": false}}))))).await);
    assert_eq!(open_ones, ["s0"]);
    reader.close();
    // The same database without the declaration scans, and agrees.
    let scanning = open(&options(&name, &user)).await;
    let scanned = short(&ok(scanning.query("todos".into(), Some(to_js(&json!({"where": {"done": true}}))))).await);
    assert_eq!(scanned, done);
    scanning.close();
}

/// An answer whose body is not UTF-8 is refused whole, never stored with its bad bytes replaced:
/// the pull fails as a network failure, nothing changes, and the next good answer lands.
#[wasm_bindgen_test]
async fn an_answer_that_is_not_utf8_is_refused_and_changes_nothing() {
    let user = random_id();
    let id = write_rows(&user, 1).await.remove(0);
    let corrupt = Rc::new(Cell::new(true));
    let c = corrupt.clone();
    let spoil = js_sys::Function::new_with_args(
        "url, init",
        "return fetch(url, init).then(async (r) => {
           if (!String(url).endsWith('kizuna_pull')) return r;
           const bytes = new Uint8Array(await r.arrayBuffer());
           // The first byte of the row's title becomes 0xFF, which no UTF-8 text holds.
           const at = new TextDecoder().decode(bytes).indexOf('row 0');
           bytes[at] = 0xff;
           return new Response(bytes, { status: r.status, headers: r.headers });
         })",
    );
    let opts = options(&format!("not-utf8-{}", random_id()), &user);
    Reflect::set(&opts, &"fetch".into(), &fetch_through_while(spoil, c)).unwrap();
    let client = open(&opts).await;
    let err = call(client.pull()).await.expect_err("the answer is not UTF-8");
    assert_eq!(error_code(&err), "NETWORK");
    assert_eq!(ok(client.list("todos".into())).await, json!([]), "nothing of the answer was stored");
    assert_eq!(from_js(client.get_checkpoint())["cursor"], json!(null));
    corrupt.set(false);
    ok(client.pull()).await;
    let row = ok(client.get("todos".into(), id.clone().into())).await;
    assert_eq!(row["title"], json!("row 0"), "{row}");
    client.close();
}

/// A page before the closing one that is not a page (a row that is not an object, an entry
/// without its table) is refused when it arrives, never staged: the pull fails as a network
/// failure, nothing is stored, and the next good answers land.
#[wasm_bindgen_test]
async fn a_staged_page_that_is_not_a_page_is_refused_and_changes_nothing() {
    let user = random_id();
    let ids = write_rows(&user, 2).await;
    for spoiled in ["entries[0].row = 5", "delete entries[0].table"] {
        let spoil = Rc::new(Cell::new(true));
        let s = spoil.clone();
        let edit = js_sys::Function::new_with_args(
            "url, init",
            &format!(
                "return fetch(url, init).then(async (r) => {{
                   if (!String(url).endsWith('kizuna_pull')) return r;
                   const page = await r.json();
                   const entries = page.entries;
                   if (!page.done) {{ {spoiled}; }}
                   return new Response(JSON.stringify(page), {{ status: r.status, headers: r.headers }});
                 }})"
            ),
        );
        let opts = options(&format!("not-a-page-{}", random_id()), &user);
        Reflect::set(&opts, &"fetch".into(), &fetch_through_while(edit, s)).unwrap();
        // A row a page: the first page is staged, the second closes the run.
        set(&opts, "pullLimit", json!(1));
        let client = open(&opts).await;
        let err = call(client.pull()).await.expect_err(spoiled);
        assert_eq!(error_code(&err), "NETWORK", "{spoiled}");
        assert_eq!(ok(client.list("todos".into())).await, json!([]), "{spoiled}: nothing of the run was stored");
        assert_eq!(from_js(client.get_checkpoint())["cursor"], json!(null), "{spoiled}");
        spoil.set(false);
        ok(client.pull()).await;
        for (i, id) in ids.iter().enumerate() {
            let row = ok(client.get("todos".into(), id.clone().into())).await;
            assert_eq!(row["title"], json!(format!("row {i}")), "{spoiled}: {row}");
        }
        client.close();
    }
}

/// A run's staged pages wait in memory up to `stagingMemoryBytes` and in IndexedDB past it: with
/// none in memory, with the first page only, and with all of them, the run commits every row, and
/// the next run (a page of its own) starts clean.
#[wasm_bindgen_test]
async fn staged_pages_commit_whether_they_waited_in_memory_or_in_indexeddb() {
    let user = random_id();
    let mut ids = write_rows(&user, 7).await;
    for budget in [0, 1000, 32 << 20] {
        let opts = options(&format!("staging-{budget}-{}", random_id()), &user);
        set(&opts, "pullLimit", json!(2));
        set(&opts, "stagingMemoryBytes", json!(budget));
        let reader = open(&opts).await;
        ok(reader.pull()).await;
        let mut got: Vec<String> =
            ok(reader.list("todos".into())).await.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect();
        got.sort();
        let mut want = ids.clone();
        want.sort();
        assert_eq!(got, want, "budget {budget}");
        reader.close();
    }
    let opts = options(&format!("staging-again-{}", random_id()), &user);
    set(&opts, "pullLimit", json!(2));
    set(&opts, "stagingMemoryBytes", json!(1000));
    let reader = open(&opts).await;
    ok(reader.pull()).await;
    // A second run of several pages, after one whose pages waited in both places.
    ids.extend(write_rows(&user, 5).await);
    ok(reader.pull()).await;
    assert_eq!(ok(reader.list("todos".into())).await.as_array().unwrap().len(), ids.len());
    reader.close();
}

/// A wake stream the gateway refuses for its limits (429: the caller, or the server, holds its
/// most) is asked for again a minute later, not on the backoff of a dropped stream (a quarter of
/// a second, doubling up to five): meanwhile the timers pull, and asking every few seconds would
/// only add refusals, from every refused device at once.
#[wasm_bindgen_test]
async fn a_refused_wake_stream_is_asked_for_again_only_a_minute_later() {
    let user = random_id();
    let opts = options(&random_id(), &user);
    set(&opts, "autoSync", json!(true));
    let asked = js_sys::Object::new();
    let fetch = js_sys::Function::new_with_args(
        "asked",
        "return (input, init) => {
           if (String(input.url ?? input).includes('/kizuna/v1/wake')) {
             asked.n = (asked.n ?? 0) + 1;
             return Promise.resolve(new Response(JSON.stringify({code: 'KZG05', message: 'this caller already has 16 wake streams open'}), {status: 429}));
           }
           return fetch(input, init);
         }",
    )
    .call1(&wasm_bindgen::JsValue::NULL, &asked)
    .unwrap();
    Reflect::set(&opts, &"fetch".into(), &fetch).unwrap();
    let client = open(&opts).await;
    sleep(2_500).await;
    let times = Reflect::get(&asked, &"n".into()).unwrap().as_f64().unwrap_or(0.0);
    assert_eq!(times, 1.0, "asked once, then not again within the minute");
    client.close();
}

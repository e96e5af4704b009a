//! The JS face: every bad argument is a rejected promise (or a thrown Error) with a code, and
//! stores nothing; rows follow JSON.stringify; reads see the app's own writes.

use js_sys::Function;
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_test::wasm_bindgen_test;

use crate::support::*;

/// A client as JS holds it: the object `KizunaClient.open` resolves to.
async fn open_in_js(name: &str, user: &str) -> JsValue {
    call(kizunasync::KizunaClient::open(options(name, user).into())).await.expect("the client opens")
}

/// Runs `body` as a JS function of `client` and returns what it returns.
fn js(client: &JsValue, body: &str) -> JsValue {
    Function::new_with_args("client", body).call1(&JsValue::NULL, client).expect("the snippet runs")
}

/// Runs `body` and awaits the promise it returns.
async fn js_await(client: &JsValue, body: &str) -> Result<JsValue, JsValue> {
    call(js(client, body).unchecked_into()).await
}

#[wasm_bindgen_test]
async fn bad_arguments_are_coded_errors_that_store_nothing() {
    let user = random_id();
    let client = open_in_js(&format!("args-{}", random_id()), &user).await;
    let snippets = [
        "return client.put(42, 'k', {title: 'x'})",
        "return client.put('todos', '', {title: 'x'})",
        "return client.put('todos', 'k', [1, 2])",
        "return client.put('todos', 'k', {title: NaN})",
        "return client.put('todos', 'k', {when: new Map()})",
        "return client.put('todos', 'k', {title: 'x'}, {applyAftr: 5})",
        "return client.put('todos', 'k', {title: 'x'}, {applyAfter: new Date('nonsense')})",
        "return client.put('todos', 'k', {title: 'x'}, 5)",
        "return client.patch('todos', 'k', {n: Infinity})",
        "return client.delete(null, 'k')",
        "return client.get('todos', 7)",
        "return client.list(undefined)",
        "return client.query('todos', {bucket: 3})",
        "return client.query('todos', {wher: {done: true}})",
        "return client.requeueDeadLetter(3.5)",
        "return client.requeueDeadLetter(1n)",
        "return client.requeueDeadLetter('2')",
        "return client.discardDeadLetter(null)",
        "return client.discardDeadLetter()",
        "return client.batch([{op: 'upsert', table: 'todos', pk: 'k', row: {f: () => 1}}])",
        // What PostgreSQL cannot store, or JSON cannot carry, is refused here, not queued to fail.
        "return client.put('todos', 'k', {title: 'a\\u0000b'})",
        "return client.put('todos', 'k\\u0000', {title: 'x'})",
        "return client.put('todos', 'k', {['ti\\u0000tle']: 'x'})",
        "return client.put('todos', 'k', {title: 'half \\ud83d pair'})",
        "return client.patch('todos', 'k', {note: ['\\udc00']})",
        // An array whose prototype was swapped is still an array to JSON.stringify, not columns.
        "return client.put('todos', 'k', Object.setPrototypeOf(['x'], Object.prototype))",
        // A column that cannot be read is refused, as JSON.stringify throws, not left out.
        "return client.put('todos', 'k', {title: 'x', get note() { throw new Error('unreadable') }})",
        "return client.patch('todos', 'k', {note: {get deep() { throw new Error('unreadable') }}})",
        "return client.put('todos', 'k', new Proxy({title: 'x'}, {ownKeys() { throw new Error('no keys') }}))",
        // Whatever else a getter, a Proxy trap or a revoked Proxy throws: each threw past the call
        // with no code, or (open) left its promise unsettled, or (applyAfter, where) read as absent.
        "const p = Proxy.revocable({title: 'x'}, {}); p.revoke(); return client.put('todos', 'k', p.proxy)",
        "return client.put('todos', 'k', new Proxy({}, {getPrototypeOf() { throw new Error('no prototype') }}))",
        "return client.put('todos', 'k', {tags: Object.defineProperty(['x'], 0, {get() { throw new Error('no item') }})})",
        "return client.put('todos', 'k', {tags: new Proxy(['x'], {get() { throw new Error('no length') }})})",
        "return client.put('todos', 'k', {when: Object.create(Date.prototype)})",
        "return client.put('todos', 'k', {title: 'x'}, {get applyAfter() { throw new Error('later') }})",
        "return client.put('todos', 'k', {title: 'x'}, new Proxy({}, {ownKeys() { throw new Error('no keys') }}))",
        "return client.query('todos', {get where() { throw new Error('no where') }})",
        "return client.query('todos', new Proxy({}, {ownKeys() { throw new Error('no keys') }}))",
        "return client.batch(new Proxy([], {get() { throw new Error('no items') }}))",
        "return client.batch([{get op() { throw new Error('no op') }, table: 'todos', pk: 'k'}])",
        "return client.constructor.open(new Proxy({name: 'x'}, {ownKeys() { throw new Error('no keys') }}))",
        // A batch member takes no options: a delay there was dropped and the write sent at once.
        "return client.batch([{op: 'patch', table: 'todos', pk: 'k', columns: {done: true}, applyAfter: 5}])",
        "return client.batch(['k'])",
    ];
    for snippet in snippets {
        let err = js_await(&client, snippet).await.expect_err(snippet);
        assert!(err.is_instance_of::<js_sys::Error>(), "{snippet}: an Error object");
        assert_eq!(error_code(&err), "INVALID_ARGUMENT", "{snippet}");
    }
    // A refused number is named as JS writes it, the app's own words for its value.
    for (snippet, words) in [
        ("return client.put('todos', 'k', {title: NaN})", "row.title is NaN,"),
        ("return client.patch('todos', 'k', {n: -Infinity})", "columns.n is -Infinity,"),
        ("return client.requeueDeadLetter(3.5)", "not 3.5"),
        ("return client.put('todos', 'k', {title: 'x', get note() { throw new Error('unreadable') }})", "row.note could not be read: Error: unreadable"),
        ("return client.put('todos', 'k', {title: 'x'}, {get applyAfter() { throw new Error('later') }})", "options.applyAfter could not be read: Error: later"),
        ("return client.put('todos', 'k', {tags: Object.defineProperty(['x'], 0, {get() { throw new Error('no item') }})})", "row.tags[0] could not be read"),
    ] {
        let err = js_await(&client, snippet).await.expect_err(snippet);
        let message = js_sys::Reflect::get(&err, &"message".into()).unwrap().as_string().unwrap_or_default();
        assert!(message.contains(words), "{snippet}: {message}");
    }
    let thrown = js(&client, "try { client.on('change', 42); return null } catch (e) { return e }");
    assert_eq!(error_code(&thrown), "INVALID_ARGUMENT", "on() with a listener that is not a function");
    // Unsubscribing twice (a cleanup that runs twice) does nothing more; it threw with no code.
    let twice = js(&client, "try { const off = client.on('change', () => {}); off(); off();
                                   const stop = client.watch('todos', {}, () => {}); stop(); stop(); return null } catch (e) { return e }");
    assert!(twice.is_null(), "{:?}", twice);
    assert_eq!(from_js(js(&client, "return client.pendingWrites()")), json!([]), "nothing was stored");
    js(&client, "client.close()");
}

#[wasm_bindgen_test]
async fn rows_follow_json_stringify_and_reads_see_the_apps_own_writes() {
    let user = random_id();
    let client = open_in_js(&format!("rows-{}", random_id()), &user).await;
    let id = random_id();
    js_await(&client, &format!(
        "return client.put('todos', '{id}', {{id: '{id}', title: 'with a date', note: undefined, position: 2,
                                              done: false, updated_at: new Date(Date.UTC(2026, 0, 2, 3, 4, 5))}})"
    ))
    .await
    .expect("a row with a Date and an undefined property is accepted");
    let row = from_js(js_await(&client, &format!("return client.get('todos', '{id}')")).await.unwrap());
    assert_eq!(row["updated_at"], "2026-01-02T03:04:05.000Z", "a Date is its ISO string: {row}");
    assert!(row.get("note").is_none(), "an undefined property is left out, not set to null: {row}");
    let pending = from_js(js(&client, "return client.pendingWrites()"));
    assert_eq!(pending[0]["permanentFailures"], 0, "payloads are camelCase: {pending}");
    let keys = from_js(js(&client, "return Object.keys(client.pendingWrites()[0])"));
    let documented = ["applyAfter", "attempts", "batch", "columns", "createdAt", "hlc", "id", "lastError", "latestOnly", "op",
                      "permanentFailures", "pk", "readSeq", "retryAt", "sent", "seq", "table"];
    assert_eq!(keys, json!(documented), "every field of a PendingWrite, and no other, in one order (sorted)");
    assert_eq!(pending[0]["readSeq"], 0);

    // Before any pull the row has no bucket; a bucket query still shows the app its own write.
    let bucket = format!("user:{user}");
    let query = |filter: serde_json::Value| format!("return client.query('todos', {filter})");
    let mine = from_js(js_await(&client, &query(json!({"bucket": bucket}))).await.unwrap());
    assert_eq!(mine.as_array().map(Vec::len), Some(1), "{mine}");
    js_await(&client, "return client.sync()").await.expect("sync");
    let placed = from_js(js_await(&client, &query(json!({"bucket": bucket, "where": {"done": false}}))).await.unwrap());
    assert_eq!(placed.as_array().map(Vec::len), Some(1), "{placed}");
    let none = from_js(js_await(&client, &query(json!({"where": {"done": true}}))).await.unwrap());
    assert_eq!(none, json!([]), "where filters by column equality");
    let stored = server_view(&user, "todos", &id).await;
    assert!(stored["updated_at"].as_str().is_some_and(|s| s.starts_with("2026-01-02T03:04:05")), "{stored}");
    // U+FFFD is where a broken string's lone surrogate would go once converted: the app's own is kept.
    let replacement = random_id();
    js_await(&client, &format!("return client.put('todos', '{replacement}', {{'\\ufffd': 'a\\ufffdb', tags: ['\\ufffd']}})"))
        .await
        .expect("a whole string holding U+FFFD is accepted");
    let kept = from_js(js_await(&client, &format!("return client.get('todos', '{replacement}')")).await.unwrap());
    assert_eq!(kept, json!({"\u{fffd}": "a\u{fffd}b", "tags": ["\u{fffd}"]}), "U+FFFD reaches the store as it was");
    js(&client, "client.close()");
}

#[wasm_bindgen_test]
async fn a_new_server_history_is_rehydrated_with_the_outbox_intact() {
    let user = random_id();
    let name = format!("reset-{}", random_id());
    let client = open(&options(&name, &user)).await;
    let (kept, pending) = (random_id(), random_id());
    ok(client.put("todos".into(), kept.clone().into(), to_js(&json!({"id": kept, "title": "on the server"})), None)).await;
    ok(client.sync()).await;
    let resets = record(&client, "serverReset");
    let rehydrated = record(&client, "rehydrated");

    operator(json!({"action": "new_epoch"})).await;
    ok(client.put("todos".into(), pending.clone().into(), to_js(&json!({"id": pending, "title": "not sent yet"})), None)).await;
    ok(client.pull()).await;
    assert_eq!((resets.length(), rehydrated.length()), (1, 1), "the reset is announced and the snapshot rebuilt");
    assert_eq!(ok(client.get("todos".into(), kept.clone().into())).await["title"], "on the server");
    assert_eq!(ok(client.get("todos".into(), pending.clone().into())).await["title"], "not sent yet", "the unsent write stays on screen");
    assert_eq!(from_js(client.pending_writes()).as_array().map(Vec::len), Some(1), "and in the outbox");
    ok(client.sync()).await;
    assert_eq!(server_view(&user, "todos", &pending).await["title"], "not sent yet");
    client.close();
}

/// Two clients of one database in one page stand for two tabs: both open it, one leads, the
/// other's `sync()` is run by the leader, and each reads what the other wrote at once.
#[wasm_bindgen_test]
async fn two_clients_share_one_database_and_one_leader() {
    let user = random_id();
    let name = format!("shared-{}", random_id());
    let first = open(&options(&name, &user)).await;
    let second = open(&options(&name, &user)).await;
    let leaders = || [&first, &second].iter().filter(|c| from_js(c.get_sync_health())["leader"] == json!(true)).count();
    let mut waited = 0;
    while leaders() != 1 {
        waited += 50;
        assert!(waited < 5_000, "exactly one of the two leads");
        sleep(50).await;
    }
    let follower = if from_js(first.get_sync_health())["leader"] == json!(true) { &second } else { &first };
    let changes = record(follower, "change");
    let (a, b) = (random_id(), random_id());
    ok(first.put("todos".into(), a.clone().into(), to_js(&json!({"id": a, "title": "from the first"})), None)).await;
    ok(second.put("todos".into(), b.clone().into(), to_js(&json!({"id": b, "title": "from the second"})), None)).await;
    assert_eq!(ok(second.get("todos".into(), a.clone().into())).await["title"], "from the first");
    assert_eq!(ok(first.get("todos".into(), b.clone().into())).await["title"], "from the second");
    let seqs: Vec<i64> = from_js(second.pending_writes()).as_array().unwrap().iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs.len(), 2, "one outbox holds both tabs' writes (the second wrote after the first, so its engine took the first's write in)");
    assert!(seqs[0] < seqs[1], "in the order they were made");
    let report = ok(follower.sync()).await;
    assert_eq!(report["pushes"], json!(1), "the follower's sync() ran in the leader: {report}");
    assert_eq!(server_view(&user, "todos", &a).await["title"], "from the first");
    assert_eq!(server_view(&user, "todos", &b).await["title"], "from the second");
    assert_eq!(from_js(first.pending_writes()), json!([]));
    assert_eq!(from_js(second.pending_writes()), json!([]));
    let other_tab = (0..changes.length()).map(|i| from_js(changes.get(i))).any(|c| c["keys"].to_string().contains(&a) || c["keys"].to_string().contains(&b));
    assert!(other_tab, "the follower heard the other tab's changes");
    first.close();
    second.close();
}

/// A batch of many keys reads the stored rows it names through a range of keys first
/// (`src/row_reads.rs`): its patches still assign over every stored row, whether the range holds
/// few other keys or many (read one by one then), and with keys that UTF-16 and UTF-8 order
/// differently ("\u{FFFD}" sorts after "😀" in IndexedDB, before it in Rust).
#[wasm_bindgen_test]
async fn a_large_batch_patches_the_stored_rows_it_names_and_creates_the_others() {
    let user = random_id();
    let name = format!("big-batch-{}", random_id());
    let writer = open_in_js(&name, &user).await;
    js_await(&writer, "return client.batch(Array.from({length: 200}, (_, i) => {
        const pk = 'k' + String(i).padStart(3, '0');
        return {op: 'upsert', table: 'todos', pk, row: {id: pk, title: 'stored ' + i, position: i}};
      }).concat(['\u{FFFD}', '\u{1F600}'].map((pk) => ({op: 'upsert', table: 'todos', pk, row: {id: pk, title: 'stored ' + pk}}))))")
        .await
        .expect("the stored rows are written");
    js(&writer, "client.close()");
    // Reopened, so that the engine holds none of these rows and the batches read them from the store.
    let client = open_in_js(&name, &user).await;
    // Close together: every other stored key up to k126, and 16 new keys between them.
    js_await(&client, "return client.batch(Array.from({length: 64}, (_, i) => 'k' + String(2 * i).padStart(3, '0'))
        .map((pk) => ({op: 'patch', table: 'todos', pk, columns: {done: true}}))
        .concat(Array.from({length: 16}, (_, i) => 'k' + String(2 * i).padStart(3, '0') + 'new')
          .map((pk) => ({op: 'upsert', table: 'todos', pk, row: {id: pk, title: 'new'}}))))")
        .await
        .expect("the close batch is written");
    // Spread: every fifth stored key over all 200, and one new key.
    js_await(&client, "return client.batch(Array.from({length: 40}, (_, i) => 'k' + String(5 * i + 1).padStart(3, '0'))
        .map((pk) => ({op: 'patch', table: 'todos', pk, columns: {position: -1}}))
        .concat([{op: 'upsert', table: 'todos', pk: 'k999new', row: {id: 'k999new', title: 'new'}}]))")
        .await
        .expect("the spread batch is written");
    // The two keys UTF-16 orders apart from Rust, with 30 new keys before both ('z' < both).
    js_await(&client, "return client.batch(['\u{FFFD}', '\u{1F600}']
        .map((pk) => ({op: 'patch', table: 'todos', pk, columns: {position: -1}}))
        .concat(Array.from({length: 30}, (_, i) => 'z' + i + 'new').map((pk) => ({op: 'upsert', table: 'todos', pk, row: {id: pk, title: 'new'}}))))")
        .await
        .expect("the batch of keys beyond ASCII is written");
    let rows = from_js(js_await(&client, "return client.list('todos')").await.unwrap());
    let rows: std::collections::BTreeMap<String, serde_json::Value> =
        rows.as_array().unwrap().iter().map(|r| (r["id"].as_str().unwrap_or_default().to_string(), r.clone())).collect();
    for i in 0..200 {
        let pk = format!("k{i:03}");
        let row = rows.get(&pk).unwrap_or_else(|| panic!("{pk} is still there"));
        assert_eq!(row["title"], format!("stored {i}"), "a patch keeps the columns it does not name: {row}");
        assert_eq!(row["done"], if i % 2 == 0 && i < 128 { json!(true) } else { json!(null) }, "{row}");
        assert_eq!(row["position"], if i % 5 == 1 { json!(-1) } else { json!(i) }, "{row}");
    }
    for pk in ["\u{FFFD}", "\u{1F600}"] {
        assert_eq!(rows[pk], json!({"id": pk, "title": format!("stored {pk}"), "position": -1}), "{pk}");
    }
    let created: Vec<_> = rows.iter().filter(|(k, r)| k.ends_with("new") && r["title"] == "new").collect();
    assert_eq!(created.len(), 47, "the keys no stored row had are created: {created:?}");
    assert_eq!(rows.len(), 249, "nothing else");
    js(&client, "client.close()");
}

#[wasm_bindgen_test]
async fn a_closed_client_lets_go_of_its_memory_and_still_answers_its_getters() {
    // An app that closes a client and keeps its object (in a component's state, a list of
    // accounts) must not keep its copy of the outbox in wasm memory, which never shrinks and
    // which the browser's collector does not see: each of these clients is closed with 1,000
    // pending writes of about 300 bytes, and all of them stay referenced.
    let user = random_id();
    let memory = || wasm_bindgen::memory().unchecked_into::<js_sys::WebAssembly::Memory>().buffer().unchecked_into::<js_sys::ArrayBuffer>().byte_length();
    let note = "n".repeat(250);
    let mut kept = Vec::new();
    let mut sizes = Vec::new();
    for _ in 0..16 {
        let client = open(&options(&format!("let-go-{}", random_id()), &user)).await;
        let writes: Value = (0..1000).map(|i| json!({"op": "upsert", "table": "todos", "pk": format!("r{i}"), "row": {"id": format!("r{i}"), "note": note}})).collect::<Vec<_>>().into();
        ok(client.batch(to_js(&writes))).await;
        let live = from_js(client.pending_writes());
        client.close();
        sleep(0).await;
        assert_eq!(from_js(client.pending_writes()), live, "a closed client still answers what is pending, as it did");
        assert_eq!(from_js(client.status())["pending"], 1000);
        kept.push(client);
        sizes.push(memory());
    }
    let grown = sizes[15] - sizes[3];
    assert!(grown < 8 << 20, "twelve closed clients grew wasm memory by {grown} bytes: {sizes:?}");
    drop(kept);
}

/// A value nested deeper than a push request may carry it (the gateway refuses a request past 64
/// levels, which held back every write behind it until the write became a dead letter; past 128
/// the stored entry did not decode and the database no longer opened), and an object that holds
/// itself (which recursed until the stack ran out, and the call never settled), are refused at the
/// call: a coded error that stores nothing, and the client goes on. A row at the limit syncs.
#[wasm_bindgen_test]
async fn a_value_nested_past_what_the_server_takes_is_refused_at_the_call() {
    let user = random_id();
    let name = format!("nested-{}", random_id());
    let client = open_in_js(&name, &user).await;
    let nest = |levels: usize, inner: &str| format!("let v = 1; for (let i = 0; i < {levels}; i++) v = {inner}; ");
    let snippets = [
        "const row = {title: 'x'}; row.self = row; return client.put('todos', 'k', row)".to_string(),
        "const a = []; a.push(a); return client.patch('todos', 'k', {note: a})".to_string(),
        format!("{}return client.put('todos', 'k', {{title: 'x', note: v}})", nest(61, "[v]")),
        format!("{}return client.batch([{{op: 'patch', table: 'todos', pk: 'k', columns: {{note: v}}}}])", nest(100_000, "{v}")),
        format!("{}return client.query('todos', {{where: {{note: v}}}})", nest(61, "{v}")),
    ];
    for snippet in &snippets {
        let err = js_await(&client, snippet).await.expect_err(snippet);
        assert_eq!(error_code(&err), "INVALID_ARGUMENT", "{snippet}");
        let message = js_sys::Reflect::get(&err, &"message".into()).unwrap().as_string().unwrap_or_default();
        assert!(message.contains("is nested deeper than 60 levels"), "{snippet}: {message}");
    }
    assert_eq!(from_js(js(&client, "return client.pendingWrites()")), json!([]), "nothing was stored");

    let id = random_id();
    js_await(&client, &format!("{}return client.put('todos', '{id}', {{id: '{id}', title: 'deep', note: v}})", nest(60, "[v]"))).await.expect("at the limit");
    js_await(&client, "return client.sync()").await.expect("the server takes it");
    assert_eq!(from_js(js(&client, "return client.pendingWrites()")), json!([]));
    assert_eq!(from_js(js(&client, "return client.deadLetters()")), json!([]));
    assert_eq!(server_view(&user, "todos", &id).await["title"], "deep");
    js(&client, "client.close()");
}

/// A delay window the wire cannot name (its RFC 3339 text has four-digit years, and PostgreSQL no
/// year 0) is refused at the call: sent, it failed its whole push request as malformed, and the
/// writes behind it waited until it became a dead letter. The earliest instant it can name is in
/// the past, so the write goes at once.
#[wasm_bindgen_test]
async fn a_delay_the_wire_cannot_name_is_refused_at_the_call() {
    let user = random_id();
    let client = open_in_js(&format!("far-{}", random_id()), &user).await;
    for after in ["1e300", "-1e300", "new Date(-8.64e15)", "253402300800000", "new Date('0000-12-31T23:59:59.999Z')"] {
        let snippet = format!("return client.put('todos', 'k', {{title: 'x'}}, {{applyAfter: {after}}})");
        let err = js_await(&client, &snippet).await.expect_err(&snippet);
        assert_eq!(error_code(&err), "INVALID_ARGUMENT", "{snippet}");
    }
    assert_eq!(from_js(js(&client, "return client.pendingWrites()")), json!([]), "nothing was stored");
    let (id, next) = (random_id(), random_id());
    js_await(&client, &format!("return client.put('todos', '{id}', {{id: '{id}', title: 'old'}}, {{applyAfter: new Date('0001-01-01T00:00:00.000Z')}})")).await.expect("year 1");
    js_await(&client, &format!("return client.put('todos', '{next}', {{id: '{next}', title: 'next'}})")).await.expect("a write behind it");
    js_await(&client, "return client.sync()").await.expect("sync");
    assert_eq!(from_js(js(&client, "return client.pendingWrites()")), json!([]));
    assert_eq!(from_js(js(&client, "return client.deadLetters()")), json!([]));
    assert_eq!(server_view(&user, "todos", &id).await["title"], "old");
    assert_eq!(server_view(&user, "todos", &next).await["title"], "next");
    js(&client, "client.close()");
}

/// Waits no timer can hold (`pullIntervalMs`, `retryBaseMs`, `retryMaxMs` of 1e300) are held to the
/// longest a browser timer waits: added to the clock they overflowed (a debug build panicked and
/// the sync never settled; a release build's next time fell into the past, a tight loop).
#[wasm_bindgen_test]
async fn waits_longer_than_a_timer_holds_are_held_to_the_longest() {
    let user = random_id();
    let opts = options(&format!("waits-{}", random_id()), &user);
    for key in ["pullIntervalMs", "retryBaseMs", "retryMaxMs"] {
        set(&opts, key, json!(1e300));
    }
    let client = open(&opts).await;
    ok(client.put("todos".into(), "w".into(), to_js(&json!({"id": "w", "title": "x"})), None)).await;
    ok(client.sync()).await;
    assert_eq!(from_js(client.pending_writes()), json!([]));
    client.close();
}

/// A message on the tabs' channel that no build of this client sends (other code of the page may
/// post there) does not break a follower: `getSyncHealth()` answers (a heartbeat whose health was
/// not an object trapped the module, and the client with it).
#[wasm_bindgen_test]
async fn a_stray_message_on_the_tabs_channel_breaks_no_follower() {
    let (name, user) = (format!("stray-{}", random_id()), random_id());
    let first = open(&options(&name, &user)).await;
    let second = open(&options(&name, &user)).await;
    sleep(100).await;
    let leads = |c: &kizunasync::KizunaClient| from_js(c.get_sync_health())["leader"] == json!(true);
    let follower = if leads(&first) { &second } else { &first };
    assert!(!leads(follower), "one of the two follows");
    let channel = web_sys::BroadcastChannel::new(&format!("kizuna:{name}")).unwrap();
    for stray in [r#"{"heartbeat":{"from":"x","health":1}}"#, r#"{"heartbeat":{"from":"x","health":[true]}}"#, "nonsense", "{}"] {
        channel.post_message(&JsValue::from_str(stray)).unwrap();
        sleep(50).await;
        let health = from_js(follower.get_sync_health());
        assert!(health.is_object(), "{stray}: {health}");
        assert_eq!(health["leader"], json!(false), "{stray}: {health}");
    }
    channel.close();
    ok(follower.put("todos".into(), "k".into(), to_js(&json!({"id": "k"})), None)).await;
    first.close();
    second.close();
}

/// A `where` condition whose value is `undefined` (`{ done: row?.done }` with no row) is refused,
/// by a query and a live query alike: left out, as a row leaves such a column out, it would match
/// every row.
#[wasm_bindgen_test]
async fn a_condition_without_a_value_is_refused() {
    let client = open(&options(&format!("undefined-where-{}", random_id()), &random_id())).await;
    ok(client.put("todos".into(), "a".into(), to_js(&json!({"id": "a", "done": true})), None)).await;
    let filter = js_sys::Object::new();
    let conditions = js_sys::Object::new();
    js_sys::Reflect::set(&conditions, &"done".into(), &JsValue::UNDEFINED).unwrap();
    js_sys::Reflect::set(&filter, &"where".into(), &conditions).unwrap();
    let refused = call(client.query("todos".into(), Some(filter.clone().into()))).await.expect_err("refused");
    assert_eq!(error_code(&refused), "INVALID_ARGUMENT");
    let listener = Function::new_no_args("");
    let refused = client.watch("todos".into(), filter.into(), listener.into()).expect_err("refused");
    assert_eq!(error_code(&refused), "INVALID_ARGUMENT");
    client.close();
}

/// Opens a client of a new database from JS and another of the same database (another tab), runs
/// `write(id)` (a JS body of `client` that writes the row `id` and returns its promise) in the
/// first, and waits until the other has heard of that row in a `change` event.
async fn another_tab_hears(write: impl FnOnce(&str) -> String) -> (JsValue, kizunasync::KizunaClient, String) {
    let user = random_id();
    let name = format!("told-{}", random_id());
    let writer = open_in_js(&name, &user).await;
    let other = open(&options(&name, &user)).await;
    let heard = record(&other, "change");
    let id = random_id();
    js_await(&writer, &write(&id)).await.expect("the write commits");
    let mut waited = 0;
    while !(0..heard.length()).any(|i| from_js(heard.get(i))["keys"].to_string().contains(&id)) {
        waited += 20;
        assert!(waited < 3_000, "the other tab heard of the write");
        sleep(20).await;
    }
    (writer, other, id)
}

/// A page hidden right after a write commits (to be closed, or discarded while hidden, as mobile
/// browsers do) still tells the other tabs: the announcement waits for a 0 ms timer, which a page
/// closed meanwhile never runs, and `pagehide` or `visibilitychange` posts it at once. Zero-delay
/// timers are held back here, as a closing page's never run.
#[wasm_bindgen_test]
async fn a_page_hidden_right_after_a_write_still_tells_the_other_tabs() {
    for hide in ["globalThis.dispatchEvent(new Event('pagehide'))", "document.dispatchEvent(new Event('visibilitychange', {bubbles: true}))"] {
        let (hiding, other, _) = another_tab_hears(|id| format!(
            "const real = globalThis.setTimeout;
             globalThis.setTimeout = (f, ms, ...rest) => (ms ? real(f, ms, ...rest) : 0);
             return client.put('todos', '{id}', {{id: '{id}', title: 'last words'}})
               .then(() => {hide})
               .finally(() => {{ globalThis.setTimeout = real; }})"
        ))
        .await;
        js(&hiding, "client.close()");
        other.close();
    }
}

/// A write whose step commits while its client closes is still told to the other tabs: the step
/// announced it after the channel was closed, and the other tab's `change` (its live queries)
/// never came. Closing from the write's own `change` listener puts the close right between the
/// commit and the announcement.
#[wasm_bindgen_test]
async fn a_write_committing_while_its_client_closes_is_still_told_to_the_other_tabs() {
    let (_, other, id) = another_tab_hears(|id| format!(
        "client.on('change', () => client.close()); return client.put('todos', '{id}', {{id: '{id}', title: 'last words'}})"
    ))
    .await;
    assert_eq!(ok(other.get("todos".into(), id.clone().into())).await["title"], "last words");
    other.close();
}

/// `free()` (also `client[Symbol.dispose]()`, which `using` calls) leaves a closed client: every
/// later call is refused with `CLIENT_CLOSED`, as after `close()`, and the database opens again.
/// Before, wasm-bindgen's own `free()` freed the object, and every later call threw its "null
/// pointer passed to rust", an Error without a code.
#[wasm_bindgen_test]
async fn calls_after_free_are_refused_with_a_code() {
    let (name, user) = (format!("freed-{}", random_id()), random_id());
    let client = open_in_js(&name, &user).await;
    js(&client, "client.free(); client.free(); client[Symbol.dispose]();");
    for snippet in [
        "return client.put('todos', 'k', {title: 'x'})",
        "return client.get('todos', 'k')",
        "return client.list('todos')",
        "return client.sync()",
    ] {
        let err = js_await(&client, snippet).await.expect_err(snippet);
        assert_eq!(error_code(&err), "CLIENT_CLOSED", "{snippet}");
    }
    let thrown = js(&client, "try { client.watch('todos', {}, () => {}); return null } catch (e) { return e }");
    assert_eq!(error_code(&thrown), "CLIENT_CLOSED");
    assert!(js(&client, "return client.status()").is_object(), "the status getters still answer");
    js(&client, "client.close()");
    let again = open_in_js(&name, &user).await;
    assert_eq!(js_await(&again, "return client.list('todos')").await.map(|rows| from_js(rows)).ok(), Some(json!([])));
    js(&again, "client.close()");
}

//! The outbox against the real server: a lost acknowledgement, a refusal, a poisoned write,
//! and reloads in the middle of them.

use js_sys::Reflect;
use serde_json::{json, Value};
use wasm_bindgen::JsValue;
use wasm_bindgen_test::wasm_bindgen_test;

use crate::support::*;

#[wasm_bindgen_test]
async fn a_lost_acknowledgement_followed_by_a_retry_has_one_effect() {
    let user = random_id();
    let id = random_id();
    let opts = options(&format!("lost-ack-{}", random_id()), &user);
    // The server commits the first push, but its answer never arrives.
    let fetch = faulty_fetch(|url, n| if url.ends_with("kizuna_push") && n == 1 { Fault::LoseAnswer } else { Fault::Pass });
    Reflect::set(&opts, &"fetch".into(), &fetch).unwrap();
    let client = open(&opts).await;
    let applied = record(&client, "applied");

    ok(client.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": "once"})), None)).await;
    let lost = call(client.sync()).await.expect_err("the lost answer fails the sync");
    assert_eq!(error_code(&lost), "NETWORK");
    assert_eq!(from_js(client.pending_writes()).as_array().unwrap().len(), 1, "the write is still pending");
    assert_eq!(ok(client.get("todos".into(), id.clone().into())).await["title"], "once", "and still visible");

    sleep(40).await;
    let report = ok(client.sync()).await;
    assert_eq!(report["pushes"], 1, "{report}");
    assert_eq!(from_js(client.pending_writes()), json!([]));
    assert_eq!(applied.length(), 1, "one acknowledgement reached the app");
    let seq = from_js(applied.get(0))["seq"].as_i64().expect("the verdict names its commit");
    let horizon = from_js(client.get_checkpoint())["horizon"].as_i64().unwrap();
    assert_eq!(horizon, seq, "the retry committed nothing new: the replayed verdict is the first commit");
    assert_eq!(server_view(&user, "todos", &id).await["title"], "once");
    client.close();
}

#[wasm_bindgen_test]
async fn a_refused_write_restores_the_server_row_and_says_why() {
    let user = random_id();
    let id = random_id();
    let client = open(&options(&format!("refused-{}", random_id()), &user)).await;
    let rejected = record(&client, "rejected");
    ok(client.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": "short"})), None)).await;
    ok(client.sync()).await;

    let long_title = "x".repeat(300);
    ok(client.patch("todos".into(), id.clone().into(), to_js(&json!({"title": long_title})), None)).await;
    assert_eq!(ok(client.get("todos".into(), id.clone().into())).await["title"], long_title.as_str(), "optimistic at first");
    ok(client.sync()).await;

    assert_eq!(rejected.length(), 1);
    let event = from_js(rejected.get(0));
    assert_eq!(event["reason"], "VALIDATION_FAILED", "{event}");
    assert_eq!(event["message"], "the table's validation gate refused the row", "{event}");
    assert_eq!(event["serverRow"]["title"], "short");
    assert_eq!(event["mutation"]["pk"], id.as_str());
    assert_eq!(ok(client.get("todos".into(), id.clone().into())).await["title"], "short", "the server's row is back");
    assert_eq!(from_js(client.status())["rejected"], 1);
    assert_eq!(from_js(client.pending_writes()), json!([]));
    client.close();
}

#[wasm_bindgen_test]
async fn a_poisoned_write_is_dead_lettered_after_five_tries_while_the_writes_behind_it_land() {
    let user = random_id();
    let name = format!("poison-{}", random_id());
    let poison = random_id();
    let good: Vec<String> = (0..3).map(|_| random_id()).collect();
    let mut client = open(&options(&name, &user)).await;
    // Larger than the pack's max_row_bytes: the server refuses the request with KZP04, every time.
    let note = "x".repeat(70_000);
    ok(client.put("todos".into(), poison.clone().into(), to_js(&json!({"id": poison, "note": note})), None)).await;
    for id in &good {
        ok(client.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": "fine"})), None)).await;
    }

    let mut dead_events = record(&client, "deadLetter");
    let mut rounds = 0;
    while from_js(client.dead_letters()).as_array().unwrap().is_empty() {
        rounds += 1;
        assert!(rounds < 60, "the poisoned write was never dead-lettered");
        let report = ok(client.sync()).await;
        if report["pushError"].is_object() {
            assert_eq!(report["pushError"]["code"], "KZP04", "{report}");
        }
        if rounds == 2 {
            // A reload in the middle: the budget already used and the queue survive it.
            client.close();
            client = open(&options(&name, &user)).await;
            dead_events = record(&client, "deadLetter");
        }
        sleep(25).await;
    }
    let dead = from_js(client.dead_letters());
    assert_eq!(dead[0]["entry"]["pk"], poison.as_str(), "{dead}");
    assert_eq!(dead[0]["entry"]["permanentFailures"], 5, "{dead}");
    assert_eq!(dead_events.length(), 1, "the dead letter was announced");
    assert_eq!(ok(client.get("todos".into(), poison.clone().into())).await, json!(null), "its local effect is undone");

    ok(client.sync()).await;
    assert_eq!(from_js(client.pending_writes()), json!([]), "the rest of the queue moved on");
    for id in &good {
        assert_eq!(server_view(&user, "todos", id).await["title"], "fine", "write {id} landed");
    }
    assert_eq!(server_view(&user, "todos", &poison).await, json!(null));
    client.close();
}

#[wasm_bindgen_test]
async fn a_missing_or_hung_session_fails_the_sync_as_retryable_and_loses_nothing() {
    use wasm_bindgen::prelude::Closure;
    let user = random_id();
    let name = format!("session-{}", random_id());
    let id = random_id();

    let signed_out = options(&name, &user);
    let no_token = Closure::<dyn Fn() -> JsValue>::new(|| JsValue::NULL);
    Reflect::set(&signed_out, &"token".into(), &no_token.into_js_value()).unwrap();
    let client = open(&signed_out).await;
    ok(client.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": "offline draft"})), None)).await;
    let err = call(client.sync()).await.expect_err("no session, no sync");
    assert_eq!(error_code(&err), "AUTH_SESSION_MISSING");
    assert_eq!(Reflect::get(&err, &"retryable".into()).unwrap(), JsValue::TRUE);
    client.close();

    // A session lookup that never settles fails the run after 10 s instead of hanging it.
    let hung = options(&name, &user);
    let never = js_sys::Function::new_no_args("return new Promise(() => {})");
    Reflect::set(&hung, &"token".into(), &never).unwrap();
    let client = open(&hung).await;
    let err = call(client.sync()).await.expect_err("a hung lookup fails the run");
    assert_eq!(error_code(&err), "AUTH_SESSION_TIMEOUT");
    assert_eq!(from_js(client.pending_writes()).as_array().unwrap().len(), 1, "the write is still queued");
    client.close();

    let client = open(&options(&name, &user)).await;
    let report = ok(client.sync()).await;
    assert_eq!(report["pushes"], 1, "{report}");
    assert_eq!(server_view(&user, "todos", &id).await["title"], "offline draft");
    client.close();
}

/// Syncs until `done` holds; a retry backoff under this suite's options is at most 20 ms.
async fn sync_until(client: &kizunasync::KizunaClient, what: &str, done: impl Fn(&kizunasync::KizunaClient) -> bool) {
    for _ in 0..60 {
        if done(client) {
            return;
        }
        ok(client.sync()).await;
        sleep(25).await;
    }
    panic!("{what} never happened");
}

fn dead_count(client: &kizunasync::KizunaClient) -> usize {
    from_js(client.dead_letters()).as_array().map_or(0, Vec::len)
}

#[wasm_bindgen_test]
async fn a_dead_letter_is_kept_across_a_reload_and_can_be_requeued_or_discarded() {
    let user = random_id();
    let name = format!("dead-api-{}", random_id());
    let poison = random_id();
    let client = open(&options(&name, &user)).await;
    let note = "x".repeat(70_000);
    ok(client.put("todos".into(), poison.clone().into(), to_js(&json!({"id": poison, "note": note})), None)).await;
    sync_until(&client, "the first dead letter", |c| dead_count(c) == 1).await;
    let first_seq = from_js(client.dead_letters())[0]["entry"]["seq"].as_f64().unwrap();
    client.close();

    let client = open(&options(&name, &user)).await;
    assert_eq!(dead_count(&client), 1, "the dead letter survives a reload");
    assert_eq!(from_js(client.status())["deadLetters"], 1);
    assert_eq!(ok(client.get("todos".into(), poison.clone().into())).await, json!(null), "its local effect stays undone");

    let missing = call(client.requeue_dead_letter((first_seq + 1000.0).into())).await.expect_err("no such dead letter");
    assert_eq!(error_code(&missing), "NOT_FOUND");

    ok(client.requeue_dead_letter(first_seq.into())).await;
    assert_eq!(dead_count(&client), 0);
    let pending = from_js(client.pending_writes());
    assert_eq!(pending.as_array().unwrap().len(), 1, "{pending}");
    assert!(pending[0]["seq"].as_f64().unwrap() > first_seq, "a requeued write gets a new sequence number");
    assert_eq!(pending[0]["permanentFailures"], 0, "and a fresh budget");
    assert_eq!(ok(client.get("todos".into(), poison.clone().into())).await["note"].as_str().map(str::len), Some(70_000), "visible again");

    sync_until(&client, "the requeued write's dead letter", |c| dead_count(c) == 1).await;
    let second_seq = from_js(client.dead_letters())[0]["entry"]["seq"].as_f64().unwrap();
    ok(client.discard_dead_letter(second_seq.into())).await;
    assert_eq!(dead_count(&client), 0);
    assert_eq!(from_js(client.pending_writes()), json!([]));
    assert_eq!(from_js(client.status())["deadLetters"], 0);
    assert_eq!(ok(client.get("todos".into(), poison.clone().into())).await, json!(null));
    client.close();
    let client = open(&options(&name, &user)).await;
    assert_eq!(dead_count(&client), 0, "a discard is durable");
    client.close();
}

#[wasm_bindgen_test]
async fn an_atomic_batch_lands_whole_or_is_refused_whole() {
    let user = random_id();
    let client = open(&options(&format!("batch-{}", random_id()), &user)).await;
    let upsert = |id: &str, title: &str| json!({"op": "upsert", "table": "todos", "pk": id, "row": {"id": id, "title": title}});

    for bad in [json!([]), json!([{"op": "merge", "table": "todos", "pk": "k"}]), json!([{"op": "upsert", "table": "todos", "pk": "k", "row": 3}]), json!([{"op": "delete", "table": "", "pk": "k"}])] {
        let err = call(client.batch(to_js(&bad))).await.expect_err("a malformed batch is refused");
        assert_eq!(error_code(&err), "INVALID_ARGUMENT", "{bad}");
    }
    assert_eq!(from_js(client.pending_writes()), json!([]), "a refused batch stores nothing");

    let (a, b) = (random_id(), random_id());
    ok(client.batch(to_js(&json!([upsert(&a, "a"), upsert(&b, "b")])))).await;
    let report = ok(client.sync()).await;
    assert_eq!(report["pushes"], 1, "{report}");
    assert_eq!(server_view(&user, "todos", &a).await["title"], "a");
    assert_eq!(server_view(&user, "todos", &b).await["title"], "b");

    // One member fails the validation gate: neither lands, and each says why.
    let rejected = record(&client, "rejected");
    let (c, d) = (random_id(), random_id());
    ok(client.batch(to_js(&json!([upsert(&c, "fine"), upsert(&d, &"x".repeat(300))])))).await;
    assert_eq!(ok(client.get("todos".into(), c.clone().into())).await["title"], "fine", "optimistic at first");
    ok(client.sync()).await;
    let reasons: std::collections::BTreeMap<String, String> = (0..rejected.length())
        .map(|i| from_js(rejected.get(i)))
        .map(|e| (e["mutation"]["pk"].as_str().unwrap().to_string(), e["reason"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(reasons.get(&c).map(String::as_str), Some("BATCH_ABORTED"), "{reasons:?}");
    assert_eq!(reasons.get(&d).map(String::as_str), Some("VALIDATION_FAILED"), "{reasons:?}");
    for id in [&c, &d] {
        assert_eq!(ok(client.get("todos".into(), id.clone().into())).await, json!(null), "{id} is taken back locally");
        assert_eq!(server_view(&user, "todos", id).await, json!(null), "{id} never reached the server");
    }
    client.close();
}

#[wasm_bindgen_test]
async fn an_answer_that_stalls_half_way_fails_the_sync_at_the_deadline() {
    let user = random_id();
    let id = random_id();
    let opts = options(&format!("stall-{}", random_id()), &user);
    set(&opts, "requestTimeoutMs", json!(500));
    let fetch = faulty_fetch(|url, n| if url.ends_with("kizuna_push") && n == 1 { Fault::StallBody } else { Fault::Pass });
    Reflect::set(&opts, &"fetch".into(), &fetch).unwrap();
    let client = open(&opts).await;
    ok(client.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": "stalled"})), None)).await;
    let err = call(client.sync()).await.expect_err("a stalled answer must not hang sync()");
    assert_eq!(error_code(&err), "TIMEOUT");
    let report = ok(client.sync()).await;
    assert_eq!(report["pushes"], 1, "the next sync delivers the write: {report}");
    assert_eq!(server_view(&user, "todos", &id).await["title"], "stalled");
    client.close();
}

#[wasm_bindgen_test]
async fn a_reload_while_a_push_is_in_flight_loses_nothing_and_applies_once() {
    let user = random_id();
    let name = format!("reload-in-flight-{}", random_id());
    let id = random_id();
    let applied_before = applied_total().await;
    let opts = options(&name, &user);
    let sent = std::rc::Rc::new(std::cell::Cell::new(false));
    let on_wire = sent.clone();
    let fetch = faulty_fetch(move |url, _| {
        if url.ends_with("kizuna_push") {
            on_wire.set(true);
        }
        Fault::Pass
    });
    Reflect::set(&opts, &"fetch".into(), &fetch).unwrap();
    let client = open(&opts).await;
    ok(client.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": "in flight"})), None)).await;
    let interrupted = client.sync();
    while !sent.get() {
        sleep(0).await;
    }
    client.close(); // the tab goes away with the push on the wire, before its answer is written down
    let _ = call(interrupted).await;

    let client = open(&options(&name, &user)).await;
    assert_eq!(from_js(client.pending_writes()).as_array().map(Vec::len), Some(1), "the write survived the reload");
    ok(client.sync()).await;
    assert_eq!(from_js(client.pending_writes()), json!([]));
    assert_eq!(server_view(&user, "todos", &id).await["title"], "in flight");
    let applied_after = applied_total().await;
    assert_eq!(applied_after - applied_before, 1, "one effect: the resend was answered from the ledger");
    client.close();
}

#[wasm_bindgen_test]
async fn numbers_reach_the_server_digit_for_digit() {
    // A JS number goes out as its shortest round-trip form, never rounded further: the server
    // stores the very double the app wrote. (A value beyond a double is written as a string,
    // which numeric columns take exactly.)
    let user = random_id();
    let id = random_id();
    let client = open(&options(&format!("digits-{}", random_id()), &user)).await;
    let row = json!({"id": id, "title": "digits", "position": 0.1_f64 + 0.2_f64, "note": "123456789012345678901234567890"});
    ok(client.put("todos".into(), id.clone().into(), to_js(&row), None)).await;
    ok(client.sync()).await;
    let pull = json!({"protocol": 1, "client_id": random_id(), "cursor": null, "buckets": [format!("user:{user}")], "limit": 10});
    let (status, text) = rpc_text("kizuna_pull", &token_for(&user), &pull).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("0.30000000000000004"), "the double was rounded on the way: {text}");
    assert!(text.contains("\"123456789012345678901234567890\""), "{text}");
    client.close();
}

#[wasm_bindgen_test]
async fn numbers_come_back_from_the_server_bit_for_bit() {
    // The server's answers are read in wasm (a push's verdict rows, the rows of pulled pages a
    // pending write touches): each double must be the very one the server sent. A reader that
    // rounds its last digit (serde_json without float_roundtrip read 0.10200000000000001 as 0.102,
    // and about one random double in three one bit off) would hand the app a value it never wrote.
    let user = random_id();
    let doubles = [0.1_f64 + 0.7, 0.10200000000000001, -1.81996730402717e-179, 1.603964615428183e143, 9.643915712060552e-234];
    let client = open(&options(&format!("bits-{}", random_id()), &user)).await;
    let ids: Vec<String> = doubles.iter().map(|_| random_id()).collect();
    for (id, x) in ids.iter().zip(doubles) {
        ok(client.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": "bits", "position": x})), None)).await;
    }
    // The verdict rows settle each row: the app now reads the server's row.
    ok(client.sync()).await;
    // A pending write on the row: the next pull's page is read in wasm to rebase it.
    let edited = &ids[1];
    ok(client.patch("todos".into(), edited.clone().into(), to_js(&json!({"title": "edited"})), None)).await;
    ok(client.pull()).await;
    let fresh = open(&options(&format!("bits-fresh-{}", random_id()), &user)).await;
    ok(fresh.sync()).await;
    for reader in [&client, &fresh] {
        for (id, x) in ids.iter().zip(doubles) {
            let row = call(reader.get("todos".into(), id.clone().into())).await.expect("get");
            let position = js_sys::Reflect::get(&row, &"position".into()).unwrap().as_f64();
            assert_eq!(position.map(f64::to_bits), Some(x.to_bits()), "{id}: {position:?}, written {x:?}");
        }
    }
    client.close();
    fresh.close();
}

/// A number beyond what a double holds in a refusal's server row (a PostgreSQL `numeric` of 10^400,
/// which it writes as its 401 digits) stalls nothing: the answer is read, the refused write gives
/// way to the server's row and the next write goes (the whole answer was refused before, and its
/// slice resent for ever, holding back every write behind it). The restored row holds the largest
/// double of that sign, the nearest a JSON value in wasm can hold to `JSON.parse`'s ±Infinity. The
/// answers are rewritten on their way in: no synced table of the tests has such a column.
#[wasm_bindgen_test]
async fn a_number_beyond_a_double_in_a_refusal_stalls_nothing() {
    let user = random_id();
    let huge = format!("1{}", "0".repeat(400));
    let opts = options(&format!("huge-verdict-{}", random_id()), &user);
    Reflect::set(&opts, &"fetch".into(), &titles_rewritten(&["kizuna_push"], &format!(r#""title": {huge}, "low": -{huge}"#))).unwrap();
    let client = open(&opts).await;
    let rejected = record(&client, "rejected");
    let (id, next) = (random_id(), random_id());
    ok(client.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": "short"})), None)).await;
    ok(client.sync()).await;
    // Refused by the table's title gate: the answer carries the server's row.
    ok(client.patch("todos".into(), id.clone().into(), to_js(&json!({"title": "x".repeat(300)})), None)).await;
    ok(client.put("todos".into(), next.clone().into(), to_js(&json!({"id": next, "title": "next"})), None)).await;
    ok(client.sync()).await;
    assert_eq!(rejected.length(), 1);
    assert_eq!(from_js(client.pending_writes()), json!([]), "the answer was read: both writes settled");
    assert_eq!(from_js(client.dead_letters()), json!([]));
    let row = call(client.get("todos".into(), id.clone().into())).await.expect("get");
    let number = |column: &str| Reflect::get(&row, &column.into()).unwrap().as_f64();
    assert_eq!((number("title"), number("low")), (Some(f64::MAX), Some(-f64::MAX)), "the server's row is back");
    assert_eq!(server_view(&user, "todos", &next).await["title"], "next", "the write behind it landed");
    client.close();
}

/// A page that goes away while it tells what a push decided (a reload, here a listener that
/// closes the client half-way) does not take the rest with it: the verdict step kept its events
/// with its commit, and the next client to open the database tells them to its first listener.
#[wasm_bindgen_test]
async fn the_verdicts_a_closing_page_did_not_tell_are_told_by_the_next_page() {
    let user = random_id();
    let name = format!("unheard-{}", random_id());
    let client = std::rc::Rc::new(open(&options(&name, &user)).await);
    for id in ["first", "second"] {
        ok(client.put("todos".into(), id.into(), to_js(&json!({"id": id, "title": id})), None)).await;
    }
    let ids: Vec<Value> = from_js(client.pending_writes()).as_array().unwrap().iter().map(|w| w["id"].clone()).collect();
    assert_eq!(ids.len(), 2);
    let heard = js_sys::Array::new();
    let (closing, sink) = (client.clone(), heard.clone());
    let listener = wasm_bindgen::closure::Closure::<dyn Fn(JsValue)>::new(move |e: JsValue| {
        sink.push(&e);
        closing.close(); // the page goes away after the first event of the step
    });
    client.on("applied".into(), listener.into_js_value()).unwrap();
    let _ = call(client.sync()).await;
    assert_eq!(heard.length(), 1, "the closed client told nothing more");

    let next = open(&options(&name, &user)).await;
    let told = record(&next, "applied");
    sleep(0).await;
    let told: Vec<Value> = told.iter().map(|e| from_js(e)["id"].clone()).collect();
    assert!(told.contains(&ids[1]), "the second write's verdict was told by the next page: {told:?}");
    assert_eq!(from_js(next.pending_writes()), json!([]), "both writes left the outbox with the step");
    ok(next.sync()).await;
    let again = record(&next, "applied");
    sleep(0).await;
    assert_eq!(again.length(), 0, "told once, then dropped");
    next.close();
}

/// An answer's settled entries leave the outbox in runs of consecutive sequence numbers; a write
/// between them that the answer left queued (its delay window is ahead) stays, across a reload.
#[wasm_bindgen_test]
async fn a_delayed_write_between_applied_ones_stays_queued_across_a_reload() {
    let user = random_id();
    let name = format!("delayed-between-{}", random_id());
    let client = open(&options(&name, &user)).await;
    let ids: Vec<String> = (0..4).map(|_| random_id()).collect();
    for (i, id) in ids.iter().enumerate() {
        let later = js_sys::Object::new();
        Reflect::set(&later, &"applyAfter".into(), &js_sys::Date::new(&(js_sys::Date::now() + 3_600_000.0).into())).unwrap();
        let options = (i == 1).then(|| JsValue::from(later));
        ok(client.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": format!("write {i}")})), options)).await;
    }
    ok(client.sync()).await;
    let queued = |c: &kizunasync::KizunaClient| -> Vec<Value> {
        from_js(c.pending_writes()).as_array().unwrap().iter().map(|w| w["pk"].clone()).collect()
    };
    assert_eq!(queued(&client), vec![json!(ids[1])], "only the delayed write is pending");
    client.close();

    let client = open(&options(&name, &user)).await;
    assert_eq!(queued(&client), vec![json!(ids[1])], "after a reload, the delayed write is still queued and the others are gone");
    client.close();
    for i in [0, 2, 3] {
        assert_eq!(server_view(&user, "todos", &ids[i]).await["title"], format!("write {i}"));
    }
    assert_eq!(server_view(&user, "todos", &ids[1]).await, json!(null), "the delayed write is not applied yet");
}

/// An answer leaves the row it applied as the store holds it when the app already sees the server's
/// row there, in the bucket the server placed it in. The next write, after a reload and with no pull
/// in between (pulls fail here), builds on that row: its own answer keeps what the earlier one set.
#[wasm_bindgen_test]
async fn a_partial_write_after_an_applied_one_keeps_its_columns_with_no_pull_between() {
    let user = random_id();
    let name = format!("applied-base-{}", random_id());
    let no_pulls = js_sys::Function::new_with_args(
        "url, init",
        "return String(url).endsWith('kizuna_pull') ? Promise.reject(new TypeError('pulls are cut off')) : fetch(url, init)",
    );
    let opts = options(&name, &user);
    Reflect::set(&opts, &"fetch".into(), &no_pulls).unwrap();
    let id = random_id();
    let pending = |c: &kizunasync::KizunaClient| from_js(c.pending_writes()).as_array().unwrap().len();
    // Each sync's push lands and its pull fails.
    let sync = |c: &kizunasync::KizunaClient| wasm_bindgen_futures::JsFuture::from(c.sync());

    let client = open(&opts).await;
    ok(client.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": "first", "done": false})), None)).await;
    let _ = sync(&client).await; // placed in its bucket by the answer
    ok(client.patch("todos".into(), id.clone().into(), to_js(&json!({"title": "second"})), None)).await;
    let _ = sync(&client).await; // the row already shows what the server holds
    assert_eq!(pending(&client), 0, "both writes were applied");
    client.close();

    let client = open(&opts).await;
    ok(client.patch("todos".into(), id.clone().into(), to_js(&json!({"done": true})), None)).await;
    let _ = sync(&client).await;
    assert_eq!(pending(&client), 0, "the last patch was applied");
    let row = ok(client.get("todos".into(), id.clone().into())).await;
    assert_eq!((row["title"].clone(), row["done"].clone()), (json!("second"), json!(true)), "{row}");
    assert_eq!(from_js(client.get_checkpoint())["cursor"], json!(null), "no pull committed");
    client.close();
    let server = server_view(&user, "todos", &id).await;
    assert_eq!((server["title"].clone(), server["done"].clone()), (json!("second"), json!(true)), "{server}");
}

/// A numeric key written in another spelling (7.00) over a row pulled as 7.0 is that row: the
/// verdict names the row's key, the device moves its write there, and no second row is left under
/// the spelling written. Before, the device kept a second row under 7.00 that no pull brought or
/// removed (and an upsert in that spelling was refused as `RLS_DENIED`).
#[wasm_bindgen_test]
async fn a_numeric_key_written_in_another_spelling_is_one_row_under_the_rows_spelling() {
    let user = random_id();
    let other = open(&options(&format!("prices-other-{}", random_id()), &user)).await;
    ok(other.put("prices".into(), "7.0".into(), to_js(&json!({"label": "theirs"})), None)).await;
    ok(other.sync()).await;
    other.close();

    let name = format!("prices-{}", random_id());
    let client = open(&options(&name, &user)).await;
    ok(client.sync()).await;
    assert_eq!(ok(client.get("prices".into(), "7.0".into())).await["label"], "theirs");
    ok(client.patch("prices".into(), "7.00".into(), to_js(&json!({"label": "mine"})), None)).await;
    ok(client.sync()).await;
    assert_eq!(from_js(client.pending_writes()), json!([]));
    assert_eq!(ok(client.get("prices".into(), "7.0".into())).await["label"], "mine");
    assert_eq!(ok(client.get("prices".into(), "7.00".into())).await, Value::Null, "none under the spelling written");
    client.close();

    let reopened = open(&options(&name, &user)).await;
    ok(reopened.sync()).await;
    let rows = ok(reopened.query("prices".into(), None)).await;
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "one row, once, after a reload: {rows}");
    assert_eq!(rows[0]["label"], "mine", "{rows}");
    reopened.close();
}

/// Delete wins across spellings: a device that had a row with a numeric key and writes it again in
/// another spelling (`.50` for `.5`) after another device deleted it does not bring it back. Before,
/// the pack looked for the key's delete by its text, applied the upsert, and the row returned on
/// every device.
#[wasm_bindgen_test]
async fn a_numeric_key_deleted_elsewhere_stays_deleted_when_written_in_another_spelling() {
    let user = random_id();
    let n = (js_sys::Math::random() * 1e9) as u64;
    let (stored, respelled) = (format!("{n}.5"), format!("{n}.50"));
    let deleter = open(&options(&format!("prices-deleter-{}", random_id()), &user)).await;
    ok(deleter.put("prices".into(), stored.clone().into(), to_js(&json!({"label": "first"})), None)).await;
    ok(deleter.sync()).await;
    let writer = open(&options(&format!("prices-writer-{}", random_id()), &user)).await;
    ok(writer.sync()).await;
    assert_eq!(ok(writer.get("prices".into(), stored.clone().into())).await["label"], "first");
    ok(deleter.delete("prices".into(), stored.clone().into(), None)).await;
    ok(deleter.sync()).await;

    let rejected = record(&writer, "rejected");
    ok(writer.put("prices".into(), respelled.clone().into(), to_js(&json!({"label": "again"})), None)).await;
    ok(writer.sync()).await;
    assert_eq!(from_js(writer.pending_writes()), json!([]));
    assert_eq!(rejected.length(), 1, "the write is refused");
    assert_eq!(from_js(rejected.get(0))["reason"], "DELETE_WINS");
    assert_eq!(ok(writer.query("prices".into(), None)).await, json!([]), "no row under either spelling");
    ok(deleter.sync()).await;
    assert_eq!(ok(deleter.query("prices".into(), None)).await, json!([]));
    writer.close();
    deleter.close();
    for key in [&stored, &respelled] {
        assert_eq!(server_view(&user, "prices", key).await, Value::Null);
    }
}

/// A uuid key written in upper case (Swift's `UUID().uuidString`, an id typed by hand) is one row
/// under PostgreSQL's spelling: the verdict names it, the device moves its row there with a write
/// still pending on it, and pulls bring the server's row under the same key. Before, the device
/// kept its row under the spelling it wrote and the pull added a second one.
#[wasm_bindgen_test]
async fn a_uuid_key_written_in_upper_case_is_one_row_under_the_servers_spelling() {
    let user = random_id();
    let name = format!("respelled-{}", random_id());
    let (first, second) = (random_id(), random_id());
    let client = open(&options(&name, &user)).await;
    ok(client.sync()).await; // a checkpoint first: the first pull would replace every row anyway

    // A new row, written twice before it is pushed.
    ok(client.put("tags".into(), first.to_uppercase().into(), to_js(&json!({"label": "a"})), None)).await;
    ok(client.patch("tags".into(), first.to_uppercase().into(), to_js(&json!({"color": "red"})), None)).await;
    ok(client.sync()).await;
    assert_eq!(from_js(client.pending_writes()), json!([]));
    let rows = ok(client.query("tags".into(), None)).await;
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "one row: {rows}");
    assert_eq!(ok(client.get("tags".into(), first.to_uppercase().into())).await, Value::Null, "none under the spelling written");
    let row = ok(client.get("tags".into(), first.clone().into())).await;
    assert_eq!((&row["id"], &row["label"], &row["color"]), (&json!(first), &json!("a"), &json!("red")), "{row}");

    // A row another device made, pulled under its one spelling, then written in upper case here.
    let other = open(&options(&format!("respelled-other-{}", random_id()), &user)).await;
    ok(other.put("tags".into(), second.clone().into(), to_js(&json!({"label": "theirs", "color": "blue"})), None)).await;
    ok(other.sync()).await;
    other.close();
    ok(client.sync()).await;
    ok(client.patch("tags".into(), second.to_uppercase().into(), to_js(&json!({"label": "mine"})), None)).await;
    ok(client.sync()).await;
    let row = ok(client.get("tags".into(), second.clone().into())).await;
    assert_eq!((&row["label"], &row["color"]), (&json!("mine"), &json!("blue")), "the write landed on the pulled row: {row}");
    assert_eq!(ok(client.get("tags".into(), second.to_uppercase().into())).await, Value::Null);
    client.close();

    let reopened = open(&options(&name, &user)).await;
    ok(reopened.sync()).await;
    let rows = ok(reopened.query("tags".into(), None)).await;
    assert_eq!(rows.as_array().map(Vec::len), Some(2), "two rows, each once, after a reload: {rows}");
    assert_eq!(server_view(&user, "tags", &second).await["label"], "mine");
    reopened.close();
}

/// A backlog of writes in several slices: the next slice is on the wire while the previous
/// answer's body is still arriving (its status already said its writes are committed), and the
/// server still takes every write once and in the order it was made: the last write of a key
/// that three slices carry is the row.
#[wasm_bindgen_test]
async fn a_backlog_goes_out_with_the_next_slice_sent_while_an_answer_is_still_arriving() {
    let user = random_id();
    let opts = options(&format!("ahead-{}", random_id()), &user);
    set(&opts, "maxSlice", json!(2));
    let (fetch, sends) = slow_push_bodies(150);
    Reflect::set(&opts, &"fetch".into(), &fetch).unwrap();
    let client = open(&opts).await;
    let (a, b, c, d) = (random_id(), random_id(), random_id(), random_id());
    let applied_before = applied_total().await;
    for (id, title) in [(&a, "a1"), (&b, "b1"), (&a, "a2"), (&c, "c1"), (&a, "a3"), (&d, "d1"), (&a, "a4")] {
        ok(client.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": title})), None)).await;
    }
    let report = ok(client.sync()).await;
    assert_eq!(report["pushes"], 4, "{report}");
    let sends = sends.borrow().clone();
    assert_eq!(sends.len(), 4);
    assert!(
        sends.iter().enumerate().skip(1).any(|(n, arrived)| (*arrived as usize) < n),
        "a slice went before the answer ahead of it had arrived (answers arrived at each send: {sends:?})"
    );
    assert_eq!(from_js(client.pending_writes()), json!([]));
    let applied_after = applied_total().await;
    assert_eq!(applied_after - applied_before, 7, "one effect per write");
    for (id, title) in [(&a, "a4"), (&b, "b1"), (&c, "c1"), (&d, "d1")] {
        assert_eq!(server_view(&user, "todos", id).await["title"], title, "the server holds the last write of each key");
        assert_eq!(ok(client.get("todos".into(), id.clone().into())).await["title"], title);
    }
    client.close();
}

/// The first answer's status arrives and then its body is cut off, with the next slice already
/// on the wire: both slices' writes stay pending (taking the second answer first would show an
/// older write of a key over a newer one) and the row still shows the last write; the next sync
/// sends both again under their ids and the server answers them from its ledger: nothing lost,
/// nothing applied twice, the later write of each key the row.
#[wasm_bindgen_test]
async fn an_answer_cut_off_after_its_status_loses_nothing_with_the_next_slice_on_the_wire() {
    let user = random_id();
    let opts = options(&format!("cut-ahead-{}", random_id()), &user);
    set(&opts, "maxSlice", json!(2));
    let pushes = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let counted = pushes.clone();
    let fetch = faulty_fetch(move |url, _| {
        if !url.ends_with("kizuna_push") {
            return Fault::Pass;
        }
        counted.set(counted.get() + 1);
        if counted.get() == 1 { Fault::CutBody } else { Fault::Pass }
    });
    Reflect::set(&opts, &"fetch".into(), &fetch).unwrap();
    let client = open(&opts).await;
    let (a, b) = (random_id(), random_id());
    let applied_before = applied_total().await;
    for (id, title) in [(&a, "a1"), (&b, "b1"), (&a, "a2"), (&b, "b2")] {
        ok(client.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": title})), None)).await;
    }
    let err = call(client.sync()).await.expect_err("the cut-off answer fails the sync");
    assert_eq!(error_code(&err), "NETWORK");
    assert_eq!(pushes.get(), 2, "the second slice went before the first answer was read");
    let pending: Vec<String> = from_js(client.pending_writes()).as_array().unwrap().iter().map(|w| w["columns"]["title"].as_str().unwrap_or_default().to_string()).collect();
    assert_eq!(pending, ["a1", "b1", "a2", "b2"], "no write counts as landed on an answer taken out of order");
    assert_eq!(ok(client.get("todos".into(), a.clone().into())).await["title"], "a2");
    assert_eq!(ok(client.get("todos".into(), b.clone().into())).await["title"], "b2");

    sleep(40).await;
    ok(client.sync()).await;
    assert_eq!(from_js(client.pending_writes()), json!([]));
    let applied_after = applied_total().await;
    assert_eq!(applied_after - applied_before, 4, "one effect per write: the first slice was answered from the ledger");
    assert_eq!(server_view(&user, "todos", &a).await["title"], "a2");
    assert_eq!(server_view(&user, "todos", &b).await["title"], "b2");
    assert_eq!(ok(client.get("todos".into(), a.clone().into())).await["title"], "a2");
    client.close();
}

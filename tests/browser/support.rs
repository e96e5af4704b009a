//! What every browser test needs: the running gateway's URL, tokens for made-up users, clients
//! opened through the same `open` path JS uses, and a fetch that can lose answers on purpose.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use js_sys::{Array, Function, Object, Promise, Reflect};
use kizunasync::KizunaClient;
use serde_json::{json, Value};
use sha2::Sha256;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

pub const SERVER_URL: &str = match option_env!("KIZUNA_TEST_URL") {
    Some(url) => url,
    None => "http://127.0.0.1:8787",
};
const JWT_SECRET: &str = match option_env!("KIZUNA_TEST_JWT_SECRET") {
    Some(secret) => secret,
    None => "kizuna-dev-secret-change-me",
};

pub fn random_id() -> String {
    let crypto = Reflect::get(&js_sys::global(), &"crypto".into()).unwrap();
    let f: Function = Reflect::get(&crypto, &"randomUUID".into()).unwrap().unchecked_into();
    f.call0(&crypto).unwrap().as_string().unwrap()
}

/// An HS256 token for `sub`, valid for an hour, signed with the gateway's secret.
pub fn token_for(sub: &str) -> String {
    token_with_role(sub, "authenticated")
}

pub fn token_with_role(sub: &str, role: &str) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let exp = (js_sys::Date::now() / 1000.0) as i64 + 3600;
    let header = b64.encode(json!({"alg": "HS256", "typ": "JWT"}).to_string());
    let claims = b64.encode(json!({"sub": sub, "role": role, "exp": exp}).to_string());
    let mut mac = Hmac::<Sha256>::new_from_slice(JWT_SECRET.as_bytes()).unwrap();
    mac.update(format!("{header}.{claims}").as_bytes());
    format!("{header}.{claims}.{}", b64.encode(mac.finalize().into_bytes()))
}

pub fn to_js(value: &Value) -> JsValue {
    js_sys::JSON::parse(&value.to_string()).unwrap()
}

pub fn from_js(value: JsValue) -> Value {
    if value.is_undefined() {
        return Value::Null;
    }
    js_sys::JSON::stringify(&value).ok().and_then(|s| serde_json::from_str(&String::from(s)).ok()).unwrap_or(Value::Null)
}

/// Options for a client of `user` on database `name`, timers off so each test drives sync itself.
pub fn options(name: &str, user: &str) -> Object {
    let opts: Object = to_js(&json!({
        "name": name,
        "url": SERVER_URL,
        "buckets": [format!("user:{user}")],
        "autoSync": false,
        "retryBaseMs": 5,
        "retryMaxMs": 20,
    }))
    .unchecked_into();
    let token = token_for(user);
    let provider = Closure::<dyn Fn() -> JsValue>::new(move || JsValue::from_str(&token));
    Reflect::set(&opts, &"token".into(), &provider.into_js_value()).unwrap();
    opts
}

pub fn set(opts: &Object, key: &str, value: Value) {
    Reflect::set(opts, &key.into(), &to_js(&value)).unwrap();
}

pub async fn open(opts: &Object) -> KizunaClient {
    KizunaClient::connect(opts.clone().into()).await.expect("the client opens")
}

pub async fn call(promise: Promise) -> Result<JsValue, JsValue> {
    JsFuture::from(promise).await
}

pub async fn ok(promise: Promise) -> Value {
    match call(promise).await {
        Ok(v) => from_js(v),
        Err(e) => panic!("call failed: {:?}", from_js(e.clone()).to_string() + &format!(" {e:?}")),
    }
}

pub fn error_code(err: &JsValue) -> String {
    Reflect::get(err, &"code".into()).ok().and_then(|c| c.as_string()).unwrap_or_default()
}

pub async fn sleep(ms: i32) {
    let p = Promise::new(&mut |resolve, _| {
        let global = js_sys::global();
        let set: Function = Reflect::get(&global, &"setTimeout".into()).unwrap().unchecked_into();
        set.call2(&global, &resolve, &ms.into()).unwrap();
    });
    JsFuture::from(p).await.unwrap();
}

/// Records every event of `name` the client emits.
pub fn record(client: &KizunaClient, name: &str) -> Array {
    let seen = Array::new();
    let sink = seen.clone();
    let listener = Closure::<dyn Fn(JsValue)>::new(move |e: JsValue| {
        sink.push(&e);
    });
    client.on(name.into(), listener.into_js_value()).unwrap();
    seen
}

/// A fetch that forwards to the real one, and on the calls `decide` picks either never sends the
/// request (`Refuse`) or sends it and throws the answer away (`LoseAnswer`), as a dropped
/// connection would.
#[derive(Clone, Copy, PartialEq)]
pub enum Fault {
    Pass,
    Refuse,
    LoseAnswer,
    /// Sends the request, passes the answer's status and headers on, and then stalls its body
    /// forever, as a proxy that hangs mid-answer would.
    StallBody,
    /// Sends the request, passes the answer's status and headers on, and then breaks off its
    /// body, as a connection dropped mid-answer would.
    CutBody,
}

pub fn faulty_fetch(decide: impl Fn(&str, u32) -> Fault + 'static) -> Function {
    let count = std::cell::Cell::new(0u32);
    let closure = Closure::<dyn Fn(JsValue, JsValue) -> Promise>::new(move |url: JsValue, init: JsValue| {
        let n = count.get() + 1;
        count.set(n);
        let url_text = url.as_string().unwrap_or_default();
        let global = js_sys::global();
        let real: Function = Reflect::get(&global, &"fetch".into()).unwrap().unchecked_into();
        match decide(&url_text, n) {
            Fault::Pass => real.call2(&global, &url, &init).unwrap().unchecked_into(),
            Fault::Refuse => Promise::reject(&js_sys::TypeError::new("Failed to fetch (refused by the test)").into()),
            Fault::LoseAnswer => {
                let sent = real.call2(&global, &url, &init).unwrap();
                let lose = Function::new_with_args(
                    "sent",
                    "return sent.then(() => { throw new TypeError('Failed to fetch (answer lost by the test)'); })",
                );
                lose.call1(&JsValue::NULL, &sent).unwrap().unchecked_into()
            }
            Fault::StallBody => {
                let stall = Function::new_with_args(
                    "sent",
                    "return sent.then((r) => new Response(new ReadableStream({ start(c) { c.enqueue(new Uint8Array([123])); } }), { status: r.status, headers: r.headers }))",
                );
                stall.call1(&JsValue::NULL, &real.call2(&global, &url, &init).unwrap()).unwrap().unchecked_into()
            }
            Fault::CutBody => {
                let cut = Function::new_with_args(
                    "sent",
                    "return sent.then((r) => new Response(new ReadableStream({ start(c) { c.error(new TypeError('connection reset (by the test)')); } }), { status: r.status, headers: r.headers }))",
                );
                cut.call1(&JsValue::NULL, &real.call2(&global, &url, &init).unwrap()).unwrap().unchecked_into()
            }
        }
    });
    closure.into_js_value().unchecked_into()
}

/// A fetch whose push answers pass their status and headers on at once and their bodies `ms`
/// later, as a slow link would deliver a large answer. Each push's request is recorded, at the
/// moment it is sent, with the number of push answers whose body had arrived by then.
pub fn slow_push_bodies(ms: u32) -> (Function, std::rc::Rc<std::cell::RefCell<Vec<u32>>>) {
    let arrived = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let sends = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let counter = arrived.clone();
    let on_body = Closure::<dyn Fn()>::new(move || counter.set(counter.get() + 1)).into_js_value();
    let delay = Function::new_with_args(
        "sent, ms, onBody",
        "return sent.then((r) => new Response(new ReadableStream({ async start(c) { \
           const body = new Uint8Array(await r.arrayBuffer()); \
           await new Promise((done) => setTimeout(done, ms)); \
           onBody(); c.enqueue(body); c.close(); } }), { status: r.status, headers: r.headers }))",
    );
    let record = sends.clone();
    let closure = Closure::<dyn Fn(JsValue, JsValue) -> JsValue>::new(move |url: JsValue, init: JsValue| {
        let global = js_sys::global();
        let real: Function = Reflect::get(&global, &"fetch".into()).unwrap().unchecked_into();
        let sent = real.call2(&global, &url, &init).unwrap();
        if !url.as_string().unwrap_or_default().ends_with("kizuna_push") {
            return sent;
        }
        record.borrow_mut().push(arrived.get());
        delay.call3(&JsValue::NULL, &sent, &ms.into(), &on_body).unwrap()
    });
    (closure.into_js_value().unchecked_into(), sends)
}

/// The row as the server has it for `user`, read through a fresh client that pulls once.
pub async fn server_view(user: &str, table: &str, pk: &str) -> Value {
    let client = open(&options(&format!("observer-{}", random_id()), user)).await;
    ok(client.pull()).await;
    let row = ok(client.get(table.into(), pk.into())).await;
    client.close();
    row
}

/// POSTs `{"request": request}` to the gateway's RPC `function` with `token` by plain fetch; the
/// status and the body as text, exactly as the server sent it.
pub async fn rpc_text(function: &str, token: &str, request: &Value) -> (u16, String) {
    let headers = Object::new();
    Reflect::set(&headers, &"content-type".into(), &"application/json".into()).unwrap();
    Reflect::set(&headers, &"authorization".into(), &format!("Bearer {token}").into()).unwrap();
    let init = Object::new();
    Reflect::set(&init, &"method".into(), &"POST".into()).unwrap();
    Reflect::set(&init, &"headers".into(), &headers).unwrap();
    Reflect::set(&init, &"body".into(), &json!({ "request": request }).to_string().into()).unwrap();
    let global = js_sys::global();
    let fetch: Function = Reflect::get(&global, &"fetch".into()).unwrap().unchecked_into();
    let url = format!("{SERVER_URL}/rest/v1/rpc/{function}");
    let response: web_sys::Response = call(fetch.call2(&global, &url.into(), &init).unwrap().unchecked_into())
        .await
        .expect("the call answers")
        .unchecked_into();
    let text = call(response.text().unwrap()).await.unwrap().as_string().unwrap();
    (response.status(), text)
}

/// Calls the operator's RPC (`kizuna_admin`) as service_role and returns its answer.
pub async fn operator(request: Value) -> Value {
    let token = token_with_role(&random_id(), "service_role");
    let (status, text) = rpc_text("kizuna_admin", &token, &request).await;
    assert_eq!(status, 200, "the operator's call {request} is accepted: {text}");
    serde_json::from_str(&text).unwrap()
}

/// The server's count of applied mutations, all callers together (the operator's `status`).
pub async fn applied_total() -> i64 {
    operator(json!({"action": "status"})).await["applied_total"].as_i64().expect("status counts applied mutations")
}

/// The operator reaps now with zero tombstone retention, so every checkpoint older than the newest
/// tombstone expires (as it would after the retention window on a real server).
pub async fn reap_all_tombstones() -> Value {
    operator(json!({"action": "reap", "tombstone_retention_seconds": 0})).await
}

/// A `fetch` option whose answers to the RPCs `functions` reach the client with every row's
/// `"title": "..."` replaced by `columns` (JSON text): values no synced table of the tests can hold.
pub fn titles_rewritten(functions: &[&str], columns: &str) -> js_sys::Function {
    let body = format!(
        "return fetch(url, init).then(async (r) => {{
           if (!{}.some((f) => String(url).endsWith(f))) return r;
           const text = (await r.text()).replace(/\"title\": ?\"[^\"]*\"/g, {});
           return new Response(text, {{ status: r.status, headers: r.headers }});
         }})",
        serde_json::to_string(functions).unwrap(),
        serde_json::to_string(columns).unwrap()
    );
    js_sys::Function::new_with_args("url, init", &body)
}

/// A live query of `filter` over `table` whose listener pushes each result it hears into the array
/// returned, with the function that stops it.
pub fn watched(client: &KizunaClient, table: &str, filter: JsValue) -> (Array, Function) {
    let heard = Array::new();
    let listener = Closure::<dyn Fn(JsValue)>::new({
        let heard = heard.clone();
        move |rows: JsValue| {
            heard.push(&rows);
        }
    });
    let stop = client.watch(table.into(), filter, listener.into_js_value()).unwrap();
    (heard, stop)
}

/// Waits (up to two seconds) until a `watched` listener has heard `n` results.
pub async fn wait_for_results(heard: &Array, n: u32) {
    for _ in 0..100 {
        if heard.length() >= n {
            break;
        }
        sleep(20).await;
    }
}

//! A thin promise bridge over the browser's IndexedDB: open with an upgrade, await a request,
//! await a transaction's end. Nothing here knows about Kizuna's records.

use js_sys::{Function, Promise, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use web_sys::{IdbDatabase, IdbFactory, IdbOpenDbRequest, IdbRequest, IdbTransaction};

use crate::error::ClientError;

fn factory() -> Result<IdbFactory, ClientError> {
    let global = js_sys::global();
    let idb = Reflect::get(&global, &JsValue::from_str("indexedDB")).map_err(ClientError::storage)?;
    idb.dyn_into::<IdbFactory>()
        .map_err(|_| ClientError::new("STORAGE_UNAVAILABLE", "IndexedDB is not available in this context"))
}

/// Opens `name` at `version`, running `upgrade` when the stored version is older.
pub async fn open(
    name: &str,
    version: u32,
    upgrade: impl Fn(&IdbDatabase, u32) -> Result<(), JsValue> + 'static,
) -> Result<IdbDatabase, ClientError> {
    let request: IdbOpenDbRequest = factory()?.open_with_u32(name, version).map_err(ClientError::storage)?;
    let on_upgrade = Closure::<dyn FnMut(web_sys::IdbVersionChangeEvent)>::new({
        let request = request.clone();
        move |event: web_sys::IdbVersionChangeEvent| {
            let Ok(result) = request.result() else { return };
            let db: IdbDatabase = result.unchecked_into();
            if let Err(err) = upgrade(&db, event.old_version() as u32) {
                web_sys::console::error_2(&"kizuna: IndexedDB upgrade failed".into(), &err);
            }
        }
    });
    request.set_onupgradeneeded(Some(on_upgrade.as_ref().unchecked_ref()));
    let outcome = settle(&request).await;
    request.set_onupgradeneeded(None);
    drop(on_upgrade);
    Ok(outcome.map_err(ClientError::storage)?.unchecked_into())
}

type Handler = Closure<dyn FnMut(web_sys::Event)>;

/// Resolves with the request's result once it succeeds. Awaiting this inside a transaction keeps
/// the transaction alive, because the continuation runs in the success event's microtask checkpoint.
pub async fn settle(request: &IdbRequest) -> Result<JsValue, JsValue> {
    let mut handlers: Option<(Handler, Handler)> = None;
    let promise = Promise::new(&mut |resolve: Function, reject: Function| {
        let ok_request = request.clone();
        let on_success: Handler = Closure::once(move |_: web_sys::Event| {
            let _ = resolve.call1(&JsValue::NULL, &ok_request.result().unwrap_or(JsValue::UNDEFINED));
        });
        let err_request = request.clone();
        let on_error: Handler = Closure::once(move |_: web_sys::Event| {
            let error = err_request.error().ok().flatten().map(JsValue::from).unwrap_or(JsValue::NULL);
            let _ = reject.call1(&JsValue::NULL, &error);
        });
        request.set_onsuccess(Some(on_success.as_ref().unchecked_ref()));
        request.set_onerror(Some(on_error.as_ref().unchecked_ref()));
        handlers = Some((on_success, on_error));
    });
    let outcome = JsFuture::from(promise).await;
    request.set_onsuccess(None);
    request.set_onerror(None);
    drop(handlers);
    outcome
}

/// Resolves when the transaction commits; rejects when it aborts.
pub async fn completion(tx: &IdbTransaction) -> Result<(), JsValue> {
    let mut handlers: Option<(Handler, Handler)> = None;
    let promise = Promise::new(&mut |resolve: Function, reject: Function| {
        let on_complete: Handler = Closure::once(move |_: web_sys::Event| {
            let _ = resolve.call0(&JsValue::NULL);
        });
        let failing = tx.clone();
        let on_abort: Handler = Closure::once(move |_: web_sys::Event| {
            let error = failing.error().map(JsValue::from).unwrap_or_else(|| "transaction aborted".into());
            let _ = reject.call1(&JsValue::NULL, &error);
        });
        tx.set_oncomplete(Some(on_complete.as_ref().unchecked_ref()));
        tx.set_onabort(Some(on_abort.as_ref().unchecked_ref()));
        handlers = Some((on_complete, on_abort));
    });
    let outcome = JsFuture::from(promise).await.map(|_| ());
    tx.set_oncomplete(None);
    tx.set_onabort(None);
    drop(handlers);
    outcome
}

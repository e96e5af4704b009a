//! One open client per local database. Two engines over one IndexedDB database would each hold
//! an in-memory outbox the other cannot see, and could reuse sequence numbers; a Web Lock named
//! after the database, held from `open` to `close`, keeps the second one out.
//!
//! The Web Locks API is reached through a typed binding (web-sys has it only behind its unstable
//! flag), never through code built from strings, so `open()` works under a Content-Security-Policy
//! without `'unsafe-eval'`.

use js_sys::{Function, Object, Promise, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

use crate::error::ClientError;

/// How long `open` waits for the lock: long enough for a client closed a moment ago to let go.
const WAIT_MS: u32 = 3_000;

#[wasm_bindgen]
extern "C" {
    /// `navigator.locks`.
    type LockManager;
    /// `locks.request(name, options, callback)`: `callback` runs once the lock is granted, and
    /// the lock is held until the promise it returns settles.
    #[wasm_bindgen(method, js_name = request)]
    fn request(this: &LockManager, name: &str, options: &Object, callback: &Function) -> Promise;
}

pub struct DatabaseLock {
    release: Option<Function>,
}

impl DatabaseLock {
    /// Takes the lock for database `name`. Where the browser has no Web Locks, there is no guard.
    pub async fn acquire(name: &str) -> Result<DatabaseLock, ClientError> {
        let global = js_sys::global();
        let locks = Reflect::get(&global, &"navigator".into())
            .and_then(|n| Reflect::get(&n, &"locks".into()))
            .unwrap_or(JsValue::UNDEFINED);
        if locks.is_undefined() || locks.is_null() {
            return Ok(DatabaseLock { release: None });
        }
        let locks: LockManager = locks.unchecked_into();

        // `granted` settles when the callback runs; `held` is what the callback returns, and its
        // resolve function is the release.
        let mut grant: Option<Function> = None;
        let granted = Promise::new(&mut |resolve, _| grant = Some(resolve));
        let mut release: Option<Function> = None;
        let held = Promise::new(&mut |resolve, _| release = Some(resolve));
        let (Some(grant), Some(release)) = (grant, release) else {
            return Err(ClientError::new("DATABASE_IN_USE", "the lock could not be requested"));
        };
        let on_granted = Closure::once_into_js(move |_lock: JsValue| -> JsValue {
            let _ = grant.call0(&JsValue::NULL);
            held.into()
        });
        let options = Object::new();
        let _ = Reflect::set(&options, &"signal".into(), &web_sys::AbortSignal::timeout_with_u32(WAIT_MS));
        let requested = locks.request(&format!("kizuna:{name}"), &options, on_granted.unchecked_ref());
        // The request rejects when the wait times out; it resolves only after a release.
        match JsFuture::from(Promise::race(&js_sys::Array::of2(&granted, &requested))).await {
            Ok(_) => Ok(DatabaseLock { release: Some(release) }),
            Err(_) => Err(ClientError::new(
                "DATABASE_IN_USE",
                format!("the local database '{name}' is open in another client (another tab?); close it first or use another name"),
            )),
        }
    }

    pub fn release(&mut self) {
        if let Some(release) = self.release.take() {
            let _ = release.call0(&JsValue::NULL);
        }
    }
}

/// A client dropped without `close()` (or an `open` that failed after taking the lock) must not
/// keep the database locked until the page unloads.
impl Drop for DatabaseLock {
    fn drop(&mut self) {
        self.release();
    }
}

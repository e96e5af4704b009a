//! The leader lock: a Web Lock named after the database, held by the one tab that runs the sync
//! loops for every tab of that database. A tab asks for it at `open` and waits in the browser's
//! queue; when the holder closes or crashes the browser hands it to the next tab at once. A frozen
//! holder keeps its locks, so a follower that hears nothing from it takes the lock with `steal`
//! (see `tabs.rs`); the stolen holder's request then rejects, which tells it that it lost.
//!
//! The Web Locks API is reached through a typed binding (web-sys has it only behind its unstable
//! flag), never through code built from strings, so `open()` works under a Content-Security-Policy
//! without `'unsafe-eval'`.

use std::cell::Cell;
use std::rc::Rc;

use js_sys::{Function, Object, Promise, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

#[wasm_bindgen]
extern "C" {
    /// `navigator.locks`.
    type LockManager;
    /// `locks.request(name, options, callback)`: `callback` runs once the lock is granted, and
    /// the lock is held until the promise it returns settles.
    #[wasm_bindgen(method, js_name = request)]
    fn request(this: &LockManager, name: &str, options: &Object, callback: &Function) -> LockRequest;
    /// The promise `request` returns: it rejects when the request was aborted or the lock stolen.
    #[wasm_bindgen(extends = Promise)]
    type LockRequest;
    /// `promise.catch(callback)`, with a self-freeing callback.
    #[wasm_bindgen(method, js_name = catch)]
    fn on_rejected(this: &LockRequest, callback: &JsValue) -> Promise;
}

fn lock_manager() -> Option<LockManager> {
    let locks = Reflect::get(&js_sys::global(), &"navigator".into())
        .and_then(|n| Reflect::get(&n, &"locks".into()))
        .ok()?;
    (!locks.is_undefined() && !locks.is_null()).then(|| locks.unchecked_into())
}

/// One request for the leader lock, queued or granted. Dropping it gives the lock up (or leaves
/// the queue) without calling either callback.
pub struct LeaderLock {
    release: Option<Function>,
    /// Leaves the queue; a `steal` request has none (the API refuses a signal with `steal`).
    abort: Option<web_sys::AbortController>,
    /// Set once this side gave up, so the request's rejection is not taken for a theft.
    given_up: Rc<Cell<bool>>,
}

impl LeaderLock {
    /// Asks for the lock of database `name`: `granted` runs when this tab holds it, `lost` when it
    /// was taken from this tab (or the request failed). `steal` takes it from its holder at once.
    /// Where the browser has no Web Locks there is only ever this tab, and `granted` runs at once.
    pub fn request(name: &str, steal: bool, granted: impl FnOnce() + 'static, lost: impl FnOnce() + 'static) -> LeaderLock {
        let given_up = Rc::new(Cell::new(false));
        let Some(locks) = lock_manager() else {
            granted();
            return LeaderLock { release: None, abort: None, given_up };
        };
        let mut release: Option<Function> = None;
        let held = Promise::new(&mut |resolve, _| release = Some(resolve));
        let on_granted = Closure::once_into_js(move |_lock: JsValue| -> JsValue {
            granted();
            held.into()
        });
        let options = Object::new();
        let abort = if steal {
            let _ = Reflect::set(&options, &"steal".into(), &JsValue::TRUE);
            None
        } else {
            let controller = web_sys::AbortController::new().ok();
            if let Some(c) = &controller {
                let _ = Reflect::set(&options, &"signal".into(), &c.signal());
            }
            controller
        };
        let requested = locks.request(&format!("kizuna:{name}"), &options, on_granted.unchecked_ref());
        let gave_up = given_up.clone();
        let on_rejected = Closure::once_into_js(move |_reason: JsValue| {
            if !gave_up.get() {
                lost();
            }
        });
        let _ = requested.on_rejected(&on_rejected);
        LeaderLock { release, abort, given_up }
    }

    /// Gives the lock up, or leaves the queue.
    pub fn give_up(&mut self) {
        self.given_up.set(true);
        if let Some(release) = self.release.take() {
            let _ = release.call0(&JsValue::NULL);
        }
        if let Some(abort) = self.abort.take() {
            abort.abort();
        }
    }
}

impl Drop for LeaderLock {
    fn drop(&mut self) {
        self.give_up();
    }
}

//! One open client per local database. Two engines over one IndexedDB database would each hold
//! an in-memory outbox the other cannot see, and could reuse sequence numbers; a Web Lock named
//! after the database, held from `open` to `close`, keeps the second one out.

use js_sys::{Function, Promise, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

use crate::error::{describe, ClientError};

/// How long `open` waits for the lock: long enough for a client closed a moment ago to let go.
const WAIT_MS: u32 = 3_000;

const ACQUIRE: &str = r#"
  return new Promise((acquired, refused) => {
    locks.request(name, { signal: AbortSignal.timeout(waitMs) },
                  () => new Promise((release) => acquired(release)))
         .catch(refused);
  });
"#;

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
        let acquire = Function::new_with_args("locks, name, waitMs", ACQUIRE);
        let pending = acquire
            .call3(&JsValue::NULL, &locks, &format!("kizuna:{name}").into(), &WAIT_MS.into())
            .map_err(|e| ClientError::new("DATABASE_IN_USE", describe(&e)))?;
        match JsFuture::from(pending.unchecked_into::<Promise>()).await {
            Ok(release) => Ok(DatabaseLock { release: release.dyn_into().ok() }),
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

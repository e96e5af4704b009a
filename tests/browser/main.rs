//! Browser tests: the real client in headless Chromium, with real IndexedDB, against a running
//! kizuna-server and PostgreSQL (started by `make test`). One binary, so the suite builds once.
#![cfg(target_arch = "wasm32")]

use wasm_bindgen_test::wasm_bindgen_test_configure;

wasm_bindgen_test_configure!(run_in_browser);

mod support;
mod chunked;
mod conflicts;
mod consistency;
mod indexes;
mod js_face;
mod ordering;
mod pull_side;
mod push_side;
mod upgrades;
mod walking_skeleton;

//! Kizuna's browser client: a local store in IndexedDB that answers at once, a durable outbox
//! pushed to the server, and pulls committed in checkpoints. The sync policy lives in the sans-IO
//! `kizuna-engine` crate; the modules here are its browser adapters and the JS face, so the crate
//! is empty on any target but wasm32.
#![cfg(target_arch = "wasm32")]

mod api;
mod chunks;
mod error;
mod events;
mod indexes;
mod js;
mod leader;
mod options;
mod ordering;
mod pages;
mod row_reads;
mod runner;
mod scheduler;
mod store;
mod tabs;
mod transport;
mod typescript;
mod values;
mod watch;

pub use api::{is_kizuna_error, KizunaClient};

/// Reports a Rust panic on the console before the module traps, so a bug shows its message
/// instead of a bare `unreachable`.
#[wasm_bindgen::prelude::wasm_bindgen(start)]
pub fn install_panic_reporter() {
    std::panic::set_hook(Box::new(|info| {
        web_sys::console::error_1(&format!("kizuna: internal error: {info}").into());
    }));
}

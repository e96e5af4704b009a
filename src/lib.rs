//! Kizuna's browser client: a local store in IndexedDB that answers at once, a durable outbox
//! pushed to the server, and pulls committed in checkpoints. The sync policy lives in the sans-IO
//! `kizuna-engine` crate; the modules here are its browser adapters and the JS face.

#[cfg(target_arch = "wasm32")]
mod api;
#[cfg(target_arch = "wasm32")]
mod error;
#[cfg(target_arch = "wasm32")]
mod events;
#[cfg(target_arch = "wasm32")]
mod idb;
#[cfg(target_arch = "wasm32")]
mod lock;
#[cfg(target_arch = "wasm32")]
mod options;
#[cfg(target_arch = "wasm32")]
mod runner;
#[cfg(target_arch = "wasm32")]
mod scheduler;
#[cfg(target_arch = "wasm32")]
mod store;
#[cfg(target_arch = "wasm32")]
mod transport;

#[cfg(target_arch = "wasm32")]
pub use api::KizunaClient;

/// Reports a Rust panic on the console before the module traps, so a bug shows its message
/// instead of a bare `unreachable`.
#[cfg(target_arch = "wasm32")]
#[wasm_bindgen::prelude::wasm_bindgen(start)]
pub fn install_panic_reporter() {
    std::panic::set_hook(Box::new(|info| {
        web_sys::console::error_1(&format!("kizuna: internal error: {info}").into());
    }));
}

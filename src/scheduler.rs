//! Browser timers and wake-ups, armed only in the tab that leads (`tabs.rs`): one timeout for the
//! engine's next wake time, a server-sent wake stream that asks for a pull soon, and the browser's
//! online/offline signals. Timers are gloo-timers handles held here, so dropping one cancels it:
//! `stop` (on `close()` or on losing the lead) leaves no timer armed.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

use gloo_timers::callback::Timeout;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::runner::{now, Inner};

/// The longest a timer waits, so a client whose engine has nothing to do still looks again.
const MAX_TIMER_MS: i64 = 60_000;
/// How long after a wake stream error a new stream is opened (with a fresh token): the first pause,
/// doubled after each stream that could not be opened, up to the longest.
const WAKE_RECONNECT_FIRST_MS: u32 = 250;
const WAKE_RECONNECT_MAX_MS: u32 = 5_000;
/// How long after the gateway refused a stream for its limits (429: the caller, or the server,
/// holds its most) one is asked for again: meanwhile the timers pull, and asking every few seconds
/// would only add refusals.
const WAKE_REFUSED_MS: u32 = 60_000;

type EventHandler = Closure<dyn FnMut(web_sys::Event)>;

#[derive(Default)]
pub struct Scheduler {
    /// True while this tab leads and `autoSync` asked for loops: timers are armed only then.
    running: Cell<bool>,
    timer: RefCell<Option<Timeout>>,
    /// The wake stream's controller: aborting it ends the stream.
    wake: RefCell<Option<web_sys::AbortController>>,
    /// The pause before the wake stream is opened again.
    reconnect: RefCell<Option<Timeout>>,
    /// Streams that could not be opened since the last one that was.
    reconnect_failures: Cell<u32>,
    /// The `online` and `offline` handlers.
    online: RefCell<Option<(EventHandler, EventHandler)>>,
}

/// This tab took the lead: run the loops the options asked for.
pub fn start(inner: &Rc<Inner>) {
    if inner.closed.get() || !inner.auto_sync {
        return;
    }
    inner.scheduler.running.set(true);
    watch_connectivity(inner);
    if inner.realtime_wakeups {
        open_wake_stream(inner);
    }
    arm(inner);
}

/// Arms the timer for the engine's next wake time (or now). Replaces any timer already armed.
pub fn arm(inner: &Rc<Inner>) {
    let scheduler = &inner.scheduler;
    if inner.closed.get() || !scheduler.running.get() {
        return;
    }
    let t = now();
    let at = inner.engine.borrow().next_wake(t).unwrap_or(t + MAX_TIMER_MS);
    let delay = (at - t).clamp(0, MAX_TIMER_MS) as u32;
    let weak = Rc::downgrade(inner);
    // Replacing the handle drops (cancels) the timer armed before.
    *scheduler.timer.borrow_mut() = Some(Timeout::new(delay, move || fire(weak)));
}

fn fire(inner: Weak<Inner>) {
    wasm_bindgen_futures::spawn_local(async move {
        let Some(inner) = inner.upgrade() else { return };
        inner.scheduler.timer.borrow_mut().take();
        if inner.tick().await {
            arm(&inner);
        }
    });
}

/// Opens the wake stream: a streaming `fetch` of `/kizuna/v1/wake` with the token in the
/// `Authorization` header (an `EventSource` can only carry it in the URL, where browser, proxy and
/// server logs keep it). Each `wake` event asks the engine for a pull and re-arms the timer; the
/// stream carries no row data, so a missed event only delays the next scheduled pull. When the
/// stream ends or fails, a new one is opened after a pause, with a fresh token.
fn open_wake_stream(inner: &Rc<Inner>) {
    let weak = Rc::downgrade(inner);
    wasm_bindgen_futures::spawn_local(async move {
        let Some(inner) = weak.upgrade() else { return };
        if !inner.scheduler.running.get() {
            return;
        }
        let opened = inner.transport.open_stream("/kizuna/v1/wake").await;
        drop(inner);
        let (response, controller) = match opened {
            Ok(opened) => opened,
            Err(failure) => {
                retry_wake_stream(&weak, failure.status == Some(429));
                return;
            }
        };
        let Some(inner) = weak.upgrade() else {
            controller.abort();
            return;
        };
        if !inner.scheduler.running.get() {
            controller.abort(); // stopped while the stream was opening
            return;
        }
        close_wake_stream(&inner.scheduler);
        *inner.scheduler.wake.borrow_mut() = Some(controller.clone());
        inner.scheduler.reconnect_failures.set(0);
        // Wake-ups sent while no stream was open are lost: pull now rather than at the next
        // scheduled pull.
        inner.engine.borrow_mut().wake();
        arm(&inner);
        drop(inner);
        read_wake_events(&response, &weak).await;
        // Ended: by `stop` (the controller is gone then) or by the network or server.
        let current = weak.upgrade().and_then(|i| i.scheduler.wake.borrow().as_ref().map(|c| c == &controller));
        if current == Some(true) {
            retry_wake_stream(&weak, false);
        }
    });
}

/// Reads Server-Sent Events from the stream until it ends; a `wake` event wakes the engine.
async fn read_wake_events(response: &web_sys::Response, inner: &Weak<Inner>) {
    let Some(body) = response.body() else { return };
    let reader: web_sys::ReadableStreamDefaultReader = body.get_reader().unchecked_into();
    let Ok(decoder) = web_sys::TextDecoder::new() else { return };
    let options = web_sys::TextDecodeOptions::new();
    options.set_stream(true);
    let mut buffer = String::new();
    loop {
        let Ok(chunk) = wasm_bindgen_futures::JsFuture::from(reader.read()).await else { return };
        if js_sys::Reflect::get(&chunk, &"done".into()).ok().and_then(|d| d.as_bool()) != Some(false) {
            return;
        }
        let Ok(bytes) = js_sys::Reflect::get(&chunk, &"value".into()) else { return };
        let bytes: js_sys::Uint8Array = bytes.unchecked_into();
        let Ok(text) = decoder.decode_with_buffer_source_and_options(&bytes, &options) else { return };
        buffer.push_str(&text.replace("\r\n", "\n"));
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            if event.lines().any(|line| line.trim_end() == "event: wake") {
                if let Some(inner) = inner.upgrade() {
                    inner.engine.borrow_mut().wake();
                    arm(&inner);
                }
            }
        }
    }
}

fn retry_wake_stream(weak: &Weak<Inner>, refused: bool) {
    let Some(inner) = weak.upgrade() else { return };
    if !inner.scheduler.running.get() {
        return;
    }
    let failures = inner.scheduler.reconnect_failures.get();
    inner.scheduler.reconnect_failures.set(failures.saturating_add(1));
    let pause = if refused { WAKE_REFUSED_MS } else { WAKE_RECONNECT_FIRST_MS.saturating_mul(1 << failures.min(5)).min(WAKE_RECONNECT_MAX_MS) };
    let weak = weak.clone();
    *inner.scheduler.reconnect.borrow_mut() = Some(Timeout::new(pause, move || {
        if let Some(inner) = weak.upgrade() {
            inner.scheduler.reconnect.borrow_mut().take();
            open_wake_stream(&inner);
        }
    }));
}

fn close_wake_stream(scheduler: &Scheduler) {
    if let Some(controller) = scheduler.wake.borrow_mut().take() {
        controller.abort();
    }
}

/// Follows the browser's online/offline signals: going online re-arms the timer at once.
fn watch_connectivity(inner: &Rc<Inner>) {
    let Ok(target) = js_sys::global().dyn_into::<web_sys::EventTarget>() else { return };
    let make = |online: bool| {
        let weak = Rc::downgrade(inner);
        EventHandler::new(move |_| {
            if let Some(inner) = weak.upgrade() {
                inner.engine.borrow_mut().set_online(online);
                arm(&inner);
            }
        })
    };
    let on_online = make(true);
    let on_offline = make(false);
    let _ = target.add_event_listener_with_callback("online", on_online.as_ref().unchecked_ref());
    let _ = target.add_event_listener_with_callback("offline", on_offline.as_ref().unchecked_ref());
    *inner.scheduler.online.borrow_mut() = Some((on_online, on_offline));
}

/// Stops every timer, stream and listener this scheduler owns.
pub fn stop(scheduler: &Scheduler) {
    scheduler.running.set(false);
    scheduler.timer.borrow_mut().take();
    scheduler.reconnect.borrow_mut().take();
    close_wake_stream(scheduler);
    if let Some((on_online, on_offline)) = scheduler.online.borrow_mut().take() {
        if let Ok(target) = js_sys::global().dyn_into::<web_sys::EventTarget>() {
            let _ = target.remove_event_listener_with_callback("online", on_online.as_ref().unchecked_ref());
            let _ = target.remove_event_listener_with_callback("offline", on_offline.as_ref().unchecked_ref());
        }
    }
}

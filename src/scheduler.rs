//! Browser timers and wake-ups: one timeout armed for the engine's next wake time, a server-sent
//! wake stream that asks for a pull soon, and the browser's online/offline signals.

use std::cell::RefCell;
use std::rc::{Rc, Weak};

use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

use crate::js;
use crate::runner::{now, Inner};

/// The longest a timer waits, so a client whose engine has nothing to do still looks again.
const MAX_TIMER_MS: i64 = 60_000;
/// How long after a wake stream error a new stream is opened (with a fresh token).
const WAKE_RECONNECT_MS: i32 = 5_000;

type EventHandler = Closure<dyn FnMut(web_sys::Event)>;

/// The armed timeout: its handle and the callback it will run.
type Timer = (JsValue, Closure<dyn FnMut()>);

#[derive(Default)]
pub struct Scheduler {
    /// `autoSync`: when false no timer is ever armed and only explicit calls talk to the server.
    pub enabled: std::cell::Cell<bool>,
    timer: RefCell<Option<Timer>>,
    /// The wake stream's controller: aborting it ends the stream.
    wake: RefCell<Option<web_sys::AbortController>>,
    /// The `online` and `offline` handlers.
    online: RefCell<Option<(EventHandler, EventHandler)>>,
}

/// Arms the timer for the engine's next wake time (or now). Replaces any timer already armed.
pub fn arm(inner: &Rc<Inner>, scheduler: &Rc<Scheduler>) {
    if inner.closed.get() || !scheduler.enabled.get() {
        return;
    }
    let t = now();
    let at = inner.engine.borrow().next_wake(t).unwrap_or(t + MAX_TIMER_MS);
    let delay = (at - t).clamp(0, MAX_TIMER_MS) as i32;
    let weak_inner = Rc::downgrade(inner);
    let weak_sched = Rc::downgrade(scheduler);
    let callback = Closure::<dyn FnMut()>::new(move || fire(weak_inner.clone(), weak_sched.clone()));
    cancel_timer(scheduler);
    if let Some(handle) = js::set_timeout(callback.as_ref(), delay, &JsValue::UNDEFINED) {
        *scheduler.timer.borrow_mut() = Some((handle, callback));
    }
}

fn fire(inner: Weak<Inner>, scheduler: Weak<Scheduler>) {
    wasm_bindgen_futures::spawn_local(async move {
        let (Some(inner), Some(scheduler)) = (inner.upgrade(), scheduler.upgrade()) else { return };
        if inner.tick().await {
            arm(&inner, &scheduler);
        }
    });
}

fn cancel_timer(scheduler: &Scheduler) {
    if let Some((handle, _closure)) = scheduler.timer.borrow_mut().take() {
        js::clear_timeout(&handle);
    }
}

/// Opens the wake stream: a streaming `fetch` of `/kizuna/v1/wake` with the token in the
/// `Authorization` header (an `EventSource` can only carry it in the URL, where browser, proxy and
/// server logs keep it). Each `wake` event asks the engine for a pull and re-arms the timer; the
/// stream carries no row data, so a missed event only delays the next scheduled pull. When the
/// stream ends or fails, a new one is opened after a pause, with a fresh token.
pub fn open_wake_stream(inner: &Rc<Inner>, scheduler: &Rc<Scheduler>) {
    let weak_inner = Rc::downgrade(inner);
    let weak_sched = Rc::downgrade(scheduler);
    wasm_bindgen_futures::spawn_local(async move {
        let Some(inner) = weak_inner.upgrade() else { return };
        if inner.closed.get() {
            return;
        }
        let opened = inner.transport.open_stream("/kizuna/v1/wake").await;
        drop(inner);
        let Ok((response, controller)) = opened else {
            retry_wake_stream(weak_inner, weak_sched);
            return;
        };
        let (Some(inner), Some(sched)) = (weak_inner.upgrade(), weak_sched.upgrade()) else {
            controller.abort();
            return;
        };
        if inner.closed.get() {
            controller.abort(); // closed while the stream was opening
            return;
        }
        close_wake_stream(&sched);
        *sched.wake.borrow_mut() = Some(controller.clone());
        drop((inner, sched));
        read_wake_events(&response, &weak_inner, &weak_sched).await;
        // Ended: by `close()` (the controller is gone then) or by the network or server.
        let current = weak_sched.upgrade().and_then(|s| s.wake.borrow().as_ref().map(|c| c == &controller));
        if current == Some(true) {
            retry_wake_stream(weak_inner, weak_sched);
        }
    });
}

/// Reads Server-Sent Events from the stream until it ends; a `wake` event wakes the engine.
async fn read_wake_events(response: &web_sys::Response, inner: &Weak<Inner>, scheduler: &Weak<Scheduler>) {
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
                if let (Some(inner), Some(sched)) = (inner.upgrade(), scheduler.upgrade()) {
                    inner.engine.borrow_mut().wake();
                    arm(&inner, &sched);
                }
            }
        }
    }
}

fn retry_wake_stream(inner: Weak<Inner>, scheduler: Weak<Scheduler>) {
    let callback = Closure::once_into_js(move || {
        if let (Some(inner), Some(sched)) = (inner.upgrade(), scheduler.upgrade()) {
            if !inner.closed.get() {
                open_wake_stream(&inner, &sched);
            }
        }
    });
    let _ = js::set_timeout(&callback, WAKE_RECONNECT_MS, &JsValue::UNDEFINED);
}

fn close_wake_stream(scheduler: &Scheduler) {
    if let Some(controller) = scheduler.wake.borrow_mut().take() {
        controller.abort();
    }
}

/// Follows the browser's online/offline signals: going online re-arms the timer at once.
pub fn watch_connectivity(inner: &Rc<Inner>, scheduler: &Rc<Scheduler>) {
    let global = js_sys::global();
    let Ok(target) = global.clone().dyn_into::<web_sys::EventTarget>() else { return };
    let make = |online: bool| {
        let weak_inner = Rc::downgrade(inner);
        let weak_sched = Rc::downgrade(scheduler);
        EventHandler::new(move |_| {
            if let (Some(inner), Some(sched)) = (weak_inner.upgrade(), weak_sched.upgrade()) {
                inner.engine.borrow_mut().set_online(online);
                arm(&inner, &sched);
            }
        })
    };
    let on_online = make(true);
    let on_offline = make(false);
    let _ = target.add_event_listener_with_callback("online", on_online.as_ref().unchecked_ref());
    let _ = target.add_event_listener_with_callback("offline", on_offline.as_ref().unchecked_ref());
    *scheduler.online.borrow_mut() = Some((on_online, on_offline));
}

/// Stops every timer, stream and listener this scheduler owns.
pub fn stop(scheduler: &Scheduler) {
    cancel_timer(scheduler);
    close_wake_stream(scheduler);
    if let Some((on_online, on_offline)) = scheduler.online.borrow_mut().take() {
        if let Ok(target) = js_sys::global().dyn_into::<web_sys::EventTarget>() {
            let _ = target.remove_event_listener_with_callback("online", on_online.as_ref().unchecked_ref());
            let _ = target.remove_event_listener_with_callback("offline", on_offline.as_ref().unchecked_ref());
        }
    }
}

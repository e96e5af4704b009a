//! Browser timers and wake-ups: one timeout armed for the engine's next wake time, a server-sent
//! wake stream that asks for a pull soon, and the browser's online/offline signals.

use std::cell::RefCell;
use std::rc::{Rc, Weak};

use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::EventSource;

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
    /// The wake stream with its `wake` and `error` handlers.
    wake: RefCell<Option<(EventSource, EventHandler, EventHandler)>>,
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

/// Opens the wake stream. Each `wake` event asks the engine for a pull and re-arms the timer;
/// the stream carries no row data, so a missed event only delays the next scheduled pull.
pub fn open_wake_stream(inner: &Rc<Inner>, scheduler: &Rc<Scheduler>) {
    let weak_inner = Rc::downgrade(inner);
    let weak_sched = Rc::downgrade(scheduler);
    wasm_bindgen_futures::spawn_local(async move {
        let Some(inner) = weak_inner.upgrade() else { return };
        if inner.closed.get() {
            return;
        }
        let Ok(token) = inner.transport.access_token().await else {
            retry_wake_stream(weak_inner.clone(), weak_sched.clone());
            return;
        };
        if inner.closed.get() {
            return;  // closed while the token lookup ran
        }
        let url = format!(
            "{}/kizuna/v1/wake?access_token={}",
            inner.transport.base_url.trim_end_matches('/'),
            js_sys::encode_uri_component(&token)
        );
        let Ok(source) = EventSource::new(&url) else { return };
        let on_wake = EventHandler::new({
            let weak_inner = weak_inner.clone();
            let weak_sched = weak_sched.clone();
            move |_| {
                if let (Some(inner), Some(sched)) = (weak_inner.upgrade(), weak_sched.upgrade()) {
                    inner.engine.borrow_mut().wake();
                    arm(&inner, &sched);
                }
            }
        });
        let on_error = EventHandler::new({
            let weak_inner = weak_inner.clone();
            let weak_sched = weak_sched.clone();
            move |_| {
                if let Some(sched) = weak_sched.upgrade() {
                    close_wake_stream(&sched);
                }
                retry_wake_stream(weak_inner.clone(), weak_sched.clone());
            }
        });
        let _ = source.add_event_listener_with_callback("wake", on_wake.as_ref().unchecked_ref());
        source.set_onerror(Some(on_error.as_ref().unchecked_ref()));
        if let Some(sched) = weak_sched.upgrade() {
            close_wake_stream(&sched);
            *sched.wake.borrow_mut() = Some((source, on_wake, on_error));
        }
    });
}

fn retry_wake_stream(inner: Weak<Inner>, scheduler: Weak<Scheduler>) {
    let callback = Closure::once_into_js(move || {
        if let (Some(inner), Some(sched)) = (inner.upgrade(), scheduler.upgrade()) {
            open_wake_stream(&inner, &sched);
        }
    });
    let _ = js::set_timeout(&callback, WAKE_RECONNECT_MS, &JsValue::UNDEFINED);
}

fn close_wake_stream(scheduler: &Scheduler) {
    if let Some((source, _, _)) = scheduler.wake.borrow_mut().take() {
        source.set_onerror(None);
        source.close();
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

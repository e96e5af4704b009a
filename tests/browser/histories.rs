//! Seeded histories in the browser: the real client (IndexedDB, fetch, the adapter) on the history
//! checker's table, several devices of two users, with requests refused and answers lost at random,
//! reloads (also with a push on the wire), then healed and synced. Checked: every device shows the
//! server's rows for its user and buckets; every applied write had exactly one effect (the table
//! counts the writes it takes in `n`); no write is left without its answer. The native checker
//! (`crates/checker`) runs the same model at volume; this runs the browser adapter under it.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use js_sys::{Array, Object, Reflect};
use kizunasync::KizunaClient;
use serde_json::{json, Value};
use wasm_bindgen::JsValue;
use wasm_bindgen_test::wasm_bindgen_test;

use crate::support::*;

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// What survives a device's reloads: its fault counter, the switch that heals the network, and
/// the events it saw.
#[derive(Clone)]
struct Kept {
    faults: Rc<Cell<u64>>,
    healed: Rc<Cell<bool>>,
    applied: Array,
    rejected: Array,
}

struct Device {
    name: String,
    user: String,
    lists: Vec<String>,
    faults: Rc<Cell<u64>>,
    healed: Rc<Cell<bool>>,
    client: KizunaClient,
    applied: Array,
    rejected: Array,
}

fn device_options(name: &str, user: &str, lists: &[String], seed: u64, faults: Rc<Cell<u64>>, healed: Rc<Cell<bool>>) -> Object {
    let opts = options(name, user);
    set(&opts, "buckets", json!(lists.iter().map(|l| format!("hl:{l}")).collect::<Vec<_>>()));
    set(&opts, "pullLimit", json!(2));
    let rng = Rc::new(Cell::new(seed | 1));
    let fetch = faulty_fetch(move |_, _| {
        if healed.get() {
            return Fault::Pass;
        }
        let mut r = Rng(rng.get());
        let roll = r.below(100);
        rng.set(r.0);
        match roll {
            0..=9 => {
                faults.set(faults.get() + 1);
                Fault::Refuse
            }
            10..=19 => {
                faults.set(faults.get() + 1);
                Fault::LoseAnswer
            }
            _ => Fault::Pass,
        }
    });
    Reflect::set(&opts, &"fetch".into(), &fetch).unwrap();
    opts
}

async fn open_device(name: &str, user: &str, lists: &[String], seed: u64, kept: Kept) -> Device {
    let Kept { faults, healed, applied, rejected } = kept;
    let client = open(&device_options(name, user, lists, seed, faults.clone(), healed.clone())).await;
    // Into the device's arrays, which outlive its reloads.
    for (event, sink) in [("applied", &applied), ("rejected", &rejected)] {
        let sink = sink.clone();
        let forward = wasm_bindgen::closure::Closure::<dyn Fn(JsValue)>::new(move |e: JsValue| {
            sink.push(&e);
        });
        client.on(event.into(), forward.into_js_value()).unwrap();
    }
    Device { name: name.into(), user: user.into(), lists: lists.to_vec(), faults, healed, client, applied, rejected }
}

/// The server's rows of `lists` as `user` pulls them, by key (a run from the beginning, fetched by
/// plain fetch, no client involved).
async fn server_rows(user: &str, lists: &[String]) -> BTreeMap<String, Value> {
    let mut rows = BTreeMap::new();
    let mut cursor = Value::Null;
    loop {
        let request = json!({"protocol": 1, "client_id": random_id(), "cursor": cursor,
                             "buckets": lists.iter().map(|l| format!("hl:{l}")).collect::<Vec<_>>(), "limit": 500});
        let (status, text) = rpc_text("kizuna_pull", &token_for(user), &request).await;
        assert_eq!(status, 200, "{text}");
        let page: Value = serde_json::from_str(&text).unwrap();
        for e in page["entries"].as_array().unwrap() {
            rows.insert(e["pk"].as_str().unwrap().to_owned(), e["row"].clone());
        }
        if page["done"] == true {
            return rows;
        }
        cursor = page["cursor"].clone();
    }
}

async fn one_history(seed: u64) -> (u64, u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let tag = format!("b{seed}-{}", &random_id()[..8]);
    let users = [random_id(), random_id()];
    let lists: Vec<String> = (0..2).map(|i| format!("{tag}-l{i}")).collect();
    let plans = [(0usize, vec![0usize, 1]), (0, vec![1]), (1, vec![0, 1])];
    let healed = Rc::new(Cell::new(false));
    let mut devices = Vec::new();
    for (i, (user, own)) in plans.iter().enumerate() {
        let own: Vec<String> = own.iter().map(|l| lists[*l].clone()).collect();
        let name = format!("hist-{tag}-{i}");
        let kept = Kept { faults: Rc::default(), healed: healed.clone(), applied: Array::new(), rejected: Array::new() };
        devices.push(open_device(&name, &users[*user], &own, seed + i as u64, kept).await);
    }
    let mut keys: Vec<String> = Vec::new();
    let mut deleted: BTreeSet<String> = BTreeSet::new();
    let mut operations = 0;
    for step in 0..25 {
        let d = rng.below(devices.len() as u64) as usize;
        let list = devices[d].lists[rng.below(devices[d].lists.len() as u64) as usize].clone();
        let dev = &devices[d];
        match rng.below(10) {
            0..=2 => {
                let pk = format!("{tag}-k{step}");
                let row = json!({"id": pk, "list": list, "shared": rng.below(3) == 0, "a": "a0", "title": "t"});
                ok(dev.client.put("hist_items".into(), pk.clone().into(), to_js(&row), None)).await;
                keys.push(pk);
            }
            3..=5 if !keys.is_empty() => {
                let pk = keys[rng.below(keys.len() as u64) as usize].clone();
                let column = if rng.below(2) == 0 { "a" } else { "b" };
                let _ = call(dev.client.patch("hist_items".into(), pk.into(), to_js(&json!({ column: format!("{}-{step}", dev.name) })), None)).await;
            }
            6 if !keys.is_empty() => {
                let pk = keys[rng.below(keys.len() as u64) as usize].clone();
                let _ = call(dev.client.patch("hist_items".into(), pk.into(), to_js(&json!({"list": list})), None)).await;
            }
            7 if !keys.is_empty() => {
                let pk = keys[rng.below(keys.len() as u64) as usize].clone();
                deleted.insert(pk.clone());
                let _ = call(dev.client.delete("hist_items".into(), pk.into(), None)).await;
            }
            8 => {
                // A reload, with whatever is on the wire cut off.
                let _on_the_wire = dev.client.sync();
                let (name, user, own) = (dev.name.clone(), dev.user.clone(), dev.lists.clone());
                let kept = Kept { faults: dev.faults.clone(), healed: dev.healed.clone(), applied: dev.applied.clone(), rejected: dev.rejected.clone() };
                dev.client.close();
                devices[d] = open_device(&name, &user, &own, seed + 100 + step, kept).await;
            }
            _ => {
                let _ = call(dev.client.sync()).await;
            }
        }
        operations += 1;
    }

    // Heal, then sync every device until nothing is pending and a last round changes nothing.
    healed.set(true);
    for _ in 0..30 {
        for d in &devices {
            let _ = call(d.client.sync()).await;
        }
        if devices.iter().all(|d| from_js(d.client.pending_writes()).as_array().is_some_and(Vec::is_empty)) {
            break;
        }
        sleep(50).await;
    }
    for d in &devices {
        let _ = call(d.client.sync()).await;
    }

    // Check.
    let mut effects: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for d in &devices {
        assert_eq!(from_js(d.client.pending_writes()), json!([]), "seed {seed}: {} still has pending writes", d.name);
        for e in d.applied.iter() {
            let e = from_js(e);
            effects.entry(e["pk"].as_str().unwrap().to_owned()).or_default().insert(e["id"].as_str().unwrap().to_owned());
        }
    }
    for d in &devices {
        let want = server_rows(&d.user, &d.lists).await;
        let mine: BTreeMap<String, Value> = ok(d.client.list("hist_items".into())).await
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["id"].as_str().is_some_and(|id| id.starts_with(&tag)))
            .map(|r| (r["id"].as_str().unwrap().to_owned(), r.clone()))
            .collect();
        assert_eq!(mine, want, "seed {seed}: {} did not converge to the server's rows", d.name);
        for (pk, row) in &want {
            if !deleted.contains(pk) {
                let applied = effects.get(pk).map_or(0, BTreeSet::len) as i64;
                assert_eq!(row["n"].as_i64(), Some(applied), "seed {seed}: {pk} took {} writes for {applied} applied", row["n"]);
            }
        }
    }
    let faults = devices.iter().map(|d| d.faults.get()).sum::<u64>();
    for d in devices {
        d.client.close();
    }
    (operations, faults)
}

#[wasm_bindgen_test]
async fn seeded_histories_with_lost_answers_and_reloads_converge_with_one_effect_per_write() {
    let (mut operations, mut faults) = (0, 0);
    for seed in 1..=4 {
        let (o, f) = one_history(seed).await;
        operations += o;
        faults += f;
    }
    web_sys::console::log_1(&format!("browser histories: 4, operations: {operations}, faults: {faults}, violations: 0").into());
    assert!(faults > 0, "the histories met no fault");
}

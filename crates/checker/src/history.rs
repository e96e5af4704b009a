//! One seeded history: a workload of real clients and a plain-SQL writer against the real gateway,
//! with faults, kills, restarts and reaper runs; then every fault healed, every client synced to
//! quiescence, and the history checked.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kizuna_engine::protocol::{Op, Row};
use kizuna_engine::LocalWrite;
use serde_json::{json, Value};
use tokio_postgres::Client as Pg;

use crate::client::{now_ms, row_name, Client, Outcome, TABLES};
use crate::gateway::Gateway;
use crate::model::{Effect, Model};
use crate::prng::Prng;
use crate::transport::Transport;

/// What one history did and found.
#[derive(Debug, Default)]
pub struct Report {
    pub operations: u64,
    pub faults: u64,
    pub violations: Vec<String>,
    /// The history cut down to the keys the violations name: every write, verdict, pulled entry
    /// and plain-SQL write of those keys, and every reload, in time order.
    pub trace: Vec<String>,
}

/// Rows over `max_row_bytes` (64 KiB): a whole-request refusal (KZP04) that dead-letters.
const POISON: usize = 70_000;

fn row(v: Value) -> Row {
    v.as_object().expect("object").clone()
}

/// A row the workload knows: its table and key.
#[derive(Clone)]
struct Key {
    table: &'static str,
    pk: String,
}

fn lw(key: &Key, op: Op, columns: Option<Value>) -> LocalWrite {
    LocalWrite { table: key.table.into(), pk: key.pk.clone(), op, columns: columns.map(row), apply_after: None, latest_only: None }
}

pub async fn run(seed: u64, gateway: &mut Gateway, pg: &Pg, database_url: &str) -> Result<Report, String> {
    let mut rng = Prng::new(seed);
    // The seed decides the workload; the tag only keeps this run's rows apart from earlier runs'.
    let tag = format!("{seed:x}-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let users = [uuid::Uuid::new_v4().to_string(), uuid::Uuid::new_v4().to_string()];
    let lists: Vec<String> = (0..3).map(|i| format!("{tag}-l{i}")).collect();
    let bucket = |l: &String| format!("hl:{l}");
    let fault_percent = 10 + rng.below(20);

    let plans = [
        (0, vec![0, 1]),
        (0, vec![1, 2]),
        (1, vec![0, 1, 2]),
    ];
    let mut clients: Vec<Client> = plans
        .iter()
        .enumerate()
        .map(|(i, (user, lists_of))| {
            let mut transport = Transport::new(gateway.url(), &users[*user], seed ^ ((i as u64 + 1) * 0x9E37));
            transport.fault_percent = fault_percent;
            let buckets = lists_of.iter().map(|l| bucket(&lists[*l])).collect();
            Client::new(format!("c{i}"), users[*user].clone(), buckets, transport, seed.wrapping_mul(31).wrapping_add(i as u64))
        })
        .collect();

    // The plain-SQL writer: commits one column of an existing row now and then, while pulls run.
    let known: Arc<Mutex<Vec<Key>>> = Arc::default();
    let sql_log: Arc<Mutex<Vec<Effect>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (known, sql_log, stop) = (known.clone(), sql_log.clone(), stop.clone());
        let url = database_url.to_owned();
        let mut rng = Prng::new(seed ^ 0x5A5A);
        tokio::spawn(async move {
            let Ok((pg, conn)) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await else { return };
            tokio::spawn(conn);
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(2 + rng.below(8))).await;
                let key = {
                    let known = known.lock().unwrap();
                    if known.is_empty() {
                        continue;
                    }
                    known[rng.below(known.len() as u64) as usize].clone()
                };
                n += 1;
                let value = format!("sql-{n}");
                // The clock this write stamps on its columns (hlc mode), chosen here so the history
                // knows it; fence_now() draws the transaction's commit number inside it, so the
                // history knows exactly where the write lands.
                let hlc = format!("{:013}-0000-sql{n}", now_ms());
                let sql = format!(
                    "with w as (update public.{} set a = $1 where id = $2 returning id) \
                     select (select count(*) from w), kizuna.fence_now()",
                    key.table
                );
                let result = async {
                    pg.batch_execute("begin").await?;
                    pg.execute("select set_config('kizuna.hlc', $1, true)", &[&hlc]).await?;
                    let row = pg.query_one(&sql, &[&value, &key.pk]).await?;
                    pg.batch_execute("commit").await?;
                    Ok::<_, tokio_postgres::Error>((row.get::<_, i64>(0), row.get::<_, i64>(1)))
                }
                .await;
                match result {
                    Ok((1, seq)) => sql_log.lock().unwrap().push(Effect {
                        seq,
                        order: 0,
                        user: String::new(),
                        table: key.table.into(),
                        pk: key.pk,
                        hlc: Some(hlc),
                        sql: true,
                        op: Op::Patch,
                        columns: Some(row(json!({"a": value}))),
                    }),
                    Ok(_) => {}
                    Err(_) => {
                        let _ = pg.batch_execute("rollback").await;
                    }
                }
            }
        })
    };

    // The workload.
    let mut keys: Vec<(usize, Key)> = Vec::new(); // (owner index, key)
    let steps = 30 + rng.below(20);
    let mut operations = 0u64;
    for step in 0..steps {
        let c = rng.below(clients.len() as u64) as usize;
        let user_of = plans[c].0;
        let my_lists: Vec<&String> = plans[c].1.iter().map(|l| &lists[*l]).collect();
        let list = (*rng.pick(&my_lists)).clone();
        let choice = rng.below(100);
        let pick_key = |rng: &mut Prng| -> Option<Key> {
            (!keys.is_empty()).then(|| keys[rng.below(keys.len() as u64) as usize].1.clone())
        };
        let new_key = |rng: &mut Prng, what: &str| Key { table: TABLES[rng.below(TABLES.len() as u64) as usize], pk: format!("{tag}-{what}{step}") };
        match choice {
            0..=19 => {
                let key = new_key(&mut rng, "k");
                let shared = rng.chance(30);
                clients[c].write(vec![lw(&key, Op::Upsert, Some(json!({"list": list, "shared": shared, "a": format!("{}-a0", key.pk), "title": "t"})))]);
                keys.push((user_of, key.clone()));
                known.lock().unwrap().push(key);
            }
            20..=39 => {
                if let Some(key) = pick_key(&mut rng) {
                    let column = if rng.chance(50) { "a" } else { "b" };
                    let mut w = lw(&key, Op::Patch, Some(json!({ column: format!("{}-{step}", clients[c].name) })));
                    w.latest_only = Some(rng.chance(25));
                    clients[c].write(vec![w]);
                }
            }
            40..=47 => {
                if let Some(key) = pick_key(&mut rng) {
                    clients[c].write(vec![lw(&key, Op::Patch, Some(json!({"list": list})))]); // a move
                }
            }
            48..=52 => {
                if let Some(key) = pick_key(&mut rng) {
                    clients[c].write(vec![lw(&key, Op::Delete, None)]);
                }
            }
            53..=57 => {
                let key = new_key(&mut rng, "k");
                let other = pick_key(&mut rng).unwrap_or_else(|| key.clone());
                clients[c].write(vec![
                    lw(&key, Op::Upsert, Some(json!({"list": list, "title": "batch"}))),
                    lw(&other, Op::Patch, Some(json!({"b": format!("batch-{step}")}))),
                ]);
                keys.push((user_of, key.clone()));
                known.lock().unwrap().push(key);
            }
            58..=60 => {
                if let Some(key) = pick_key(&mut rng) {
                    clients[c].write(vec![lw(&key, Op::Patch, Some(json!({"title": "refuse-me"})))]); // the gate says no
                }
            }
            61..=62 => {
                let key = new_key(&mut rng, "poison");
                clients[c].write(vec![lw(&key, Op::Upsert, Some(json!({"list": list, "title": "x".repeat(POISON)})))]);
            }
            63..=65 => {
                if let Some(key) = pick_key(&mut rng) {
                    let mut w = lw(&key, Op::Patch, Some(json!({"b": format!("later-{step}")})));
                    w.apply_after = Some(now_ms() + 100 + rng.below(300) as i64);
                    clients[c].write(vec![w]);
                }
            }
            66..=69 => {
                let online = !clients[c].engine.is_online();
                clients[c].engine.set_online(online);
            }
            70..=72 => clients[c].reload(None),
            73..=74 => clients[c].push_then_reload().await,
            75..=76 => {
                // The app changes the buckets it follows.
                let mut set: Vec<String> = plans[c].1.iter().map(|l| bucket(&lists[*l])).collect();
                if rng.chance(50) {
                    set.truncate(1);
                }
                clients[c].reload(Some(set));
            }
            77 => {
                if gateway.is_up() {
                    gateway.kill().await;
                } else {
                    gateway.restart().await?;
                }
            }
            79 => {
                // A crash in the middle of whatever comes next, then a restart a little later.
                if gateway.is_up() {
                    gateway.kill_after(rng.below(15));
                    let key = new_key(&mut rng, "k");
                    for _ in 0..2 {
                        let c = rng.below(clients.len() as u64) as usize;
                        clients[c].write(vec![lw(&key, Op::Upsert, Some(json!({"list": lists[plans[c].1[0]], "title": "crash"})))]);
                        keys.push((plans[c].0, key.clone()));
                        clients[c].step().await;
                    }
                    gateway.restart().await?;
                }
            }
            78 => {
                if gateway.is_up() {
                    let _ = gateway.reap_tombstones().await;
                }
            }
            _ => {
                for _ in 0..1 + rng.below(3) {
                    let c = rng.below(clients.len() as u64) as usize;
                    clients[c].step().await;
                }
            }
        }
        operations += 1;
        if rng.chance(40) {
            let c = rng.below(clients.len() as u64) as usize;
            clients[c].step().await;
        }
    }

    // Heal: the network, the gateway, every client online with its own buckets; stop the writer.
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = writer.await;
    if !gateway.is_up() {
        gateway.restart().await?;
    }
    for (i, client) in clients.iter_mut().enumerate() {
        client.transport.fault_percent = 0;
        client.engine.set_online(true);
        let own: Vec<String> = plans[i].1.iter().map(|l| bucket(&lists[*l])).collect();
        if client.config.buckets != own {
            client.reload(Some(own));
        }
    }
    quiesce(&mut clients, pg).await?;

    // Check.
    let mut report = Report { operations, ..Report::default() };
    for client in &clients {
        report.operations += client.ops;
        report.faults += client.transport.faults;
        report.violations.extend(client.violations.iter().cloned());
    }
    let mut model = Model::default();
    for effect in sql_log.lock().unwrap().iter() {
        model.add(effect.clone());
    }
    for client in &clients {
        for (id, entry) in &client.writes {
            match client.outcomes.get(id) {
                Some(Outcome::Applied(Some(seq))) => model.add(Effect {
                    seq: *seq,
                    order: entry.seq,
                    user: client.user.clone(),
                    table: entry.table.clone(),
                    pk: entry.pk.clone(),
                    hlc: Some(entry.hlc.clone()),
                    sql: false,
                    op: entry.op,
                    columns: entry.columns.clone(),
                }),
                Some(Outcome::Applied(None)) => report
                    .violations
                    .push(format!("{}: write {} was SKIPPED with no ledger pruning in this history", client.name, entry.seq)),
                Some(_) => {}
                None => report.violations.push(format!("{}: write {} ({}) ended with no verdict, event or dead letter", client.name, entry.seq, entry.pk)),
            }
        }
    }
    check(&clients, &model, pg, &tag, &mut report).await?;
    if !report.violations.is_empty() {
        report.trace = shrunk(&clients, &sql_log.lock().unwrap(), &report.violations, &tag);
    }
    Ok(report)
}

/// Syncs every client until none has anything to send and each has committed the server's
/// current horizon.
async fn quiesce(clients: &mut [Client], pg: &Pg) -> Result<(), String> {
    let deadline = now_ms() + 60_000;
    loop {
        for client in clients.iter_mut() {
            client.engine.request_push();
            client.engine.request_pull();
            for _ in 0..20 {
                if !client.step().await {
                    break;
                }
            }
        }
        let horizon: i64 = pg.query_one("select kizuna.horizon()", &[]).await.map_err(|e| e.to_string())?.get(0);
        if clients.iter().all(|c| c.settled() && c.engine.checkpoint().horizon == horizon) {
            return Ok(());
        }
        if now_ms() > deadline {
            let stuck: Vec<String> = clients
                .iter()
                .map(|c| format!("{}: pending {}, horizon {} of {horizon}", c.name, c.engine.status().pending, c.engine.checkpoint().horizon))
                .collect();
            return Err(format!("no quiescence within 60 s: {}", stuck.join("; ")));
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

async fn check(clients: &[Client], model: &Model, pg: &Pg, tag: &str, report: &mut Report) -> Result<(), String> {
    // Every committed checkpoint is the server's state at its horizon, as the user sees it, with
    // the client's own writes that were acknowledged before it but committed after its horizon
    // folded in (the engine keeps an acknowledged write in the row until a pull brings it, so that
    // read-your-writes holds between the verdict and that pull).
    for client in clients {
        let mut own: Vec<&kizuna_engine::OutboxEntry> = client.writes.values().collect();
        own.sort_by_key(|e| e.seq);
        for snap in &client.snapshots {
            let mut want = model.view_at(snap.horizon, &client.user, &snap.buckets);
            for entry in &own {
                let folded = matches!(client.outcomes.get(&entry.id), Some(Outcome::Applied(Some(seq))) if *seq > snap.horizon)
                    && client.answered_at.get(&entry.id).is_some_and(|at| *at < snap.at);
                if folded {
                    let name = row_name(&entry.table, &entry.pk);
                    let base = want.remove(&name).and_then(|v| v.as_object().cloned());
                    if let Some(row) = kizuna_engine::util::apply_op(base, entry.op, entry.columns.as_ref()) {
                        want.insert(name, Value::Object(row));
                    }
                }
            }
            let got: BTreeMap<String, Value> = snap.rows.iter().filter(|(k, _)| mine(k, tag)).map(|(k, v)| (k.clone(), v.clone())).collect();
            if got != want {
                report.violations.push(format!(
                    "{}: checkpoint {} is not the server's state at its horizon: {}",
                    client.name,
                    snap.horizon,
                    difference(&got, &want)
                ));
            }
        }
        // Monotonic writes: applied in issue order. A write with a delay window is the documented
        // exception: it is held without holding the writes behind it.
        let mut applied: Vec<(i64, i64)> = client
            .writes
            .values()
            .filter(|e| e.apply_after.is_none())
            .filter_map(|e| match client.outcomes.get(&e.id) {
                Some(Outcome::Applied(Some(seq))) => Some((e.seq, *seq)),
                _ => None,
            })
            .collect();
        applied.sort();
        if applied.windows(2).any(|w| w[0].1 > w[1].1) {
            report.violations.push(format!("{}: writes applied out of issue order: {applied:?}", client.name));
        }
    }

    // Exactly-once effect: the server's rows (with `n`, the writes each took) are the model's.
    let mut server: BTreeMap<String, Value> = BTreeMap::new();
    for table in TABLES {
        let rows = pg
            .query(&format!("select id, to_jsonb(t) from public.{table} t where id like $1"), &[&format!("{tag}-%")])
            .await
            .map_err(|e| e.to_string())?;
        for r in rows {
            server.insert(row_name(table, &r.get::<_, String>(0)), r.get::<_, Value>(1));
        }
    }
    let modelled = model.rows_at(i64::MAX);
    if server != modelled {
        report.violations.push(format!("the server's rows are not the applied writes, each once: {}", difference(&server, &modelled)));
    }

    // Convergence: every client shows the server's rows as its user and buckets render them.
    for client in clients {
        let mut buckets = client.config.buckets.clone();
        buckets.sort();
        let want = model.view_at(i64::MAX, &client.user, &buckets);
        let got: BTreeMap<String, Value> =
            client.visible_rows().into_iter().filter(|(k, _)| mine(k, tag)).collect();
        if got != want {
            report.violations.push(format!("{}: did not converge: {}", client.name, difference(&got, &want)));
        }
    }
    Ok(())
}

/// A `table/pk` of this history's.
fn mine(name: &str, tag: &str) -> bool {
    name.split_once('/').is_some_and(|(_, pk)| pk.starts_with(tag))
}

fn difference(got: &BTreeMap<String, Value>, want: &BTreeMap<String, Value>) -> String {
    let mut out = Vec::new();
    for (k, v) in want {
        match got.get(k) {
            None => out.push(format!("missing {k}={v}")),
            Some(g) if g != v => out.push(format!("{k}: has {g}, should be {v}")),
            _ => {}
        }
    }
    for k in got.keys().filter(|k| !want.contains_key(*k)) {
        out.push(format!("extra {k}={}", got[k]));
    }
    out.join("; ")
}

/// The part of the history that concerns the keys a violation names.
fn shrunk(clients: &[Client], sql: &[Effect], violations: &[String], tag: &str) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for v in violations {
        for word in v.split(|c: char| !(c.is_alphanumeric() || c == '-' || c == '_' || c == '/')) {
            let pk = word.split_once('/').map_or(word, |(_, pk)| pk);
            if pk.starts_with(tag) && pk.contains("-k") && !keys.iter().any(|k| k == pk) {
                keys.push(pk.to_owned());
            }
        }
    }
    let mut lines: Vec<(i64, String)> = clients
        .iter()
        .flat_map(|c| c.trace.iter())
        .filter(|(_, line)| line.contains("reload") || keys.iter().any(|k| line.split_whitespace().any(|w| w == k)))
        .cloned()
        .collect();
    lines.sort();
    let mut out: Vec<String> = lines.into_iter().map(|(t, line)| format!("{t} {line}")).collect();
    for e in sql.iter().filter(|e| keys.contains(&e.pk)) {
        out.push(format!("sql write {} {:?} at seq {}", e.pk, e.columns, e.seq));
    }
    out
}

//! One seeded history: its plan (plan.rs) carried out by real clients, each behind its own faulty
//! network (proxy.rs), and a plain-SQL writer, against the real gateway, with kills, restarts and
//! reaper runs; then every fault healed, every client synced to quiescence, and the history checked
//! (checks.rs).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kizuna_engine::protocol::{Op, Row};
use kizuna_engine::LocalWrite;
use serde_json::{json, Value};
use tokio_postgres::Client as Pg;

use crate::browser::Browser;
use crate::checks;
use crate::device::Device;
use crate::gateway::Gateway;
use crate::model::Effect;
use crate::operator;
use crate::plan::{Action, Key, Plan, Step, PLANS};
use crate::prng::Prng;
use crate::proxy::Proxy;
use crate::record::now_ms;

/// What one history did and found.
#[derive(Debug, Default)]
pub struct Report {
    pub operations: u64,
    pub faults: u64,
    pub violations: Vec<String>,
    /// The history cut down to the keys the violations name: every write, verdict, pulled entry
    /// and plain-SQL write of those keys, and every reload, in time order.
    pub trace: Vec<String>,
    /// A line per device: what it did and heard (`--verbose`).
    pub devices: Vec<String>,
}

/// Rows over `max_row_bytes` (64 KiB): a whole-request refusal (KZP04) that dead-letters.
const POISON: usize = 70_000;

/// How the clients of one history are made: all native, or the last one a real browser.
pub struct Setup<'a> {
    pub gateway: &'a mut Gateway,
    pub pg: &'a Pg,
    pub database_url: &'a str,
    pub browser: Option<&'a mut Browser>,
}

fn row(v: Value) -> Row {
    v.as_object().expect("object").clone()
}

/// A write of `key`. An upsert names the row's `id` too, as an app's row carries its key (a read of
/// a table lists rows, not keys).
fn lw(tag: &str, key: &Key, op: Op, columns: Option<Value>) -> LocalWrite {
    let pk = format!("{tag}-{}", key.name);
    let mut columns = columns.map(row);
    if let (Op::Upsert, Some(c)) = (op, columns.as_mut()) {
        c.insert("id".into(), Value::from(pk.clone()));
    }
    LocalWrite { table: key.table.into(), pk, op, columns, apply_after: None, latest_only: None }
}

/// Runs the steps of `plan` that `keep` admits, heals, quiesces, and checks.
pub async fn run(seed: u64, plan: &Plan, keep: &dyn Fn(&Step) -> bool, setup: &mut Setup<'_>) -> Result<Report, String> {
    // The seed decides the workload; the tag only keeps this run's rows apart from earlier runs'.
    let tag = format!("{seed:x}-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let users = [uuid::Uuid::new_v4().to_string(), uuid::Uuid::new_v4().to_string()];
    let lists: Vec<String> = (0..3).map(|i| format!("{tag}-l{i}")).collect();
    let bucket = |l: usize| format!("hl:{}", lists[l]);
    let own_buckets = |c: usize| PLANS[c].1.iter().map(|l| bucket(*l)).collect::<Vec<_>>();

    let mut clients: Vec<Device> = Vec::new();
    for (i, (user, _)) in PLANS.iter().enumerate() {
        let proxy = Proxy::start(setup.gateway.url(), seed ^ ((i as u64 + 1) * 0x9E37)).await?;
        proxy.set_fault_percent(plan.fault_percent);
        let name = format!("c{i}");
        let client_seed = seed.wrapping_mul(31).wrapping_add(i as u64);
        // The last client of a history with a browser is the real client in a page.
        let device = match setup.browser.as_deref_mut() {
            Some(browser) if i == PLANS.len() - 1 => {
                Device::Browser(browser.client(name, users[*user].clone(), own_buckets(i), proxy).await?)
            }
            _ => Device::native(name, users[*user].clone(), own_buckets(i), proxy, client_seed),
        };
        clients.push(device);
    }

    let sql_log: Arc<Mutex<Vec<Effect>>> = Arc::default();
    let known: Arc<Mutex<Vec<(&'static str, String)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(sql_writer(setup.database_url.to_owned(), seed, known.clone(), sql_log.clone(), stop.clone()));

    let mut operations = 0u64;
    for step in plan.steps.iter().filter(|s| keep(s)) {
        operations += 1;
        let c = step.client;
        let list = |l: usize| lists[l].clone();
        match &step.action {
            Action::Insert { key, list: l, shared } => {
                let columns = json!({"list": list(*l), "shared": shared, "a": format!("{tag}-{}-a0", key.name), "title": "t"});
                clients[c].write(vec![lw(&tag, key, Op::Upsert, Some(columns))]).await?;
                known.lock().unwrap().push((key.table, format!("{tag}-{}", key.name)));
            }
            Action::Patch { key, column, latest_only } => {
                let value = match *column {
                    "x" => json!(rounding_bait(step.index as u64 * 64 + c as u64)),
                    _ => json!(format!("c{c}-{}", step.index)),
                };
                let mut w = lw(&tag, key, Op::Patch, Some(json!({ *column: value })));
                w.latest_only = Some(*latest_only);
                clients[c].write(vec![w]).await?;
            }
            Action::Move { key, list: l } => clients[c].write(vec![lw(&tag, key, Op::Patch, Some(json!({"list": list(*l)})))]).await?,
            Action::Delete { key } => clients[c].write(vec![lw(&tag, key, Op::Delete, None)]).await?,
            Action::Batch { new, list: l, other } => {
                clients[c]
                    .write(vec![
                        lw(&tag, new, Op::Upsert, Some(json!({"list": list(*l), "title": "batch"}))),
                        lw(&tag, other, Op::Patch, Some(json!({"b": format!("batch-{}", step.index)}))),
                    ])
                    .await?;
                known.lock().unwrap().push((new.table, format!("{tag}-{}", new.name)));
            }
            Action::Refused { key } => clients[c].write(vec![lw(&tag, key, Op::Patch, Some(json!({"title": "refuse-me"})))]).await?,
            Action::Poison { key, list: l } => {
                clients[c].write(vec![lw(&tag, key, Op::Upsert, Some(json!({"list": list(*l), "title": "x".repeat(POISON)})))]).await?
            }
            Action::Delayed { key, after_ms } => {
                let mut w = lw(&tag, key, Op::Patch, Some(json!({"b": format!("later-{}", step.index)})));
                w.apply_after = Some(now_ms() + after_ms);
                clients[c].write(vec![w]).await?;
            }
            Action::ToggleOnline => {
                let online = !clients[c].is_online();
                clients[c].set_online(online).await?;
            }
            Action::TogglePartition => {
                let proxy = clients[c].proxy();
                proxy.set_partitioned(!proxy.is_partitioned());
            }
            Action::Reload => clients[c].reload(None).await?,
            Action::PushThenReload => clients[c].push_then_reload().await?,
            Action::Buckets { first_only } => {
                let mut set = own_buckets(c);
                if *first_only {
                    set.truncate(1);
                }
                clients[c].reload(Some(set)).await?;
            }
            Action::KillOrRestart => {
                if setup.gateway.is_up() {
                    setup.gateway.kill().await;
                } else {
                    setup.gateway.restart().await?;
                }
            }
            Action::Reap => {
                if setup.gateway.is_up() {
                    let _ = setup.gateway.reap_tombstones().await;
                }
            }
            Action::Crash { after_ms, key, writers } => {
                // A crash in the middle of whatever comes next, then a restart a little later.
                if setup.gateway.is_up() {
                    setup.gateway.kill_after(*after_ms);
                    for w in writers {
                        let l = PLANS[*w].1[0];
                        clients[*w].write(vec![lw(&tag, key, Op::Upsert, Some(json!({"list": list(l), "title": "crash"})))]).await?;
                        clients[*w].sync().await?;
                    }
                    known.lock().unwrap().push((key.table, format!("{tag}-{}", key.name)));
                    setup.gateway.restart().await?;
                }
            }
            Action::SqlBulk { list: from, to, fill, owner } => {
                let prefix = format!("{tag}-bulk{}", step.index);
                let to = to.map(list);
                let (effects, created) = operator::bulk(setup.pg, &prefix, &users[*owner], &list(*from), to.as_deref(), *fill).await?;
                sql_log.lock().unwrap().extend(effects);
                known.lock().unwrap().extend(created);
            }
            Action::Migrate { table } => operator::migrate(setup.pg, table).await?,
            Action::Read => clients[c].read().await?,
            Action::Sync => {
                clients[c].sync().await?;
            }
        }
    }

    // Heal: the network, the gateway, every client online with its own buckets; stop the writer.
    stop.store(true, Ordering::Relaxed);
    let _ = writer.await;
    if !setup.gateway.is_up() {
        setup.gateway.restart().await?;
    }
    for (i, client) in clients.iter_mut().enumerate() {
        client.proxy().set_fault_percent(0);
        client.proxy().set_partitioned(false);
        client.set_online(true).await?;
        let own = own_buckets(i);
        if client.rec().buckets != own {
            client.reload(Some(own)).await?;
        }
    }
    quiesce(&mut clients, setup.pg).await?;
    for client in clients.iter_mut() {
        client.read().await?;
        client.finish().await?;
    }

    let mut report = Report { operations, ..Report::default() };
    for client in &clients {
        report.operations += client.rec().ops;
        report.faults += client.proxy().faults();
        report.devices.push(client.rec().summary());
    }
    let sql = sql_log.lock().unwrap().clone();
    let records: Vec<&crate::record::Record> = clients.iter().map(Device::rec).collect();
    report.violations = checks::check(&records, &sql, setup.pg, &tag).await?;
    if !report.violations.is_empty() {
        report.trace = checks::trace_of(&records, &sql, &report.violations, &tag);
    }
    for client in clients {
        client.close().await?;
    }
    Ok(report)
}

/// The plain-SQL writer: commits one column of an existing row now and then, while pulls run, and
/// logs each write with the commit number it drew inside its transaction.
async fn sql_writer(url: String, seed: u64, known: Arc<Mutex<Vec<(&'static str, String)>>>, log: Arc<Mutex<Vec<Effect>>>, stop: Arc<AtomicBool>) {
    let Ok((pg, conn)) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await else { return };
    tokio::spawn(conn);
    let mut rng = Prng::new(seed ^ 0x5A5A);
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(2 + rng.below(8))).await;
        let (table, pk) = {
            let known = known.lock().unwrap();
            if known.is_empty() {
                continue;
            }
            known[rng.below(known.len() as u64) as usize].clone()
        };
        n += 1;
        let value = format!("sql-{n}");
        // The clock this write stamps on its columns (hlc mode), chosen here so the history knows
        // it; fence_now() draws the transaction's commit number inside it, so the history knows
        // exactly where the write lands.
        let hlc = format!("{:013}-0000-sql{n}", now_ms());
        let sql = format!(
            "with w as (update public.{table} set a = $1 where id = $2 returning id) \
             select (select count(*) from w), kizuna.fence_now()"
        );
        let result = async {
            pg.batch_execute("begin").await?;
            pg.execute("select set_config('kizuna.hlc', $1, true)", &[&hlc]).await?;
            let row = pg.query_one(&sql, &[&value, &pk]).await?;
            pg.batch_execute("commit").await?;
            Ok::<_, tokio_postgres::Error>((row.get::<_, i64>(0), row.get::<_, i64>(1)))
        }
        .await;
        match result {
            Ok((1, seq)) => log.lock().unwrap().push(Effect {
                seq,
                order: 0,
                user: String::new(),
                table: table.into(),
                pk,
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
}

/// Syncs every client until none has anything to send and each has committed the server's
/// current horizon.
async fn quiesce(clients: &mut [Device], pg: &Pg) -> Result<(), String> {
    let deadline = now_ms() + 60_000;
    loop {
        for client in clients.iter_mut() {
            client.sync_until_idle().await?;
        }
        let horizon: i64 = pg.query_one("select kizuna.horizon()", &[]).await.map_err(|e| e.to_string())?.get(0);
        let mut stuck = Vec::new();
        for client in clients.iter_mut() {
            let (pending, at) = client.progress().await?;
            if pending > 0 || at != horizon {
                stuck.push(format!("{}: pending {pending}, horizon {at} of {horizon}", client.rec().name));
            }
        }
        if stuck.is_empty() {
            return Ok(());
        }
        if now_ms() > deadline {
            return Err(format!("no quiescence within 60 s: {}", stuck.join("; ")));
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// A double for the `x` column: a random mantissa and sign, an exponent between 2^-100 and 2^100.
/// Most such doubles are changed by a reader that rounds their last digit (serde_json without
/// `float_roundtrip` read one in three of them one bit off), so every history also checks that the
/// numbers a client writes come back to every device bit for bit.
fn rounding_bait(seed: u64) -> f64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let exponent = 1023 - 100 + (z >> 52) % 200;
    f64::from_bits((z & 0x800F_FFFF_FFFF_FFFF) | (exponent << 52))
}

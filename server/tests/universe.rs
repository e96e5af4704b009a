//! Universe sync end to end, on two real PostgreSQL clusters: the source universe's database on the
//! second cluster (`KIZUNA_SECOND_DATABASE_URL`, which `make test` starts and stops), the target
//! deployment's database on the first (`DATABASE_URL`) behind a real `kizuna-server` gateway, and
//! the real `kizuna-server universe-sync`, `universe-status` and `universe-dead` commands between
//! them. One test crashes the source cluster, so the tests here run one at a time.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::db::{now_ms, TestDb};
use support::server::{TestServer, SECRET};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_kizuna-server");

/// The same table on both sides; `total` is generated (computed on each side, never sent).
const ITEMS: &str = "create table public.items (
    id text primary key, title text, amount numeric, region text, publish_at timestamptz,
    total numeric generated always as (amount * 2) stored)";

/// One test at a time: a test crashes the source cluster under everyone's connections.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn second_cluster() -> String {
    std::env::var("KIZUNA_SECOND_DATABASE_URL").unwrap_or_else(|_| {
        panic!("KIZUNA_SECOND_DATABASE_URL is unset, so this test cannot run: universe sync is tested across two \
                PostgreSQL clusters. Run `make test` (it starts both), or set DATABASE_URL and \
                KIZUNA_SECOND_DATABASE_URL to superuser URLs of two running clusters \
                (the test that crashes the source cluster needs to be able to kill its processes, as root can)")
    })
}

/// A source database (second cluster) and a target deployment (first cluster, real gateway).
struct Universe {
    source: TestDb,
    target: TestDb,
    gateway: TestServer,
}

impl Universe {
    /// `register` is the source's `kizuna.register_universe_table` call for `public.items`. The
    /// target holds the same table as a synced table the service identity may write.
    async fn new(register: &str) -> Universe {
        let source = TestDb::on(&second_cluster()).await;
        source.exec(&format!("{ITEMS}; {register}")).await;
        let target = TestDb::new().await;
        target
            .exec(&format!(
                "{ITEMS};
                 grant select, insert, update, delete on public.items to service_role;
                 select kizuna.register_table('public.items', bucket => $$'region:' || region$$);"
            ))
            .await;
        let gateway = TestServer::start(target.url(), &[]).await;
        Universe { source, target, gateway }
    }

    /// `universe-sync --once` to the real target; the run's report.
    async fn sync(&self, extra: &[&str]) -> Value {
        self.sync_to(&self.gateway.url, extra).await
    }

    async fn sync_to(&self, target: &str, extra: &[&str]) -> Value {
        let mut args = vec!["universe-sync", "--source", self.source.url(), "--target", target, "--once"];
        args.extend(["--target-jwt-secret", SECRET]);
        args.extend(extra);
        let out = cli(&args).await;
        serde_json::from_str(out.lines().last().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}: {out}"))
    }

    /// `universe-status --source` as JSON.
    async fn source_status(&self) -> Value {
        let out = cli(&["universe-status", "--source", self.source.url()]).await;
        serde_json::from_str::<Value>(&out).unwrap()["source"].clone()
    }

    /// The source's pending events, oldest first: (id, pk, op, attempts, error).
    async fn pending(&self) -> Vec<(i64, String, String, i32, Option<String>)> {
        let client = self.source.connect().await;
        let rows = client
            .query(
                "select id, pk, op, attempts, error from kizuna.universe_events
                  where acked_at is null and not dead_letter order by id",
                &[],
            )
            .await
            .unwrap();
        rows.iter().map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))).collect()
    }

    /// A side's rows as JSON, ordered by key.
    async fn rows(db: &TestDb, filter: &str) -> Value {
        let client = db.connect().await;
        let sql = format!("select coalesce(jsonb_agg(to_jsonb(i) order by id), '[]') from public.items i where {filter}");
        client.query_one(&sql, &[]).await.unwrap().get(0)
    }

    /// Runs the target's reaper with no ledger retention: every recorded verdict is pruned.
    async fn prune_target_ledger(&self) {
        let token = self.gateway.token_with_role("00000000-0000-4000-8000-00000000aaaa", "service_role");
        let (code, answer) =
            self.gateway.rpc("kizuna_admin", Some(&token), &json!({"action": "reap", "ledger_retention_seconds": 0})).await;
        assert_eq!(code, 200, "{answer}");
        assert!(answer["ledger_pruned"].as_i64().unwrap() >= 1, "{answer}");
    }
}

/// Runs the real binary (off the runtime's thread, so servers in this process keep serving).
async fn cli(args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let output = tokio::task::spawn_blocking(move || {
        let mut command = std::process::Command::new(BIN);
        for (name, _) in std::env::vars() {
            if name.starts_with("KIZUNA_") {
                command.env_remove(name);
            }
        }
        command.args(&args).env_remove("DATABASE_URL").output().expect("run kizuna-server")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "kizuna-server failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    stdout
}

/// An address where nothing listens: a target that is down.
fn down_target() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

async fn sleep_until_ms(at: i64) {
    let wait = (at - now_ms()).max(0) as u64 + 50;
    tokio::time::sleep(Duration::from_millis(wait)).await;
}

/// The earliest retry_at of the pending events, in unix ms.
async fn earliest_retry_ms(db: &TestDb) -> i64 {
    let client = db.connect().await;
    client
        .query_one("select (extract(epoch from min(retry_at)) * 1000)::bigint from kizuna.universe_events where acked_at is null", &[])
        .await
        .unwrap()
        .get::<_, Option<i64>>(0)
        .expect("a pending event with a retry_at")
}

#[tokio::test]
async fn writes_from_any_caller_arrive_on_the_target_exactly_as_written() {
    let _serial = SERIAL.lock().await;
    let u = Universe::new("select kizuna.register_universe_table('public.items', row_filter => $$region = 'eu'$$)").await;
    u.source
        .exec(
            "grant select, insert, update, delete on public.items to authenticated;
             insert into public.items (id, title, amount, region) values
               ('a', 'exact', 123456789012345678901234567890.123456789, 'eu'),
               ('b', 'leaves', 2, 'eu'), ('c', 'enters', 3, 'us'), ('d', 'deleted', 4, 'eu'),
               ('e', 'renamed', 5, 'eu'), ('f', 'never', 6, 'us');
             update public.items set region = 'us' where id = 'b';
             update public.items set region = 'eu' where id = 'c';
             delete from public.items where id = 'd';
             update public.items set id = 'e2' where id = 'e';
             update public.items set title = 'unicode ✓ \"quoted\" and ''single''', publish_at = '2026-01-02T03:04:05.123456Z' where id = 'a';
             -- Another caller than the owner: an API role writing in plain SQL.
             begin; set local role authenticated; insert into public.items (id, title, amount, region) values ('g', 'by authenticated', 7, 'eu'); commit;",
        )
        .await;
    let report = u.sync(&[]).await;
    assert_eq!(report["failed_requests"], 0, "{report}");
    assert_eq!(report["dead_lettered"], 0, "{report}");
    assert!(report["applied"].as_u64().unwrap() >= 8, "{report}");

    // The target holds exactly the selected rows, every value as written (30 digits, text, time),
    // its generated column computed there.
    let want = Universe::rows(&u.source, "region = 'eu'").await;
    assert_eq!(Universe::rows(&u.target, "true").await, want);
    let ids: Vec<&str> = want.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["a", "c", "e2", "g"], "b left the selection, d was deleted, e was renamed, f never matched");
    let exact: String = u.target.one("select amount::text from public.items where id = 'a'").await;
    assert_eq!(exact, "123456789012345678901234567890.123456789");

    // Nothing more to send; the outbox holds acknowledged events only.
    let again = u.sync(&[]).await;
    assert_eq!(again["sent"], 0, "{again}");

    // TRUNCATE would bypass the outbox: refused, nothing changed.
    let refused = u.source.client().batch_execute("truncate public.items").await.unwrap_err();
    assert_eq!(refused.as_db_error().map(|e| e.code().code()), Some("KZP05"), "{refused:?}");

    // A deleted key created again arrives again (the target holds its tombstone).
    u.source.exec("insert into public.items (id, title, amount, region) values ('d', 'back', 8, 'eu')").await;
    let back = u.sync(&[]).await;
    assert_eq!((back["applied"].as_u64(), back["dead_lettered"].as_u64()), (Some(1), Some(0)), "{back}");
    assert_eq!(Universe::rows(&u.target, "true").await, Universe::rows(&u.source, "region = 'eu'").await);
    let status = u.source_status().await;
    assert_eq!((status["pending"].as_i64(), status["dead_letters"].as_i64()), (Some(0), Some(0)), "{status}");
    assert_eq!(status["applied_total"].as_u64(), Some(report["applied"].as_u64().unwrap() + 1), "{status}");

    // A write applied with session_replication_role = replica (a logical replication subscriber,
    // a restore that turns triggers off) arrives too, and a truncate there is refused all the same.
    let replica = u.source.connect().await;
    replica
        .batch_execute("set session_replication_role = replica;
                        insert into public.items (id, title, amount, region) values ('h', 'replicated', 9, 'eu')")
        .await
        .unwrap();
    let refused = replica.batch_execute("truncate public.items").await.unwrap_err();
    assert_eq!(refused.as_db_error().map(|e| e.code().code()), Some("KZP05"), "{refused:?}");
    let replicated = u.sync(&[]).await;
    assert_eq!(replicated["applied"].as_u64(), Some(1), "{replicated}");
    assert_eq!(Universe::rows(&u.target, "true").await, Universe::rows(&u.source, "region = 'eu'").await);
}

#[tokio::test]
async fn a_target_that_is_down_leaves_events_pending_until_retry_at() {
    let _serial = SERIAL.lock().await;
    let u = Universe::new("select kizuna.register_universe_table('public.items')").await;
    u.source.exec("insert into public.items (id, title, region) values ('a', 'x', 'eu'), ('b', 'y', 'eu')").await;

    let report = u.sync_to(&down_target(), &["--retry-base-ms", "1500"]).await;
    assert_eq!((report["failed_requests"].as_u64(), report["retrying"].as_u64()), (Some(1), Some(2)), "{report}");
    let pending = u.pending().await;
    assert_eq!(pending.len(), 2);
    for (_, _, _, attempts, error) in &pending {
        assert_eq!(*attempts, 1, "the unreachable target cost an attempt");
        assert!(error.as_deref().unwrap_or_default().starts_with("NETWORK: "), "{error:?}");
    }
    let retry_at = earliest_retry_ms(&u.source).await;
    assert!(retry_at > now_ms(), "a backoff retry_at ahead");

    // Before retry_at nothing is sent, even to a target that is back.
    let early = u.sync(&["--retry-base-ms", "1500"]).await;
    assert_eq!(early["sent"], 0, "{early}");
    assert!(early["next_due_ms"].as_i64().unwrap() >= retry_at - 1, "{early}");
    assert_eq!(Universe::rows(&u.target, "true").await, json!([]));

    sleep_until_ms(retry_at).await;
    let late = u.sync(&["--retry-base-ms", "1500"]).await;
    assert_eq!(late["applied"], 2, "{late}");
    assert_eq!(Universe::rows(&u.target, "true").await, Universe::rows(&u.source, "true").await);
    assert!(u.pending().await.is_empty());
}

/// A proxy in front of the target that forwards each request and then closes the connection
/// without answering: the target applied the push, the source never hears it.
async fn answer_losing_proxy(target: String) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut request = Vec::new();
            let mut buf = [0u8; 8192];
            let (head_end, length) = loop {
                let n = socket.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    break (None, 0);
                }
                request.extend_from_slice(&buf[..n]);
                if let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&request[..end]).to_lowercase();
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap_or(0)))
                        .unwrap_or(0);
                    break (Some(end + 4), length);
                }
            };
            let Some(head_end) = head_end else { continue };
            while request.len() < head_end + length {
                let n = socket.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&buf[..n]);
            }
            let head = String::from_utf8_lossy(&request[..head_end]).into_owned();
            let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
            let auth = head
                .lines()
                .find_map(|l| l.to_lowercase().starts_with("authorization:").then(|| l[14..].trim().to_owned()))
                .unwrap_or_default();
            let _ = http
                .post(format!("{target}{path}"))
                .header("authorization", auth)
                .header("content-type", "application/json")
                .body(request[head_end..].to_vec())
                .send()
                .await;
            let _ = socket.shutdown().await; // the answer is lost
        }
    });
    format!("http://{address}")
}

#[tokio::test]
async fn an_event_whose_answer_was_lost_is_acknowledged_skipped_after_the_target_pruned_its_verdict() {
    let _serial = SERIAL.lock().await;
    let u = Universe::new("select kizuna.register_universe_table('public.items')").await;
    u.source.exec("insert into public.items (id, title, amount, region) values ('a', 'once', 1, 'eu')").await;

    let proxy = answer_losing_proxy(u.gateway.url.clone()).await;
    let lost = u.sync_to(&proxy, &["--retry-base-ms", "300"]).await;
    assert_eq!(lost["failed_requests"], 1, "{lost}");
    assert_eq!(Universe::rows(&u.target, "true").await, Universe::rows(&u.source, "true").await, "the target applied it");
    assert_eq!(u.pending().await.len(), 1, "the source never heard so: still pending");

    // The target forgets the verdict (ledger retention 0); resending answers SKIPPED, no second effect.
    u.prune_target_ledger().await;
    u.target.exec("update public.items set title = 'changed on the target since'").await;
    sleep_until_ms(earliest_retry_ms(&u.source).await).await;
    let report = u.sync(&[]).await;
    assert_eq!((report["skipped"].as_u64(), report["applied"].as_u64()), (Some(1), Some(0)), "{report}");
    assert!(u.pending().await.is_empty(), "SKIPPED acknowledges");
    let title: String = u.target.one("select title from public.items where id = 'a'").await;
    assert_eq!(title, "changed on the target since", "the event did not apply a second time");
    assert_eq!(u.source_status().await["skipped_total"], 1);
}

#[tokio::test]
async fn pruning_every_acknowledged_event_and_restarting_the_source_never_reuses_an_id() {
    let _serial = SERIAL.lock().await;
    let u = Universe::new("select kizuna.register_universe_table('public.items')").await;
    u.source.exec("insert into public.items (id, title, region) select 'k' || g, 'x', 'eu' from generate_series(1, 3) g").await;
    let report = u.sync(&["--prune-acked"]).await;
    assert_eq!((report["applied"].as_u64(), report["pruned"].as_u64()), (Some(3), Some(3)), "{report}");
    let status = u.source_status().await;
    assert_eq!((status["acknowledged"].as_i64(), status["last_event_id"].as_i64()), (Some(0), Some(3)), "{status}");
    // The target forgets every verdict: an id at or below 3 would now be answered SKIPPED, unapplied.
    u.prune_target_ledger().await;

    // The source cluster crashes and restarts its server: a backend killed with SIGKILL makes the
    // postmaster end every server process, reset shared memory and replay the WAL, so whatever
    // lived only in memory (a sequence's cached values) is gone.
    let bystander = u.source.connect().await;
    let victim = u.source.connect().await;
    let pid: i32 = victim.query_one("select pg_backend_pid()", &[]).await.unwrap().get(0);
    let killed = kill_hard(pid).await;
    assert!(killed, "kill -9 {pid}");
    let mut ended = false;
    for _ in 0..200 {
        if bystander.query_one("select 1", &[]).await.is_err() {
            ended = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ended, "every server process ended, the bystander's too");
    let source = reconnect(u.source.url()).await;

    source.batch_execute("insert into public.items (id, title, region) values ('after-restart', 'y', 'eu')").await.unwrap();
    let id: i64 = source.query_one("select max(id) from kizuna.universe_events", &[]).await.unwrap().get(0);
    assert!(id > 3, "a new event id after pruning and a restart: {id}");
    let report = u.sync(&[]).await;
    assert_eq!((report["applied"].as_u64(), report["skipped"].as_u64()), (Some(1), Some(0)), "{report}");
    let arrived: i64 = u.target.one("select count(*) from public.items where id = 'after-restart'").await;
    assert_eq!(arrived, 1);
}

/// `kill -9 pid`.
async fn kill_hard(pid: i32) -> bool {
    tokio::task::spawn_blocking(move || {
        std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().is_ok_and(|s| s.success())
    })
    .await
    .unwrap()
}

/// A connection once the server accepts them again (crash recovery takes a moment).
async fn reconnect(url: &str) -> tokio_postgres::Client {
    for _ in 0..300 {
        if let Ok((client, connection)) = tokio_postgres::connect(url, tokio_postgres::NoTls).await {
            tokio::spawn(connection);
            if client.query_one("select 1", &[]).await.is_ok() {
                return client;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the source never came back after the crash");
}

#[tokio::test]
async fn a_dead_letter_after_max_attempts_is_kept_through_prune_then_requeued_and_delivered() {
    let _serial = SERIAL.lock().await;
    let u = Universe::new("select kizuna.register_universe_table('public.items', max_attempts => 2)").await;
    u.source.exec("insert into public.items (id, title, region) values ('delivered', 'x', 'eu')").await;
    assert_eq!(u.sync(&[]).await["applied"], 1);
    u.source.exec("insert into public.items (id, title, region) values ('doomed', 'first image', 'eu'), ('dropped', 'z', 'eu')").await;

    let down = down_target();
    let first = u.sync_to(&down, &["--retry-base-ms", "100"]).await;
    assert_eq!(first["retrying"], 2, "{first}");
    sleep_until_ms(earliest_retry_ms(&u.source).await + 100).await;
    let second = u.sync_to(&down, &["--retry-base-ms", "100"]).await;
    assert_eq!(second["dead_lettered"], 2, "max_attempts 2: dead letters: {second}");
    assert!(u.pending().await.is_empty());

    // Inspected: kept with their attempts and error, never acknowledged.
    let dead: Value = serde_json::from_str(&cli(&["universe-dead", "--source", u.source.url(), "list"]).await).unwrap();
    let dead = dead.as_array().unwrap().clone();
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert_eq!((dead[0]["pk"].as_str(), dead[0]["attempts"].as_i64()), (Some("doomed"), Some(2)));
    assert!(dead[0]["error"].as_str().unwrap().starts_with("NETWORK: "), "{dead:?}");
    let old_id = dead[0]["id"].as_i64().unwrap();

    // --prune-acked removes the acknowledged event only.
    let pruned = u.sync(&["--prune-acked"]).await;
    assert_eq!((pruned["sent"].as_u64(), pruned["pruned"].as_u64()), (Some(0), Some(1)), "{pruned}");
    assert_eq!(u.source_status().await["dead_letters"], 2);

    // Requeued as a new event carrying the key's current state; the other one discarded.
    u.source.exec("update public.items set title = 'current image' where id = 'doomed'").await;
    let requeued = cli(&["universe-dead", "--source", u.source.url(), "requeue", &old_id.to_string()]).await;
    assert_eq!(serde_json::from_str::<Value>(&requeued).unwrap()["requeued"], 1, "{requeued}");
    let discarded = cli(&["universe-dead", "--source", u.source.url(), "discard", "--all"]).await;
    assert_eq!(serde_json::from_str::<Value>(&discarded).unwrap()["discarded"], 1, "{discarded}");
    let pending = u.pending().await;
    // The update made its own event; the requeued one comes after it, with a new id.
    assert!(pending.iter().all(|(id, pk, ..)| *id > old_id && pk == "doomed"), "{pending:?}");
    let delivered = u.sync(&[]).await;
    assert_eq!(delivered["dead_lettered"], 0, "{delivered}");
    let title: String = u.target.one("select title from public.items where id = 'doomed'").await;
    assert_eq!(title, "current image");
    let status = u.source_status().await;
    assert_eq!((status["dead_letters"].as_i64(), status["requeued_total"].as_i64(), status["discarded_total"].as_i64()),
               (Some(0), Some(1), Some(1)), "{status}");
}

#[tokio::test]
async fn delayed_until_apply_after_without_costing_an_attempt_or_blocking_the_queue() {
    let _serial = SERIAL.lock().await;
    let u = Universe::new("select kizuna.register_universe_table('public.items', apply_after => $$publish_at$$)").await;
    u.source
        .exec("insert into public.items (id, title, region, publish_at) values ('later', 'x', 'eu', now() + interval '2 seconds');
               insert into public.items (id, title, region) values ('now', 'y', 'eu');")
        .await;
    let report = u.sync(&[]).await;
    assert_eq!((report["delayed"].as_u64(), report["applied"].as_u64()), (Some(1), Some(1)), "{report}");
    let pending = u.pending().await;
    assert_eq!(pending.len(), 1);
    let (_, pk, _, attempts, error) = &pending[0];
    assert_eq!((pk.as_str(), *attempts, error.clone()), ("later", 0, None), "DELAYED is not a failed attempt");
    let ids: Value = Universe::rows(&u.target, "true").await;
    assert_eq!(ids.as_array().unwrap().len(), 1, "the later event waits; the one behind it did not: {ids}");

    // Held until its time: a run before it sends nothing.
    let held = u.sync(&[]).await;
    assert_eq!(held["sent"], 0, "{held}");
    let publish_at: i64 = u.source.one("select (extract(epoch from publish_at) * 1000)::bigint from public.items where id = 'later'").await;
    assert_eq!(held["next_due_ms"].as_i64().map(|at| (at - publish_at).abs() < 2), Some(true), "{held}");
    // Meanwhile the target prunes the verdict of the event behind it (7 days by default; a
    // scheduled post waits longer): the held event, sent again under its first id, now below the
    // target's pruned client_seq, was answered SKIPPED, acknowledged, and never applied.
    u.prune_target_ledger().await;
    sleep_until_ms(publish_at).await;
    // And a later write of the same row, sent in the same slice: the held event, now under a fresh
    // id, keeps its place before it (sorted by id, it went last and its older image won).
    u.source.exec("update public.items set title = 'x2' where id = 'later'").await;
    let due = u.sync(&[]).await;
    assert_eq!((due["applied"].as_u64(), due["skipped"].as_u64()), (Some(2), Some(0)), "{due}");
    assert_eq!(u.target.one::<String>("select title from public.items where id = 'later'").await, "x2");
    assert_eq!(Universe::rows(&u.target, "true").await, Universe::rows(&u.source, "true").await);
}

#[tokio::test]
async fn a_time_of_infinity_or_past_year_9999_holds_its_own_event_and_no_other() {
    let _serial = SERIAL.lock().await;
    let u = Universe::new("select kizuna.register_universe_table('public.items', apply_after => $$publish_at$$)").await;
    // 'infinity' is a common "never"; no number of milliseconds, and a year of five digits is no
    // RFC 3339 time: the window that read them failed every run, for every event behind them.
    u.source
        .exec("insert into public.items (id, title, region, publish_at) values
                 ('never', 'x', 'eu', 'infinity'), ('far', 'x', 'eu', '12000-01-01'),
                 ('long-ago', 'x', 'eu', '-infinity'), ('now', 'y', 'eu', null);")
        .await;
    let report = u.sync(&[]).await;
    assert_eq!((report["applied"].as_u64(), report["delayed"].as_u64()), (Some(2), Some(2)), "{report}");
    let ids: Vec<String> = u.pending().await.into_iter().map(|(_, pk, _, attempts, error)| {
        assert_eq!((attempts, error), (0, None), "held, not failed");
        pk
    }).collect();
    assert_eq!(ids, ["never", "far"]);
    assert_eq!(Universe::rows(&u.target, "true").await, Universe::rows(&u.source, "id in ('long-ago', 'now')").await);
    // Held from then on, until the end of year 9999.
    let held = u.sync(&[]).await;
    assert_eq!(held["sent"], 0, "{held}");
    assert_eq!(held["next_due_ms"].as_i64(), Some(253_402_300_800_000), "the end of 9999, in whole milliseconds: {held}");
}

#[tokio::test]
async fn latest_only_keeps_the_newest_pending_event_per_key_replaced_in_the_writing_transaction() {
    let _serial = SERIAL.lock().await;
    let u = Universe::new("select kizuna.register_universe_table('public.items', latest_only => true)").await;
    let events = |db: &TestDb| {
        let db_url = db.url().to_owned();
        async move {
            let client = support::db::connect(&db_url).await;
            let rows = client
                .query("select id, pk, columns ->> 'title' from kizuna.universe_events where acked_at is null order by id", &[])
                .await
                .unwrap();
            rows.iter().map(|r| (r.get::<_, i64>(0), r.get::<_, String>(1), r.get::<_, Option<String>>(2))).collect::<Vec<_>>()
        }
    };
    u.source.exec("insert into public.items (id, title, region) values ('p', 'v1', 'eu'), ('q', 'q1', 'eu')").await;
    u.source.exec("update public.items set title = 'v2' where id = 'p'").await;
    u.source.exec("begin; update public.items set title = 'v3' where id = 'p'; update public.items set title = 'v4' where id = 'p'; commit").await;
    let after = events(&u.source).await;
    assert_eq!(after.iter().map(|(_, pk, t)| (pk.as_str(), t.as_deref())).collect::<Vec<_>>(), [("q", Some("q1")), ("p", Some("v4"))]);

    // The replacement commits with the write: while the writing transaction is open the old event
    // is still there, a rolled-back write leaves it, and a committed one replaces it.
    let writer = u.source.connect().await;
    writer.batch_execute("begin; update public.items set title = 'v5' where id = 'p'").await.unwrap();
    assert_eq!(events(&u.source).await, after, "not before the writer commits");
    writer.batch_execute("rollback").await.unwrap();
    assert_eq!(events(&u.source).await, after, "a rolled-back write replaces nothing");
    writer.batch_execute("begin; update public.items set title = 'v6' where id = 'p'; commit").await.unwrap();
    let replaced = events(&u.source).await;
    assert_eq!(replaced.len(), 2);
    assert_eq!((replaced[1].1.as_str(), replaced[1].2.as_deref()), ("p", Some("v6")));
    assert!(replaced[1].0 > after[1].0, "the newest event, a new id");

    // A key created and deleted before delivery leaves only its delete, which finds no row there.
    u.source.exec("insert into public.items (id, title, region) values ('gone', 'g', 'eu'); delete from public.items where id = 'gone'").await;
    let report = u.sync(&[]).await;
    assert_eq!((report["sent"].as_u64(), report["applied"].as_u64(), report["skipped"].as_u64(), report["dead_lettered"].as_u64()),
               (Some(3), Some(2), Some(1), Some(0)), "{report}");
    assert_eq!(Universe::rows(&u.target, "true").await, Universe::rows(&u.source, "true").await);
    let title: String = u.target.one("select title from public.items where id = 'p'").await;
    assert_eq!(title, "v6");
}

/// Writes made after the transaction's events were given their ids (constraints set immediate
/// midway, or an app's deferred trigger writing at commit) are events too: they stayed in the
/// pending table for good, never delivered nor counted as pending.
#[tokio::test]
async fn writes_after_a_transactions_events_were_numbered_are_delivered_too() {
    let _serial = SERIAL.lock().await;
    let u = Universe::new("select kizuna.register_universe_table('public.items')").await;
    u.source
        .exec(
            "begin;
             insert into public.items (id, title, region) values ('a', 'a1', 'eu');
             set constraints all immediate;
             insert into public.items (id, title, region) values ('b', 'b1', 'eu');
             update public.items set title = 'a2' where id = 'a';
             commit;
             create function public.items_echo() returns trigger language plpgsql as $$
             begin
               if new.id not like '%-echo' then
                 insert into public.items (id, title, region) values (new.id || '-echo', new.title, new.region);
               end if;
               return null;
             end $$;
             create constraint trigger items_echo after insert on public.items
               deferrable initially deferred for each row execute function public.items_echo();
             begin;
             insert into public.items (id, title, region) values ('c', 'c1', 'eu');
             insert into public.items (id, title, region) values ('d', 'd1', 'eu');
             commit;",
        )
        .await;
    assert_eq!(u.source.one::<Value>("select coalesce(jsonb_agg(p.pk), '[]') from kizuna.universe_pending p").await, json!([]), "nothing left unnumbered");
    let pending: Vec<String> = u.pending().await.into_iter().map(|(_, pk, op, _, _)| format!("{op} {pk}")).collect();
    assert_eq!(pending, ["upsert a", "upsert b", "upsert a", "upsert c", "upsert d", "upsert c-echo", "upsert d-echo"]);
    // A key too long for the outbox's index is refused at its statement, not at commit with
    // PostgreSQL's words naming the index.
    let long = "k".repeat(2401);
    let refused = u.source.client().batch_execute(&format!("insert into public.items (id, region) values ('{long}', 'eu')")).await;
    let code = refused.expect_err("refused").as_db_error().map(|e| (e.code().code().to_owned(), e.message().contains("2,400 bytes")));
    assert_eq!(code, Some(("54000".to_owned(), true)));
    let report = u.sync(&[]).await;
    assert_eq!(report["applied"].as_u64(), Some(7), "{report}");
    assert_eq!(Universe::rows(&u.target, "true").await, Universe::rows(&u.source, "true").await);
}

#[tokio::test]
async fn status_counters_as_json_and_metrics_on_both_sides() {
    let _serial = SERIAL.lock().await;
    let u = Universe::new("select kizuna.register_universe_table('public.items', max_attempts => 3, apply_after => $$publish_at$$)").await;
    // The target refuses a title: that event is a refusal, recorded and made a dead letter.
    u.target
        .exec("create function public.items_gate(op text, row_ jsonb) returns boolean language sql as $$ select row_ ->> 'title' <> 'refused' $$;
               select kizuna.register_table('public.items', bucket => $$'region:' || region$$, gate => 'public.items_gate(text, jsonb)');")
        .await;
    u.source
        .exec("insert into public.items (id, title, region) values ('ok', 'fine', 'eu'), ('no', 'refused', 'eu');
               insert into public.items (id, title, region, publish_at) values ('held', 'x', 'eu', now() + interval '1 hour');")
        .await;
    let report = u.sync(&[]).await;
    assert_eq!((report["applied"].as_u64(), report["dead_lettered"].as_u64(), report["delayed"].as_u64()), (Some(1), Some(1), Some(1)), "{report}");
    let refused: Value = serde_json::from_str(&cli(&["universe-dead", "--source", u.source.url(), "list"]).await).unwrap();
    assert_eq!(refused[0]["error"], "REJECTED VALIDATION_FAILED: the table's validation gate refused the row", "{refused}");
    // A request the target refuses as a whole (a row over its max_row_bytes): a refusal of this
    // event alone, recorded, a dead letter at once.
    u.target.exec("update kizuna.settings set max_row_bytes = 200").await;
    u.source.exec(&format!("insert into public.items (id, title, region) values ('big', '{}', 'eu')", "x".repeat(300))).await;
    let too_big = u.sync(&[]).await;
    assert_eq!((too_big["failed_requests"].as_u64(), too_big["dead_lettered"].as_u64()), (Some(1), Some(1)), "{too_big}");
    // A target that is down: an attempt, a retry.
    u.source.exec("insert into public.items (id, title, region) values ('retry', 'y', 'eu')").await;
    assert_eq!(u.sync_to(&down_target(), &[]).await["retrying"], 1);

    // The source: pending, retrying, delayed, dead letters, applied.
    let status = u.source_status().await;
    for (key, want) in [("pending", 2), ("retrying", 1), ("delayed", 1), ("dead_letters", 2), ("applied_total", 1)] {
        assert_eq!(status[key].as_i64(), Some(want), "{key}: {status}");
    }
    let text = cli(&["universe-status", "--source", u.source.url(), "--metrics"]).await;
    for line in [
        "kizuna_universe_pending 2",
        "kizuna_universe_retrying 1",
        "kizuna_universe_dead_letters 2",
        "kizuna_universe_applied_total 1",
        "# TYPE kizuna_universe_applied_total counter",
        "# TYPE kizuna_universe_pending gauge",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
    }

    // The target's apply path: process counters, as JSON and as metrics, and on its /metrics.
    let target = ["--target", u.gateway.url.as_str(), "--target-jwt-secret", SECRET];
    let json_out: Value = serde_json::from_str(&cli(&[&["universe-status"][..], &target[..]].concat()).await).unwrap();
    let apply = &json_out["target"]["apply_process_counters"];
    for (key, want) in [("applied", 1), ("rejected", 1), ("delayed", 1), ("errors", 1), ("skipped", 0)] {
        assert_eq!(apply[key].as_i64(), Some(want), "{key}: {json_out}");
    }
    assert!(apply["last_ok"].as_u64().unwrap() > 0 && apply["last_error"].as_u64().unwrap() > 0, "{json_out}");
    assert_eq!(apply["last_error_code"], "KZP04", "the refused request was the last error: {json_out}");
    assert!(json_out["target"]["kind"].as_str().unwrap().contains("process counters"), "{json_out}");
    let metrics = cli(&[&["universe-status", "--metrics"][..], &target[..]].concat()).await;
    let scraped = u.gateway.metrics().await;
    for line in [
        "kizuna_process_universe_apply_applied_total 1",
        "kizuna_process_universe_apply_rejected_total 1",
        "kizuna_process_universe_apply_errors_total 1",
        "# TYPE kizuna_process_universe_apply_applied_total counter",
    ] {
        assert!(metrics.lines().any(|l| l == line), "universe-status --metrics lacks {line}:\n{metrics}");
        assert!(scraped.lines().any(|l| l == line), "the target's /metrics lacks {line}:\n{scraped}");
    }
    // Only operators may read them.
    let anyone = u.gateway.http.get(u.gateway.path("/kizuna/v1/universe-apply"))
        .bearer_auth(u.gateway.token("a11ce000-0000-4000-8000-000000000001")).send().await.unwrap();
    assert_eq!(anyone.status(), 403);
}

#[tokio::test]
async fn a_long_running_sync_delivers_writes_as_they_come_and_stops_on_sigterm() {
    let _serial = SERIAL.lock().await;
    let u = Universe::new("select kizuna.register_universe_table('public.items')").await;
    let mut sync = std::process::Command::new(BIN)
        .args(["universe-sync", "--source", u.source.url(), "--target", &u.gateway.url, "--target-jwt-secret", SECRET])
        .args(["--interval", "200ms", "--prune-acked"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start universe-sync --interval");
    for key in ["first", "second"] {
        u.source.exec(&format!("insert into public.items (id, title, region) values ('{key}', 'x', 'eu')")).await;
        let mut arrived = false;
        for _ in 0..150 {
            let n: i64 = u.target.one(&format!("select count(*) from public.items where id = '{key}'")).await;
            if n == 1 {
                arrived = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(arrived, "{key} never arrived while universe-sync ran");
    }
    let status = u.source_status().await;
    assert_eq!((status["pending"].as_i64(), status["applied_total"].as_i64()), (Some(0), Some(2)), "{status}");

    let _ = std::process::Command::new("kill").args(["-TERM", &sync.id().to_string()]).status();
    let mut exited = None;
    for _ in 0..100 {
        if let Some(status) = sync.try_wait().unwrap() {
            exited = Some(status);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let Some(exit) = exited else {
        let _ = sync.kill();
        panic!("universe-sync ignored SIGTERM");
    };
    let output = sync.wait_with_output().unwrap();
    assert!(exit.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let reports: Vec<Value> = String::from_utf8_lossy(&output.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(reports.len() >= 2, "one JSON line per run: {reports:?}");
    assert_eq!(reports.iter().map(|r| r["applied"].as_u64().unwrap()).sum::<u64>(), 2, "{reports:?}");
}

/// A target whose answer never ends (broken, or hostile) fails the request as a bad answer once it
/// passes what any push answer holds, and the event stays pending: the answer was read whole into
/// memory, bounded only by the request's timeout (a fast target could run universe-sync out of
/// memory first).
#[tokio::test]
async fn an_answer_that_never_ends_is_a_bad_answer_not_a_whole_read() {
    let _serial = SERIAL.lock().await;
    let u = Universe::new("select kizuna.register_universe_table('public.items')").await;
    u.source.exec("insert into public.items (id, title, region) values ('e1', 'x', 'eu')").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endless = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 65536];
                let _ = socket.read(&mut buf).await;
                let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n{\"verdicts\": [";
                if socket.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let spaces = vec![b' '; 1 << 20];
                while socket.write_all(&spaces).await.is_ok() {}
            });
        }
    });
    let started = std::time::Instant::now();
    let report = u.sync_to(&endless, &[]).await;
    assert_eq!(report["failed_requests"], 1, "{report}");
    assert!(report["last_error"].as_str().unwrap_or_default().starts_with("BAD_RESPONSE"), "{report}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "not the request's timeout: {report}");
    assert_eq!(u.pending().await.len(), 1, "the event waits for a target that answers");
}

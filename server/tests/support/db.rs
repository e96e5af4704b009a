//! A fresh PostgreSQL database per test, with the pack installed, and calls to the pack's entry
//! points made exactly as the gateway makes them: one transaction, `SET LOCAL ROLE`, the JWT claims
//! in `request.jwt.claims`, then `select public.kizuna_push($1::jsonb)`.
//!
//! `DATABASE_URL` must name an admin (superuser) connection to a running cluster; without it every
//! test fails and says how to run it (`make test` starts a throwaway cluster and sets it). The
//! database is dropped when the `TestDb` is dropped (best effort).

#![allow(dead_code)] // each test binary uses a different part of the harness

use serde_json::{json, Value};
use tokio_postgres::{Client, NoTls};

// The pack's own installer, compiled in directly so that these tests always install the files in
// server/sql/ (the same function the gateway calls at start as `kizuna_server::pack::install`).
#[path = "../../src/pack.rs"]
mod pack;

pub struct TestDb {
    url: String,
    admin_url: String,
    name: String,
    client: Client,
}

/// Who makes a call: the role the gateway would `SET LOCAL ROLE` to and the token's claims.
#[derive(Clone, Debug)]
pub struct Caller {
    pub role: &'static str,
    pub claims: Value,
}

impl Caller {
    /// An `authenticated` user with this `sub`.
    pub fn user(sub: &str) -> Caller {
        Caller { role: "authenticated", claims: json!({"sub": sub, "role": "authenticated"}) }
    }
    pub fn anon() -> Caller {
        Caller { role: "anon", claims: json!({"role": "anon"}) }
    }
    pub fn service() -> Caller {
        Caller { role: "service_role", claims: json!({"role": "service_role"}) }
    }
}

/// A refused call: the SQLSTATE (e.g. `KZP01`) and the message.
#[derive(Clone, Debug, PartialEq)]
pub struct SqlError {
    pub code: String,
    pub message: String,
}

impl TestDb {
    /// A fresh database with the pack installed. Without `DATABASE_URL` the test fails: a test
    /// that could not run must never count as passed.
    pub async fn new() -> TestDb {
        let Ok(admin_url) = std::env::var("DATABASE_URL") else {
            panic!("DATABASE_URL is unset, so this test cannot run: run `make test` (it starts a throwaway \
                    PostgreSQL cluster), or set DATABASE_URL to a superuser URL of a running cluster");
        };
        TestDb::on(&admin_url).await
    }

    /// A fresh database with the pack installed on the cluster of `admin_url` (a superuser URL).
    pub async fn on(admin_url: &str) -> TestDb {
        let admin_url = admin_url.to_owned();
        let (admin, conn) = tokio_postgres::connect(&admin_url, NoTls).await.expect("connect DATABASE_URL");
        let admin_task = tokio::spawn(conn);
        let name = format!("kz_test_{}", uuid::Uuid::new_v4().simple());
        admin.batch_execute(&format!("create database {name}")).await.expect("create test database");
        drop(admin);
        let _ = admin_task.await;
        let url = with_database(&admin_url, &name);
        let client = connect(&url).await;
        pack::install(&client).await.expect("install the pack");
        TestDb { url, admin_url, name, client }
    }

    /// A fresh database with the pack and the example `todos` table.
    pub async fn with_todos() -> TestDb {
        let db = TestDb::new().await;
        db.exec(include_str!("../../sql/examples/todos.sql")).await;
        db
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The admin connection to the test database.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Another admin connection (for concurrency tests).
    pub async fn connect(&self) -> Client {
        connect(&self.url).await
    }

    /// Runs SQL as the admin; panics on error.
    pub async fn exec(&self, sql: &str) {
        self.client.batch_execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)));
    }

    /// One value as the admin: `select <expr>`-style queries returning one jsonb/int/text column.
    pub async fn one<T: for<'a> tokio_postgres::types::FromSql<'a>>(&self, sql: &str) -> T {
        let row = self.client.query_one(sql, &[]).await.unwrap_or_else(|e| panic!("{sql}: {}", describe(&e)));
        row.get(0)
    }

    pub async fn push(&self, caller: &Caller, request: Value) -> Result<Value, SqlError> {
        call_as(&self.client, caller, "kizuna_push", request).await
    }

    pub async fn pull(&self, caller: &Caller, request: Value) -> Result<Value, SqlError> {
        call_as(&self.client, caller, "kizuna_pull", request).await
    }

    /// A table owned row by row like `todos` (`owner` defaults to the caller, one policy lets the
    /// owner do everything), in bucket `user:<owner>`, registered with `options` (e.g.
    /// `, conflict_mode => 'hlc'`). `columns` are the others, the primary key first.
    pub async fn owned_table(&self, name: &str, columns: &str, options: &str) {
        self.exec(&format!(
            "create table public.{name} ({columns}, owner uuid not null default auth.uid());
             alter table public.{name} enable row level security;
             create policy own on public.{name} using (owner = auth.uid()) with check (owner = auth.uid());
             grant select, insert, update, delete on public.{name} to authenticated;
             select kizuna.register_table('public.{name}', bucket => $$'user:' || owner$$ {options});"
        ))
        .await;
    }

    /// Runs the pack's installer again (as the gateway does at every start).
    pub async fn reinstall(&self) {
        pack::install(&self.client).await.expect("reinstall the pack");
    }

    /// The pack's files, in the order the installer applies them.
    pub fn pack_files() -> Vec<&'static str> {
        pack::FILES.iter().map(|(name, _)| *name).collect()
    }

    /// `kizuna.status()` as the admin.
    pub async fn status(&self) -> Value {
        self.one("select kizuna.status()").await
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Best effort, on a thread of its own: Drop cannot await, and we may be inside a runtime.
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            rt.block_on(async move {
                if let Ok((admin, conn)) = tokio_postgres::connect(&admin_url, NoTls).await {
                    let task = tokio::spawn(conn);
                    let _ = admin.batch_execute(&format!("drop database if exists {name} with (force)")).await;
                    drop(admin);
                    let _ = task.await;
                }
            });
        })
        .join();
    }
}

pub async fn connect(url: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect test database");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

fn with_database(admin_url: &str, name: &str) -> String {
    let (base, query) = match admin_url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (admin_url, None),
    };
    let base = match base.rsplit_once('/') {
        Some((head, _)) if head.contains("//") && head.len() > head.find("//").unwrap() + 2 => head,
        _ => base,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

/// Calls `public.<function>(request)` as `caller`, in one transaction, exactly like the gateway.
pub async fn call_as(client: &Client, caller: &Caller, function: &str, request: Value) -> Result<Value, SqlError> {
    call_raw_as(client, caller, function, &request.to_string()).await
}

/// Like `call_as` with the request as raw text (for malformed JSON).
pub async fn call_raw_as(client: &Client, caller: &Caller, function: &str, request: &str) -> Result<Value, SqlError> {
    assert!(matches!(function, "kizuna_push" | "kizuna_pull"));
    // A pull page reads one snapshot, as the gateway runs it.
    let begin = if function == "kizuna_pull" { "begin isolation level repeatable read" } else { "begin" };
    select_as(client, caller, begin, &format!("select public.{function}($1::text::jsonb)"), &[&request], true).await
}

/// Runs `select to_jsonb((<expr>))` as `caller`, in one transaction: what a caller with a SQL
/// session (or a schema exposed by mistake) could run directly. Nothing it does is kept.
pub async fn sql_as(client: &Client, caller: &Caller, expr: &str) -> Result<Value, SqlError> {
    select_as(client, caller, "begin", &format!("select to_jsonb(({expr}))"), &[], false).await
}

/// `sql_as`, committed: for what a direct call must not leave behind (a refusal that only a
/// rollback hid would pass unseen).
pub async fn sql_kept_as(client: &Client, caller: &Caller, expr: &str) -> Result<Value, SqlError> {
    select_as(client, caller, "begin", &format!("select to_jsonb(({expr}))"), &[], true).await
}

/// One `select` of a jsonb value as `caller`, in a transaction of its own set up as the gateway
/// sets it up (`SET LOCAL ROLE`, then the claims); committed when `keep`, else rolled back.
async fn select_as(
    client: &Client,
    caller: &Caller,
    begin: &str,
    select: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    keep: bool,
) -> Result<Value, SqlError> {
    client.batch_execute(begin).await.expect("begin");
    let result = async {
        client.batch_execute(&format!("set local role {}", caller.role)).await?;
        client
            .execute("select set_config('request.jwt.claims', $1, true)", &[&caller.claims.to_string()])
            .await?;
        let row = client.query_one(select, params).await?;
        Ok::<Value, tokio_postgres::Error>(row.get::<_, Option<Value>>(0).unwrap_or(Value::Null))
    }
    .await;
    let end = if keep && result.is_ok() { "commit" } else { "rollback" };
    let ended = client.batch_execute(end).await;
    let value = result.map_err(to_sql_error)?;
    ended.map_err(to_sql_error)?;
    Ok(value)
}

fn to_sql_error(e: tokio_postgres::Error) -> SqlError {
    match e.as_db_error() {
        Some(db) => SqlError { code: db.code().code().to_string(), message: db.message().to_string() },
        None => SqlError { code: "connection".into(), message: e.to_string() },
    }
}

// ---------------------------------------------------------------------------------------------
// Wire builders (PROTOCOL.md shapes).

/// A mutation with a fresh id.
pub fn mutation(client_seq: i64, table: &str, pk: &str, op: &str, columns: Value) -> Value {
    let mut m = json!({
        "id": uuid::Uuid::new_v4().to_string(), "client_seq": client_seq,
        "table": table, "pk": pk, "op": op, "read_seq": 0,
    });
    if !columns.is_null() {
        m["columns"] = columns;
    }
    m
}

/// Wall-clock time in milliseconds since the epoch, as a hybrid logical clock counts it.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// `m` stamped with the hybrid logical clock `<ms>-<counter>-<node>`, the shape the pack checks.
pub fn clocked(mut m: Value, ms: i64, counter: u32, node: &str) -> Value {
    m["hlc"] = json!(format!("{ms:013}-{counter:04}-{node}"));
    m
}

pub fn push_request(client_id: &str, mutations: Vec<Value>) -> Value {
    json!({"protocol": 1, "client_id": client_id, "mutations": mutations})
}

pub fn pull_request(client_id: &str, cursor: Option<&str>, buckets: &[&str], limit: u32) -> Value {
    json!({"protocol": 1, "client_id": client_id, "cursor": cursor, "buckets": buckets, "limit": limit})
}

/// The statuses of a push response's verdicts, in order.
pub fn statuses(response: &Value) -> Vec<String> {
    response["verdicts"]
        .as_array()
        .expect("verdicts")
        .iter()
        .map(|v| match v["reason"].as_str() {
            Some(reason) => format!("{}:{}", v["status"].as_str().unwrap(), reason),
            None => v["status"].as_str().unwrap().to_string(),
        })
        .collect()
}

/// A completed pull run: every page's entries, the closing checkpoint and the run's horizon.
pub struct Run {
    pub entries: Vec<Value>,
    pub checkpoint: String,
    pub horizon: i64,
    pub pages: usize,
    pub conflicts: Vec<Value>,
}

/// Pulls pages from `cursor` until `done`, on `client` (one transaction per page).
pub async fn pull_run(
    client: &Client,
    caller: &Caller,
    client_id: &str,
    cursor: Option<&str>,
    buckets: &[&str],
    limit: u32,
) -> Result<Run, SqlError> {
    let mut cursor = cursor.map(str::to_string);
    let mut run = Run { entries: vec![], checkpoint: String::new(), horizon: -1, pages: 0, conflicts: vec![] };
    loop {
        let page = call_as(client, caller, "kizuna_pull", pull_request(client_id, cursor.as_deref(), buckets, limit)).await?;
        run.pages += 1;
        let entries = page["entries"].as_array().expect("entries").clone();
        assert!(entries.len() <= limit as usize, "a page holds at most limit entries");
        if run.horizon >= 0 {
            assert!(page["horizon"].as_i64() >= Some(run.horizon), "a run's horizon never goes back");
        }
        run.horizon = page["horizon"].as_i64().expect("horizon");
        run.entries.extend(entries);
        if let Some(c) = page["conflicts"].as_array() {
            run.conflicts.extend(c.iter().cloned());
        }
        let next = page["cursor"].as_str().expect("cursor").to_string();
        if page["lifecycle"].is_string() {
            return Err(SqlError { code: "lifecycle".into(), message: page["lifecycle"].as_str().unwrap().into() });
        }
        if page["done"] == json!(true) {
            run.checkpoint = next;
            return Ok(run);
        }
        cursor = Some(next);
    }
}

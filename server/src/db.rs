//! The database side: the pool, start-up (connect, install the pack, apply --init-sql) and the one
//! transaction per request in which the pack's functions run as the caller.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use serde_json::Value;
use tokio_postgres::{IsolationLevel, NoTls};

use crate::errors::{is_retryable_sqlstate, ApiError};
use crate::jwt::{Claims, Role};

/// The pack's entry points. The SQL text is fixed here: nothing from a request is spliced in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rpc {
    Push,
    Pull,
    /// The operator's RPC; the pack grants it to service_role only.
    Admin,
}

impl Rpc {
    fn sql(self) -> &'static str {
        match self {
            // Text in, text out: the caller's JSON reaches the pack as sent and the answer leaves as
            // the pack wrote it, so numbers keep every digit (jsonb holds them as numeric).
            Rpc::Push => "select public.kizuna_push($1::text::jsonb)::text",
            Rpc::Pull => "select public.kizuna_pull($1::text::jsonb)::text",
            Rpc::Admin => "select public.kizuna_admin($1::text::jsonb)::text",
        }
    }
}

/// Attempts for a transaction that hits a serialization failure or deadlock before answering 503.
const SERIALIZATION_ATTEMPTS: u32 = 5;

pub fn parse_url(url: &str) -> Result<tokio_postgres::Config, String> {
    tokio_postgres::Config::from_str(url).map_err(|e| format!("invalid --database-url: {e}"))
}

pub fn pool(config: tokio_postgres::Config, size: usize) -> Result<Pool, String> {
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size.max(1))
        // A request waits this long for a free connection, then gets 503 instead of hanging.
        .wait_timeout(Some(Duration::from_secs(10)))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|e| format!("could not build the connection pool: {e}"))
}

/// Opens one plain connection, retrying until `timeout` while the database comes up.
pub async fn connect_with_retry(
    config: &tokio_postgres::Config,
    timeout: Duration,
) -> Result<tokio_postgres::Client, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match config.connect(NoTls).await {
            Ok((client, connection)) => {
                tokio::spawn(async move {
                    if let Err(e) = connection.await {
                        eprintln!("kizuna-server: database connection closed: {e}");
                    }
                });
                return Ok(client);
            }
            Err(e) if Instant::now() < deadline => {
                eprintln!("kizuna-server: database not reachable yet ({e}); retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(format!("could not connect to the database: {e}")),
        }
    }
}

/// Installs the pack and applies the --init-sql files, in order, on one connection.
pub async fn prepare(client: &tokio_postgres::Client, init_sql: &[PathBuf]) -> Result<(), String> {
    crate::pack::install(client)
        .await
        .map_err(|e| format!("could not install the SQL pack: {}", describe(&e)))?;
    for file in init_sql {
        let sql = std::fs::read_to_string(file)
            .map_err(|e| format!("could not read --init-sql {}: {e}", file.display()))?;
        client
            .batch_execute(&sql)
            .await
            .map_err(|e| format!("--init-sql {} failed: {}", file.display(), describe(&e)))?;
    }
    Ok(())
}

/// Runs one pack function as the caller: role and claims are transaction-local, exactly as
/// PostgREST sets them, so the tables' RLS policies decide. Serialization failures and deadlocks
/// are retried; the whole transaction is repeated, so no partial effect survives a retry.
pub async fn call(
    pool: &Pool,
    rpc: Rpc,
    claims: &Claims,
    request: &str,
    statement_timeout: Duration,
) -> Result<String, ApiError> {
    let mut attempt = 1;
    loop {
        match call_once(pool, rpc, claims, request, statement_timeout).await {
            Err(Failure::Db(e)) => {
                let retry = e.code().is_some_and(|c| is_retryable_sqlstate(c.code()));
                if retry && attempt < SERIALIZATION_ATTEMPTS {
                    // Back off a little, more each time, with jitter so that colliding requests part.
                    let jitter = u64::from(uuid::Uuid::new_v4().as_bytes()[0]) % 20;
                    tokio::time::sleep(Duration::from_millis(10 * u64::from(attempt) + jitter))
                        .await;
                    attempt += 1;
                    continue;
                }
                return Err(ApiError::from_db(&e, claims.role == Role::Anon));
            }
            Err(Failure::Pool(message)) => return Err(ApiError::unavailable(message)),
            Err(Failure::Refused { code, message }) => {
                return Err(ApiError::refused(&code, message, claims.role == Role::Anon))
            }
            Ok(value) => return Ok(value),
        }
    }
}

enum Failure {
    Pool(String),
    Db(tokio_postgres::Error),
    /// Refused at commit, in the pack's words: SQLSTATE and message.
    Refused { code: String, message: String },
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Failure {
        Failure::Db(e)
    }
}

async fn call_once(
    pool: &Pool,
    rpc: Rpc,
    claims: &Claims,
    request: &str,
    statement_timeout: Duration,
) -> Result<String, Failure> {
    let mut client = pool
        .get()
        .await
        .map_err(|e| Failure::Pool(format!("no database connection available: {e}")))?;
    // A pull page reads one snapshot: its horizon and the rows it renders agree (006_pull.sql).
    let tx = match rpc {
        Rpc::Pull => client.build_transaction().isolation_level(IsolationLevel::RepeatableRead).start().await?,
        _ => client.transaction().await?,
    };
    // set_config('role', ..., true) is SET LOCAL ROLE in a form that takes parameters; the role
    // name comes from the gateway's allowlist, never from the token's text.
    // The statement timeout bounds what one request can make the database do (and how long it
    // holds a pooled connection), whatever it asks for.
    let setup = tx
        .prepare_cached(
            "select set_config('role', $1, true), set_config('request.jwt.claims', $2, true), \
                    set_config('statement_timeout', $3, true)",
        )
        .await?;
    let timeout_ms = statement_timeout.as_millis().to_string();
    tx.execute(&setup, &[&claims.role.as_str(), &claims.json, &timeout_ms])
        .await?;
    let statement = tx.prepare_cached(rpc.sql()).await?;
    let row = tx.query_one(&statement, &[&request]).await?;
    let answer: Option<String> = row.try_get(0)?;
    if let Err(e) = tx.commit().await {
        return Err(match e.as_db_error() {
            // A constraint checked at commit (DEFERRABLE INITIALLY DEFERRED) refuses the whole
            // request. Its text and detail can carry other rows' values and the schema's names, so
            // the caller hears the pack's own sentence for the same refusal of one mutation.
            Some(db) if db.code().code().starts_with("23") => {
                let code = db.code().code().to_owned();
                let words = client
                    .query_one("select kizuna.refusal_message($1, '', $2)", &[&code, &db.constraint()])
                    .await?
                    .try_get(0)?;
                Failure::Refused { code, message: words }
            }
            _ => Failure::Db(e),
        });
    }
    Ok(answer.unwrap_or_else(|| "null".to_owned()))
}

/// `kizuna.status()`: the durable figures, read as the connecting user.
pub async fn status(client: &tokio_postgres::Client) -> Result<Value, tokio_postgres::Error> {
    let row = client
        .query_one("select kizuna.status()::jsonb", &[])
        .await?;
    Ok(row.try_get::<_, Option<Value>>(0)?.unwrap_or(Value::Null))
}

/// True when the database answers and the pack's entry points exist.
pub async fn healthy(pool: &Pool) -> bool {
    let Ok(client) = pool.get().await else {
        return false;
    };
    let sql = "select to_regprocedure('public.kizuna_push(jsonb)') is not null \
               and to_regprocedure('public.kizuna_pull(jsonb)') is not null";
    matches!(
        client
            .query_one(sql, &[])
            .await
            .map(|r| r.get::<_, bool>(0)),
        Ok(true)
    )
}

/// Calls `kizuna.reap()` every `every`, for as long as the process lives.
pub async fn reap_forever(pool: Pool, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await; // the first tick is immediate; the pack was just installed
    loop {
        ticks.tick().await;
        let result = match pool.get().await {
            Ok(client) => client
                .execute("select kizuna.reap()", &[])
                .await
                .map(drop)
                .map_err(|e| describe(&e)),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = result {
            eprintln!("kizuna-server: kizuna.reap() failed: {e}");
        }
    }
}

/// A database error as one line for the operator: SQLSTATE, message, detail, hint.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = format!("{} {}", db.code().code(), db.message());
            if let Some(d) = db.detail() {
                s.push_str(&format!(" (detail: {d})"));
            }
            if let Some(h) = db.hint() {
                s.push_str(&format!(" (hint: {h})"));
            }
            if let Some(w) = db.where_() {
                s.push_str(&format!(" (where: {w})"));
            }
            s
        }
        None => e.to_string(),
    }
}

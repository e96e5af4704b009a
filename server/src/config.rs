//! Command line and environment: every flag has an environment variable and a documented default.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// The development secret. Anyone who reads this file can mint tokens for it, so the server warns
/// loudly whenever it is in use.
pub const DEV_JWT_SECRET: &str = "kizuna-dev-secret-change-me";

#[derive(Debug, Parser)]
#[command(
    name = "kizuna-server",
    version,
    about = "Kizuna's gateway: JWT check, one transaction per request, wake-ups and metrics in front of the SQL pack.",
    // The universe commands name their databases themselves (--source): they need no --database-url.
    subcommand_negates_reqs = true
)]
pub struct Cli {
    #[command(flatten)]
    pub config: Config,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the durable figures (`select kizuna.status()`) as pretty JSON and exit.
    Status,
    /// Deliver universe sync's source outbox to a target Kizuna deployment's push entry point.
    UniverseSync(crate::universe::cli::SyncArgs),
    /// Print universe sync's counters: the source outbox's, and a target's apply path's.
    UniverseStatus(crate::universe::cli::StatusArgs),
    /// Inspect, requeue or discard universe sync's dead letters.
    UniverseDead(crate::universe::cli::DeadArgs),
}

#[derive(Debug, Clone, Parser)]
pub struct Config {
    /// Address to listen on. Port 0 picks a free port; the ready line names the real one.
    #[arg(long, env = "KIZUNA_LISTEN", default_value = "127.0.0.1:8787")]
    pub listen: SocketAddr,

    /// PostgreSQL connection URL, e.g. postgres://postgres@127.0.0.1:5432/postgres.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, required = true)]
    pub database_url: Option<String>,

    /// HS256 secret that signs access tokens (Supabase: the project's JWT secret). The default is a
    /// public development secret: the server warns loudly while it is in use.
    #[arg(long, env = "KIZUNA_JWT_SECRET", default_value = DEV_JWT_SECRET, hide_env_values = true,
          value_parser = jwt_secret)]
    pub jwt_secret: String,

    /// Folder served at `/` (the demo page); nothing is served there when absent.
    #[arg(long, env = "KIZUNA_WWW")]
    pub www: Option<PathBuf>,

    /// Folder served at `/pkg/` (wasm-pack output); nothing is served there when absent.
    #[arg(long, env = "KIZUNA_PKG")]
    pub pkg: Option<PathBuf>,

    /// Serve every answer with the headers that make a page cross-origin isolated
    /// (`Cross-Origin-Opener-Policy: same-origin`, `Cross-Origin-Embedder-Policy: require-corp`).
    /// `make bench` uses it: an isolated page's clock (`performance.now()`) has 5 µs steps in
    /// Chromium instead of 100 µs, finer than one local write. A page served so cannot embed
    /// resources of other origins that do not allow it.
    #[arg(long, env = "KIZUNA_CROSS_ORIGIN_ISOLATED")]
    pub cross_origin_isolated: bool,

    /// Extra SQL file applied after the pack at start (repeatable; the variable takes a comma list).
    #[arg(long = "init-sql", env = "KIZUNA_INIT_SQL", value_delimiter = ',')]
    pub init_sql: Vec<PathBuf>,

    /// Largest accepted request body in bytes; larger bodies get 413 KZG01.
    #[arg(long, env = "KIZUNA_BODY_LIMIT", default_value_t = 1024 * 1024)]
    pub body_limit: usize,

    /// Seconds between `select kizuna.reap()` runs; 0 disables the reaper.
    #[arg(long, env = "KIZUNA_REAP_INTERVAL", default_value_t = 60)]
    pub reap_interval: u64,

    /// Allowed CORS origins: `*` or a comma list of origins.
    #[arg(long, env = "KIZUNA_CORS_ORIGIN", default_value = "*")]
    pub cors_origin: String,

    /// Demo only: enable `POST /kizuna/v1/dev-token`, which mints a token for any user id.
    #[arg(long, env = "KIZUNA_DEV_TOKENS")]
    pub dev_tokens: bool,

    /// Largest number of pooled database connections.
    #[arg(long, env = "KIZUNA_POOL_SIZE", default_value_t = 16)]
    pub pool_size: usize,

    /// Seconds to keep retrying the first database connection while the database comes up.
    #[arg(long, env = "KIZUNA_CONNECT_TIMEOUT", default_value_t = 15)]
    pub connect_timeout: u64,

    /// Milliseconds one request's statements may run (PostgreSQL's statement_timeout, per request),
    /// so that no request holds a pooled connection for long; 0 turns it off.
    #[arg(long, env = "KIZUNA_STATEMENT_TIMEOUT_MS", default_value_t = 15_000)]
    pub statement_timeout_ms: u64,

    /// Milliseconds a request's body may take to arrive once its headers have; a slower one gets
    /// 408 KZG06 (clients retry it), so that an upload that stalls (a phone that lost its network
    /// mid-request, or a caller that trickles bytes) does not hold its caller's share of
    /// `--caller-concurrency` for as long as the connection lives; 0 turns it off.
    #[arg(long, env = "KIZUNA_BODY_TIMEOUT_MS", default_value_t = 30_000)]
    pub body_timeout_ms: u64,

    /// Requests one caller (one token `sub`, or without one its role at one address: see
    /// `--trust-forwarded-for`) may have in flight at once; more get 429 KZG05. Keeps one caller
    /// from holding the whole pool. Callers without a `sub` hold at most half of `--pool-size`
    /// together.
    #[arg(long, env = "KIZUNA_CALLER_CONCURRENCY", default_value_t = 4)]
    pub caller_concurrency: usize,

    /// Take the address a request came from, which tells apart callers without a `sub` (anon) for
    /// `--caller-concurrency`, from the last `X-Forwarded-For` entry: the address the proxy in
    /// front saw. Set it only behind one proxy that appends to that header; without it the
    /// connection's peer address is taken (behind a proxy, the proxy's: one anon caller).
    #[arg(long, env = "KIZUNA_TRUST_FORWARDED_FOR")]
    pub trust_forwarded_for: bool,

    /// Wake streams one caller (one token `sub`, or without one an address) may hold open at once
    /// (one per device that leads its tabs); more get 429 KZG05 and go on pulling on their timers.
    /// 0 turns it off.
    #[arg(long, env = "KIZUNA_WAKE_STREAMS_PER_CALLER", default_value_t = 16)]
    pub wake_streams_per_caller: usize,

    /// Wake streams the process holds open in all, whoever opened them (callers without a `sub`,
    /// anon, half of them together); more get 429 KZG05. 0 turns it off.
    #[arg(long, env = "KIZUNA_MAX_WAKE_STREAMS", default_value_t = 10_000)]
    pub max_wake_streams: usize,

    /// Token that `GET /metrics` on `--listen` requires (`Authorization: Bearer ...`); a
    /// service_role JWT is accepted too. Without it only service_role tokens may scrape there.
    #[arg(long, env = "KIZUNA_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,

    /// A separate address serving only `GET /metrics`, without a token (bind it to a private
    /// interface); off when absent.
    #[arg(long, env = "KIZUNA_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// Milliseconds the durable figures of `/metrics` (`kizuna.status()`, which counts tables) are
    /// reused between scrapes; concurrent scrapes share one read. 0 reads them at every scrape.
    #[arg(long, env = "KIZUNA_METRICS_CACHE_MS", default_value_t = 15_000)]
    pub metrics_cache_ms: u64,
}

/// A JWT secret as given, refused when empty: HMAC takes an empty key, so anyone could sign a
/// service_role token with it. `KIZUNA_JWT_SECRET=${JWT_SECRET}` with the variable unset gives
/// exactly that, and clap takes an empty environment value as a value.
pub fn jwt_secret(value: &str) -> Result<String, String> {
    if value.is_empty() {
        return Err("the JWT secret is empty: anyone could sign tokens with it (is the variable it comes from unset?)".into());
    }
    Ok(value.to_owned())
}

impl Config {
    /// `--database-url`, which clap requires unless a universe command runs instead.
    pub fn database_url(&self) -> Result<&str, String> {
        self.database_url.as_deref().ok_or_else(|| "--database-url (or DATABASE_URL) is required".to_owned())
    }

    pub fn uses_dev_secret(&self) -> bool {
        self.jwt_secret == DEV_JWT_SECRET
    }
}

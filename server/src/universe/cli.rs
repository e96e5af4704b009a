//! `kizuna-server universe-sync`, `universe-status` and `universe-dead`.

use std::io::Write;
use std::time::Duration;

use clap::{Args, Subcommand};
use kizuna_engine::universe::{Delivery, DeliveryConfig};
use prometheus::Registry;
use serde_json::{json, Value};

use super::apply::ApplyFigures;
use super::source::Source;
use super::sync::{now_ms, run};
use super::target::{Credentials, Target};
use crate::figures::{encode, register_json};
use crate::jwt::JwtKey;

/// How to reach a target gateway.
#[derive(Debug, Clone, Args)]
pub struct TargetArgs {
    /// The target Kizuna deployment's base URL (its gateway, or a hosted project's API URL).
    #[arg(long, env = "KIZUNA_UNIVERSE_TARGET")]
    pub target: Option<String>,

    /// The target's JWT secret: a service_role token is minted per request, with the source
    /// universe's id as `sub` and `kizuna_universe`.
    #[arg(long, env = "KIZUNA_TARGET_JWT_SECRET", hide_env_values = true, value_parser = crate::config::jwt_secret)]
    pub target_jwt_secret: Option<String>,

    /// A ready service_role token for the target, sent as it is (instead of --target-jwt-secret).
    #[arg(long, env = "KIZUNA_TARGET_TOKEN", hide_env_values = true, conflicts_with = "target_jwt_secret")]
    pub target_token: Option<String>,

    /// Milliseconds one request to the target may take (then: TIMEOUT, an attempt).
    #[arg(long, env = "KIZUNA_UNIVERSE_REQUEST_TIMEOUT_MS", default_value_t = 30_000)]
    pub request_timeout_ms: u64,
}

impl TargetArgs {
    fn target(&self) -> Result<Option<Target>, String> {
        let Some(url) = &self.target else { return Ok(None) };
        let credentials = match (&self.target_jwt_secret, &self.target_token) {
            (_, Some(token)) => Credentials::Token(token.clone()),
            (Some(secret), None) => Credentials::Secret(JwtKey::new(secret)),
            (None, None) => return Err("--target needs --target-jwt-secret or --target-token".into()),
        };
        Target::new(url, credentials, Duration::from_millis(self.request_timeout_ms)).map(Some)
    }
}

#[derive(Debug, Clone, Args)]
pub struct SyncArgs {
    /// The source database (owner or superuser URL), whose outbox is delivered.
    #[arg(long, env = "KIZUNA_UNIVERSE_SOURCE", hide_env_values = true)]
    pub source: String,

    #[command(flatten)]
    pub target: TargetArgs,

    /// Deliver what is due now, then exit (the default).
    #[arg(long, conflicts_with = "interval")]
    pub once: bool,

    /// Keep running: a delivery run every D (e.g. `5s`, `500ms`), sooner when an event is due
    /// sooner; SIGINT/SIGTERM stop it between requests.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub interval: Option<Duration>,

    /// After each run, remove the acknowledged events (never pending ones, never dead letters).
    #[arg(long)]
    pub prune_acked: bool,

    /// Most events in one push request (keep it at or below the target's max_batch_size, 500 by default).
    #[arg(long, default_value_t = DeliveryConfig::default().max_slice)]
    pub batch_size: usize,

    /// First backoff step after a failed attempt, in milliseconds (doubling, jittered, capped).
    #[arg(long, default_value_t = DeliveryConfig::default().retry_base_ms)]
    pub retry_base_ms: i64,

    /// Backoff cap, in milliseconds.
    #[arg(long, default_value_t = DeliveryConfig::default().retry_max_ms)]
    pub retry_max_ms: i64,

    /// Seconds to keep retrying the first connection to the source while it comes up.
    #[arg(long, default_value_t = 15)]
    pub connect_timeout: u64,
}

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// The source database: prints its outbox's figures.
    #[arg(long, env = "KIZUNA_UNIVERSE_SOURCE", hide_env_values = true)]
    pub source: Option<String>,

    #[command(flatten)]
    pub target: TargetArgs,

    /// Prometheus text instead of JSON.
    #[arg(long)]
    pub metrics: bool,
}

#[derive(Debug, Clone, Args)]
pub struct DeadArgs {
    /// The source database.
    #[arg(long, env = "KIZUNA_UNIVERSE_SOURCE", hide_env_values = true)]
    pub source: String,

    #[command(subcommand)]
    pub action: DeadAction,
}

#[derive(Debug, Clone, Subcommand)]
pub enum DeadAction {
    /// Print dead letters as JSON (all, or the ids given).
    List { ids: Vec<i64> },
    /// Put dead letters back in the outbox as new events carrying the key's current state.
    Requeue {
        ids: Vec<i64>,
        /// Every dead letter.
        #[arg(long, conflicts_with = "ids")]
        all: bool,
    },
    /// Drop dead letters for good.
    Discard {
        ids: Vec<i64>,
        /// Every dead letter.
        #[arg(long, conflicts_with = "ids")]
        all: bool,
    },
}

/// `universe-sync`: one run (`--once`, the default) or a run every `--interval`.
pub async fn sync(args: SyncArgs) -> Result<(), String> {
    let target = args.target.target()?.ok_or("universe-sync needs --target")?;
    let connect = Duration::from_secs(args.connect_timeout);
    let config = DeliveryConfig {
        max_slice: args.batch_size.max(1),
        retry_base_ms: args.retry_base_ms.max(1),
        retry_max_ms: args.retry_max_ms.max(1),
    };
    let mut delivery = Delivery::new(config, seed());
    let mut source = Source::connect(&args.source, connect).await?;
    loop {
        let report = match run(&source, &target, &mut delivery).await {
            Ok(mut report) => {
                if args.prune_acked {
                    report.pruned = source.prune_acked().await? as u64;
                }
                report
            }
            // In the long-running mode a lost source connection is retried at the next run.
            Err(e) if args.interval.is_some() => {
                eprintln!("kizuna-server universe-sync: {e}");
                source = match Source::connect(&args.source, connect).await {
                    Ok(s) => s,
                    Err(e) => {
                        eprintln!("kizuna-server universe-sync: {e}");
                        source
                    }
                };
                Default::default()
            }
            Err(e) => return Err(e),
        };
        println!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
        let _ = std::io::stdout().flush();
        let Some(interval) = args.interval else { return Ok(()) };
        let until_due = report.next_due_ms.map(|at| Duration::from_millis((at - now_ms()).max(0) as u64));
        let wait = until_due.map_or(interval, |d| d.min(interval));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = crate::app::signal() => return Ok(()),
        }
    }
}

/// `universe-status`: the source outbox's figures and/or a target's apply-path process counters.
pub async fn status(args: StatusArgs) -> Result<(), String> {
    let target = args.target.target()?;
    if args.source.is_none() && target.is_none() {
        return Err("universe-status needs --source and/or --target".into());
    }
    let mut out = serde_json::Map::new();
    let registry = Registry::new();
    if let Some(url) = &args.source {
        let figures = Source::connect(url, Duration::from_secs(15)).await?.status().await?;
        register_json(&registry, "kizuna_universe_", &figures, "Universe sync source outbox figure (durable):");
        out.insert("source".into(), figures);
    }
    if let Some(target) = &target {
        let answer = target.apply_counters().await?;
        let figures: ApplyFigures = serde_json::from_value(answer["process_counters"].clone())
            .map_err(|e| format!("target {}: unexpected answer {answer}: {e}", target.url()))?;
        figures.register(&registry);
        out.insert("target".into(), json!({"url": target.url(), "apply_process_counters": figures, "kind": answer["kind"]}));
    }
    if args.metrics {
        print!("{}", encode(&[&registry]));
    } else {
        println!("{}", serde_json::to_string_pretty(&Value::Object(out)).map_err(|e| e.to_string())?);
    }
    Ok(())
}

/// `universe-dead list|requeue|discard`.
pub async fn dead(args: DeadArgs) -> Result<(), String> {
    let source = Source::connect(&args.source, Duration::from_secs(15)).await?;
    let answer = match &args.action {
        DeadAction::List { ids } => source.dead_letters(selected(ids, ids.is_empty())).await?,
        DeadAction::Requeue { ids, all } => json!({"requeued": source.requeue(chosen(ids, *all)?).await?}),
        DeadAction::Discard { ids, all } => json!({"discarded": source.discard(chosen(ids, *all)?).await?}),
    };
    println!("{}", serde_json::to_string_pretty(&answer).map_err(|e| e.to_string())?);
    Ok(())
}

fn selected(ids: &[i64], all: bool) -> Option<&[i64]> {
    (!all).then_some(ids)
}

/// Ids, or every dead letter with `--all`; never all by accident.
fn chosen(ids: &[i64], all: bool) -> Result<Option<&[i64]>, String> {
    if ids.is_empty() && !all {
        return Err("name the dead letters' ids, or pass --all".into());
    }
    Ok(selected(ids, all))
}

/// Jitter seed: the clock and the process id, enough to part processes that failed together.
fn seed() -> u64 {
    (now_ms() as u64) ^ (u64::from(std::process::id()) << 32)
}

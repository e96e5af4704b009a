//! `kizuna-history`: runs seeded histories of real clients against the real gateway and PostgreSQL
//! and checks each against the consistency model (see history.rs for the workload and the checks).
//!
//! ```text
//! kizuna-history --database-url URL --gateway target/debug/kizuna-server --seeds 1-8
//! ```
//! Prints one line, `histories: H, operations: O, faults: F, violations: V`, and for each
//! violation the seed that reproduces it (`--seeds N-N`) with what was found. Exits 1 on any.

mod client;
mod gateway;
mod history;
mod model;
mod prng;
mod transport;

use std::process::ExitCode;

struct Args {
    database_url: String,
    gateway: String,
    seeds: std::ops::RangeInclusive<u64>,
}

fn args() -> Result<Args, String> {
    let mut database_url = std::env::var("DATABASE_URL").ok();
    let mut gateway = "target/debug/kizuna-server".to_owned();
    let mut seeds = 1..=8;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--database-url" => database_url = Some(value()?),
            "--gateway" => gateway = value()?,
            "--seeds" => {
                let v = value()?;
                let (a, b) = v.split_once('-').unwrap_or((&v, &v));
                let (a, b) = (a.parse().map_err(|_| format!("bad --seeds {v}"))?, b.parse().map_err(|_| format!("bad --seeds {v}"))?);
                seeds = a..=b;
            }
            other => return Err(format!("unknown argument {other}; see the source's header")),
        }
    }
    let database_url = database_url.ok_or("--database-url or DATABASE_URL is required")?;
    Ok(Args { database_url, gateway, seeds })
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("kizuna-history: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<bool, String> {
    let args = args()?;
    let (pg, conn) = tokio_postgres::connect(&args.database_url, tokio_postgres::NoTls).await.map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let mut gateway = gateway::Gateway::start(&args.gateway, &args.database_url).await?;
    pg.batch_execute(include_str!("../schema.sql")).await.map_err(|e| format!("schema: {e}"))?;

    let (mut histories, mut operations, mut faults, mut violations) = (0u64, 0u64, 0u64, 0usize);
    for seed in args.seeds.clone() {
        let report = history::run(seed, &mut gateway, &pg, &args.database_url).await.map_err(|e| format!("seed {seed}: {e}"))?;
        histories += 1;
        operations += report.operations;
        faults += report.faults;
        if !report.violations.is_empty() {
            violations += report.violations.len();
            eprintln!("violations in seed {seed} (rerun with --seeds {seed}-{seed}):");
            for v in &report.violations {
                eprintln!("  {v}");
            }
            eprintln!("  the history of the keys involved:");
            for line in &report.trace {
                eprintln!("    {line}");
            }
        }
    }
    gateway.kill().await;
    println!("histories: {histories}, operations: {operations}, faults: {faults}, violations: {violations}");
    Ok(violations == 0)
}

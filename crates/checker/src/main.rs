//! `kizuna-history`: runs seeded histories of real clients against the real gateway and PostgreSQL
//! and checks each against the consistency model (history.rs runs one, checks.rs judges it).
//!
//! ```text
//! kizuna-history --database-url URL --gateway target/debug/kizuna-server --seeds 1-8
//!     [--browser-every K --pkg pkg]   a real browser client in every K-th history
//!     [--steps 3,7,12]                only these steps of each seed's plan (a shrunk reproduction)
//!     [--no-shrink]                   report a violation without shrinking it
//!     [--plant-bug]                   a self-test: install a server bug the checker must catch
//!     [--verbose]                     a line per device of each history: what it did and heard
//! ```
//! Prints one line, `histories: H, operations: O, faults: F, violations: V`, and for each
//! violation the seed that reproduces it with what was found, then the history shrunk to the
//! fewest steps that still show a violation (`--seeds N-N --steps ...`). Exits 1 on any.
//! With `--plant-bug` it exits 0 only when the planted bug was caught, and shrunk every time.

mod browser;
mod checks;
mod client;
mod device;
mod gateway;
mod history;
mod model;
mod operator;
mod plan;
mod prng;
mod proxy;
mod record;
mod shrink;
mod transport;

use std::process::ExitCode;

use history::Setup;

struct Args {
    database_url: String,
    gateway: String,
    seeds: std::ops::RangeInclusive<u64>,
    steps: Option<Vec<usize>>,
    browser_every: u64,
    pkg: String,
    shrink: bool,
    plant_bug: bool,
    verbose: bool,
}

fn args() -> Result<Args, String> {
    let mut database_url = std::env::var("DATABASE_URL").ok();
    let mut a = Args {
        database_url: String::new(),
        gateway: "target/debug/kizuna-server".to_owned(),
        seeds: 1..=8,
        steps: None,
        browser_every: 0,
        pkg: "pkg".to_owned(),
        shrink: true,
        plant_bug: false,
        verbose: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--database-url" => database_url = Some(value()?),
            "--gateway" => a.gateway = value()?,
            "--seeds" => {
                let v = value()?;
                let (x, y) = v.split_once('-').unwrap_or((&v, &v));
                let bad = || format!("bad --seeds {v}");
                a.seeds = x.parse().map_err(|_| bad())?..=y.parse().map_err(|_| bad())?;
            }
            "--steps" => {
                let v = value()?;
                a.steps = Some(v.split(',').map(|s| s.trim().parse().map_err(|_| format!("bad --steps {v}"))).collect::<Result<_, _>>()?);
            }
            "--browser-every" => a.browser_every = value()?.parse().map_err(|_| "bad --browser-every")?,
            "--pkg" => a.pkg = value()?,
            "--no-shrink" => a.shrink = false,
            "--plant-bug" => a.plant_bug = true,
            "--verbose" => a.verbose = true,
            other => return Err(format!("unknown argument {other}; see the source's header")),
        }
    }
    a.database_url = database_url.ok_or("--database-url or DATABASE_URL is required")?;
    Ok(a)
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

/// A bug for the self-test, of the kind the checks exist for: an update of `b` in `hist_items` is
/// silently lost (the write is acknowledged, its effect is not there).
const PLANTED_BUG: &str = "
create or replace function public.hist_planted_bug() returns trigger language plpgsql as $$
begin
  new.b := old.b;
  return new;
end $$;
drop trigger if exists hist_planted_bug on public.hist_items;
create trigger hist_planted_bug before update on public.hist_items for each row execute function public.hist_planted_bug();
";

async fn run() -> Result<bool, String> {
    let args = args()?;
    let (pg, conn) = tokio_postgres::connect(&args.database_url, tokio_postgres::NoTls).await.map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let mut gateway = gateway::Gateway::start(&args.gateway, &args.database_url).await?;
    pg.batch_execute(include_str!("../schema.sql")).await.map_err(|e| format!("schema: {}", e.as_db_error().map_or(e.to_string(), ToString::to_string)))?;
    if args.plant_bug {
        pg.batch_execute(PLANTED_BUG).await.map_err(|e| format!("planting the bug: {e}"))?;
    }
    let mut browser = match args.browser_every {
        0 => None,
        _ => Some(browser::Browser::launch(&args.pkg).await?),
    };

    let (mut histories, mut with_browser, mut operations, mut faults, mut violations) = (0u64, 0u64, 0u64, 0u64, 0usize);
    let (mut caught, mut unshrunk) = (0u64, 0u64);
    // The operator's steps run (operator.rs): bulk transactions and migrations.
    let (mut bulks, mut migrations) = (0usize, 0usize);
    for seed in args.seeds.clone() {
        let plan = plan::plan(seed);
        let in_browser = args.browser_every > 0 && seed % args.browser_every == 0;
        let mut setup = Setup {
            gateway: &mut gateway,
            pg: &pg,
            database_url: &args.database_url,
            browser: if in_browser { browser.as_mut() } else { None },
        };
        let keep = |s: &plan::Step| args.steps.as_ref().is_none_or(|steps| steps.contains(&s.index));
        let report = history::run(seed, &plan, &keep, &mut setup).await.map_err(|e| format!("seed {seed}: {e}"))?;
        histories += 1;
        with_browser += in_browser as u64;
        if args.verbose {
            println!("seed {seed}: {} steps, {} faults", plan.steps.len(), report.faults);
            for line in &report.devices {
                println!("  {line}");
            }
        }
        operations += report.operations;
        let kept = || plan.steps.iter().filter(|s| keep(s));
        bulks += kept().filter(|s| matches!(s.action, plan::Action::SqlBulk { .. })).count();
        migrations += kept().filter(|s| matches!(s.action, plan::Action::Migrate { .. })).count();
        faults += report.faults;
        if report.violations.is_empty() {
            if args.plant_bug {
                println!("planted bug missed in seed {seed}");
            }
            continue;
        }
        let heading = if args.plant_bug { "planted bug caught in seed" } else { "violations in seed" };
        violations += report.violations.len();
        eprintln!("{heading} {seed} (rerun with --seeds {seed}-{seed}):");
        for v in &report.violations {
            eprintln!("  {v}");
        }
        if !args.shrink || args.steps.is_some() {
            print_trace(&report.trace);
            continue;
        }
        let total = plan.steps.len();
        let shrunk = shrink::shrink(seed, &plan, &mut setup, report).await.map_err(|e| format!("seed {seed}, shrinking: {e}"))?;
        let list: Vec<String> = shrunk.steps.iter().map(usize::to_string).collect();
        eprintln!(
            "  shrunk from {total} to {} steps in {} runs; reproduce with --seeds {seed}-{seed} --steps {}",
            shrunk.steps.len(),
            shrunk.runs,
            list.join(",")
        );
        for step in plan.steps.iter().filter(|s| shrunk.steps.contains(&s.index)) {
            eprintln!("    {step}");
        }
        eprintln!("  what the shrunk history found:");
        for v in &shrunk.report.violations {
            eprintln!("    {v}");
        }
        print_trace(&shrunk.report.trace);
        if args.plant_bug {
            if shrunk.steps.len() < total && !shrunk.report.violations.is_empty() {
                caught += 1;
                println!("planted bug caught in seed {seed} and shrunk from {total} to {} steps", shrunk.steps.len());
            } else {
                unshrunk += 1;
            }
        }
    }
    if let Some(browser) = browser {
        browser.quit().await;
    }
    gateway.kill().await;
    if args.plant_bug {
        // A history whose plan never changes `b` of an item cannot show this bug; one that shows it
        // must shrink to fewer steps that still show it.
        println!("planted bug: caught and shrunk in {caught} of {histories} histories, caught but not shrunk in {unshrunk}");
        let passed = caught > 0 && unshrunk == 0;
        println!("planted bug self-test: {}", if passed { "passed" } else { "failed" });
        return Ok(passed);
    }
    if with_browser > 0 {
        println!("{with_browser} of {histories} histories had a client in a real browser");
    }
    println!("{bulks} bulk SQL transactions and {migrations} migrations ran among the histories");
    println!("histories: {histories}, operations: {operations}, faults: {faults}, violations: {violations}");
    Ok(violations == 0)
}

fn print_trace(trace: &[String]) {
    eprintln!("  the history of the keys involved:");
    for line in trace {
        eprintln!("    {line}");
    }
}

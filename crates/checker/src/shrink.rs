//! Shrinking a violating history: delta debugging (Zeller's ddmin) over its plan's steps. Each
//! candidate is a real run of the history with some steps left out; a candidate that still shows a
//! violation is kept. Runs are not deterministic (timing, the SQL writer), so a shrunk plan is one
//! that reproduced the violation when it was tried, and the result is the smallest found within the
//! budget of runs.

use crate::history::{self, Report, Setup};
use crate::plan::Plan;

/// How many reruns a shrink may take.
const MAX_RUNS: usize = 80;

pub struct Shrunk {
    /// The step indices that still show a violation.
    pub steps: Vec<usize>,
    pub runs: usize,
    /// The last violating run's report.
    pub report: Report,
}

pub async fn shrink(seed: u64, plan: &Plan, setup: &mut Setup<'_>, first: Report) -> Result<Shrunk, String> {
    let mut current: Vec<usize> = plan.steps.iter().map(|s| s.index).collect();
    let mut report = first;
    let mut runs = 0;
    let mut n = 2usize;
    while current.len() >= 2 && runs < MAX_RUNS {
        let chunk = current.len().div_ceil(n);
        let mut reduced = false;
        for i in 0..n {
            let start = i * chunk;
            if start >= current.len() {
                break;
            }
            let candidate: Vec<usize> = current[..start].iter().chain(current[(start + chunk).min(current.len())..].iter()).copied().collect();
            runs += 1;
            let tried = history::run(seed, plan, &|s| candidate.contains(&s.index), setup).await?;
            if !tried.violations.is_empty() {
                current = candidate;
                report = tried;
                n = (n - 1).max(2);
                reduced = true;
                break;
            }
            if runs >= MAX_RUNS {
                break;
            }
        }
        if !reduced {
            if n >= current.len() {
                break;
            }
            n = (n * 2).min(current.len());
        }
    }
    Ok(Shrunk { steps: current, runs, report })
}

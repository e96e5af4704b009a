//! A history's workload, drawn from its seed before anything runs: a numbered list of steps, so a
//! violation can be replayed with fewer of them (`--steps`) and shrunk (shrink.rs). Steps name rows
//! by the step that created them, so any subset of the plan is still a history that makes sense: a
//! write to a row whose creating step was left out meets the server's answer for a missing row.

use std::fmt;

use crate::prng::Prng;

/// The checker's tables: columns ordered by arrival, and by hybrid logical clocks.
pub const TABLES: [&str; 2] = ["hist_items", "hist_notes"];

/// Which of the history's three lists each client follows (its buckets), and its user.
pub const PLANS: [(usize, &[usize]); 3] = [(0, &[0, 1]), (0, &[1, 2]), (1, &[0, 1, 2])];

/// A row of the history: its table and the step that created it (`{tag}-{prefix}{step}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    pub table: &'static str,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// A new row in one of the client's lists, shared (readable by the other user) or not.
    Insert { key: Key, list: usize, shared: bool },
    /// One column of a row, `latest_only` or not.
    Patch { key: Key, column: &'static str, latest_only: bool },
    /// The row into another list: another bucket.
    Move { key: Key, list: usize },
    Delete { key: Key },
    /// An atomic batch: a new row and a patch of another.
    Batch { new: Key, list: usize, other: Key },
    /// A title the server's gate refuses.
    Refused { key: Key },
    /// A row over the server's size limit: refused as a whole request until it dead-letters.
    Poison { key: Key, list: usize },
    /// A patch held back by `applyAfter` for this many milliseconds.
    Delayed { key: Key, after_ms: i64 },
    /// The client goes offline, or back online.
    ToggleOnline,
    /// The network between the client and the gateway is cut, or restored.
    TogglePartition,
    Reload,
    /// A push goes on the wire and the page goes away before its answer.
    PushThenReload,
    /// The app follows only its first list, or all of its lists again.
    Buckets { first_only: bool },
    /// The gateway is killed (SIGKILL), or restarted when it is down.
    KillOrRestart,
    /// The gateway is killed a few milliseconds into the next requests (two clients each write
    /// `key` and sync), then restarted.
    Crash { after_ms: u64, key: Key, writers: [usize; 2] },
    /// The reaper runs with no tombstone retention: older checkpoints expire.
    Reap,
    /// A read of everything the client shows.
    Read,
    /// An operator's bulk SQL in one transaction: `fill` new rows of user `owner` put in `list`
    /// (in both tables), then every row of the list moved to list `to` (another bucket) or, without
    /// one, deleted. A commit of many rows and buckets, read by clients in pages of two entries.
    SqlBulk { list: usize, to: Option<usize>, fill: u64, owner: usize },
    /// A migration while clients write: the table's key and one column change type (text and
    /// varchar in turn), a column is added with a default and dropped, and the table is registered
    /// again, which announces its rows anew.
    Migrate { table: &'static str },
    /// A round of sync work: a push if due, then a pull run if due.
    Sync,
}

/// One step: a client (or none, for the gateway's steps) and what happens.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub index: usize,
    pub client: usize,
    pub action: Action,
}

pub struct Plan {
    pub fault_percent: u64,
    pub steps: Vec<Step>,
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.table, self.name)
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step {}: c{} {:?}", self.index, self.client, self.action)
    }
}

/// The history's workload for `seed`.
pub fn plan(seed: u64) -> Plan {
    let mut rng = Prng::new(seed);
    let fault_percent = 10 + rng.below(20);
    let mut keys: Vec<Key> = Vec::new();
    let mut steps: Vec<Step> = Vec::new();
    let rounds = 30 + rng.below(20);
    let mut push = |client: usize, action: Action| {
        let index = steps.len();
        steps.push(Step { index, client, action });
    };
    for round in 0..rounds {
        let c = rng.below(PLANS.len() as u64) as usize;
        let lists = PLANS[c].1;
        let list = *rng.pick(lists);
        let choice = rng.below(100);
        let new_key = |rng: &mut Prng, prefix: &str| Key { table: TABLES[rng.below(2) as usize], name: format!("{prefix}{round}") };
        let existing = |rng: &mut Prng| (!keys.is_empty()).then(|| keys[rng.below(keys.len() as u64) as usize].clone());
        let action = match choice {
            0..=19 => {
                let key = new_key(&mut rng, "k");
                keys.push(key.clone());
                Some(Action::Insert { key, list, shared: rng.chance(30) })
            }
            20..=39 => existing(&mut rng).map(|key| {
                let column = *rng.pick(&["a", "b", "x"]);
                Action::Patch { key, column, latest_only: rng.chance(25) }
            }),
            40..=47 => existing(&mut rng).map(|key| Action::Move { key, list }),
            48..=52 => existing(&mut rng).map(|key| Action::Delete { key }),
            53..=57 => {
                let new = new_key(&mut rng, "k");
                let other = existing(&mut rng).unwrap_or_else(|| new.clone());
                keys.push(new.clone());
                Some(Action::Batch { new, list, other })
            }
            58..=60 => existing(&mut rng).map(|key| Action::Refused { key }),
            61..=62 => Some(Action::Poison { key: new_key(&mut rng, "poison"), list }),
            63..=65 => existing(&mut rng).map(|key| Action::Delayed { key, after_ms: 100 + rng.below(300) as i64 }),
            66..=68 => Some(Action::ToggleOnline),
            69 => Some(Action::TogglePartition),
            70..=72 => Some(Action::Reload),
            73..=74 => Some(Action::PushThenReload),
            75..=76 => Some(Action::Buckets { first_only: rng.chance(50) }),
            77 => Some(Action::KillOrRestart),
            78 => Some(Action::Reap),
            79 => {
                let key = new_key(&mut rng, "k");
                keys.push(key.clone());
                let writers = [rng.below(3) as usize, rng.below(3) as usize];
                Some(Action::Crash { after_ms: rng.below(15), key, writers })
            }
            80..=84 => Some(Action::Read),
            85..=86 => {
                let to = rng.chance(50).then(|| rng.below(3) as usize);
                Some(Action::SqlBulk { list: rng.below(3) as usize, to, fill: 10 + rng.below(40), owner: rng.below(2) as usize })
            }
            87 => Some(Action::Migrate { table: TABLES[rng.below(2) as usize] }),
            _ => {
                for _ in 0..1 + rng.below(3) {
                    push(rng.below(3) as usize, Action::Sync);
                }
                None
            }
        };
        if let Some(action) = action {
            push(c, action);
        }
        if rng.chance(40) {
            push(rng.below(3) as usize, Action::Sync);
        }
    }
    Plan { fault_percent, steps }
}

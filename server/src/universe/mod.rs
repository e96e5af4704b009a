//! Universe sync: copies the writes of selected tables from one Kizuna database (the source
//! universe) into another Kizuna deployment (the target), with the outbox rules of the Kouten seed.
//!
//! * The source outbox lives in the pack (`server/sql/009_universe.sql`): every write to a
//!   registered table appends its event in its own transaction.
//! * `kizuna-server universe-sync` ([`sync`]) delivers pending events to the target's
//!   `kizuna_push`, driving the engine's outbox policy (`kizuna_engine::universe`): a thin adapter
//!   over the source database ([`source`]) and the target's HTTP entry point ([`target`]).
//! * The target is an ordinary Kizuna deployment; its gateway counts the apply path ([`apply`]).
//! * `universe-status` and `universe-dead` ([`cli`]) are the operator's view.

pub mod apply;
pub mod cli;
pub mod source;
pub mod sync;
pub mod target;

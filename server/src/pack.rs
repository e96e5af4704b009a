//! The SQL pack: the server semantics, as versioned SQL files applied in lexical order.
//!
//! Every file is idempotent, so installing at each start (under an advisory lock, so two gateways
//! starting at once do not interleave) upgrades an installed database in place. The same files
//! can be applied by hand: `psql -f 001_core.sql -f 002_support.sql ...` in order.

/// (file name, contents), in the order they must be applied.
pub const FILES: &[(&str, &str)] = &[
    ("001_core.sql", include_str!("../sql/001_core.sql")),
    ("002_support.sql", include_str!("../sql/002_support.sql")),
    ("003_registry.sql", include_str!("../sql/003_registry.sql")),
    ("004_fence.sql", include_str!("../sql/004_fence.sql")),
    ("005_push.sql", include_str!("../sql/005_push.sql")),
    ("005_push_runs.sql", include_str!("../sql/005_push_runs.sql")),
    ("006_pull.sql", include_str!("../sql/006_pull.sql")),
    ("007_admin.sql", include_str!("../sql/007_admin.sql")),
    ("008_operator.sql", include_str!("../sql/008_operator.sql")),
    ("009_universe.sql", include_str!("../sql/009_universe.sql")),
];

/// The example synced table used by the demo and the browser tests (not part of the pack).
pub const EXAMPLE_TODOS: &str = include_str!("../sql/examples/todos.sql");

/// Session advisory lock key held while installing (distinct from the pack's fence lock).
const INSTALL_LOCK_KEY: i64 = 7_583_421_590_113_000;

/// Installs or upgrades the pack on the connected database.
pub async fn install(client: &tokio_postgres::Client) -> Result<(), tokio_postgres::Error> {
    client.execute("select pg_advisory_lock($1)", &[&INSTALL_LOCK_KEY]).await?;
    let mut result = Ok(());
    for (_, sql) in FILES {
        result = client.batch_execute(sql).await;
        if result.is_err() {
            break;
        }
    }
    let unlocked = client.execute("select pg_advisory_unlock($1)", &[&INSTALL_LOCK_KEY]).await;
    result?;
    unlocked.map(|_| ())
}

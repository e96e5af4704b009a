//! `kizuna-server`: serve the gateway; `kizuna-server status` prints the durable figures; the
//! `universe-*` commands deliver and inspect universe sync's source outbox.

use clap::Parser;
use kizuna_server::{app, universe};
use kizuna_server::config::{Cli, Command};

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        None => app::serve(cli.config).await,
        Some(Command::Status) => app::status(cli.config).await,
        Some(Command::UniverseSync(args)) => universe::cli::sync(args).await,
        Some(Command::UniverseStatus(args)) => universe::cli::status(args).await,
        Some(Command::UniverseDead(args)) => universe::cli::dead(args).await,
    };
    if let Err(message) = result {
        eprintln!("kizuna-server: {message}");
        std::process::exit(1);
    }
}

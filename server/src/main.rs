//! `kizuna-server`: serve the gateway, or `kizuna-server status` to print the durable figures.

use clap::Parser;
use kizuna_server::app;
use kizuna_server::config::{Cli, Command};

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        None => app::serve(cli.config).await,
        Some(Command::Status) => app::status(cli.config).await,
    };
    if let Err(message) = result {
        eprintln!("kizuna-server: {message}");
        std::process::exit(1);
    }
}

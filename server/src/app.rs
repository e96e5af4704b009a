//! Start-up, serving and shutdown, and the `status` subcommand.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::Config;
use crate::db;
use crate::jwt::JwtKey;
use crate::limits::{CallerLimits, StreamLimits};
use crate::metrics::{DurableFigures, Metrics};
use crate::routes::{metrics_router, router, AppState};
use crate::wake::Wake;

/// How long open requests get to finish after SIGINT/SIGTERM before the process exits anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Connects, installs the pack, applies --init-sql, starts LISTEN, then serves until a signal.
pub async fn serve(config: Config) -> Result<(), String> {
    warn_about_demo_settings(&config);
    let pg = db::parse_url(config.database_url()?)?;

    let setup = db::connect_with_retry(&pg, Duration::from_secs(config.connect_timeout)).await?;
    db::prepare(&setup, &config.init_sql).await?;
    drop(setup);

    let pool = db::pool(pg.clone(), config.pool_size)?;
    let metrics = Arc::new(Metrics::default());
    let wake = Wake::new();
    wake.start(pg, metrics.clone()).await?;
    if config.reap_interval > 0 {
        tokio::spawn(db::reap_forever(
            pool.clone(),
            Duration::from_secs(config.reap_interval),
        ));
    }

    let (stop, shutdown) = watch::channel(false);
    let state = AppState {
        pool,
        key: JwtKey::new(&config.jwt_secret),
        metrics,
        durable: Arc::new(DurableFigures::new(Duration::from_millis(config.metrics_cache_ms))),
        wake,
        body_limit: config.body_limit,
        limits: CallerLimits::new(config.caller_concurrency, config.pool_size),
        stream_limits: StreamLimits::new(config.wake_streams_per_caller, config.max_wake_streams),
        trust_forwarded_for: config.trust_forwarded_for,
        statement_timeout: Duration::from_millis(config.statement_timeout_ms),
        body_timeout: (config.body_timeout_ms > 0).then(|| Duration::from_millis(config.body_timeout_ms)),
        metrics_token: config.metrics_token.clone(),
        shutdown,
    };
    if let Some(address) = config.metrics_listen {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(|e| format!("could not listen on --metrics-listen {address}: {e}"))?;
        let only_metrics = metrics_router(state.clone());
        tokio::spawn(async move { axum::serve(listener, only_metrics).await });
    }
    let app = router(state, &config);

    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("could not listen on {}: {e}", config.listen))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    // The one line on stdout: scripts and tests wait for it.
    println!("kizuna-server listening on http://{address}");
    let _ = std::io::stdout().flush();

    let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        signal().await;
        eprintln!("kizuna-server: shutting down");
        let _ = stop.send(true); // ends the wake streams, which would otherwise hold shutdown open
    });
    let server = tokio::spawn(async move { server.await });
    // Serve until the graceful shutdown finishes, or give up on stragglers after the grace period.
    let finished = async {
        match server.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("server failed: {e}")),
            Err(e) => Err(format!("server task failed: {e}")),
        }
    };
    tokio::pin!(finished);
    tokio::select! {
        result = &mut finished => result,
        _ = async { signal().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
            eprintln!("kizuna-server: requests still open after {}s; exiting", SHUTDOWN_GRACE.as_secs());
            Ok(())
        }
    }
}

/// `kizuna-server status`: the durable figures as pretty JSON.
pub async fn status(config: Config) -> Result<(), String> {
    let pg = db::parse_url(config.database_url()?)?;
    let client = db::connect_with_retry(&pg, Duration::from_secs(config.connect_timeout)).await?;
    let figures = db::status(&client)
        .await
        .map_err(|e| format!("select kizuna.status() failed: {}", db::describe(&e)))?;
    println!(
        "{}",
        serde_json::to_string_pretty(&figures).map_err(|e| e.to_string())?
    );
    Ok(())
}

fn warn_about_demo_settings(config: &Config) {
    if config.uses_dev_secret() {
        eprintln!("kizuna-server: WARNING: using the built-in development JWT secret; anyone can mint tokens. Set KIZUNA_JWT_SECRET for anything but a local demo.");
    }
    if config.dev_tokens {
        eprintln!("kizuna-server: WARNING: --dev-tokens is on: POST /kizuna/v1/dev-token hands out a token for any user id. Demo only.");
    }
}

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return interrupt.await.unwrap_or(()),
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

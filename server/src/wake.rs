//! Wake-ups: one LISTEN connection on `kizuna_wake`, fanned out to every SSE client through a
//! broadcast channel. A wake carries only the horizon, never row data: it tells a client that
//! pulling is worthwhile, and the pull decides what the caller may see.

use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{stream, StreamExt};
use serde_json::Value;
use tokio::sync::broadcast;
use tokio_postgres::{AsyncMessage, NoTls};

pub const CHANNEL: &str = "kizuna_wake";

/// The horizon of the latest wake. Only the newest matters to a client, so lagging receivers skip
/// ahead instead of replaying every notification.
#[derive(Clone)]
pub struct Wake {
    sender: broadcast::Sender<i64>,
    latest: Arc<AtomicI64>,
}

impl Wake {
    pub fn new() -> Wake {
        let (sender, _) = broadcast::channel(64);
        Wake {
            sender,
            latest: Arc::new(AtomicI64::new(0)),
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<i64> {
        self.sender.subscribe()
    }

    pub fn latest(&self) -> i64 {
        self.latest.load(Relaxed)
    }

    fn publish(&self, horizon: i64) {
        self.latest.fetch_max(horizon, Relaxed);
        // No receivers is fine: nobody is listening right now.
        let _ = self.sender.send(horizon);
    }

    /// Opens the LISTEN connection and keeps it open: returns once the first LISTEN is in place
    /// (so that no commit after start-up is missed), then reconnects in the background whenever the
    /// connection drops, sending one wake after each reconnection for what the gap may have hidden.
    pub async fn start(
        &self,
        config: tokio_postgres::Config,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Result<(), String> {
        let first = listen(&config, self.clone(), metrics.clone())
            .await
            .map_err(|e| format!("LISTEN {CHANNEL} failed: {e}"))?;
        let wake = self.clone();
        tokio::spawn(async move {
            let mut connection = first;
            loop {
                let _ = connection.await;
                eprintln!("kizuna-server: the LISTEN connection closed; reconnecting");
                connection = loop {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    match listen(&config, wake.clone(), metrics.clone()).await {
                        Ok(c) => break c,
                        Err(e) => eprintln!("kizuna-server: LISTEN reconnect failed: {e}"),
                    }
                };
                wake.publish(wake.latest());
            }
        });
        Ok(())
    }
}

impl Default for Wake {
    fn default() -> Self {
        Wake::new()
    }
}

/// Connects, issues LISTEN, and returns the task that forwards notifications until the connection ends.
async fn listen(
    config: &tokio_postgres::Config,
    wake: Wake,
    metrics: Arc<crate::metrics::Metrics>,
) -> Result<tokio::task::JoinHandle<()>, tokio_postgres::Error> {
    let (client, mut connection) = config.connect(NoTls).await?;
    // The connection must be polled for LISTEN to complete, and from then on for notifications.
    let mut messages = stream::poll_fn(move |cx| connection.poll_message(cx));
    let forward = tokio::spawn(async move {
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) if n.channel() == CHANNEL => {
                    metrics.record_wake();
                    wake.publish(horizon_of(n.payload()).unwrap_or_else(|| wake.latest()));
                }
                Ok(_) => {}
                Err(e) => {
                    eprintln!("kizuna-server: LISTEN connection error: {e}");
                    break;
                }
            }
        }
    });
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    // The client must outlive the forwarding task, or the connection closes.
    Ok(tokio::spawn(async move {
        let _client = client;
        let _ = forward.await;
    }))
}

fn horizon_of(payload: &str) -> Option<i64> {
    serde_json::from_str::<Value>(payload)
        .ok()?
        .get("horizon")?
        .as_i64()
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_horizon_and_nothing_else() {
        assert_eq!(super::horizon_of(r#"{"horizon": 42}"#), Some(42));
        assert_eq!(super::horizon_of("42"), None);
        assert_eq!(super::horizon_of("not json"), None);
    }
}

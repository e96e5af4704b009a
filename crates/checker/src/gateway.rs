//! The real `kizuna-server` binary, started by the checker on one fixed port so that clients keep
//! their URL across kills and restarts.

use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// The signing secret of the checker's gateways.
pub const SECRET: &str = "kizuna-history-secret";

pub struct Gateway {
    bin: String,
    database_url: String,
    port: u16,
    child: Option<Child>,
    http: reqwest::Client,
}

impl Gateway {
    /// Starts the gateway and waits until it is healthy.
    pub async fn start(bin: &str, database_url: &str) -> Result<Gateway, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let mut gateway = Gateway {
            bin: bin.to_owned(),
            database_url: database_url.to_owned(),
            port,
            child: None,
            http: reqwest::Client::new(),
        };
        gateway.restart().await?;
        Ok(gateway)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn is_up(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL: whatever it was doing is cut off, as a crash would.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
            let _ = child.wait().await;
        }
    }

    /// SIGKILL after `ms`, whatever the gateway is doing then: in the middle of the next push or
    /// pull, usually. `is_up` stays true until `restart` or `kill` is called; the requests meanwhile
    /// fail as they would against a crashed server.
    pub fn kill_after(&mut self, ms: u64) {
        if let Some(pid) = self.child.as_ref().and_then(Child::id) {
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).stderr(Stdio::null()).status().await;
            });
        }
    }

    /// (Re)starts the process on the same port and waits for `/healthz`.
    pub async fn restart(&mut self) -> Result<(), String> {
        self.kill().await;
        let child = Command::new(&self.bin)
            .args(["--listen", &format!("127.0.0.1:{}", self.port), "--reap-interval", "0"])
            .args(["--caller-concurrency", "16", "--metrics-cache-ms", "0"])
            .env("DATABASE_URL", &self.database_url)
            .env("KIZUNA_JWT_SECRET", SECRET)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("could not start {}: {e}", self.bin))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let healthy = self.http.get(format!("{}/healthz", self.url())).send().await.is_ok_and(|r| r.status() == 200);
            if healthy {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("the gateway did not become healthy within 30 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Runs `kizuna.reap()` now with no tombstone retention, through the operator's RPC, so that
    /// every checkpoint older than the newest tombstone expires. The verdict ledger is kept, so
    /// every verdict keeps its commit number.
    pub async fn reap_tombstones(&self) -> Result<(), String> {
        let token = crate::transport::token("operator", "service_role");
        let response = self
            .http
            .post(format!("{}/rest/v1/rpc/kizuna_admin", self.url()))
            .bearer_auth(token)
            .json(&serde_json::json!({"request": {"action": "reap", "tombstone_retention_seconds": 0}}))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if response.status() != 200 {
            return Err(format!("reap answered {}", response.status()));
        }
        Ok(())
    }
}

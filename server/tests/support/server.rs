//! Starts the real `kizuna-server` binary on a free port against a test database, waits until it
//! is healthy, mints tokens for it, and stops it when dropped.

#![allow(dead_code)] // each test binary uses a different part of the harness

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

/// The secret the test servers sign with (never the development default).
pub const SECRET: &str = "gateway-test-secret";
/// The token `/metrics` wants from the test servers.
pub const METRICS_TOKEN: &str = "gateway-test-metrics-token";

const BIN: &str = env!("CARGO_BIN_EXE_kizuna-server");

pub struct TestServer {
    child: Child,
    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub url: String,
    pub http: reqwest::Client,
    stderr: Arc<Mutex<String>>,
}

impl TestServer {
    /// Starts the server with `--listen 127.0.0.1:0` (the OS picks the port, read back from the
    /// ready line), no reaper, the test secret, and `extra` flags.
    pub async fn start(database_url: &str, extra: &[&str]) -> TestServer {
        let mut command = Command::new(BIN);
        if !extra.contains(&"--metrics-cache-ms") {
            // Every scrape reads the durable figures, so tests see them move; the cache has its test.
            command.args(["--metrics-cache-ms", "0"]);
        }
        command
            .args(["--listen", "127.0.0.1:0", "--reap-interval", "0"])
            .args(["--metrics-token", METRICS_TOKEN])
            .args(extra)
            .env("DATABASE_URL", database_url)
            .env("KIZUNA_JWT_SECRET", SECRET)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (name, _) in std::env::vars() {
            if name.starts_with("KIZUNA_") && name != "KIZUNA_JWT_SECRET" {
                command.env_remove(name);
            }
        }
        let mut child = command.spawn().expect("spawn kizuna-server");

        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err_pipe = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err_pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });

        let (ready_tx, ready_rx) = mpsc::channel();
        let out = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = ready_tx.send(line);
            }
        });
        let line = match ready_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "kizuna-server never said it was listening; stderr:\n{}",
                    stderr.lock().unwrap()
                );
            }
        };
        let url = line
            .strip_prefix("kizuna-server listening on ")
            .unwrap_or_else(|| panic!("unexpected ready line {line:?}"))
            .to_owned();

        let server = TestServer {
            child,
            url,
            http: reqwest::Client::new(),
            stderr,
        };
        server.wait_healthy().await;
        server
    }

    async fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = self.http.get(self.path("/healthz")).send().await {
                if r.status() == 200 {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "/healthz never answered 200; stderr:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn path(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// What the server wrote on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// A valid token for `sub` (role authenticated, one hour).
    pub fn token(&self, sub: &str) -> String {
        self.token_with_role(sub, "authenticated")
    }

    /// A valid token for `sub` with `role`, one hour.
    pub fn token_with_role(&self, sub: &str, role: &str) -> String {
        sign(
            &json!({"alg": "HS256", "typ": "JWT"}),
            &json!({"sub": sub, "role": role, "exp": now() + 3600}),
            SECRET,
        )
    }

    /// The `/metrics` text, scraped with the metrics token.
    pub async fn metrics(&self) -> String {
        let response = self.http.get(self.path("/metrics")).bearer_auth(METRICS_TOKEN).send().await.unwrap();
        assert_eq!(response.status(), 200, "/metrics with the metrics token");
        response.text().await.unwrap()
    }

    /// GETs `path` from the server.
    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.http.get(self.path(path)).send().await.unwrap()
    }

    /// POSTs `{"request": request}` to `/rest/v1/rpc/{function}` with `token`; returns status and JSON body.
    pub async fn rpc(&self, function: &str, token: Option<&str>, request: &Value) -> (u16, Value) {
        self.post_raw(function, token, json!({ "request": request }).to_string())
            .await
    }

    /// POSTs a raw body to `/rest/v1/rpc/{function}`.
    pub async fn post_raw(
        &self,
        function: &str,
        token: Option<&str>,
        body: String,
    ) -> (u16, Value) {
        let mut request = self
            .http
            .post(self.path(&format!("/rest/v1/rpc/{function}")))
            .header("content-type", "application/json")
            .body(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("request");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        let json = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("status {status}: body is not JSON: {text:?}"));
        (status, json)
    }

    /// Sends SIGTERM and waits (up to 15 s) for a graceful exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "kizuna-server ignored SIGTERM; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `kizuna-server status` against `database_url`; returns (exit success, stdout, stderr).
pub fn status(database_url: &str) -> (bool, String, String) {
    run(&["status"], &[("DATABASE_URL", database_url)])
}

/// Runs `kizuna-server` with `args` and `env` to its end; returns (exit success, stdout, stderr).
pub fn run(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let output = Command::new(BIN).args(args).envs(env.iter().copied()).output().expect("run kizuna-server");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Signs any header and claims with HS256 under `secret`: the tool for forging bad tokens.
pub fn sign(header: &Value, claims: &Value, secret: &str) -> String {
    let input = format!(
        "{}.{}",
        B64.encode(header.to_string()),
        B64.encode(claims.to_string())
    );
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(input.as_bytes());
    format!("{input}.{}", B64.encode(mac.finalize().into_bytes()))
}

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

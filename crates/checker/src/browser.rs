//! Real clients in a browser: the npm package (pkg/) in headless Chromium pages, one browser
//! context (its own IndexedDB) per client, driven through `browser/driver.mjs` (playwright-core)
//! over its stdin and stdout. Such a client runs its own timers (push and pull loops, the wake
//! stream through its proxy) beside what the history asks of it, and reports every event it hears;
//! its record is built from those events and from reads of what its page shows.

use std::process::Stdio;
use std::sync::Arc;

use kizuna_engine::protocol::{Op, Reason, Row};
use kizuna_engine::{LocalWrite, OutboxEntry};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::Mutex;

use crate::client::describe_write;
use crate::proxy::Proxy;
use crate::record::{Outcome, Read, Record};
use crate::transport::token;

struct Driver {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    next_id: u64,
}

impl Driver {
    /// One command and its answer.
    async fn call(&mut self, cmd: &str, client: &str, args: Value) -> Result<Value, String> {
        self.next_id += 1;
        let mut message = json!({"id": self.next_id, "cmd": cmd, "client": client});
        if let (Some(m), Value::Object(args)) = (message.as_object_mut(), args) {
            m.extend(args);
        }
        let line = format!("{message}\n");
        self.stdin.write_all(line.as_bytes()).await.map_err(|e| format!("browser driver: {e}"))?;
        let answer = self
            .stdout
            .next_line()
            .await
            .map_err(|e| format!("browser driver: {e}"))?
            .ok_or("the browser driver exited (is Chromium at /usr/bin/chromium and tools/node_modules installed?)")?;
        serde_json::from_str(&answer).map_err(|e| format!("browser driver answered {answer:?}: {e}"))
    }
}

/// The browser process (through its driver), shared by the browser clients of every history.
pub struct Browser {
    driver: Arc<Mutex<Driver>>,
    opened: u64,
}

impl Browser {
    /// Starts Chromium through `browser/driver.mjs`, serving the package built in `pkg`.
    pub async fn launch(pkg: &str) -> Result<Browser, String> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/browser/driver.mjs");
        if !std::path::Path::new(pkg).join("kizunasync.js").exists() {
            return Err(format!("no built package in {pkg}: run scripts/package.sh first (make test does)"));
        }
        let mut child = Command::new("node")
            .arg(script)
            .arg(std::fs::canonicalize(pkg).map_err(|e| e.to_string())?)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("could not start node {script}: {e}"))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped")).lines();
        Ok(Browser { driver: Arc::new(Mutex::new(Driver { child, stdin, stdout, next_id: 0 })), opened: 0 })
    }

    /// A new client in a page of its own (a new browser context: an empty IndexedDB), reaching the
    /// gateway through `proxy`.
    pub async fn client(&mut self, name: String, user: String, buckets: Vec<String>, proxy: Proxy) -> Result<BrowserClient, String> {
        self.opened += 1;
        let id = format!("{name}-{}", self.opened);
        let params = json!({
            "name": format!("history-{id}"),
            "url": proxy.url(),
            "token": token(&user, "authenticated"),
            "buckets": buckets,
            // The native clients' settings (client.rs), as the browser adapter takes them.
            "options": {"pullIntervalMs": 200, "pullLimit": 2, "maxSlice": 8, "retryBaseMs": 20, "retryMaxMs": 200, "requestTimeoutMs": 10000},
        });
        let mut client = BrowserClient {
            rec: Record::new(name, user, buckets),
            proxy,
            online: true,
            driver: self.driver.clone(),
            id,
            previous_buckets: Vec::new(),
            page: 1,
        };
        client.call("open", json!({ "params": params })).await?;
        Ok(client)
    }

    /// Closes Chromium, or kills the driver when it does not end within 10 s.
    pub async fn quit(self) {
        let mut driver = self.driver.lock().await;
        let _ = driver.stdin.write_all(b"{\"id\":0,\"cmd\":\"quit\"}\n").await;
        if tokio::time::timeout(std::time::Duration::from_secs(10), driver.child.wait()).await.is_err() {
            let _ = driver.child.kill().await;
        }
    }
}

pub struct BrowserClient {
    pub rec: Record,
    pub proxy: Proxy,
    pub online: bool,
    driver: Arc<Mutex<Driver>>,
    id: String,
    /// The buckets the page before this one followed (see `Record::applied`).
    previous_buckets: Vec<String>,
    /// The number of the page now open (`gen` in the driver: the first page is 1, each reload
    /// opens the next).
    page: u64,
}

/// When a page heard an event or read: its page (`gen`) and how many events it had heard (`n`).
fn moment(v: &Value) -> Result<crate::record::At, String> {
    match (v["gen"].as_u64(), v["n"].as_u64()) {
        (Some(gen), Some(n)) => Ok((gen, n)),
        _ => Err(format!("no page and number in {v}")),
    }
}

/// A pending write as the page reports it (`PendingWrite`, camelCase) as the engine's entry.
fn entry(v: &Value) -> Result<OutboxEntry, String> {
    let text = |k: &str| v[k].as_str().map(str::to_owned).ok_or_else(|| format!("pending write without {k}: {v}"));
    let number = |k: &str| v[k].as_i64();
    Ok(OutboxEntry {
        seq: number("seq").ok_or("pending write without seq")?,
        id: text("id")?.parse().map_err(|e| format!("bad id: {e}"))?,
        table: text("table")?,
        pk: text("pk")?,
        op: serde_json::from_value::<Op>(v["op"].clone()).map_err(|e| e.to_string())?,
        columns: v["columns"].as_object().cloned(),
        hlc: text("hlc")?,
        read_seq: number("readSeq").unwrap_or(0),
        batch: v["batch"].as_str().and_then(|b| b.parse().ok()),
        apply_after: number("applyAfter"),
        latest_only: v["latestOnly"].as_bool().unwrap_or(false),
        created_at: number("createdAt").unwrap_or(0),
        sent: v["sent"].as_bool().unwrap_or(false),
        attempts: number("attempts").unwrap_or(0) as u32,
        permanent_failures: number("permanentFailures").unwrap_or(0) as u32,
        retry_at: number("retryAt"),
        last_error: v["lastError"].as_str().map(str::to_owned),
    })
}

impl BrowserClient {
    /// One command to this client's page; the events the answer carries go into the record first.
    async fn call(&mut self, cmd: &str, args: Value) -> Result<Value, String> {
        let answer = self.driver.lock().await.call(cmd, &self.id, args).await?;
        for event in answer["events"].as_array().into_iter().flatten() {
            self.hear(event)?;
        }
        for error in answer["pageErrors"].as_array().into_iter().flatten() {
            self.rec.violations.push(format!("{}: the page threw: {error}", self.rec.name));
        }
        for line in answer["console"].as_array().into_iter().flatten() {
            self.rec.note(format!("console: {}", line.as_str().unwrap_or_default()));
        }
        match answer.get("error") {
            Some(error) => Err(format!("{}: {cmd}: {error}", self.rec.name)),
            None => Ok(answer["ok"].clone()),
        }
    }

    /// A page tells again, at open, what a page that went away kept and may have told already
    /// (the client promises at least once): the outcome heard first stands.
    fn told_again(&mut self, id: uuid::Uuid, payload: &Value) -> bool {
        let again = matches!(self.rec.outcomes.get(&id), Some(o) if !matches!(o, Outcome::Coalesced));
        if again {
            self.rec.note(format!("told again: {payload}"));
        }
        again
    }

    fn hear(&mut self, event: &Value) -> Result<(), String> {
        let payload = &event["payload"];
        let name = event["name"].as_str().unwrap_or_default();
        let at = moment(event)?;
        // Heard by the page before this one, so decided under its buckets: a reload's answer carries
        // what that page heard between the reload's drain and its close (taken as heard under the
        // new buckets, a verdict it decided for a row of a bucket the new page dropped read as a
        // row that should have gone: seed 416 of a soak). Or heard as this page opened: possibly
        // what the page before it kept and did not tell.
        let by_page_before = at.0 < self.page;
        let kept_from = (event["early"] == true || by_page_before).then(|| self.previous_buckets.clone());
        match name {
            "applied" => {
                let id = payload["id"].as_str().and_then(|s| s.parse().ok()).ok_or("applied without id")?;
                if self.told_again(id, payload) {
                    return Ok(());
                }
                self.rec.note(format!("applied {} seq {}", payload["pk"].as_str().unwrap_or_default(), payload["seq"]));
                self.rec.applied(at, id, payload["seq"].as_i64(), payload["bucket"].as_str().map(str::to_owned), kept_from.as_deref());
            }
            "rejected" => {
                let mutation = entry(&payload["mutation"])?;
                if self.told_again(mutation.id, payload) {
                    return Ok(());
                }
                let reason: Reason = serde_json::from_value(payload["reason"].clone()).map_err(|e| e.to_string())?;
                let server_row: Option<Row> = payload["serverRow"].as_object().cloned();
                self.rec.note(format!("rejected {} {reason:?}", mutation.pk));
                self.rec.writes.insert(mutation.id, mutation.clone());
                self.rec.rejected(at, &mutation, reason, server_row, kept_from.as_deref());
            }
            "deadLetter" => {
                let dead = entry(&payload["entry"])?;
                if self.told_again(dead.id, payload) {
                    return Ok(());
                }
                self.rec.note(format!("dead letter {}", dead.pk));
                self.rec.outcomes.insert(dead.id, Outcome::DeadLettered);
            }
            "checkpoint" => {
                let horizon = payload["horizon"].as_i64().ok_or("checkpoint without horizon")?;
                self.rec.note(format!("committed horizon {horizon}"));
                self.rec.committed(at, horizon);
            }
            _ => {}
        }
        Ok(())
    }

    pub async fn write(&mut self, writes: Vec<LocalWrite>) -> Result<(), String> {
        self.rec.ops += writes.len() as u64;
        for w in &writes {
            self.rec.note(describe_write(w));
        }
        let writes: Vec<Value> = writes
            .iter()
            .map(|w| {
                let mut options = serde_json::Map::new();
                if let Some(at) = w.apply_after {
                    options.insert("applyAfter".into(), json!(at));
                }
                if let Some(latest) = w.latest_only {
                    options.insert("latestOnly".into(), json!(latest));
                }
                json!({"op": w.op, "table": w.table, "pk": w.pk, "columns": w.columns, "options": options})
            })
            .collect();
        let answer = self.call("write", json!({ "writes": writes })).await?;
        if !answer["error"].is_null() {
            self.rec.violations.push(format!("{}: a valid write was refused locally: {}", self.rec.name, answer["error"]));
        }
        let after: Vec<OutboxEntry> = answer["after"].as_array().into_iter().flatten().map(entry).collect::<Result<_, _>>()?;
        for e in &after {
            self.rec.writes.insert(e.id, e.clone());
        }
        // An entry the write took out of the outbox with no verdict heard: coalesced away.
        for id in answer["before"].as_array().into_iter().flatten().filter_map(|v| v.as_str()?.parse::<uuid::Uuid>().ok()) {
            if !after.iter().any(|e| e.id == id) && self.rec.writes.contains_key(&id) {
                self.rec.outcomes.entry(id).or_insert(Outcome::Coalesced);
            }
        }
        // Read-your-writes, and everything else a read promises, right after the write.
        self.read().await
    }

    /// The app's `sync()`; its failures (the network's faults) are the client's to handle.
    pub async fn sync(&mut self) -> Result<(), String> {
        let answer = self.call("sync", json!({})).await?;
        if !answer["error"].is_null() {
            self.rec.note(format!("sync failed: {}", answer["error"]));
        }
        self.read().await
    }

    pub async fn progress(&mut self) -> Result<(usize, i64), String> {
        let answer = self.call("progress", json!({})).await?;
        Ok((answer["open"].as_u64().unwrap_or(0) as usize, answer["horizon"].as_i64().unwrap_or(0)))
    }

    pub async fn read(&mut self) -> Result<(), String> {
        let written: std::collections::BTreeSet<(&str, &str)> = self.rec.writes.values().map(|e| (e.table.as_str(), e.pk.as_str())).collect();
        let written: Vec<Value> = written.into_iter().map(|(table, pk)| json!({"table": table, "pk": pk})).collect();
        let answer = self.call("read", json!({ "written": written })).await?;
        let at = moment(&answer)?;
        let rows = answer["rows"].as_object().cloned().unwrap_or_default().into_iter().collect();
        let pending = answer["pending"].as_array().into_iter().flatten().map(entry).collect::<Result<Vec<_>, _>>()?;
        for e in &pending {
            self.rec.writes.insert(e.id, e.clone());
        }
        let horizon = answer["horizon"].as_i64().unwrap_or(0);
        let checkpoint_buckets = match answer["buckets"].as_array() {
            Some(list) => list.iter().filter_map(|b| b.as_str().map(str::to_owned)).collect(),
            None => self.rec.buckets.clone(),
        };
        self.rec.reads.push(Read { at, horizon, checkpoint_buckets, buckets: self.rec.buckets.clone(), rows, pending });
        Ok(())
    }

    pub async fn reload(&mut self, buckets: Option<Vec<String>>) -> Result<(), String> {
        self.rec.note(format!("reload, buckets {:?}", buckets.as_ref().unwrap_or(&self.rec.buckets)));
        // What the page heard before it goes is heard under the buckets it followed.
        self.drain().await?;
        self.previous_buckets = self.rec.buckets.clone();
        if let Some(b) = &buckets {
            self.rec.buckets = b.clone();
        }
        self.page += 1;
        self.call("reload", json!({ "buckets": buckets })).await?;
        Ok(())
    }

    pub async fn push_then_reload(&mut self) -> Result<(), String> {
        self.rec.note("reload with a push on the wire".into());
        self.previous_buckets = self.rec.buckets.clone();
        self.page += 1;
        self.call("pushThenReload", json!({})).await?;
        Ok(())
    }

    pub async fn set_online(&mut self, online: bool) -> Result<(), String> {
        if online != self.online {
            self.call("offline", json!({ "on": !online })).await?;
            self.online = online;
        }
        Ok(())
    }

    /// Collects the events heard since the last command.
    pub async fn drain(&mut self) -> Result<(), String> {
        self.call("progress", json!({})).await.map(|_| ())
    }

    pub async fn close(mut self) -> Result<(), String> {
        self.call("close", json!({})).await.map(|_| ())
    }
}

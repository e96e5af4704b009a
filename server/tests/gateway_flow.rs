//! The happy path through the real binary: push then pull over HTTP, replay, the wake stream after
//! a committed push, metrics moving, CORS pre-flights, static files, dev tokens, the `status`
//! subcommand and a graceful shutdown with a wake stream open. One server process for the file.

mod support;

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use support::db::TestDb;
use support::server::{status, TestServer};

const ALICE: &str = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa";
const BOB: &str = "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb";
const ROW: &str = "0f0f0f0f-0f0f-4f0f-8f0f-0f0f0f0f0f0f";

/// The SQL engineer's example table, applied with --init-sql.
fn example_sql() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sql/examples/todos.sql")
}

fn push_request() -> Value {
    json!({
        "protocol": 1,
        "client_id": "cccccccc-cccc-4ccc-8ccc-cccccccccccc",
        "mutations": [{
            "id": "dddddddd-dddd-4ddd-8ddd-dddddddddddd", "client_seq": 1,
            "table": "todos", "pk": ROW, "op": "upsert",
            "columns": {"id": ROW, "owner": ALICE, "title": "through the gateway", "done": false},
            "read_seq": 0
        }]
    })
}

fn pull_request(cursor: Value) -> Value {
    json!({"protocol": 1, "client_id": "cccccccc-cccc-4ccc-8ccc-cccccccccccc", "cursor": cursor, "buckets": [format!("user:{ALICE}")], "limit": 100})
}

/// `kizuna_admin` is service_role's: an ordinary user is refused (403, nothing reaped); the
/// operator reaps now, and a bad argument is a coded error.
async fn only_the_operator_may_reap(server: &TestServer) {
    let reap = json!({"action": "reap", "tombstone_retention_seconds": 0});
    let (code, body) = server.rpc("kizuna_admin", Some(&server.token(ALICE)), &reap).await;
    assert_eq!(code, 403, "{body}");
    assert_eq!(body["code"], "42501");

    let operator = server.token_with_role(ALICE, "service_role");
    let (code, body) = server.rpc("kizuna_admin", Some(&operator), &reap).await;
    assert_eq!(code, 200, "{body}");
    assert!(body["low_watermark"].is_i64(), "{body}");
    let (code, body) = server.rpc("kizuna_admin", Some(&operator), &json!({"action": "status"})).await;
    assert_eq!(code, 200, "{body}");
    assert!(body["horizon"].is_i64(), "{body}");
    let (code, body) = server.rpc("kizuna_admin", Some(&operator), &json!({"action": "reap", "tombstone_retention_seconds": -1})).await;
    assert_eq!((code, body["code"].as_str()), (400, Some("KZP01")), "{body}");
    let (code, body) = server.rpc("kizuna_admin", Some(&operator), &json!({"action": "drop everything"})).await;
    assert_eq!((code, body["code"].as_str()), (400, Some("KZP01")), "{body}");
}

async fn runs_as_the_caller(server: &TestServer) {
    let bob = server.token(BOB);
    let bob_client = "eeeeeeee-eeee-4eee-8eee-eeeeeeeeeeee";
    let pull = json!({"protocol": 1, "client_id": bob_client, "cursor": null, "buckets": [format!("user:{ALICE}"), format!("user:{BOB}")], "limit": 100});
    let (status_code, page) = server.rpc("kizuna_pull", Some(&bob), &pull).await;
    assert_eq!(status_code, 200, "{page}");
    assert_eq!(
        page["entries"],
        json!([]),
        "Bob must not see Alice's row: {page}"
    );

    let overwrite = json!({"protocol": 1, "client_id": bob_client, "mutations": [{
        "id": "ffffffff-ffff-4fff-8fff-ffffffffffff", "client_seq": 1, "table": "todos", "pk": ROW,
        "op": "patch", "columns": {"title": "Bob was here"}, "read_seq": 0}]});
    let (status_code, answer) = server.rpc("kizuna_push", Some(&bob), &overwrite).await;
    assert_eq!(status_code, 200, "{answer}");
    assert_eq!(answer["verdicts"][0]["status"], "REJECTED", "{answer}");
    assert_eq!(
        answer["verdicts"][0]["server_row"],
        Value::Null,
        "no row for a caller who may not see it: {answer}"
    );
}

/// A folder with a demo page and a fake wasm-pack output, for the static routes.
fn static_folders() -> (PathBuf, PathBuf) {
    let root = std::env::temp_dir().join(format!("kizuna-gateway-flow-{}", std::process::id()));
    let (www, pkg) = (root.join("www"), root.join("pkg"));
    std::fs::create_dir_all(&www).unwrap();
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(
        www.join("index.html"),
        "<!doctype html><title>kizuna demo</title>",
    )
    .unwrap();
    std::fs::write(pkg.join("kizunasync_bg.wasm"), b"\0asm\x01\0\0\0").unwrap();
    (www, pkg)
}

/// Reads one counter or gauge from the /metrics text (0 when absent).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn push_pull_wake_metrics_cors_static_status_through_the_real_binary() {
    let db = TestDb::new().await;
    let (www, pkg) = static_folders();
    let example = example_sql();
    let (www_s, pkg_s, example_s) = (
        www.display().to_string(),
        pkg.display().to_string(),
        example.display().to_string(),
    );
    // The example table comes in through --init-sql, as in the demo.
    let args = [
        "--www",
        &www_s,
        "--pkg",
        &pkg_s,
        "--dev-tokens",
        "--init-sql",
        &example_s,
        "--cross-origin-isolated",
    ];
    let mut server = TestServer::start(db.url(), &args).await;
    let token = server.token(ALICE);

    answers_preflights(&server).await;
    serves_static_files(&server).await;

    // Open a wake stream before the push: EventSource style, token in the query.
    let mut wake = server.http.get(server.path("/kizuna/v1/wake")).bearer_auth(&token).send().await.unwrap();
    assert_eq!(wake.status(), 200);
    assert_eq!(wake.headers()["content-type"], "text/event-stream");

    let metrics_before = server.metrics().await;

    // Push through HTTP, with an apikey header as Supabase clients send it.
    let response = server
        .http
        .post(server.path("/rest/v1/rpc/kizuna_push"))
        .bearer_auth(&token)
        .header("apikey", "anything")
        .json(&json!({"request": push_request()}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let pushed: Value = response.json().await.unwrap();
    let verdict = &pushed["verdicts"][0];
    assert_eq!(verdict["status"], "APPLIED", "{pushed}");
    assert_eq!(verdict["replayed"], false, "{pushed}");
    let seq = verdict["seq"]
        .as_i64()
        .expect("an applied verdict has a seq");

    // The committed push wakes the stream, with the horizon and nothing else.
    let event = tokio::time::timeout(Duration::from_secs(10), async {
        let mut text = String::new();
        while !text.contains("event: wake")
            || !text[text.find("event: wake").unwrap()..].contains("\n\n")
        {
            let chunk = wake.chunk().await.unwrap().expect("the wake stream ended");
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        text
    })
    .await
    .expect("no wake event within 10 s of a committed push");
    let data = event[event.find("event: wake").unwrap()..]
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap();
    let data: Value = serde_json::from_str(data).unwrap();
    assert!(data["horizon"].as_i64().unwrap() >= seq, "{data}");
    assert_eq!(
        data.as_object().unwrap().len(),
        1,
        "a wake carries only the horizon: {data}"
    );

    // Pull from the beginning: the row comes back, and the run closes.
    let (status_code, page) = server
        .rpc("kizuna_pull", Some(&token), &pull_request(Value::Null))
        .await;
    assert_eq!(status_code, 200, "{page}");
    assert_eq!(page["done"], true, "{page}");
    assert!(page["cursor"].is_string(), "{page}");
    let entry = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["pk"] == ROW)
        .unwrap_or_else(|| panic!("row not pulled: {page}"));
    assert_eq!(entry["row"]["title"], "through the gateway", "{page}");
    assert_eq!(entry["seq"], seq, "{page}");

    // The same push again is a replay with no second effect.
    let (_, replay) = server
        .rpc("kizuna_push", Some(&token), &push_request())
        .await;
    assert_eq!(replay["verdicts"][0]["replayed"], true, "{replay}");
    assert_eq!(replay["verdicts"][0]["seq"], seq, "{replay}");

    // Each request runs as its caller: Bob neither sees nor overwrites Alice's row.
    runs_as_the_caller(&server).await;
    only_the_operator_may_reap(&server).await;

    // The counters moved, and the durable figures are there.
    let metrics = server.metrics().await;
    for (name, by) in [
        ("kizuna_process_applied_total", 1.0),
        ("kizuna_process_replayed_total", 1.0),
        ("kizuna_process_push_requests_total", 2.0),
        ("kizuna_process_pull_pages_total", 1.0),
        ("kizuna_process_wakes_total", 1.0),
    ] {
        assert!(
            metric(&metrics, name) - metric(&metrics_before, name) >= by,
            "{name} did not move by {by}:\n{metrics}"
        );
        assert!(
            metrics.contains(&format!("# TYPE {name} counter")),
            "{name} has no TYPE line"
        );
    }
    assert!(metric(&metrics, "kizuna_process_last_ok_timestamp_seconds") > 0.0);
    assert_eq!(metric(&metrics, "kizuna_up"), 1.0, "{metrics}");
    assert_eq!(
        metric(&metrics, "kizuna_process_wake_clients"),
        1.0,
        "{metrics}"
    );
    assert!(
        metrics.contains("kizuna_process_rejected_total{reason=\"RLS_DENIED\"} 1"),
        "{metrics}"
    );
    for durable in [
        "kizuna_ledger_size",
        "kizuna_horizon",
        "kizuna_applied_total",
    ] {
        assert!(
            metric(&metrics, durable) >= 1.0,
            "{durable} missing or zero:\n{metrics}"
        );
    }

    // Dev tokens: only with --dev-tokens; the token they mint is accepted.
    let minted: Value = server
        .http
        .post(server.path("/kizuna/v1/dev-token"))
        .json(&json!({"sub": ALICE}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(minted["expires_in"], 3600);
    let (status_code, _) = server
        .rpc(
            "kizuna_pull",
            minted["token"].as_str(),
            &pull_request(Value::Null),
        )
        .await;
    assert_eq!(status_code, 200);
    let refused = server
        .http
        .post(server.path("/kizuna/v1/dev-token"))
        .json(&json!({"sub": ALICE, "role": "postgres"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);

    // `kizuna-server status` prints the durable figures as JSON.
    let (ok, stdout, stderr) = status(db.url());
    assert!(ok, "status failed: {stderr}");
    let figures: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|_| panic!("status did not print JSON: {stdout}"));
    assert!(figures["ledger_size"].as_i64().unwrap() >= 1, "{figures}");

    // One mutation more than the example table's max_batch_size (500): KZP02, as a 400.
    let wide = {
        let mut request = push_request();
        let one = request["mutations"][0].clone();
        request["mutations"] = json!((0..501)
            .map(|i| {
                let mut m = one.clone();
                m["id"] = json!(uuid::Uuid::new_v4().to_string());
                m["client_seq"] = json!(1000 + i);
                m
            })
            .collect::<Vec<_>>());
        request
    };
    let (code, body) = server.rpc("kizuna_push", Some(&token), &wide).await;
    assert_eq!((code, body["code"].as_str()), (400, Some("KZP02")), "{body}");

    // The operator prunes the whole ledger (as retention would, later).
    let operator = server.token_with_role(ALICE, "service_role");
    let (code, reaped) = server
        .rpc("kizuna_admin", Some(&operator), &json!({"action": "reap", "ledger_retention_seconds": 0}))
        .await;
    assert_eq!(code, 200, "{reaped}");
    assert!(reaped["ledger_pruned"].as_i64().unwrap() >= 1, "{reaped}");

    // SIGTERM ends the open wake stream and the process exits cleanly.
    let exit = server.terminate();
    assert!(
        exit.success(),
        "exit {exit:?}; stderr:\n{}",
        server.stderr()
    );

    // After the restart the pruned push is answered SKIPPED, never applied a second time.
    let server = TestServer::start(db.url(), &args).await;
    let (code, again) = server.rpc("kizuna_push", Some(&server.token(ALICE)), &push_request()).await;
    assert_eq!(code, 200, "{again}");
    assert_eq!(again["verdicts"][0]["status"], "SKIPPED", "{again}");
    assert_eq!(db.one::<i64>(&format!("select count(*) from public.todos where id = '{ROW}'")).await, 1);

    // The new process counts from zero; the durable figures carried over the restart.
    let (code, _) = server.rpc("kizuna_pull", Some("not.a.token"), &pull_request(Value::Null)).await;
    assert_eq!(code, 401);
    let metrics = server.metrics().await;
    for (name, want) in [
        ("kizuna_process_skipped_total", 1.0),
        ("kizuna_process_applied_total", 0.0),
        ("kizuna_process_request_errors_total{code=\"KZA01\"}", 1.0),
    ] {
        assert_eq!(metric(&metrics, name), want, "{name}:\n{metrics}");
    }
    assert!(metric(&metrics, "kizuna_process_last_error_timestamp_seconds") > 0.0, "{metrics}");
    for durable in ["kizuna_skipped_total", "kizuna_ledger_pruned_total", "kizuna_applied_total"] {
        assert!(metric(&metrics, durable) >= 1.0, "{durable} missing or zero:\n{metrics}");
    }
    for gauge in ["kizuna_low_watermark", "kizuna_tombstones", "kizuna_ledger_size"] {
        assert!(metrics.contains(&format!("\n{gauge} ")), "{gauge} missing:\n{metrics}");
    }
    let _ = std::fs::remove_dir_all(www.parent().unwrap());
}

async fn answers_preflights(server: &TestServer) {
    for path in [
        "/rest/v1/rpc/kizuna_push",
        "/rest/v1/rpc/kizuna_pull",
        "/kizuna/v1/wake",
        "/metrics",
    ] {
        let response = server
            .http
            .request(reqwest::Method::OPTIONS, server.path(path))
            .header("origin", "http://localhost:5173")
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization,apikey,content-type,x-client-info",
            )
            .send()
            .await
            .unwrap();
        assert!(
            response.status().is_success(),
            "{path}: {}",
            response.status()
        );
        let headers = response.headers();
        assert_eq!(headers["access-control-allow-origin"], "*", "{path}");
        let allowed = headers["access-control-allow-headers"]
            .to_str()
            .unwrap()
            .to_owned();
        for h in ["authorization", "apikey", "content-type", "x-client-info"] {
            assert!(allowed.contains(h), "{path}: {h} not in {allowed}");
        }
        assert!(
            headers["access-control-allow-methods"]
                .to_str()
                .unwrap()
                .contains("POST"),
            "{path}"
        );
    }
}

async fn serves_static_files(server: &TestServer) {
    let index = server.get("/").await;
    assert_eq!(index.status(), 200);
    // --cross-origin-isolated: the page gets the headers that give its clock 5 µs steps (make bench).
    assert_eq!(index.headers()["cross-origin-opener-policy"], "same-origin");
    assert_eq!(index.headers()["cross-origin-embedder-policy"], "require-corp");
    assert!(index.text().await.unwrap().contains("kizuna demo"));
    let wasm = server.get("/pkg/kizunasync_bg.wasm").await;
    assert_eq!(wasm.status(), 200);
    assert_eq!(wasm.headers()["content-type"], "application/wasm");
    let missing = server.get("/pkg/nothing.js").await;
    assert_eq!(missing.status(), 404);
}

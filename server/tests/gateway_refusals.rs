//! Every request the gateway must refuse gets a clear coded error and writes nothing: missing and
//! forged tokens (401 KZA01), bad JSON (400 KZG02), wrong types (400 KZP01), oversized bodies (413
//! KZG01). One server process for the whole file.

mod support;

use serde_json::{json, Value};
use support::db::TestDb;
use support::server::{now, sign, TestServer, SECRET};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const USER: &str = "11111111-1111-4111-8111-111111111111";
const BODY_LIMIT: usize = 8 * 1024;

fn push_request(id: &str, seq: i64) -> Value {
    json!({
        "protocol": 1,
        "client_id": "22222222-2222-4222-8222-222222222222",
        "mutations": [{
            "id": id, "client_seq": seq, "table": "todos", "pk": id, "op": "upsert",
            "columns": {"id": id, "owner": USER, "title": "refusals", "done": false},
            "read_seq": 0
        }]
    })
}

/// What a refused request must leave unchanged: the verdict ledger, the client registry, the global
/// horizon and the rows.
async fn footprint(db: &TestDb) -> (Value, i64) {
    let client = db.client();
    let status: Value = client
        .query_one("select kizuna.status()::jsonb", &[])
        .await
        .unwrap()
        .get(0);
    let figures = json!({"ledger_size": status["ledger_size"], "clients": status["clients"], "horizon": status["horizon"]});
    let rows: i64 = client
        .query_one("select count(*) from public.todos", &[])
        .await
        .unwrap()
        .get(0);
    (figures, rows)
}

fn assert_refused(what: &str, (status, body): (u16, Value), want_status: u16, want_code: &str) {
    assert_eq!(status, want_status, "{what}: {body}");
    assert_eq!(body["code"], want_code, "{what}: {body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: no message in {body}"
    );
}

#[tokio::test]
async fn refused_requests_get_coded_errors_and_write_nothing() {
    let db = TestDb::with_todos().await;
    let limit = BODY_LIMIT.to_string();
    let server = TestServer::start(db.url(), &["--body-limit", &limit]).await;
    let before = footprint(&db).await;

    refuses_bad_tokens(&server).await;
    refuses_bad_bodies(&server).await;
    refuses_oversized_bodies(&server).await;

    refuses_unknown_endpoints(&server).await;

    assert_eq!(
        footprint(&db).await,
        before,
        "a refused request wrote something"
    );

    // The check above is not vacuous: the same request with a good token does write.
    let id = "33333333-3333-4333-8333-333333333333";
    let (status, body) = server
        .rpc(
            "kizuna_push",
            Some(&server.token(USER)),
            &push_request(id, 1),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["verdicts"][0]["status"], "APPLIED", "{body}");
    assert_ne!(footprint(&db).await, before);
}

async fn refuses_bad_tokens(server: &TestServer) {
    let hs256 = json!({"alg": "HS256", "typ": "JWT"});
    let good = json!({"sub": USER, "role": "authenticated", "exp": now() + 600});
    let unsigned = |header: &Value, claims: &Value| {
        let token = sign(header, claims, SECRET);
        format!("{}.", token.rsplit_once('.').unwrap().0)
    };
    let forged: Vec<(&str, String)> = vec![
        ("bad signature", sign(&hs256, &good, "not-the-secret")),
        (
            "alg none, unsigned",
            unsigned(&json!({"alg": "none", "typ": "JWT"}), &good),
        ),
        (
            "alg none, signed anyway",
            sign(&json!({"alg": "none"}), &good, SECRET),
        ),
        ("alg HS512", sign(&json!({"alg": "HS512"}), &good, SECRET)),
        (
            "expired",
            sign(
                &hs256,
                &json!({"sub": USER, "role": "authenticated", "exp": now() - 10}),
                SECRET,
            ),
        ),
        (
            "no exp",
            sign(
                &hs256,
                &json!({"sub": USER, "role": "authenticated"}),
                SECRET,
            ),
        ),
        (
            "unknown role",
            sign(
                &hs256,
                &json!({"sub": USER, "role": "postgres", "exp": now() + 600}),
                SECRET,
            ),
        ),
        (
            "role missing",
            sign(&hs256, &json!({"sub": USER, "exp": now() + 600}), SECRET),
        ),
        (
            "authenticated without sub",
            sign(
                &hs256,
                &json!({"role": "authenticated", "exp": now() + 600}),
                SECRET,
            ),
        ),
        ("not a JWT", "garbage".to_owned()),
        ("payload swapped", {
            let token = sign(&hs256, &good, SECRET);
            let parts: Vec<&str> = token.split('.').collect();
            let other = sign(
                &hs256,
                &json!({"sub": USER, "role": "service_role", "exp": now() + 600}),
                SECRET,
            );
            format!(
                "{}.{}.{}",
                parts[0],
                other.split('.').nth(1).unwrap(),
                parts[2]
            )
        }),
    ];
    let request = push_request("44444444-4444-4444-8444-444444444444", 1);

    assert_refused(
        "push without a token",
        server.rpc("kizuna_push", None, &request).await,
        401,
        "KZA01",
    );
    let pull =
        json!({"protocol": 1, "client_id": USER, "cursor": null, "buckets": [], "limit": 10});
    assert_refused(
        "pull without a token",
        server.rpc("kizuna_pull", None, &pull).await,
        401,
        "KZA01",
    );
    for (what, token) in &forged {
        assert_refused(
            what,
            server.rpc("kizuna_push", Some(token), &request).await,
            401,
            "KZA01",
        );
        assert_refused(
            what,
            server.rpc("kizuna_pull", Some(token), &pull).await,
            401,
            "KZA01",
        );
    }

    // A scheme other than Bearer is no token at all.
    let response = server
        .http
        .post(server.path("/rest/v1/rpc/kizuna_push"))
        .header("authorization", format!("Basic {}", server.token(USER)))
        .json(&json!({"request": request}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);

    // The wake stream checks its token the same way, from the header only: a token in the URL,
    // even a good one, is refused (URLs end up in logs).
    for url in [
        server.path("/kizuna/v1/wake"),
        server.path(&format!("/kizuna/v1/wake?access_token={}", forged[0].1)),
        server.path(&format!("/kizuna/v1/wake?access_token={}", server.token(USER))),
    ] {
        let response = server.http.get(&url).send().await.unwrap();
        assert_eq!(response.status(), 401, "{url}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["code"], "KZA01");
    }
}

async fn refuses_bad_bodies(server: &TestServer) {
    let token = server.token(USER);
    let token = Some(token.as_str());
    let id = "55555555-5555-4555-8555-555555555555";

    for (what, body) in [
        ("truncated JSON", "{\"request\": {".to_owned()),
        ("not JSON", "request=1".to_owned()),
        ("empty body", String::new()),
        ("an array", "[1, 2]".to_owned()),
        ("no request field", r#"{"mutations": []}"#.to_owned()),
    ] {
        assert_refused(
            what,
            server.post_raw("kizuna_push", token, body.clone()).await,
            400,
            "KZG02",
        );
        assert_refused(
            what,
            server.post_raw("kizuna_pull", token, body).await,
            400,
            "KZG02",
        );
    }

    let mut wrong_seq = push_request(id, 1);
    wrong_seq["mutations"][0]["client_seq"] = json!("one");
    let mut wrong_op = push_request(id, 1);
    wrong_op["mutations"][0]["op"] = json!("merge");
    let mut no_client = push_request(id, 1);
    no_client.as_object_mut().unwrap().remove("client_id");
    let mut not_a_list = push_request(id, 1);
    not_a_list["mutations"] = json!({"0": 1});
    for (what, request, field) in [
        ("client_seq as text", wrong_seq, "client_seq"),
        ("unknown op", wrong_op, "op"),
        ("missing client_id", no_client, "client_id"),
        ("mutations not a list", not_a_list, "mutations"),
        ("request not an object", json!("push"), "request"),
    ] {
        let (status, body) = server.rpc("kizuna_push", token, &request).await;
        assert_refused(what, (status, body.clone()), 400, "KZP01");
        assert!(
            body["message"].as_str().unwrap().contains(field),
            "{what}: the message should name {field}: {body}"
        );
    }
    let pull = json!({"protocol": 1, "client_id": USER, "cursor": 7, "buckets": [], "limit": -1});
    let (status, body) = server.rpc("kizuna_pull", token, &pull).await;
    assert_refused("pull of the wrong shape", (status, body), 400, "KZP01");

    // Well-formed but refused by the pack itself: its SQLSTATE becomes the code, with status 400.
    let mut future = push_request(id, 1);
    future["protocol"] = json!(99);
    assert_refused(
        "protocol 99",
        server.rpc("kizuna_push", token, &future).await,
        400,
        "KZP03",
    );
}

async fn refuses_oversized_bodies(server: &TestServer) {
    let token = server.token(USER);
    let mut big = push_request("66666666-6666-4666-8666-666666666666", 1);
    big["mutations"][0]["columns"]["title"] = json!("x".repeat(BODY_LIMIT));
    assert_refused(
        "oversized body",
        server.rpc("kizuna_push", Some(&token), &big).await,
        413,
        "KZG01",
    );

    // Without a Content-Length (chunked), the limit holds while reading.
    let body = json!({ "request": big }).to_string();
    let address = server.url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let mut request = format!(
        "POST /rest/v1/rpc/kizuna_push HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    for chunk in body.as_bytes().chunks(1000) {
        request.push_str(&format!(
            "{:x}\r\n{}\r\n",
            chunk.len(),
            std::str::from_utf8(chunk).unwrap()
        ));
    }
    request.push_str("0\r\n\r\n");
    // The server may answer and close before reading everything; a write error is fine then.
    let _ = stream.write_all(request.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 413"),
        "chunked oversized body: {answer}"
    );
    assert!(answer.contains("KZG01"), "chunked oversized body: {answer}");
}

async fn refuses_unknown_endpoints(server: &TestServer) {
    let wrong_method = server.get("/rest/v1/rpc/kizuna_push").await;
    assert_eq!(wrong_method.status(), 405);
    assert_eq!(wrong_method.json::<Value>().await.unwrap()["code"], "KZG04");
    let unknown = server
        .http
        .post(server.path("/rest/v1/rpc/drop_everything"))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    assert_eq!(unknown.json::<Value>().await.unwrap()["code"], "KZG04");
}

#[tokio::test]
async fn a_constraint_checked_at_commit_refuses_in_the_packs_words_and_shows_no_other_values() {
    let db = TestDb::with_todos().await;
    // A foreign key checked at commit (as the demo's board has): it fails the whole request at
    // commit, where PostgreSQL's text names the table it refers to and the key's value.
    db.exec(
        "create table public.todo_lists (id text primary key);
         grant select, references on public.todo_lists to authenticated;
         alter table public.todos add column list text
           references public.todo_lists (id) deferrable initially deferred;",
    )
    .await;
    let server = TestServer::start(db.url(), &[]).await;
    let before = footprint(&db).await;
    let id = "66666666-6666-4666-8666-666666666666";
    let mut request = push_request(id, 1);
    request["mutations"][0]["columns"]["list"] = json!("secret-list-name");
    let (status, body) = server.rpc("kizuna_push", Some(&server.token(USER)), &request).await;
    assert_refused("a deferred foreign key", (status, body.clone()), 409, "23503");
    assert_eq!(
        body["message"], "a row it refers to does not exist, or others refer to it (todos_list_fkey)",
        "the pack's sentence for the same refusal of one mutation: {body}"
    );
    assert!(body.get("details").map_or(true, Value::is_null), "no detail with the key's value: {body}");
    assert!(!body.to_string().contains("todo_lists"), "no other table's name: {body}");
    assert_eq!(footprint(&db).await, before, "the refused request wrote nothing");
}

/// An empty JWT secret is refused at start, by the gateway and by universe sync: HMAC takes an
/// empty key, so anyone could have signed a service_role token with it (what
/// `KIZUNA_JWT_SECRET=${JWT_SECRET}` gives when the variable is unset).
#[test]
fn an_empty_jwt_secret_is_refused_at_start() {
    let (started, _, stderr) = support::server::run(&[], &[("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none"), ("KIZUNA_JWT_SECRET", "")]);
    assert!(!started && stderr.contains("the JWT secret is empty"), "{stderr}");
    let (started, _, stderr) = support::server::run(
        &["universe-sync", "--source", "postgres://nobody@127.0.0.1:1/none", "--target", "http://127.0.0.1:1", "--once"],
        &[("KIZUNA_TARGET_JWT_SECRET", "")],
    );
    assert!(!started && stderr.contains("the JWT secret is empty"), "{stderr}");
}

//! Hostile callers and careless apps against the real gateway and PostgreSQL (issue 9): no value is
//! altered in transit, one bad write is that write's refusal and never stalls the others, what the
//! contract forbids is refused with a code and changes nothing, over-limit bodies get their 413, a
//! stranger's pull costs a bounded amount and reveals nothing, `/metrics` is protected and cheap,
//! errors look like PostgREST's, and random hostile bodies never get a 5xx.

mod support;

use serde_json::{json, Value};
use support::db::{mutation, push_request, Caller, TestDb};
use support::server::{TestServer, METRICS_TOKEN};

const A: &str = "a0000000-0000-4000-8000-00000000000a";
const B: &str = "b0000000-0000-4000-8000-00000000000b";
const CLIENT_A: &str = "c0000000-0000-4000-8000-0000000000a1";
const CLIENT_B: &str = "c0000000-0000-4000-8000-0000000000b1";

/// The pack's state a refused request must leave as it was: ledger, clients, horizon and rows.
async fn footprint(db: &TestDb) -> Value {
    db.one::<Value>(
        "select jsonb_build_object(
           'ledger', (select count(*) from kizuna.ledger), 'clients', (select count(*) from kizuna.clients),
           'horizon', kizuna.horizon(), 'changes', (select count(*) from kizuna.changes),
           'todos', (select count(*) from public.todos), 'amounts', (select count(*) from public.amounts),
           'bookmarks', (select count(*) from public.bookmarks), 'notes', (select count(*) from public.guarded_notes))",
    )
    .await
}

/// POSTs a raw body; returns the status and the body as text, untouched.
async fn post_text(server: &TestServer, function: &str, token: &str, body: String) -> (u16, String) {
    let response = server
        .http
        .post(server.path(&format!("/rest/v1/rpc/{function}")))
        .header("content-type", "application/json")
        .bearer_auth(token)
        .body(body)
        .send()
        .await
        .expect("an answer, not a transport error");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

async fn schema(db: &TestDb) {
    db.owned_table("amounts", "id text primary key, amount numeric, ratio numeric", "").await;
    db.owned_table("bookmarks", "url text primary key, title text", "").await;
    db.owned_table("guarded_notes", "id text primary key, body text", "").await;
    db.exec(
        "create function public.guard_notes() returns trigger language plpgsql as $$
         begin
           if new.body = 'forbidden' then raise exception 'notes may not say forbidden'; end if;
           if new.body = 'zero' then perform 1 / 0; end if;
           return new;
         end $$;
         create trigger guard before insert or update on public.guarded_notes
           for each row execute function public.guard_notes();",
    )
    .await;
}

/// A string of `n` characters that does not compress (so an index cannot hold it).
fn incompressible(n: usize) -> String {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"[(x % 62) as usize])
        })
        .collect()
}

#[tokio::test]
async fn hostile_and_careless_callers_change_nothing_they_should_not() {
    let db = TestDb::with_todos().await;
    schema(&db).await;
    let server = TestServer::start(db.url(), &[]).await;
    let token_a = server.token(A);

    numbers_keep_every_digit_both_ways(&db, &server, &token_a).await;
    one_bad_value_is_that_writes_refusal(&db, &server, &token_a).await;
    what_the_contract_forbids_is_refused(&db, &server, &token_a).await;
    over_limit_bodies_get_their_413(&server, &token_a).await;
    errors_look_like_postgrests(&db, &server, &token_a).await;
}

async fn numbers_keep_every_digit_both_ways(db: &TestDb, server: &TestServer, token: &str) {
    let id = uuid::Uuid::new_v4();
    let body = format!(
        r#"{{"request": {{"protocol": 1, "client_id": "{CLIENT_A}", "mutations": [{{"id": "{id}", "client_seq": 1,
            "table": "amounts", "pk": "n1", "op": "upsert", "read_seq": 0,
            "columns": {{"amount": 123456789012345678901234567890, "ratio": 0.12345678901234567890123456789}}}}]}}}}"#
    );
    let (status, text) = post_text(server, "kizuna_push", token, body).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("APPLIED"), "{text}");
    let stored: Value = db.one("select to_jsonb(array[amount::text, ratio::text]) from public.amounts where id = 'n1'").await;
    assert_eq!(stored, json!(["123456789012345678901234567890", "0.12345678901234567890123456789"]));

    let pull = json!({"request": {"protocol": 1, "client_id": CLIENT_A, "cursor": null,
                                  "buckets": [format!("user:{A}")], "limit": 100}});
    let (status, text) = post_text(server, "kizuna_pull", token, pull.to_string()).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("123456789012345678901234567890"), "the pull rounded the integer: {text}");
    assert!(text.contains("0.12345678901234567890123456789"), "the pull rounded the fraction: {text}");
}

async fn one_bad_value_is_that_writes_refusal(db: &TestDb, server: &TestServer, token: &str) {
    // The application's own SQL refusing one mutation, and a key too long for its index: each is
    // that mutation's REJECTED verdict with words and no internals; the good write beside it lands.
    let long_key = format!("https://example.com/{}", incompressible(3000));
    let request = push_request(
        CLIENT_A,
        vec![
            mutation(10, "guarded_notes", "g1", "upsert", json!({"body": "forbidden"})),
            mutation(11, "guarded_notes", "g2", "upsert", json!({"body": "zero"})),
            mutation(12, "bookmarks", &long_key, "upsert", json!({"title": "long"})),
            mutation(13, "guarded_notes", "g3", "upsert", json!({"body": "fine"})),
        ],
    );
    let (status, body) = server.rpc("kizuna_push", Some(token), &request).await;
    assert_eq!(status, 200, "{body}");
    let verdicts = body["verdicts"].as_array().unwrap();
    let reasons: Vec<&str> = verdicts.iter().map(|v| v["reason"].as_str().unwrap_or(v["status"].as_str().unwrap())).collect();
    assert_eq!(reasons, ["VALIDATION_FAILED", "VALIDATION_FAILED", "VALIDATION_FAILED", "APPLIED"], "{body}");
    assert_eq!(verdicts[0]["message"], "notes may not say forbidden", "the trigger's own words: {body}");
    for v in &verdicts[..3] {
        let message = v["message"].as_str().expect("a message");
        for internal in ["tuple", "relation", "bookmarks_pkey", "btree", "index row"] {
            assert!(!message.contains(internal), "internals in {message:?}");
        }
    }
    assert_eq!(db.one::<i64>("select count(*) from public.guarded_notes").await, 1);

    // NUL cannot be stored by PostgreSQL at all: the request is refused with a code (the client
    // narrows to the one write and dead-letters it), never a 5xx, and nothing changes.
    let before = footprint(db).await;
    let request = push_request(CLIENT_A, vec![mutation(20, "todos", "nul", "upsert", json!({"title": "a\u{0}b"}))]);
    let (status, body) = server.rpc("kizuna_push", Some(token), &request).await;
    assert_eq!((status, body["code"].as_str()), (400, Some("22P05")), "{body}");
    assert_eq!(footprint(db).await, before);
}

async fn what_the_contract_forbids_is_refused(db: &TestDb, server: &TestServer, token: &str) {
    let before = footprint(db).await;
    let todo = |seq: i64| mutation(seq, "todos", &format!("t{seq}"), "upsert", json!({"title": "x"}));
    let mut zero = todo(30);
    zero["client_seq"] = json!(0);
    let mut negative = todo(31);
    negative["client_seq"] = json!(-5);
    let first = todo(32);
    let mut twin = todo(33);
    twin["id"] = first["id"].clone();
    let mut no_id = todo(34);
    no_id.as_object_mut().unwrap().remove("id");
    let mut no_read_seq = todo(35);
    no_read_seq.as_object_mut().unwrap().remove("read_seq");
    let mut negative_read = todo(36);
    negative_read["read_seq"] = json!(-1);
    for (what, mutations, words) in [
        ("client_seq 0", vec![zero], "client_seq must be at least 1"),
        ("client_seq -5", vec![negative], "client_seq must be at least 1"),
        ("a repeated id", vec![first, twin], "repeats"),
        ("client_seq not rising", vec![todo(41), todo(40)], "is not above"),
        ("no id", vec![no_id], "id must be a UUID"),
        ("no read_seq", vec![no_read_seq], "read_seq must be an integer"),
        ("negative read_seq", vec![negative_read], "read_seq must not be negative"),
    ] {
        let (status, body) = server.rpc("kizuna_push", Some(token), &push_request(CLIENT_A, mutations)).await;
        assert_eq!((status, body["code"].as_str()), (400, Some("KZP01")), "{what}: {body}");
        assert!(body["message"].as_str().unwrap().contains(words), "{what}: {body}");
    }
    let too_many: Vec<String> = (0..300).map(|i| format!("b{i}")).collect();
    let (status, body) = server
        .rpc("kizuna_pull", Some(token), &json!({"protocol": 1, "client_id": CLIENT_A, "cursor": null, "buckets": too_many, "limit": 10}))
        .await;
    assert_eq!((status, body["code"].as_str()), (400, Some("KZP01")), "too many buckets: {body}");
    assert_eq!(footprint(db).await, before, "a refused request changed something");
}

async fn over_limit_bodies_get_their_413(server: &TestServer, token: &str) {
    // The default limit is 1 MiB; these are 4 MiB. Every one must read its 413, never a reset.
    let big = format!(r#"{{"request": {{"padding": "{}"}}}}"#, "x".repeat(4 * 1024 * 1024));
    for attempt in 0..8 {
        let (status, text) = post_text(server, "kizuna_push", token, big.clone()).await;
        assert_eq!(status, 413, "attempt {attempt}: {text}");
        assert!(text.contains("KZG01"), "{text}");
    }
}

async fn errors_look_like_postgrests(db: &TestDb, server: &TestServer, token: &str) {
    // details and hint are null when absent, from the gateway and from the pack alike.
    let (status, body) = server.post_raw("kizuna_push", Some(token), "[1]".into()).await;
    assert_eq!((status, &body["details"]), (400, &Value::Null), "{body}");
    let (status, body) = server
        .rpc("kizuna_push", Some(token), &json!({"protocol": 1, "client_id": CLIENT_A, "mutations": "no"}))
        .await;
    assert_eq!((status, body["code"].as_str()), (400, Some("KZP01")), "{body}");
    assert_eq!(body["details"], Value::Null, "{body}");
    assert_eq!(body["hint"], Value::Null, "{body}");

    // Refused by privileges: 401 for anon, 403 for a signed-in user, as PostgREST answers.
    db.exec("revoke execute on function public.kizuna_pull(jsonb) from anon, authenticated").await;
    let pull = json!({"protocol": 1, "client_id": CLIENT_B, "cursor": null, "buckets": [], "limit": 1});
    let (status, body) = server.rpc("kizuna_pull", Some(&server.token_with_role(B, "anon")), &pull).await;
    assert_eq!((status, body["code"].as_str()), (401, Some("42501")), "{body}");
    let (status, body) = server.rpc("kizuna_pull", Some(&server.token(B)), &pull).await;
    assert_eq!((status, body["code"].as_str()), (403, Some("42501")), "{body}");
    db.exec("grant execute on function public.kizuna_pull(jsonb) to anon, authenticated").await;
}

#[tokio::test]
async fn a_strangers_pull_costs_a_bounded_amount_and_reveals_no_key() {
    let db = TestDb::with_todos().await;
    let hidden = 2000;
    db.exec(&format!(
        "insert into public.todos (id, owner, title) select 'secret-' || i, '{A}', 'hidden' from generate_series(1, {hidden}) i"
    ))
    .await;
    let stranger = Caller::user(B);
    db.push(&stranger, push_request(CLIENT_B, vec![])).await.unwrap(); // registers B's client

    // One page costs at most the budget, whatever the caller may not see: it ends early with no
    // entries (it used to scan all 2000 rows, re-reading the table under the policy per chunk).
    let bucket = format!("user:{A}");
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let page = db
            .pull(&stranger, json!({"protocol": 1, "client_id": CLIENT_B, "cursor": cursor, "buckets": [bucket], "limit": 1}))
            .await
            .unwrap();
        pages += 1;
        assert_eq!(page["entries"], json!([]), "a stranger sees nothing");
        let next = page["cursor"].as_str().unwrap().to_owned();
        for i in [1, 7, 500, 1999] {
            let key_hex: String = format!("secret-{i}").bytes().map(|b| format!("{b:02x}")).collect();
            assert!(!next.contains(&key_hex), "the cursor reveals a hidden key: {next}");
        }
        if page["done"] == json!(true) {
            break;
        }
        assert!(pages < 200, "a run over hidden rows must end");
        cursor = Some(next);
    }
    assert!(pages > 1, "one page examined all {hidden} hidden rows");
    assert!(pages <= hidden / 32 + 2, "{pages} pages: the budget at limit 1 is 32 entries a page");

    // The owner's run over the same bucket is unchanged: every row, at most `limit` per page.
    let owner = support::db::pull_run(db.client(), &Caller::user(A), CLIENT_A, None, &[&bucket], 300).await.unwrap();
    assert_eq!(owner.entries.len(), hidden);
    assert_eq!(owner.pages, hidden / 300 + 1);

    // A forged or foreign sealed cursor is refused, not opened.
    let forged = cursor.unwrap().replace(".x", ".x0");
    let refused = db
        .pull(&stranger, json!({"protocol": 1, "client_id": CLIENT_B, "cursor": forged, "buckets": [bucket], "limit": 1}))
        .await
        .unwrap_err();
    assert_eq!(refused.code, "KZP01");
}

#[tokio::test]
async fn metrics_need_a_token_and_read_the_database_at_most_once_per_window() {
    let db = TestDb::with_todos().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let side = format!("127.0.0.1:{port}");
    // The support's servers read the figures at every scrape; this one keeps them for a minute.
    let server = TestServer::start(db.url(), &["--metrics-cache-ms", "60000", "--metrics-listen", &side]).await;
    let scrape = |token: Option<String>| {
        let mut request = server.http.get(server.path("/metrics"));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(scrape(None).await, 401, "no token");
    assert_eq!(scrape(Some(server.token(A))).await, 403, "a user's token");
    assert_eq!(scrape(Some("wrong".into())).await, 401, "a wrong token");
    assert_eq!(scrape(Some(METRICS_TOKEN.into())).await, 200, "the metrics token");
    assert_eq!(scrape(Some(server.token_with_role(A, "service_role"))).await, 200, "service_role");

    let metric = |text: &str, name: &str| -> f64 {
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok()).unwrap_or(-1.0)
    };
    let before = server.metrics().await;
    let request = push_request(CLIENT_A, vec![mutation(1, "todos", "m1", "upsert", json!({"title": "x"}))]);
    assert_eq!(server.rpc("kizuna_push", Some(&server.token(A)), &request).await.0, 200);
    let after = server.metrics().await;
    assert_eq!(metric(&after, "kizuna_process_applied_total"), metric(&before, "kizuna_process_applied_total") + 1.0);
    assert_eq!(
        metric(&after, "kizuna_applied_total"),
        metric(&before, "kizuna_applied_total"),
        "the durable figures were read again within the window"
    );

    // The side address serves the same text without a token.
    let text = server.http.get(format!("http://{side}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(text.contains("kizuna_process_applied_total 1"), "{text}");
    let other = server.http.get(format!("http://{side}/rest/v1/rpc/kizuna_push")).send().await.unwrap();
    assert_eq!(other.status(), 404, "the side address serves metrics only");
}

/// A small seeded generator, so a failing body can be reproduced from the printed seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A JSON text that is hostile in one or more ways: huge and precise numbers, NUL and lone
/// surrogates, long keys, deep nesting, wrong types, missing fields, repeated ids, bad sequences.
fn hostile_body(rng: &mut Rng) -> String {
    let value = |rng: &mut Rng| -> String {
        match rng.below(12) {
            0 => "1e400".into(),
            1 => "-1e999999".into(),
            2 => "123456789012345678901234567890123456789".into(),
            3 => "0.000000000000000000000000000001".into(),
            4 => r#""a\u0000b""#.into(),
            5 => r#""\ud800""#.into(),
            6 => format!("\"{}\"", "k".repeat(4000)),
            7 => format!("{}1{}", "[".repeat(70), "]".repeat(70)),
            8 => format!("{}1{}", "[".repeat(30), "]".repeat(30)),
            9 => "{\"nested\": {\"x\": [true, null, \"\u{1F600}\"]}}".into(),
            10 => "\"plain\"".into(),
            _ => "-0".into(),
        }
    };
    let n = rng.below(4);
    let shared_id = uuid::Uuid::new_v4();
    let mutations: Vec<String> = (0..n)
        .map(|i| {
            let id = if rng.below(5) == 0 { shared_id } else { uuid::Uuid::new_v4() };
            let seq = match rng.below(6) {
                0 => "0".to_owned(),
                1 => "-5".to_owned(),
                2 => "\"one\"".to_owned(),
                3 => "99999999999999999999".to_owned(),
                _ => (1000 + i * 10 + rng.below(5)).to_string(),
            };
            let table = ["todos", "amounts", "bookmarks", "guarded_notes", "no_such_table"][rng.below(5) as usize];
            let pk = match rng.below(4) {
                0 => value(rng),
                1 => format!("\"{}\"", incompressible(3000)),
                _ => format!("\"fz{}\"", rng.below(50)),
            };
            let op = ["\"upsert\"", "\"patch\"", "\"delete\"", "\"merge\"", "7"][rng.below(5) as usize];
            let column = ["title", "amount", "body", "url", "owner", "nope"][rng.below(6) as usize];
            let columns = match rng.below(4) {
                0 => "[]".to_owned(),
                1 => value(rng),
                _ => format!("{{\"{column}\": {}}}", value(rng)),
            };
            let read_seq = ["0", "-1", "null", "3"][rng.below(4) as usize];
            let batch = if rng.below(4) == 0 { format!(", \"batch\": \"{shared_id}\"") } else { String::new() };
            format!(
                r#"{{"id": "{id}", "client_seq": {seq}, "table": "{table}", "pk": {pk}, "op": {op}, "columns": {columns}, "read_seq": {read_seq}{batch}}}"#
            )
        })
        .collect();
    let protocol = ["1", "1", "1", "2", "\"1\""][rng.below(5) as usize];
    let client = [CLIENT_A, CLIENT_A, CLIENT_B, "not-a-uuid"][rng.below(4) as usize];
    match rng.below(10) {
        0 => format!("{{\"request\": {}}}", value(rng)),
        1 => "{\"request\": {\"protocol\": 1}".into(),
        _ => format!(
            r#"{{"request": {{"protocol": {protocol}, "client_id": "{client}", "mutations": [{}]}}}}"#,
            mutations.join(", ")
        ),
    }
}

#[tokio::test]
async fn random_hostile_bodies_get_verdicts_or_coded_4xx_never_5xx() {
    let db = TestDb::with_todos().await;
    schema(&db).await;
    let server = TestServer::start(db.url(), &[]).await;
    let token = server.token(A);
    let seed = std::env::var("KIZUNA_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5EED_0009_u64);
    let mut rng = Rng(seed | 1);
    let (mut answered, mut refused) = (0, 0);
    for round in 0..300 {
        let body = hostile_body(&mut rng);
        let before = footprint(&db).await;
        let (status, text) = post_text(&server, "kizuna_push", &token, body.clone()).await;
        let answer: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("seed {seed} round {round}: not JSON: {text}"));
        match status {
            200 => {
                let sent: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                let n = sent["request"]["mutations"].as_array().map_or(0, Vec::len);
                assert_eq!(answer["verdicts"].as_array().map(Vec::len), Some(n), "seed {seed} round {round}: {body}\n{text}");
                answered += 1;
            }
            400..=499 => {
                let code = answer["code"].as_str().unwrap_or("");
                assert!(!code.is_empty() && answer["message"].is_string(), "seed {seed} round {round}: {text}");
                assert_eq!(footprint(&db).await, before, "seed {seed} round {round}: refused but changed: {body}");
                refused += 1;
            }
            _ => panic!("seed {seed} round {round}: {status} {text}\nbody: {}", &body[..body.len().min(2000)]),
        }
    }
    println!("hostile bodies: {answered} answered with verdicts, {refused} refused with a code");
    assert!(answered > 20 && refused > 20, "the generator must exercise both ({answered}/{refused})");
}

/// A synced table whose insert sleeps as many seconds as its `body` says: a request that keeps the
/// database busy for as long as a test needs.
async fn slow_notes(db: &TestDb) {
    db.owned_table("slow_notes", "id text primary key, body text", "").await;
    db.exec(
        "create function public.slow_notes_sleep() returns trigger language plpgsql as $$
         begin perform pg_sleep(new.body::numeric); return new; end $$;
         create trigger slow before insert on public.slow_notes for each row execute function public.slow_notes_sleep();",
    )
    .await;
}

#[tokio::test]
async fn no_caller_holds_the_pool_a_slow_request_times_out_and_a_greedy_caller_waits_its_turn() {
    let db = TestDb::with_todos().await;
    slow_notes(&db).await;
    let server = TestServer::start(db.url(), &["--statement-timeout-ms", "2500", "--caller-concurrency", "1"]).await;
    let token = server.token(A);
    let sleepy = |seq: i64, seconds: &str| push_request(CLIENT_A, vec![mutation(seq, "slow_notes", &format!("s{seq}"), "upsert", json!({"body": seconds}))]);

    // Past the statement timeout the request fails as a fault of the server (retried by clients),
    // its effects rolled back, and the connection serves the next request.
    let (status, body) = server.rpc("kizuna_push", Some(&token), &sleepy(1, "5")).await;
    assert_eq!((status, body["code"].as_str()), (500, Some("57014")), "{body}");
    assert_eq!(db.one::<i64>("select count(*) from public.slow_notes").await, 0);
    let (status, body) = server.rpc("kizuna_push", Some(&token), &sleepy(2, "0")).await;
    assert_eq!(status, 200, "{body}");

    // One request in flight per caller here: a second one at the same time is told to wait (429,
    // retryable), while another caller is served.
    let first = sleepy(3, "1");
    let (slow, second, other) = tokio::join!(
        server.rpc("kizuna_push", Some(&token), &first),
        async {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            server.rpc("kizuna_push", Some(&token), &sleepy(4, "0")).await
        },
        async {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            let b = push_request(CLIENT_B, vec![mutation(1, "slow_notes", "b1", "upsert", json!({"body": "0"}))]);
            server.rpc("kizuna_push", Some(&server.token(B)), &b).await
        },
    );
    assert_eq!(slow.0, 200, "{}", slow.1);
    assert_eq!((second.0, second.1["code"].as_str()), (429, Some("KZG05")), "{}", second.1);
    assert_eq!(other.0, 200, "another caller is not held back: {}", other.1);
}

#[tokio::test]
async fn a_body_that_stops_arriving_is_answered_and_gives_its_callers_share_back() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let db = TestDb::with_todos().await;
    let server = TestServer::start(db.url(), &["--caller-concurrency", "1", "--body-timeout-ms", "600"]).await;
    let token = server.token(A);
    // A phone that lost its network mid-upload: the headers and the start of the body arrived,
    // the rest never will, and the connection stays open.
    let mut stalled = tokio::net::TcpStream::connect(server.url.trim_start_matches("http://")).await.unwrap();
    let head = format!(
        "POST /rest/v1/rpc/kizuna_push HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: 4000\r\n\r\n{{\"request\": {{\"client_id\": "
    );
    stalled.write_all(head.as_bytes()).await.unwrap();

    // Meanwhile it holds the caller's one share: the caller's next request is told to wait.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let next = push_request(CLIENT_A, vec![mutation(1, "todos", "t1", "upsert", json!({"title": "after the stall"}))]);
    let (status, body) = server.rpc("kizuna_push", Some(&token), &next).await;
    assert_eq!((status, body["code"].as_str()), (429, Some("KZG05")), "{body}");

    // The stalled request is answered (408, which clients retry) once its time is up ...
    let mut answer = vec![0u8; 4096];
    let read = tokio::time::timeout(std::time::Duration::from_secs(5), stalled.read(&mut answer))
        .await
        .expect("the gateway answers a body that stopped arriving")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..read]);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":\"KZG06\""), "{answer}");
    // ... and its share is the caller's again.
    let (status, body) = server.rpc("kizuna_push", Some(&token), &next).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(db.one::<String>("select title from public.todos where id = 't1'").await, "after the stall");
}

/// A caller that goes away mid-request keeps its share until PostgreSQL has finished with the
/// request: the share was given back the moment the connection closed, while the statement ran on
/// in the database on a connection returned to the pool, so a caller that opened and closed
/// requests could keep every connection busy whatever `--caller-concurrency` said.
#[tokio::test]
async fn a_caller_that_hangs_up_keeps_its_share_until_the_database_has_finished() {
    use tokio::io::AsyncWriteExt;
    let db = TestDb::with_todos().await;
    slow_notes(&db).await;
    let server = TestServer::start(db.url(), &["--caller-concurrency", "1"]).await;
    let token = server.token(A);
    let body = json!({"request": push_request(CLIENT_A, vec![mutation(1, "slow_notes", "s1", "upsert", json!({"body": "1.5"}))])}).to_string();
    let mut hangs_up = tokio::net::TcpStream::connect(server.url.trim_start_matches("http://")).await.unwrap();
    let request = format!(
        "POST /rest/v1/rpc/kizuna_push HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    hangs_up.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    drop(hangs_up);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;

    let next = push_request(CLIENT_A, vec![mutation(2, "todos", "t2", "upsert", json!({"title": "next"}))]);
    let (status, body) = server.rpc("kizuna_push", Some(&token), &next).await;
    assert_eq!((status, body["code"].as_str()), (429, Some("KZG05")), "the share is still held: {body}");
    tokio::time::sleep(std::time::Duration::from_millis(1600)).await;
    let (status, body) = server.rpc("kizuna_push", Some(&token), &next).await;
    assert_eq!(status, 200, "and given back once the database finished: {body}");
}

/// A wake stream ends when its token expires, as every other request with that token is refused
/// then (the client opens another with a fresh token): it went on for as long as the connection
/// lived, telling a caller whose token had expired when others' writes landed.
#[tokio::test]
async fn a_wake_stream_ends_when_its_token_expires() {
    let db = TestDb::with_todos().await;
    let server = TestServer::start(db.url(), &[]).await;
    let short = support::server::sign(
        &json!({"alg": "HS256", "typ": "JWT"}),
        &json!({"sub": A, "role": "authenticated", "exp": support::server::now() + 2}),
        support::server::SECRET,
    );
    let mut wake = server.http.get(server.path("/kizuna/v1/wake")).bearer_auth(&short).send().await.unwrap();
    assert_eq!(wake.status(), 200);
    let ended = tokio::time::timeout(std::time::Duration::from_secs(6), async {
        while let Ok(Some(_)) = wake.chunk().await {}
    })
    .await;
    assert!(ended.is_ok(), "the stream ended once its token expired");
}

/// Wake streams are bounded: a caller may hold `--wake-streams-per-caller` open, the process
/// `--max-wake-streams` in all (anon callers, who cannot be told apart, only by the latter); one
/// more is refused 429 KZG05 before anything is held, and a place comes back when a stream ends.
/// A caller could open stream after stream, each holding a socket and a task for its token's life.
#[tokio::test]
async fn wake_streams_are_bounded_per_caller_and_in_all() {
    let db = TestDb::with_todos().await;
    let server = TestServer::start(db.url(), &["--wake-streams-per-caller", "2", "--max-wake-streams", "3"]).await;
    let header = json!({"alg": "HS256", "typ": "JWT"});
    let sign = |claims: Value| support::server::sign(&header, &claims, support::server::SECRET);
    let a = server.token(A);
    let a_short = sign(json!({"sub": A, "role": "authenticated", "exp": support::server::now() + 3}));
    let anon = sign(json!({"role": "anon", "exp": support::server::now() + 3600}));
    let open = |token: String| {
        let request = server.http.get(server.path("/kizuna/v1/wake")).bearer_auth(token);
        async move { request.send().await.unwrap() }
    };
    let first = open(a_short.clone()).await;
    let _second = open(a.clone()).await;
    assert_eq!((first.status(), _second.status()), (reqwest::StatusCode::OK, reqwest::StatusCode::OK));
    let third = open(a.clone()).await;
    assert_eq!(third.status(), 429);
    let body: Value = third.json().await.unwrap();
    assert_eq!(body["code"], "KZG05", "{body}");
    assert!(body["message"].as_str().unwrap().contains("2 wake streams"), "{body}");

    let _anon = open(anon.clone()).await;
    assert_eq!(_anon.status(), 200, "anon callers count as the others do");
    let over = open(server.token(B)).await;
    assert_eq!(over.status(), 429, "the process holds its most");
    let body: Value = over.json().await.unwrap();
    assert!(body["message"].as_str().unwrap().contains("3 wake streams"), "{body}");

    // The short token's stream ends at its expiry, and its place comes back.
    let mut first = first;
    tokio::time::timeout(std::time::Duration::from_secs(10), async { while let Ok(Some(_)) = first.chunk().await {} }).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(open(server.token(B)).await.status(), 200);
}

/// Callers without a `sub` (anon: every visitor of a public app holds the same token) are told
/// apart by the address they come from: the connection's peer, or with `--trust-forwarded-for`
/// the last `X-Forwarded-For` entry (the address the proxy in front saw). They shared their role's
/// share of `--caller-concurrency`: one upload stalled on a bad network held every anonymous
/// visitor's requests back until the body timeout.
#[tokio::test]
async fn anonymous_callers_at_different_addresses_do_not_share_their_share() {
    use tokio::io::AsyncWriteExt;
    let db = TestDb::with_todos().await;
    let anon = support::server::sign(
        &json!({"alg": "HS256", "typ": "JWT"}),
        &json!({"role": "anon", "exp": support::server::now() + 3600}),
        support::server::SECRET,
    );
    let pull = json!({"request": support::db::pull_request(CLIENT_A, None, &[], 10)});
    for trust_forwarded_for in [false, true] {
        let mut args = vec!["--caller-concurrency", "1", "--body-timeout-ms", "5000"];
        if trust_forwarded_for {
            args.push("--trust-forwarded-for");
        }
        let server = TestServer::start(db.url(), &args).await;
        // A visitor's upload stalls from 127.0.0.1 (as 198.51.100.7, through the proxy).
        let mut stalled = tokio::net::TcpStream::connect(server.url.trim_start_matches("http://")).await.unwrap();
        let head = format!(
            "POST /rest/v1/rpc/kizuna_push HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {anon}\r\n\
             X-Forwarded-For: 198.51.100.7\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n{{\"request\": "
        );
        stalled.write_all(head.as_bytes()).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let from = |local: &str, forwarded: &str| {
            let http = reqwest::Client::builder().local_address(local.parse::<std::net::IpAddr>().unwrap()).build().unwrap();
            let request = http.post(server.path("/rest/v1/rpc/kizuna_pull")).bearer_auth(&anon).header("x-forwarded-for", forwarded).json(&pull);
            async move { request.send().await.unwrap().status().as_u16() }
        };
        if trust_forwarded_for {
            assert_eq!(from("127.0.0.1", "203.0.113.9").await, 200, "another visitor behind the proxy");
            assert_eq!(from("127.0.0.1", "198.51.100.7").await, 429, "the same visitor");
            assert_eq!(from("127.0.0.1", "203.0.113.9, 198.51.100.7").await, 429, "the entry the proxy wrote counts, not the client's own");
            assert_eq!(from("127.0.0.1", "198.51.100.7:443").await, 429, "with the port some proxies write");
        } else {
            assert_eq!(from("127.0.0.2", "198.51.100.7").await, 200, "another address");
            assert_eq!(from("127.0.0.1", "203.0.113.9").await, 429, "the same address; the header is not trusted");
        }
        drop(stalled);
    }
}

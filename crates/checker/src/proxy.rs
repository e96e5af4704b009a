//! The network between one client and the gateway: an HTTP proxy of its own on a loopback port,
//! which forwards each request to the gateway or does to it, as the history's seed decides, what a
//! network that misbehaves does. Native and browser clients alike reach the gateway only through
//! their proxy, so both meet the same faults, and the gateway meets clients that vanish mid-request.
//!
//! A fault either answers for the gateway (a 503 from something in the way) or cuts the
//! connection with no answer at all (hyper closes a connection whose service fails), which a client
//! sees exactly as it sees a reset or a refused connection.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use crate::prng::Prng;

/// What the network does to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Pass,
    /// Never reaches the gateway: the connection is cut before anything is forwarded.
    Refuse,
    /// Forwarded and answered, but the answer never arrives: a lost acknowledgement after a commit.
    LoseAnswer,
    /// A 503 from something in the way (a load balancer's plain-text page); the gateway never saw it.
    Unavailable,
    /// Forwarded after a pause of this many milliseconds.
    Delay(u64),
    /// Answered, but the connection is cut halfway through the body.
    Truncate,
    /// The connection is cut this many milliseconds after forwarding: the gateway is left in the
    /// middle of the request, before or after its transaction commits.
    Reset(u64),
}

/// Why the proxy cut a connection (hyper closes it without an answer).
#[derive(Debug)]
struct Cut(&'static str);

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Cut {}

type Body = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

struct Shared {
    upstream: String,
    http: reqwest::Client,
    prng: Mutex<Prng>,
    /// Percent of requests that meet a fault; 0 once the history heals.
    fault_percent: AtomicU64,
    /// A network partition: every request is cut before it is forwarded.
    partitioned: AtomicBool,
    faults: AtomicU64,
}

/// One client's network. Dropping it stops the listener.
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    listener: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl Proxy {
    /// A proxy to the gateway at `upstream`, its faults drawn from `seed`.
    pub async fn start(upstream: String, seed: u64) -> Result<Proxy, String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| format!("proxy: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let shared = Arc::new(Shared {
            upstream,
            http: reqwest::Client::builder().pool_max_idle_per_host(0).build().map_err(|e| e.to_string())?,
            prng: Mutex::new(Prng::new(seed)),
            fault_percent: AtomicU64::new(0),
            partitioned: AtomicBool::new(false),
            faults: AtomicU64::new(0),
        });
        let serving = shared.clone();
        let listener = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let shared = serving.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| forward(shared.clone(), request));
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        Ok(Proxy { port, shared, listener })
    }

    /// The URL a client uses to reach the gateway.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn set_fault_percent(&self, percent: u64) {
        self.shared.fault_percent.store(percent, Ordering::Relaxed);
    }

    /// Cuts the client off the network (true) or reconnects it (false).
    pub fn set_partitioned(&self, on: bool) {
        self.shared.partitioned.store(on, Ordering::Relaxed);
    }

    pub fn is_partitioned(&self) -> bool {
        self.shared.partitioned.load(Ordering::Relaxed)
    }

    /// Requests that met a fault (a partition's refusals included).
    pub fn faults(&self) -> u64 {
        self.shared.faults.load(Ordering::Relaxed)
    }
}

impl Shared {
    fn fault(&self, rpc: bool) -> Fault {
        if self.partitioned.load(Ordering::Relaxed) {
            self.faults.fetch_add(1, Ordering::Relaxed);
            return Fault::Refuse;
        }
        let mut prng = self.prng.lock().unwrap();
        if !rpc || prng.below(100) >= self.fault_percent.load(Ordering::Relaxed) {
            return Fault::Pass;
        }
        self.faults.fetch_add(1, Ordering::Relaxed);
        match prng.below(6) {
            0 => Fault::Refuse,
            1 => Fault::LoseAnswer,
            2 => Fault::Unavailable,
            3 => Fault::Delay(prng.below(80)),
            4 => Fault::Reset(1 + prng.below(15)),
            _ => Fault::Truncate,
        }
    }
}

fn full(status: u16, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(body.into()).map_err(|never| match never {}).boxed())
        .expect("a valid response")
}

/// Headers that belong to one connection, not to the message, and are never forwarded.
fn hop_by_hop(name: &str) -> bool {
    matches!(name, "connection" | "keep-alive" | "transfer-encoding" | "content-length" | "host" | "upgrade" | "te" | "trailer")
}

async fn forward(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Response<Body>, Cut> {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let wake = path.starts_with("/kizuna/v1/wake");
    let rpc = parts.method == hyper::Method::POST;
    let body = body.collect().await.map_err(|_| Cut("the client's body did not arrive"))?.to_bytes();
    // Only posts meet the seed's faults; a preflight or a wake stream meets only a partition.
    let fault = shared.fault(rpc);
    match fault {
        Fault::Refuse => return Err(Cut("refused")),
        Fault::Unavailable => return Ok(full(503, "text/plain", "503 Service Temporarily Unavailable")),
        Fault::Delay(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
        _ => {}
    }
    let method = reqwest::Method::from_bytes(parts.method.as_str().as_bytes()).map_err(|_| Cut("method"))?;
    let mut upstream = shared.http.request(method, format!("{}{path}", shared.upstream)).body(body);
    for (name, value) in &parts.headers {
        if !hop_by_hop(name.as_str()) {
            upstream = upstream.header(name.as_str(), value.as_bytes());
        }
    }
    let sent = upstream.send();
    let answer = match fault {
        Fault::Reset(ms) => match tokio::time::timeout(Duration::from_millis(ms), sent).await {
            Ok(_) => return Err(Cut("reset after the gateway answered")),
            Err(_) => return Err(Cut("reset while the gateway worked")),
        },
        // A gateway that is down: the client sees what it would see without the proxy.
        _ => sent.await.map_err(|_| Cut("the gateway is unreachable"))?,
    };
    let mut response = Response::builder().status(answer.status().as_u16());
    for (name, value) in answer.headers() {
        if !hop_by_hop(name.as_str()) {
            response = response.header(name.as_str(), value.as_bytes());
        }
    }
    if wake {
        // Streamed as it comes, never buffered: a wake-up is only worth its latency.
        let stream = answer.bytes_stream().map(|chunk| chunk.map(Frame::data).map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>));
        return response.body(BodyExt::boxed(StreamBody::new(stream))).map_err(|_| Cut("response"));
    }
    let bytes = answer.bytes().await.map_err(|_| Cut("the gateway's answer broke off"))?;
    match fault {
        Fault::LoseAnswer => Err(Cut("answer lost")),
        Fault::Truncate => {
            // The declared length, then half the bytes, then the connection goes.
            let half = bytes.slice(..bytes.len() / 2);
            let chunks = futures_util::stream::iter([
                Ok(Frame::data(half)),
                Err(Box::new(Cut("cut short")) as Box<dyn std::error::Error + Send + Sync>),
            ]);
            response
                .header("content-length", bytes.len())
                .body(BodyExt::boxed(StreamBody::new(chunks)))
                .map_err(|_| Cut("response"))
        }
        _ => response.body(Full::new(bytes).map_err(|never: Infallible| match never {}).boxed()).map_err(|_| Cut("response")),
    }
}

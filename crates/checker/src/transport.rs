//! The clients' HTTP, with faults injected between them and the gateway, decided by the history's
//! seed: a request never sent, an answer lost after the server committed, a 503 that never reached
//! the server, a delay, a body cut short. Each is what a client sees of a network that misbehaves.

use std::time::Duration;

use kizuna_engine::Failure;
use kizuna_protocol::ErrorBody;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::gateway::SECRET;
use crate::prng::Prng;

/// A token for `sub` with `role`, an hour long, signed with the checker's gateway secret.
pub fn token(sub: &str, role: &str) -> String {
    let exp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 3600;
    let claims = serde_json::json!({"sub": sub, "role": role, "exp": exp});
    jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()))
        .expect("claims encode")
}

/// What the network does to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Pass,
    /// Never sent: the connection could not be made.
    Refuse,
    /// Sent and answered, but the answer never arrives: a lost acknowledgement after a commit.
    LoseAnswer,
    /// A 503 from something in the way; the server never saw the request.
    Unavailable,
    /// Sent after a pause.
    Delay(u64),
    /// Sent and answered, but the body arrives cut short.
    Truncate,
    /// The connection is reset this many milliseconds after sending: the gateway is cut off in
    /// the middle of the request, before or after its transaction commits.
    Reset(u64),
}

pub struct Transport {
    pub url: String,
    token: String,
    http: reqwest::Client,
    /// Percent of requests that meet a fault; 0 once the history heals.
    pub fault_percent: u64,
    prng: Prng,
    pub faults: u64,
}

impl Transport {
    pub fn new(url: String, user: &str, seed: u64) -> Transport {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("http client");
        Transport { url, token: token(user, "authenticated"), http, fault_percent: 0, prng: Prng::new(seed), faults: 0 }
    }

    fn fault(&mut self) -> Fault {
        if self.prng.below(100) >= self.fault_percent {
            return Fault::Pass;
        }
        self.faults += 1;
        match self.prng.below(6) {
            0 => Fault::Refuse,
            1 => Fault::LoseAnswer,
            2 => Fault::Unavailable,
            3 => Fault::Delay(self.prng.below(80)),
            4 => Fault::Reset(1 + self.prng.below(15)),
            _ => Fault::Truncate,
        }
    }

    /// One RPC: the answer, or the failure the client adapter would report.
    pub async fn rpc<Req: Serialize, Res: DeserializeOwned>(&mut self, function: &str, request: &Req) -> Result<Res, Failure> {
        let fault = self.fault();
        let network = |message: &str| Failure { status: None, code: "NETWORK".into(), message: message.into() };
        match fault {
            Fault::Refuse => return Err(network("connection refused (injected)")),
            Fault::Unavailable => {
                return Err(Failure { status: Some(503), code: "KZG03".into(), message: "unavailable (injected)".into() })
            }
            Fault::Delay(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            _ => {}
        }
        let mut call = self
            .http
            .post(format!("{}/rest/v1/rpc/{function}", self.url))
            .bearer_auth(&self.token)
            .json(&serde_json::json!({ "request": request }));
        if let Fault::Reset(ms) = fault {
            call = call.timeout(Duration::from_millis(ms));
        }
        let sent = call.send().await;
        let response = sent.map_err(|e| network(&format!("request failed: {e}")))?;
        let status = response.status().as_u16();
        let mut text = response.text().await.map_err(|e| network(&format!("body failed: {e}")))?;
        match fault {
            Fault::LoseAnswer => return Err(network("answer lost (injected)")),
            Fault::Truncate => text.truncate(text.len() / 2),
            _ => {}
        }
        if status != 200 {
            let body: Option<ErrorBody> = serde_json::from_str(&text).ok();
            return Err(match body {
                Some(body) => Failure { status: Some(status), code: body.code, message: body.message },
                None => Failure { status: Some(status), code: format!("HTTP_{status}"), message: text },
            });
        }
        serde_json::from_str(&text).map_err(|e| network(&format!("undecodable answer: {e}")))
    }
}

//! The native clients' HTTP, as the browser adapter's fetch does it: a PostgREST-style RPC with the
//! caller's token, every failure turned into the `Failure` the engine classifies. What the network
//! does to a request is the proxy's business (proxy.rs).

use std::time::Duration;

use kizuna_engine::Failure;
use kizuna_protocol::ErrorBody;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::gateway::SECRET;

/// A token for `sub` with `role`, an hour long, signed with the checker's gateway secret.
pub fn token(sub: &str, role: &str) -> String {
    let exp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() + 3600;
    let claims = serde_json::json!({"sub": sub, "role": role, "exp": exp});
    jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()))
        .expect("claims encode")
}

pub struct Transport {
    url: String,
    token: String,
    http: reqwest::Client,
}

impl Transport {
    pub fn new(url: String, user: &str) -> Transport {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("http client");
        Transport { url, token: token(user, "authenticated"), http }
    }

    /// One RPC: the answer, or the failure the client adapter would report.
    pub async fn rpc<Req: Serialize, Res: DeserializeOwned>(&self, function: &str, request: &Req) -> Result<Res, Failure> {
        Self::read(self.send(function, request).await).await
    }

    /// Sends one RPC and waits for its answer's status and headers only (`read` reads the rest).
    pub async fn send<Req: Serialize>(&self, function: &str, request: &Req) -> Result<reqwest::Response, Failure> {
        self.http
            .post(format!("{}/rest/v1/rpc/{function}", self.url))
            .bearer_auth(&self.token)
            .json(&serde_json::json!({ "request": request }))
            .send()
            .await
            .map_err(|e| network(format!("request failed: {e}")))
    }

    /// The rest of an answer `send` began: the answer, or the failure the client adapter would report.
    pub async fn read<Res: DeserializeOwned>(response: Result<reqwest::Response, Failure>) -> Result<Res, Failure> {
        let response = response?;
        let status = response.status().as_u16();
        let text = response.text().await.map_err(|e| network(format!("body failed: {e}")))?;
        if status != 200 {
            let body: Option<ErrorBody> = serde_json::from_str(&text).ok();
            return Err(match body {
                Some(body) => Failure { status: Some(status), code: body.code, message: body.message },
                None => Failure { status: Some(status), code: kizuna_protocol::codes::http_status(status), message: text },
            });
        }
        serde_json::from_str(&text).map_err(|e| network(format!("undecodable answer: {e}")))
    }
}

fn network(message: String) -> Failure {
    Failure { status: None, code: "NETWORK".into(), message }
}

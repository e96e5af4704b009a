//! HS256 access tokens, checked the way PostgREST checks them: the header must say `HS256` (never
//! `none`, never another algorithm), the signature must match in constant time, `exp` must be
//! present and in the future, and `role` must be one the gateway may switch to.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::alphabet::URL_SAFE;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::{Map, Value};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// base64url as JWTs use it: no padding when encoding, padding tolerated when decoding.
const B64: GeneralPurpose = GeneralPurpose::new(
    &URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The database roles a token may name. The role is spliced into `SET LOCAL ROLE` only as one of
/// these constants, never as text from the token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Authenticated,
    Anon,
    ServiceRole,
}

impl Role {
    pub fn parse(name: &str) -> Option<Role> {
        match name {
            "authenticated" => Some(Role::Authenticated),
            "anon" => Some(Role::Anon),
            "service_role" => Some(Role::ServiceRole),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Authenticated => "authenticated",
            Role::Anon => "anon",
            Role::ServiceRole => "service_role",
        }
    }
}

/// A verified token.
#[derive(Debug, Clone)]
pub struct Claims {
    pub role: Role,
    pub sub: Option<String>,
    /// The whole verified payload as JSON text, for `request.jwt.claims`.
    pub json: String,
}

/// Why a token was refused. The message is safe to show the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwtError {
    Missing,
    Malformed(&'static str),
    Algorithm,
    Signature,
    Expired,
    NotYetValid,
    Role,
    Subject,
}

impl std::fmt::Display for JwtError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JwtError::Missing => write!(f, "missing bearer token"),
            JwtError::Malformed(what) => write!(f, "malformed token: {what}"),
            JwtError::Algorithm => write!(f, "token algorithm must be HS256"),
            JwtError::Signature => write!(f, "token signature does not verify"),
            JwtError::Expired => write!(f, "token expired"),
            JwtError::NotYetValid => write!(f, "token not valid yet"),
            JwtError::Role => write!(f, "token role must be authenticated, anon or service_role"),
            JwtError::Subject => write!(f, "an authenticated token needs a sub claim"),
        }
    }
}

/// Verifies and mints tokens with one HS256 secret.
#[derive(Clone)]
pub struct JwtKey {
    secret: Vec<u8>,
}

impl JwtKey {
    pub fn new(secret: &str) -> JwtKey {
        JwtKey {
            secret: secret.as_bytes().to_vec(),
        }
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.secret).expect("HMAC accepts keys of any length")
    }

    pub fn verify(&self, token: &str) -> Result<Claims, JwtError> {
        self.verify_at(token, unix_now())
    }

    /// `now` in unix seconds; separate so that expiry can be tested without waiting.
    pub fn verify_at(&self, token: &str, now: u64) -> Result<Claims, JwtError> {
        let mut parts = token.split('.');
        let (Some(header_b64), Some(payload_b64), Some(signature_b64), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(JwtError::Malformed("expected three dot-separated parts"));
        };

        let header =
            decode_json(header_b64).ok_or(JwtError::Malformed("header is not base64url JSON"))?;
        if header.get("alg").and_then(Value::as_str) != Some("HS256") {
            return Err(JwtError::Algorithm);
        }

        // The signature is checked (in constant time) before the payload is even parsed.
        let signature = B64
            .decode(signature_b64)
            .map_err(|_| JwtError::Malformed("signature is not base64url"))?;
        let signing_input = &token[..header_b64.len() + 1 + payload_b64.len()];
        let mut mac = self.mac();
        mac.update(signing_input.as_bytes());
        mac.verify_slice(&signature)
            .map_err(|_| JwtError::Signature)?;

        let payload =
            decode_json(payload_b64).ok_or(JwtError::Malformed("payload is not base64url JSON"))?;
        let Value::Object(claims) = payload else {
            return Err(JwtError::Malformed("payload is not a JSON object"));
        };
        check_times(&claims, now)?;
        let role = claims
            .get("role")
            .and_then(Value::as_str)
            .and_then(Role::parse)
            .ok_or(JwtError::Role)?;
        let sub = claims
            .get("sub")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        if role == Role::Authenticated && sub.is_none() {
            return Err(JwtError::Subject);
        }
        let json = Value::Object(claims).to_string();
        Ok(Claims { role, sub, json })
    }

    /// Signs `claims` as an HS256 token (dev tokens and tests).
    pub fn mint(&self, claims: &Value) -> String {
        let header = B64.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let payload = B64.encode(claims.to_string());
        let signing_input = format!("{header}.{payload}");
        let mut mac = self.mac();
        mac.update(signing_input.as_bytes());
        let signature = B64.encode(mac.finalize().into_bytes());
        format!("{signing_input}.{signature}")
    }
}

/// `exp` is required: a token without one would be valid forever. `nbf` is honoured when present.
fn check_times(claims: &Map<String, Value>, now: u64) -> Result<(), JwtError> {
    let exp = claims
        .get("exp")
        .and_then(Value::as_f64)
        .ok_or(JwtError::Malformed("exp claim missing or not a number"))?;
    if exp <= now as f64 {
        return Err(JwtError::Expired);
    }
    if let Some(nbf) = claims.get("nbf") {
        let nbf = nbf
            .as_f64()
            .ok_or(JwtError::Malformed("nbf claim is not a number"))?;
        if nbf > now as f64 {
            return Err(JwtError::NotYetValid);
        }
    }
    Ok(())
}

fn decode_json(part: &str) -> Option<Value> {
    serde_json::from_slice(&B64.decode(part).ok()?).ok()
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: u64 = 1_700_000_000;

    fn key() -> JwtKey {
        JwtKey::new("secret")
    }

    fn token_with(header: &str, claims: &Value, secret: &str) -> String {
        let signing_input = format!("{}.{}", B64.encode(header), B64.encode(claims.to_string()));
        let mut mac = JwtKey::new(secret).mac();
        mac.update(signing_input.as_bytes());
        format!(
            "{signing_input}.{}",
            B64.encode(mac.finalize().into_bytes())
        )
    }

    #[test]
    fn accepts_a_good_token_and_keeps_its_claims() {
        let t = key().mint(&json!({"sub": "u1", "role": "authenticated", "exp": NOW + 60, "x": 1}));
        let c = key().verify_at(&t, NOW).unwrap();
        assert_eq!(c.role, Role::Authenticated);
        assert_eq!(c.sub.as_deref(), Some("u1"));
        assert_eq!(serde_json::from_str::<Value>(&c.json).unwrap()["x"], 1);
    }

    #[test]
    fn refuses_every_bad_token() {
        let good = json!({"sub": "u1", "role": "authenticated", "exp": NOW + 60});
        let cases: Vec<(String, JwtError)> = vec![
            (
                token_with(r#"{"alg":"HS256"}"#, &good, "other"),
                JwtError::Signature,
            ),
            (
                token_with(r#"{"alg":"none"}"#, &good, "secret"),
                JwtError::Algorithm,
            ),
            (
                token_with(r#"{"alg":"HS512"}"#, &good, "secret"),
                JwtError::Algorithm,
            ),
            (
                token_with(
                    r#"{"alg":"HS256"}"#,
                    &json!({"sub":"u","role":"authenticated","exp":NOW}),
                    "secret",
                ),
                JwtError::Expired,
            ),
            (
                token_with(
                    r#"{"alg":"HS256"}"#,
                    &json!({"sub":"u","role":"authenticated"}),
                    "secret",
                ),
                JwtError::Malformed("exp claim missing or not a number"),
            ),
            (
                token_with(
                    r#"{"alg":"HS256"}"#,
                    &json!({"sub":"u","role":"postgres","exp":NOW+60}),
                    "secret",
                ),
                JwtError::Role,
            ),
            (
                token_with(
                    r#"{"alg":"HS256"}"#,
                    &json!({"role":"authenticated","exp":NOW+60}),
                    "secret",
                ),
                JwtError::Subject,
            ),
            (
                token_with(
                    r#"{"alg":"HS256"}"#,
                    &json!({"sub":"u","role":"anon","exp":NOW+60,"nbf":NOW+30}),
                    "secret",
                ),
                JwtError::NotYetValid,
            ),
        ];
        for (token, want) in cases {
            assert_eq!(key().verify_at(&token, NOW).unwrap_err(), want, "{token}");
        }
        // An unsigned `alg: none` token with an empty signature part.
        let none = format!(
            "{}.{}.",
            B64.encode(r#"{"alg":"none"}"#),
            B64.encode(good.to_string())
        );
        assert_eq!(
            key().verify_at(&none, NOW).unwrap_err(),
            JwtError::Algorithm
        );
        for garbage in ["", "a", "a.b", "a.b.c.d", "!!.??.**", "e30.e30.e30"] {
            assert!(key().verify_at(garbage, NOW).is_err(), "{garbage}");
        }
    }

    #[test]
    fn anon_needs_no_subject() {
        let t = key().mint(&json!({"role": "anon", "exp": NOW + 60}));
        assert_eq!(key().verify_at(&t, NOW).unwrap().role, Role::Anon);
    }
}

//! HS256 access tokens, checked the way PostgREST checks them, by the `jsonwebtoken` crate: the
//! header must say `HS256` (never `none`, never another algorithm), the signature must match, `exp`
//! must be present and not past (no leeway), `nbf` is honoured, and `role` must be one the gateway
//! may switch to. `aud` is not checked, as PostgREST does not check it unless configured.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use base64::Engine as _;
use serde_json::Value;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

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
    /// The source universe a universe-sync token speaks for (its `kizuna_universe` claim): its
    /// pushes are counted on the apply path's process counters too.
    pub universe: Option<String>,
    /// The whole verified payload as JSON text, for `request.jwt.claims`.
    pub json: String,
    /// `exp`, in seconds since the epoch: a wake stream ends then (the client opens another with
    /// a fresh token).
    pub expires_at: f64,
}

/// The claim naming the source universe in a universe-sync token.
pub const UNIVERSE_CLAIM: &str = "kizuna_universe";

/// The claims the gateway itself reads (any JSON, judged in `verify`); the others are skipped.
#[derive(serde::Deserialize)]
struct Known {
    role: Option<Value>,
    sub: Option<Value>,
    #[serde(rename = "kizuna_universe")]
    universe: Option<Value>,
    /// Required and checked by the library (a number).
    exp: Option<Value>,
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
    decoding: DecodingKey,
    encoding: EncodingKey,
    validation: Validation,
}

impl JwtKey {
    pub fn new(secret: &str) -> JwtKey {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = 0;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.validate_aud = false;
        validation.set_required_spec_claims(&["exp"]);
        JwtKey {
            decoding: DecodingKey::from_secret(secret.as_bytes()),
            encoding: EncodingKey::from_secret(secret.as_bytes()),
            validation,
        }
    }

    /// The claims the gateway reads are decoded; the rest are skipped, not converted, and the
    /// payload reaches `request.jwt.claims` as the token holds it: re-serialised from JSON values,
    /// a claim such as `"tenant": 123456789012345678901234` reached the policies as
    /// `1.2345678901234568e23`, and one of `1e400` got the whole token refused.
    pub fn verify(&self, token: &str) -> Result<Claims, JwtError> {
        let data = jsonwebtoken::decode::<Known>(token, &self.decoding, &self.validation)
            .map_err(|e| refusal(e.kind()))?;
        let claims = data.claims;
        let role = claims.role.as_ref().and_then(Value::as_str).and_then(Role::parse).ok_or(JwtError::Role)?;
        let sub = claims.sub.as_ref().and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_owned);
        if role == Role::Authenticated && sub.is_none() {
            return Err(JwtError::Subject);
        }
        let universe = claims.universe.as_ref().and_then(Value::as_str).map(str::to_owned);
        // The library decoded this very segment, so it is base64url JSON.
        let payload = token.split('.').nth(1).ok_or(JwtError::Malformed("no payload"))?;
        let json = B64.decode(payload).ok().and_then(|bytes| String::from_utf8(bytes).ok()).ok_or(JwtError::Malformed("payload"))?;
        let expires_at = claims.exp.as_ref().and_then(Value::as_f64).ok_or(JwtError::Malformed("exp"))?;
        Ok(Claims { role, sub, universe, json, expires_at })
    }

    /// Signs `claims` as an HS256 token (dev tokens and tests).
    pub fn mint(&self, claims: &Value) -> String {
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &self.encoding)
            .expect("a JSON value always encodes")
    }
}

/// The library's refusal, in the gateway's words (safe to show the caller).
fn refusal(kind: &ErrorKind) -> JwtError {
    match kind {
        ErrorKind::InvalidSignature => JwtError::Signature,
        ErrorKind::InvalidAlgorithm | ErrorKind::InvalidAlgorithmName => JwtError::Algorithm,
        ErrorKind::ExpiredSignature => JwtError::Expired,
        ErrorKind::ImmatureSignature => JwtError::NotYetValid,
        ErrorKind::MissingRequiredClaim(_) => JwtError::Malformed("exp claim missing"),
        ErrorKind::Json(_) => JwtError::Malformed("header or payload is not the JSON a JWT holds"),
        ErrorKind::Base64(_) | ErrorKind::Utf8(_) => JwtError::Malformed("a part is not base64url"),
        _ => JwtError::Malformed("expected three dot-separated base64url parts"),
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    use base64::Engine;
    use hmac::{Hmac, Mac};
    use serde_json::json;
    use sha2::Sha256;

    fn key() -> JwtKey {
        JwtKey::new("secret")
    }

    /// A token signed by hand, so that tests can build headers the library would never write.
    fn token_with(header: &str, claims: &Value, secret: &str) -> String {
        let signing_input = format!("{}.{}", B64.encode(header), B64.encode(claims.to_string()));
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(signing_input.as_bytes());
        format!("{signing_input}.{}", B64.encode(mac.finalize().into_bytes()))
    }

    #[test]
    fn accepts_a_good_token_and_keeps_its_claims() {
        let now = unix_now();
        let t = key().mint(&json!({"sub": "u1", "role": "authenticated", "exp": now + 60, "x": 1}));
        let c = key().verify(&t).unwrap();
        assert_eq!(c.role, Role::Authenticated);
        assert_eq!(c.sub.as_deref(), Some("u1"));
        assert_eq!(serde_json::from_str::<Value>(&c.json).unwrap()["x"], 1);
        // Supabase's own tokens carry an audience; it does not stop them.
        let supabase = key().mint(&json!({"sub": "u1", "role": "authenticated", "aud": "authenticated", "exp": now + 60}));
        assert!(key().verify(&supabase).is_ok());
    }

    /// The payload reaches the database as the token holds it, digit for digit.
    #[test]
    fn claims_reach_the_database_as_the_token_holds_them() {
        let now = unix_now();
        let payload = format!(r#"{{"sub":"u1","role":"authenticated","exp":{},"app_metadata":{{"tenant":123456789012345678901234}},"big":1e400}}"#, now + 60);
        let signing_input = format!("{}.{}", B64.encode(r#"{"alg":"HS256","typ":"JWT"}"#), B64.encode(&payload));
        let mut mac = Hmac::<Sha256>::new_from_slice(b"secret").unwrap();
        mac.update(signing_input.as_bytes());
        let token = format!("{signing_input}.{}", B64.encode(mac.finalize().into_bytes()));
        let c = key().verify(&token).expect("a large number in a claim is no reason to refuse the token");
        assert_eq!(c.json, payload);
    }

    #[test]
    fn refuses_every_bad_token() {
        let now = unix_now();
        let good = json!({"sub": "u1", "role": "authenticated", "exp": now + 60});
        let cases: Vec<(String, JwtError)> = vec![
            (token_with(r#"{"alg":"HS256"}"#, &good, "other"), JwtError::Signature),
            (token_with(r#"{"alg":"HS512"}"#, &good, "secret"), JwtError::Algorithm),
            (token_with(r#"{"alg":"RS256"}"#, &good, "secret"), JwtError::Algorithm),
            (
                token_with(r#"{"alg":"HS256"}"#, &json!({"sub":"u","role":"authenticated","exp":now - 5}), "secret"),
                JwtError::Expired,
            ),
            (
                token_with(r#"{"alg":"HS256"}"#, &json!({"sub":"u","role":"authenticated"}), "secret"),
                JwtError::Malformed("exp claim missing"),
            ),
            (
                token_with(r#"{"alg":"HS256"}"#, &json!({"sub":"u","role":"postgres","exp":now + 60}), "secret"),
                JwtError::Role,
            ),
            (
                token_with(r#"{"alg":"HS256"}"#, &json!({"role":"authenticated","exp":now + 60}), "secret"),
                JwtError::Subject,
            ),
            (
                token_with(r#"{"alg":"HS256"}"#, &json!({"sub":"u","role":"anon","exp":now + 60,"nbf":now + 30}), "secret"),
                JwtError::NotYetValid,
            ),
        ];
        for (token, want) in cases {
            assert_eq!(key().verify(&token).unwrap_err(), want, "{token}");
        }
        // `alg: none`, signed or with an empty signature part, is never accepted.
        let none_signed = token_with(r#"{"alg":"none"}"#, &good, "secret");
        let none_empty = format!("{}.{}.", B64.encode(r#"{"alg":"none"}"#), B64.encode(good.to_string()));
        for token in [none_signed, none_empty] {
            assert!(key().verify(&token).is_err(), "{token}");
        }
        for garbage in ["", "a", "a.b", "a.b.c.d", "!!.??.**", "e30.e30.e30"] {
            assert!(key().verify(garbage).is_err(), "{garbage}");
        }
    }

    #[test]
    fn anon_needs_no_subject() {
        let t = key().mint(&json!({"role": "anon", "exp": unix_now() + 60}));
        assert_eq!(key().verify(&t).unwrap().role, Role::Anon);
    }
}

//! Per-caller admission: at most `--caller-concurrency` requests of one caller in flight, so that no
//! caller can hold the connection pool (and so every other caller's requests) by itself (a caller:
//! a token's `sub`, or without one its role at one address); and at
//! most `--wake-streams-per-caller` wake streams of one caller, `--max-wake-streams` in all.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use crate::jwt::Claims;

#[derive(Clone)]
pub struct CallerLimits {
    limit: usize,
    in_flight: Arc<Mutex<HashMap<String, usize>>>,
}

/// One admitted request; dropping it (however the request ends) gives the slot back.
pub struct Admitted {
    key: String,
    in_flight: Arc<Mutex<HashMap<String, usize>>>,
}

impl CallerLimits {
    pub fn new(limit: usize) -> CallerLimits {
        CallerLimits { limit: limit.max(1), in_flight: Arc::default() }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A slot for this caller, or `None` when it already has `limit` requests in flight. Callers
    /// are told apart by `sub`; tokens without one (anon: every visitor of a public app holds the
    /// same one) by their role and `address`, the address the request came from. They shared
    /// their role's slots: four uploads stalled on bad networks held every anonymous visitor's
    /// requests back until the body timeout.
    pub fn admit(&self, claims: &Claims, address: Option<IpAddr>) -> Option<Admitted> {
        let key = match (&claims.sub, address) {
            (Some(sub), _) => format!("sub:{sub}"),
            (None, Some(address)) => format!("role:{}@{address}", claims.role.as_str()),
            (None, None) => format!("role:{}", claims.role.as_str()),
        };
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        let count = in_flight.entry(key.clone()).or_default();
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(Admitted { key, in_flight: self.in_flight.clone() })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = in_flight.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                in_flight.remove(&self.key);
            }
        }
    }
}

/// Open wake streams: at most `per_caller` of one `sub` and at most `total` in all. A stream holds
/// a socket and a task for as long as its token lives (an hour, as Supabase issues them), so a
/// caller that opens stream after stream would hold the process's sockets and memory. Callers
/// without a `sub` (anon) cannot be told apart, so only `total` bounds theirs: a per-role share
/// would shut every anonymous visitor's wake-ups out behind the first few.
#[derive(Clone)]
pub struct StreamLimits {
    per_caller: usize,
    total: usize,
    open: Arc<Mutex<OpenStreams>>,
}

#[derive(Default)]
struct OpenStreams {
    total: usize,
    by_sub: HashMap<String, usize>,
}

/// One open stream; dropping it (however the stream ends) gives its place back.
pub struct StreamAdmitted {
    sub: Option<String>,
    open: Arc<Mutex<OpenStreams>>,
}

/// Why a stream was refused.
pub enum StreamRefusal {
    /// This caller has `per_caller` streams open.
    Caller(usize),
    /// The process has `total` streams open.
    Total(usize),
}

impl StreamLimits {
    /// `0` for either limit leaves it off.
    pub fn new(per_caller: usize, total: usize) -> StreamLimits {
        StreamLimits { per_caller, total, open: Arc::default() }
    }

    pub fn admit(&self, claims: &Claims) -> Result<StreamAdmitted, StreamRefusal> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if self.total > 0 && open.total >= self.total {
            return Err(StreamRefusal::Total(self.total));
        }
        if let Some(sub) = &claims.sub {
            let mine = open.by_sub.entry(sub.clone()).or_default();
            if self.per_caller > 0 && *mine >= self.per_caller {
                return Err(StreamRefusal::Caller(self.per_caller));
            }
            *mine += 1;
        }
        open.total += 1;
        Ok(StreamAdmitted { sub: claims.sub.clone(), open: self.open.clone() })
    }
}

impl Drop for StreamAdmitted {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.total = open.total.saturating_sub(1);
        if let Some(sub) = &self.sub {
            if let Some(count) = open.by_sub.get_mut(sub) {
                *count -= 1;
                if *count == 0 {
                    open.by_sub.remove(sub);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jwt::Role;

    fn claims(sub: Option<&str>) -> Claims {
        Claims { role: Role::Authenticated, sub: sub.map(str::to_owned), universe: None, json: "{}".into(), expires_at: 0.0 }
    }

    #[test]
    fn a_caller_gets_its_share_and_no_more_and_slots_come_back() {
        let limits = CallerLimits::new(2);
        let here: IpAddr = "192.0.2.1".parse().unwrap();
        let there: IpAddr = "192.0.2.2".parse().unwrap();
        let a1 = limits.admit(&claims(Some("a")), Some(here)).unwrap();
        let _a2 = limits.admit(&claims(Some("a")), Some(there)).unwrap();
        assert!(limits.admit(&claims(Some("a")), None).is_none(), "a sub is one caller wherever it is");
        assert!(limits.admit(&claims(Some("b")), Some(here)).is_some(), "another caller is not affected");
        drop(a1);
        assert!(limits.admit(&claims(Some("a")), Some(here)).is_some());
        // Without a sub, an address is a caller.
        let _n1 = limits.admit(&claims(None), Some(here)).unwrap();
        let _n2 = limits.admit(&claims(None), Some(here)).unwrap();
        assert!(limits.admit(&claims(None), Some(here)).is_none());
        assert!(limits.admit(&claims(None), Some(there)).is_some());
    }

    #[test]
    fn wake_streams_are_bounded_per_caller_and_in_all_and_anon_only_in_all() {
        let limits = StreamLimits::new(2, 4);
        let a1 = limits.admit(&claims(Some("a"))).ok().unwrap();
        let _a2 = limits.admit(&claims(Some("a"))).ok().unwrap();
        assert!(matches!(limits.admit(&claims(Some("a"))), Err(StreamRefusal::Caller(2))));
        let _anon = limits.admit(&claims(None)).ok().unwrap();
        let _anon2 = limits.admit(&claims(None)).ok().unwrap();
        assert!(matches!(limits.admit(&claims(Some("b"))), Err(StreamRefusal::Total(4))));
        drop(a1);
        assert!(limits.admit(&claims(Some("a"))).is_ok(), "a place comes back when its stream ends");
    }
}

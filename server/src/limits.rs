//! Admission: how much of the gateway one caller may hold at once, so that no caller holds the
//! connection pool (and so every other caller's requests), or the process's sockets, by itself.
//!
//! A caller is a token's `sub`. Tokens without one (anon: every visitor of a public app holds the
//! same one) are told apart by the address a request came from (`address_group`), and all of them
//! together hold at most a share of their own: an address is cheap to come by (an IPv6 /64 holds
//! 2^64), so per address alone a few hosts could hold the whole pool, and one share for all of
//! them let one upload stalled on a bad network hold every visitor's requests back.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use crate::jwt::Claims;

/// Counts per key; one admission counts under several keys at once (a caller's, all callers').
#[derive(Clone, Default)]
struct Counts(Arc<Mutex<HashMap<String, usize>>>);

/// A place under each of its keys; dropping it (however the request or stream ends) gives them back.
pub struct Admitted {
    keys: Vec<String>,
    counts: Counts,
}

impl Counts {
    /// A place under every key, each below its limit (0: no limit), or the position and limit of
    /// the first key that is full.
    fn admit(&self, keys: Vec<(String, usize)>) -> Result<Admitted, (usize, usize)> {
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let full = keys.iter().position(|(key, limit)| *limit > 0 && counts.get(key).copied().unwrap_or(0) >= *limit);
        if let Some(full) = full {
            return Err((full, keys[full].1));
        }
        for (key, _) in &keys {
            *counts.entry(key.clone()).or_default() += 1;
        }
        Ok(Admitted { keys: keys.into_iter().map(|(key, _)| key).collect(), counts: self.clone() })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut counts = self.counts.0.lock().unwrap_or_else(|e| e.into_inner());
        for key in &self.keys {
            if let Some(count) = counts.get_mut(key) {
                *count -= 1;
                if *count == 0 {
                    counts.remove(key);
                }
            }
        }
    }
}

/// Who a caller is, for its share: its `sub`, or without one its role at `address`.
fn caller_key(claims: &Claims, address: Option<IpAddr>) -> String {
    match (&claims.sub, address) {
        (Some(sub), _) => format!("sub:{sub}"),
        (None, Some(address)) => format!("anon:{}@{}", claims.role.as_str(), address_group(address)),
        (None, None) => format!("anon:{}", claims.role.as_str()),
    }
}

/// The addresses one anonymous caller may hold: one IPv4 address (also when it comes mapped into
/// IPv6), or an IPv6 /64, the block one host is given.
fn address_group(address: IpAddr) -> String {
    match address.to_canonical() {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
        }
    }
}

/// Requests in flight: `--caller-concurrency` of one caller, and half the pool (at least one
/// caller's share) for all callers without a `sub` together.
#[derive(Clone)]
pub struct CallerLimits {
    limit: usize,
    anonymous: usize,
    counts: Counts,
}

impl CallerLimits {
    pub fn new(limit: usize, pool_size: usize) -> CallerLimits {
        let limit = limit.max(1);
        CallerLimits { limit, anonymous: (pool_size / 2).max(limit), counts: Counts::default() }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A place for this caller's request, or `None` when it (or, without a `sub`, every such
    /// caller together) already has its share in flight. `address`: where the request came from.
    pub fn admit(&self, claims: &Claims, address: Option<IpAddr>) -> Option<Admitted> {
        let mut keys = vec![(caller_key(claims, address), self.limit)];
        if claims.sub.is_none() {
            keys.push(("anon".to_string(), self.anonymous));
        }
        self.counts.admit(keys).ok()
    }
}

/// Open wake streams: `--wake-streams-per-caller` of one caller, `--max-wake-streams` in all, and
/// half of those for callers without a `sub` together. A stream holds a socket and a task for as
/// long as its token lives (an hour, as Supabase issues them).
#[derive(Clone)]
pub struct StreamLimits {
    per_caller: usize,
    total: usize,
    counts: Counts,
}

/// Why a stream was refused.
pub enum StreamRefusal {
    /// This caller has this many streams open.
    Caller(usize),
    /// The process has this many streams open (for callers without a `sub`: they have).
    Total(usize),
}

impl StreamLimits {
    /// `0` for either limit leaves it off.
    pub fn new(per_caller: usize, total: usize) -> StreamLimits {
        StreamLimits { per_caller, total, counts: Counts::default() }
    }

    pub fn admit(&self, claims: &Claims, address: Option<IpAddr>) -> Result<Admitted, StreamRefusal> {
        let mut keys = vec![(caller_key(claims, address), self.per_caller), ("all".to_string(), self.total)];
        if claims.sub.is_none() && self.total > 0 {
            keys.push(("anon".to_string(), (self.total / 2).max(1)));
        }
        // The caller's key comes first.
        self.counts.admit(keys).map_err(|(full, limit)| if full == 0 { StreamRefusal::Caller(limit) } else { StreamRefusal::Total(limit) })
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
        let limits = CallerLimits::new(2, 16);
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

    /// Anonymous callers are one caller per IPv4 address (mapped into IPv6 or not) and per IPv6
    /// /64, and all of them together hold at most half the pool.
    #[test]
    fn anonymous_callers_hold_a_share_per_address_block_and_half_the_pool_in_all() {
        let limits = CallerLimits::new(2, 8);
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        let _v4 = limits.admit(&claims(None), ip("192.0.2.1")).unwrap();
        let _mapped = limits.admit(&claims(None), ip("::ffff:192.0.2.1")).unwrap();
        assert!(limits.admit(&claims(None), ip("192.0.2.1")).is_none(), "one address, however written");
        let _v6 = limits.admit(&claims(None), ip("2001:db8:0:1::1")).unwrap();
        let _same_block = limits.admit(&claims(None), ip("2001:db8:0:1::2")).unwrap();
        assert!(limits.admit(&claims(None), ip("2001:db8:0:1:ffff::9")).is_none(), "one /64");
        assert!(limits.admit(&claims(None), ip("2001:db8:0:2::1")).is_none(), "half the pool of 8 is held");
        assert!(limits.admit(&claims(Some("a")), ip("2001:db8:0:2::1")).is_some(), "the other half is the signed-in callers'");
    }

    #[test]
    fn wake_streams_are_bounded_per_caller_and_in_all() {
        let limits = StreamLimits::new(2, 6);
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        let a1 = limits.admit(&claims(Some("a")), ip("192.0.2.1")).ok().unwrap();
        let _a2 = limits.admit(&claims(Some("a")), ip("192.0.2.2")).ok().unwrap();
        assert!(matches!(limits.admit(&claims(Some("a")), ip("192.0.2.3")), Err(StreamRefusal::Caller(2))));
        let anon: Vec<_> = ["192.0.2.1", "192.0.2.2", "192.0.2.3"].iter().map(|a| limits.admit(&claims(None), ip(a)).ok().unwrap()).collect();
        assert!(matches!(limits.admit(&claims(None), ip("192.0.2.4")), Err(StreamRefusal::Total(3))), "anon callers hold half in all");
        let _b = limits.admit(&claims(Some("b")), ip("192.0.2.4")).ok().unwrap();
        assert!(matches!(limits.admit(&claims(Some("c")), ip("192.0.2.5")), Err(StreamRefusal::Total(6))));
        drop(a1);
        assert!(limits.admit(&claims(Some("a")), ip("192.0.2.1")).is_ok(), "a place comes back when its stream ends");
        drop(anon);
    }
}

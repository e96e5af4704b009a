//! Per-caller admission: at most `--caller-concurrency` requests of one caller in flight, so that no
//! caller can hold the connection pool (and so every other caller's requests) by itself.

use std::collections::HashMap;
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
    /// are told apart by `sub`; tokens without one (anon) share their role's slots.
    pub fn admit(&self, claims: &Claims) -> Option<Admitted> {
        let key = match &claims.sub {
            Some(sub) => format!("sub:{sub}"),
            None => format!("role:{}", claims.role.as_str()),
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
        let a1 = limits.admit(&claims(Some("a"))).unwrap();
        let _a2 = limits.admit(&claims(Some("a"))).unwrap();
        assert!(limits.admit(&claims(Some("a"))).is_none());
        assert!(limits.admit(&claims(Some("b"))).is_some(), "another caller is not affected");
        drop(a1);
        assert!(limits.admit(&claims(Some("a"))).is_some());
    }
}

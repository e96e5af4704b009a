//! Exponential backoff with jitter, capped.
//!
//! The n-th consecutive failure waits a random time in `[d/2, d]` where
//! `d = min(retry_max, retry_base * 2^(n-1))` ("equal jitter"): the lower half keeps the
//! growth, the random half spreads devices that failed together (a server restart) apart.

use crate::prng::Prng;
use crate::records::Millis;

/// The ceiling `d` for the `failures`-th consecutive failure (`failures >= 1`).
pub fn ceiling(failures: u32, base: Millis, max: Millis) -> Millis {
    let exponent = failures.saturating_sub(1).min(40);
    base.max(1).saturating_mul(1i64 << exponent).min(max.max(1))
}

/// The wait after the `failures`-th consecutive failure: uniform in `[d/2, d]`.
pub fn delay(failures: u32, base: Millis, max: Millis, prng: &mut Prng) -> Millis {
    let d = ceiling(failures, base, max);
    d - prng.below_or_eq(d / 2)
}

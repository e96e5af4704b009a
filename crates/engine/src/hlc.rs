//! The origin hybrid logical clock: `{physical_ms:013}-{counter:04}-{client_id}`.
//!
//! Monotonic per device: each new value is greater than the last one issued (which is persisted
//! in `Meta::hlc_last`), even when the wall clock steps back. The fixed-width fields make the
//! string order equal to the clock order, so the server may compare them as text.

use uuid::Uuid;

use crate::records::Millis;

/// The largest counter the 4-digit field holds; past it the physical part is advanced by 1 ms.
const MAX_COUNTER: u32 = 9999;

/// Issues the next HLC after `last` (if any) at wall time `now`.
pub fn next_hlc(last: Option<&str>, now: Millis, client_id: Uuid) -> String {
    let now = now.max(0);
    let (physical, counter) = match last.and_then(parse) {
        Some((last_ms, last_counter)) if last_ms >= now => {
            if last_counter >= MAX_COUNTER {
                (last_ms + 1, 0)
            } else {
                (last_ms, last_counter + 1)
            }
        }
        _ => (now, 0),
    };
    format!("{:013}-{:04}-{}", physical, counter, client_id)
}

/// Reads the physical and counter parts of an HLC this module issued.
pub fn parse(hlc: &str) -> Option<(Millis, u32)> {
    let mut parts = hlc.splitn(3, '-');
    let physical = parts.next()?.parse().ok()?;
    let counter = parts.next()?.parse().ok()?;
    Some((physical, counter))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_when_the_clock_steps_back() {
        let c = Uuid::nil();
        let a = next_hlc(None, 5_000, c);
        let b = next_hlc(Some(&a), 4_000, c);
        let d = next_hlc(Some(&b), 6_000, c);
        assert_eq!(a, format!("0000000005000-0000-{c}"));
        assert_eq!(b, format!("0000000005000-0001-{c}"));
        assert!(a < b && b < d);
        assert_eq!(parse(&d), Some((6_000, 0)));
    }

    #[test]
    fn counter_overflow_advances_physical() {
        let c = Uuid::nil();
        let last = format!("0000000005000-9999-{c}");
        assert_eq!(next_hlc(Some(&last), 1, c), format!("0000000005001-0000-{c}"));
    }
}

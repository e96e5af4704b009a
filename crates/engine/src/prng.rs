//! A tiny deterministic random source (SplitMix64) for mutation ids and backoff jitter.
//!
//! The engine has no entropy of its own: the adapter passes a seed (from
//! `crypto.getRandomValues`), and tests pass a fixed one to replay exactly. The seed is mixed
//! with the client id and `next_seq`, so even a constant seed cannot repeat an id: an id is only
//! drawn together with a new `seq`, which is persisted in the same transaction.

use uuid::Uuid;

/// SplitMix64: one `u64` of state, passes BigCrush, trivially portable to wasm.
#[derive(Debug, Clone)]
pub struct Prng {
    state: u64,
}

impl Prng {
    /// A generator whose stream is fixed by `seed`.
    pub fn new(seed: u64) -> Prng {
        Prng { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform integer in `0..=max` (`max >= 0`).
    pub fn below_or_eq(&mut self, max: i64) -> i64 {
        if max <= 0 {
            return 0;
        }
        (self.next_u64() % (max as u64 + 1)) as i64
    }

    /// A random (version 4) UUID.
    pub fn uuid_v4(&mut self) -> Uuid {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.next_u64().to_le_bytes());
        bytes[8..].copy_from_slice(&self.next_u64().to_le_bytes());
        uuid::Builder::from_random_bytes(bytes).into_uuid()
    }
}

/// Folds the client id and the next sequence number into the caller's seed (see module docs).
pub(crate) fn mix_seed(seed: u64, client_id: Uuid, next_seq: i64) -> u64 {
    let (hi, lo) = client_id.as_u64_pair();
    let mut mixer = Prng::new(seed ^ hi.rotate_left(17) ^ lo ^ (next_seq as u64).rotate_left(41));
    mixer.next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_v4_ids() {
        let (mut a, mut b) = (Prng::new(7), Prng::new(7));
        assert_eq!(a.next_u64(), b.next_u64());
        let id = a.uuid_v4();
        assert_eq!(id.get_version_num(), 4);
        assert_ne!(id, a.uuid_v4());
    }

    #[test]
    fn below_or_eq_stays_in_range() {
        let mut p = Prng::new(1);
        for _ in 0..10_000 {
            let v = p.below_or_eq(10);
            assert!((0..=10).contains(&v));
        }
    }
}

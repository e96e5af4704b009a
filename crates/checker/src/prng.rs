//! The history's randomness: the engine's seeded generator, with the helpers a workload needs.

pub struct Prng(kizuna_engine::util::Prng);

impl Prng {
    pub fn new(seed: u64) -> Prng {
        Prng(kizuna_engine::util::Prng::new(seed))
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.next_u64() % n.max(1)
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

//! Sorting and ordered collections built through one sort. The standard library's sort is
//! generated anew for each element type and comparison, about 4 KB of wasm each, and collecting
//! into a `BTreeSet` or `BTreeMap` sorts with one more: the client carried nine of them
//! (2026-12-07). Here every sort orders positions through a comparison passed by reference, so the
//! package holds one, and the items are moved once.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

/// Sorts `items` by `compare`, stably (equal items keep their order).
pub fn sort_by<T>(items: &mut Vec<T>, compare: impl Fn(&T, &T) -> Ordering) {
    if items.len() < 2 {
        return;
    }
    let order = sorted_positions(items.len(), &|a, b| compare(&items[a], &items[b]));
    let mut slots: Vec<Option<T>> = std::mem::take(items).into_iter().map(Some).collect();
    // `order` names every position once, so every slot is taken once.
    items.extend(order.into_iter().filter_map(|i| slots[i].take()));
}

/// Sorts `items` in their own order, stably.
pub fn sort<T: Ord>(items: &mut Vec<T>) {
    sort_by(items, T::cmp);
}

/// Sorts `items` by the key `key` gives each, stably.
pub fn sort_by_key<T, K: Ord>(items: &mut Vec<T>, key: impl Fn(&T) -> K) {
    sort_by(items, |a, b| key(a).cmp(&key(b)));
}

/// The set of `items`, built by inserting each (`collect` sorts them first, with a sort of its own).
pub fn set_of<T: Ord>(items: impl IntoIterator<Item = T>) -> BTreeSet<T> {
    let mut set = BTreeSet::new();
    set.extend(items);
    set
}

/// The map of `entries`, built by inserting each: a later entry of a key replaces an earlier one,
/// as `collect` does.
pub fn map_of<K: Ord, V>(entries: impl IntoIterator<Item = (K, V)>) -> BTreeMap<K, V> {
    let mut map = BTreeMap::new();
    map.extend(entries);
    map
}

/// The positions `0..len` in the order `compare` gives them: the one sort the package holds.
fn sorted_positions(len: usize, compare: &dyn Fn(usize, usize) -> Ordering) -> Vec<usize> {
    let mut order: Vec<usize> = (0..len).collect();
    order.sort_by(|&a, &b| compare(a, b));
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_stably_and_builds_sets_and_maps_as_collect_does() {
        let mut pairs = vec![(2, "a"), (1, "b"), (2, "c"), (1, "d"), (0, "e")];
        sort_by_key(&mut pairs, |p| p.0);
        assert_eq!(pairs, [(0, "e"), (1, "b"), (1, "d"), (2, "a"), (2, "c")]);
        let mut words = vec!["pear".to_string(), "apple".into(), "fig".into()];
        sort(&mut words);
        assert_eq!(words, ["apple", "fig", "pear"]);
        let mut one = vec![5];
        sort(&mut one);
        assert_eq!(one, [5]);
        assert_eq!(set_of([3, 1, 3, 2]), [1, 2, 3].into_iter().collect::<BTreeSet<_>>());
        assert_eq!(map_of([(1, "x"), (0, "y"), (1, "z")]), [(0, "y"), (1, "z")].into_iter().collect::<BTreeMap<_, _>>());
    }
}

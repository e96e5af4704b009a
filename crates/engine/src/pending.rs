//! The live outbox: entries by `seq` (issue order), with each key's entries and each batch's
//! members at hand. Settling a verdict, replaying a key's pending writes and asking whether a key
//! is tracked look a key up here instead of scanning every pending write (with 10,000 pending,
//! each 64-write slice did that for each of its keys); the delivery units are read from the head
//! of the outbox only as far as the caller goes (every local write asks when the next push is
//! due, and building every unit cost it a walk of the whole outbox).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use uuid::Uuid;

use crate::records::{OutboxEntry, RowKey};

#[derive(Debug, Default, Clone)]
pub(crate) struct Outbox {
    entries: BTreeMap<i64, OutboxEntry>,
    by_key: HashMap<RowKey, BTreeSet<i64>>,
    by_batch: HashMap<Uuid, BTreeSet<i64>>,
}

impl Outbox {
    pub fn insert(&mut self, seq: i64, entry: OutboxEntry) -> Option<OutboxEntry> {
        let replaced = self.entries.remove(&seq);
        if let Some(old) = &replaced {
            self.forget(old);
        }
        self.by_key.entry(entry.key()).or_default().insert(seq);
        if let Some(batch) = entry.batch {
            self.by_batch.entry(batch).or_default().insert(seq);
        }
        self.entries.insert(seq, entry);
        replaced
    }

    pub fn remove(&mut self, seq: &i64) -> Option<OutboxEntry> {
        let removed = self.entries.remove(seq)?;
        self.forget(&removed);
        Some(removed)
    }

    fn forget(&mut self, entry: &OutboxEntry) {
        forget_in(&mut self.by_key, &entry.key(), entry.seq);
        if let Some(batch) = entry.batch {
            forget_in(&mut self.by_batch, &batch, entry.seq);
        }
    }

    pub fn get(&self, seq: &i64) -> Option<&OutboxEntry> {
        self.entries.get(seq)
    }

    /// An entry to change in place; its key and batch must stay as they are.
    pub fn get_mut(&mut self, seq: &i64) -> Option<&mut OutboxEntry> {
        self.entries.get_mut(seq)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &OutboxEntry> {
        self.entries.values()
    }

    /// Every entry to change in place; their keys and batches must stay as they are.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut OutboxEntry> {
        self.entries.values_mut()
    }

    pub fn keys(&self) -> impl Iterator<Item = &i64> {
        self.entries.keys()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries for `key`, in seq order.
    pub fn for_key<'a>(&'a self, key: &RowKey) -> impl Iterator<Item = &'a OutboxEntry> + 'a {
        self.by_key.get(key).into_iter().flatten().map(|seq| &self.entries[seq])
    }

    pub fn has_key(&self, key: &RowKey) -> bool {
        self.by_key.contains_key(key)
    }

    /// Every key with a pending entry.
    pub fn pending_keys(&self) -> impl Iterator<Item = &RowKey> {
        self.by_key.keys()
    }

    /// The delivery units in issue order, each its entries' seqs: an entry outside a batch alone,
    /// a batch whole at the place of its first member. Lazy: a caller that stops at the first
    /// unit it can send reads only the outbox's head.
    pub fn units(&self) -> impl Iterator<Item = Vec<i64>> + '_ {
        self.entries.values().filter_map(|entry| match entry.batch {
            None => Some(vec![entry.seq]),
            Some(batch) => {
                let members = &self.by_batch[&batch];
                (members.first() == Some(&entry.seq)).then(|| members.iter().copied().collect())
            }
        })
    }
}

fn forget_in<K: std::hash::Hash + Eq>(index: &mut HashMap<K, BTreeSet<i64>>, key: &K, seq: i64) {
    if let Some(seqs) = index.get_mut(key) {
        seqs.remove(&seq);
        if seqs.is_empty() {
            index.remove(key);
        }
    }
}

impl std::ops::Index<&i64> for Outbox {
    type Output = OutboxEntry;

    fn index(&self, seq: &i64) -> &OutboxEntry {
        &self.entries[seq]
    }
}

impl FromIterator<(i64, OutboxEntry)> for Outbox {
    fn from_iter<I: IntoIterator<Item = (i64, OutboxEntry)>>(entries: I) -> Outbox {
        let mut outbox = Outbox::default();
        for (seq, entry) in entries {
            outbox.insert(seq, entry);
        }
        outbox
    }
}

#[cfg(test)]
mod tests {
    use super::Outbox;
    use crate::records::OutboxEntry;
    use kizuna_protocol::Op;
    use uuid::Uuid;

    fn entry(seq: i64, batch: Option<u128>) -> (i64, OutboxEntry) {
        let entry = OutboxEntry {
            seq,
            id: Uuid::from_u128(seq as u128),
            table: "t".into(),
            pk: seq.to_string(),
            op: Op::Delete,
            columns: None,
            hlc: String::new(),
            read_seq: 0,
            batch: batch.map(Uuid::from_u128),
            apply_after: None,
            latest_only: false,
            created_at: 0,
            sent: false,
            attempts: 0,
            permanent_failures: 0,
            retry_at: None,
            last_error: None,
        };
        (seq, entry)
    }

    #[test]
    fn a_batch_is_one_unit_at_the_place_of_its_first_member_still_pending() {
        let mut outbox: Outbox = [entry(1, None), entry(2, Some(7)), entry(3, None), entry(4, Some(7)), entry(5, Some(8))].into_iter().collect();
        assert_eq!(outbox.units().collect::<Vec<_>>(), vec![vec![1], vec![2, 4], vec![3], vec![5]]);
        outbox.remove(&2);
        assert_eq!(outbox.units().collect::<Vec<_>>(), vec![vec![1], vec![3], vec![4], vec![5]]);
        outbox.remove(&4);
        outbox.insert(6, entry(6, Some(8)).1);
        assert_eq!(outbox.units().collect::<Vec<_>>(), vec![vec![1], vec![3], vec![5, 6]]);
    }
}

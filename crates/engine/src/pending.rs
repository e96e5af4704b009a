//! The live outbox: entries by `seq` (issue order), with each key's entries at hand. Settling a
//! verdict, replaying a key's pending writes and asking whether a key is tracked look a key up here
//! instead of scanning every pending write (with 10,000 pending, each 64-write slice did that for
//! each of its keys).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::records::{OutboxEntry, RowKey};

#[derive(Debug, Default, Clone)]
pub(crate) struct Outbox {
    entries: BTreeMap<i64, OutboxEntry>,
    by_key: HashMap<RowKey, BTreeSet<i64>>,
}

impl Outbox {
    pub fn insert(&mut self, seq: i64, entry: OutboxEntry) -> Option<OutboxEntry> {
        let replaced = self.entries.remove(&seq);
        if let Some(old) = &replaced {
            self.forget(seq, &old.key());
        }
        self.by_key.entry(entry.key()).or_default().insert(seq);
        self.entries.insert(seq, entry);
        replaced
    }

    pub fn remove(&mut self, seq: &i64) -> Option<OutboxEntry> {
        let removed = self.entries.remove(seq)?;
        self.forget(*seq, &removed.key());
        Some(removed)
    }

    fn forget(&mut self, seq: i64, key: &RowKey) {
        if let Some(seqs) = self.by_key.get_mut(key) {
            seqs.remove(&seq);
            if seqs.is_empty() {
                self.by_key.remove(key);
            }
        }
    }

    pub fn get(&self, seq: &i64) -> Option<&OutboxEntry> {
        self.entries.get(seq)
    }

    /// An entry to change in place; its key must stay as it is.
    pub fn get_mut(&mut self, seq: &i64) -> Option<&mut OutboxEntry> {
        self.entries.get_mut(seq)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &OutboxEntry> {
        self.entries.values()
    }

    /// Every entry to change in place; their keys must stay as they are.
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

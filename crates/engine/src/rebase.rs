//! Replaying writes over a row: the one rule behind local writes, verdicts and checkpoints.
//!
//! `visible = replay(pending writes for the key, in seq order) over base`: so unsent edits stay
//! on screen and the columns they do not touch show whatever the server says underneath.

use kizuna_protocol::{Op, Row};

use crate::records::{OutboxEntry, RowRecord};
use crate::transaction::StoreOp;

/// One write over a row, as the server applies it: upsert creates the row or assigns the columns
/// it names (the others keep their values), patch assigns the columns it names (over nothing it
/// yields just those, so the writer reads its own write), delete removes. The write's columns are
/// given up: over no row they become the row without a copy (a verdict folding a new row into its
/// base).
pub fn apply_owned(row: Option<Row>, op: Op, columns: Option<Row>) -> Option<Row> {
    match (op, row) {
        (Op::Delete, _) => None,
        (_, None) => Some(columns.unwrap_or_default()),
        (_, Some(mut merged)) => {
            merged.extend(columns.unwrap_or_default());
            Some(merged)
        }
    }
}

/// `apply_owned` with a write's columns copied (a write that stays pending).
pub fn apply_op(row: Option<Row>, op: Op, columns: Option<&Row>) -> Option<Row> {
    apply_owned(row, op, columns.filter(|_| op != Op::Delete).cloned())
}

/// Replays `pending` (already in seq order) over `base`.
pub fn replay<'a>(base: Option<&Row>, pending: impl IntoIterator<Item = &'a OutboxEntry>) -> Option<Row> {
    pending.into_iter().fold(base.cloned(), |row, entry| apply_op(row, entry.op, entry.columns.as_ref()))
}

/// The store operation that persists `record`: a record with neither a base nor a visible
/// row carries no information, so it is deleted rather than kept as an empty shell.
pub fn row_op(record: RowRecord) -> StoreOp {
    if record.base.is_none() && record.visible.is_none() {
        StoreOp::DeleteRow(record.key())
    } else {
        StoreOp::PutRow(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(v: serde_json::Value) -> Row {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn patch_and_upsert_assign_the_named_columns_delete_removes() {
        let base = row(json!({"a": 1, "b": 2}));
        assert_eq!(apply_op(Some(base.clone()), Op::Patch, Some(&row(json!({"b": 3})))), Some(row(json!({"a": 1, "b": 3}))));
        assert_eq!(apply_op(Some(base.clone()), Op::Upsert, Some(&row(json!({"c": 4})))), Some(row(json!({"a": 1, "b": 2, "c": 4}))));
        assert_eq!(apply_op(None, Op::Upsert, Some(&row(json!({"c": 4})))), Some(row(json!({"c": 4}))));
        assert_eq!(apply_op(Some(base), Op::Delete, None), None);
        assert_eq!(apply_op(None, Op::Patch, Some(&row(json!({"b": 3})))), Some(row(json!({"b": 3}))));
    }

    #[test]
    fn apply_owned_yields_what_apply_op_yields() {
        let base = row(json!({"a": 1, "b": 2}));
        for op in [Op::Upsert, Op::Patch, Op::Delete] {
            for over in [None, Some(base.clone())] {
                for columns in [None, Some(row(json!({"b": 3, "c": 4})))] {
                    assert_eq!(apply_owned(over.clone(), op, columns.clone()), apply_op(over.clone(), op, columns.as_ref()));
                }
            }
        }
    }
}

use super::*;
use serde_json::json;

#[test]
fn mutation_omits_absent_optionals() {
    let m = Mutation {
        id: Uuid::nil(),
        client_seq: 1,
        table: "todos".into(),
        pk: "a".into(),
        op: Op::Delete,
        columns: None,
        hlc: None,
        read_seq: 0,
        batch: None,
        apply_after: None,
    };
    let v = serde_json::to_value(&m).unwrap();
    assert_eq!(
        v,
        json!({"id": Uuid::nil(), "client_seq": 1, "table": "todos", "pk": "a", "op": "delete", "read_seq": 0})
    );
}

#[test]
fn tombstone_and_row_entries_round_trip() {
    let page: PullPage = serde_json::from_value(json!({
        "entries": [
            {"seq": 3, "table": "t", "pk": "1", "bucket": "b", "row": {"id": "1"}},
            {"seq": 4, "table": "t", "pk": "2", "bucket": "b", "deleted": true}
        ],
        "cursor": "c", "done": true, "horizon": 4, "lifecycle": "CHECKPOINT_EXPIRED"
    }))
    .unwrap();
    assert!(page.entries[1].deleted && page.entries[1].row.is_none());
    assert_eq!(page.lifecycle, Some(Lifecycle::CheckpointExpired));
    let back = serde_json::to_value(&page.entries[1]).unwrap();
    assert_eq!(back, json!({"seq": 4, "table": "t", "pk": "2", "bucket": "b", "deleted": true}));
}

#[test]
fn a_page_total_is_optional_and_omitted_when_absent() {
    let page = |extra: serde_json::Value| {
        let mut v = json!({"entries": [], "cursor": "c", "done": false, "horizon": 4});
        v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        serde_json::from_value::<PullPage>(v).unwrap()
    };
    assert_eq!(page(json!({})).total, None, "an older pack sends none");
    assert_eq!(page(json!({"total": null})).total, None, "past the server's cap");
    assert_eq!(page(json!({"total": 12})).total, Some(12));
    assert!(serde_json::to_value(page(json!({}))).unwrap().get("total").is_none());
}

#[test]
fn rejected_verdict_with_null_row() {
    let v: Verdict = serde_json::from_value(json!({
        "id": Uuid::nil(), "status": "REJECTED", "reason": "RLS_DENIED", "server_row": null, "replayed": false
    }))
    .unwrap();
    assert_eq!(v.reason, Some(Reason::RlsDenied));
    assert_eq!(v.server_row, None);
}

#[test]
fn classification_keeps_unknown_failures_retryable() {
    assert_eq!(ErrorClass::of(Some(400), Some(codes::MALFORMED)), ErrorClass::Permanent);
    assert_eq!(ErrorClass::of(Some(400), Some(codes::BATCH_TOO_LARGE)), ErrorClass::Permanent);
    assert_eq!(ErrorClass::of(Some(413), None), ErrorClass::Permanent);
    assert_eq!(ErrorClass::of(Some(503), None), ErrorClass::Retryable);
    assert_eq!(ErrorClass::of(Some(401), Some(codes::UNAUTHORIZED)), ErrorClass::Retryable);
    // Any other refusal of the request as it is (PostgREST's 400 for a value PostgreSQL cannot
    // store, 403 for privileges) is permanent; the session, the url and the server's load are not.
    assert_eq!(ErrorClass::of(Some(400), Some("22P05")), ErrorClass::Permanent);
    assert_eq!(ErrorClass::of(Some(403), Some("42501")), ErrorClass::Permanent);
    assert_eq!(ErrorClass::of(Some(409), Some("23505")), ErrorClass::Permanent);
    assert_eq!(ErrorClass::of(Some(404), Some("KZG04")), ErrorClass::Retryable);
    assert_eq!(ErrorClass::of(Some(429), Some("KZG05")), ErrorClass::Retryable);
    assert_eq!(ErrorClass::of(Some(500), Some("XX000")), ErrorClass::Retryable);
    assert!(ErrorClass::is_size_refusal(codes::BODY_TOO_LARGE) && ErrorClass::is_size_refusal(codes::BATCH_TOO_LARGE));
    assert!(!ErrorClass::is_size_refusal(codes::MALFORMED));
    assert_eq!(ErrorClass::of(None, Some(codes::NETWORK)), ErrorClass::Retryable);
}

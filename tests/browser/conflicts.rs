//! Column order by the writers' clocks and the conflict journal, against the real server: the
//! `notes` table of server/sql/examples/notes.sql is in hlc mode with the journal on.

use serde_json::json;
use wasm_bindgen_test::wasm_bindgen_test;

use crate::support::*;

#[wasm_bindgen_test]
async fn in_hlc_mode_the_later_clock_holds_a_column_and_the_device_that_lost_is_told() {
    let user = random_id();
    let id = random_id();
    let a = open(&options(&format!("hlc-a-{}", random_id()), &user)).await;
    let b = open(&options(&format!("hlc-b-{}", random_id()), &user)).await;
    ok(a.put("notes".into(), id.clone().into(), to_js(&json!({"id": id, "body": "first", "color": "red"})), None)).await;
    ok(a.sync()).await;
    ok(b.sync()).await;

    // A edits first but pushes last; B edits the body later and pushes first.
    let conflicts = record(&a, "conflicts");
    ok(a.patch("notes".into(), id.clone().into(), to_js(&json!({"body": "from a", "color": "blue"})), None)).await;
    sleep(5).await;
    ok(b.patch("notes".into(), id.clone().into(), to_js(&json!({"body": "from b"})), None)).await;
    ok(b.sync()).await;
    let report = ok(a.sync()).await;
    assert!(report["pushError"].is_null(), "{report}");

    let row = ok(a.get("notes".into(), id.clone().into())).await;
    assert_eq!(row["body"], "from b", "the later clock holds the body, though its write arrived first: {row}");
    assert_eq!(row["color"], "blue", "the column only A wrote is A's: {row}");
    ok(b.sync()).await;
    assert_eq!(ok(b.get("notes".into(), id.clone().into())).await, row, "both devices converge");

    assert_eq!(conflicts.length(), 1, "one conflicts event, after the commit that settled the row");
    let list = from_js(conflicts.get(0))["conflicts"].clone();
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list[0]["table"], "notes");
    assert_eq!(list[0]["pk"], id.as_str());
    assert_eq!(list[0]["column"], "body");
    assert_eq!(list[0]["loser"], "from a", "the journal kept the value that lost: {list}");
    assert_eq!(list[0]["winner"], "from b");
    a.close();
    b.close();
}

#[wasm_bindgen_test]
async fn with_the_journal_off_a_contested_column_raises_no_conflicts_event() {
    let user = random_id();
    let id = random_id();
    let a = open(&options(&format!("arrival-a-{}", random_id()), &user)).await;
    let b = open(&options(&format!("arrival-b-{}", random_id()), &user)).await;
    ok(a.put("todos".into(), id.clone().into(), to_js(&json!({"id": id, "title": "first"})), None)).await;
    ok(a.sync()).await;
    ok(b.sync()).await;

    let conflicts = record(&a, "conflicts");
    ok(a.patch("todos".into(), id.clone().into(), to_js(&json!({"title": "from a"})), None)).await;
    ok(b.patch("todos".into(), id.clone().into(), to_js(&json!({"title": "from b"})), None)).await;
    ok(b.sync()).await;
    ok(a.sync()).await;
    assert_eq!(ok(a.get("todos".into(), id.clone().into())).await["title"], "from a", "arrival mode: the later arrival holds");
    assert_eq!(conflicts.length(), 0, "the todos table keeps no journal");
    a.close();
    b.close();
}

//! Numbers as a JS client reads them. `JSON.parse` reads every number as a double, so an integer
//! beyond 2^53 (a Postgres bigint, a snowflake id) becomes the nearest double; serde_json would keep
//! it exact. A number beyond the largest double (a `numeric` of 10^400) becomes ±Infinity, which
//! serde_json refuses. A client that reads a server's answer in Rust rewrites such literals in the
//! text first, so that what it decodes is what the app and IndexedDB, which only hold JS numbers,
//! see, as near as a JSON value can hold it.

use std::borrow::Cow;

/// The largest integer every double between it and zero can hold exactly (`Number.MAX_SAFE_INTEGER`).
const MAX_SAFE: u64 = (1 << 53) - 1;

/// `text` (JSON) with every number literal serde_json would read otherwise than `JSON.parse`
/// rewritten (`nearest_double`), in serde_json's shortest form.
/// Strings are left as they are. Borrowed when nothing needs rewriting, which is the common case:
/// one pass over the bytes, no copy.
pub fn js_safe_text(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let mut rewritten: Option<String> = None;
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() {
                    match bytes[i] {
                        b'\\' => i += 2,
                        b'"' => {
                            i += 1;
                            break;
                        }
                        _ => i += 1,
                    }
                }
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                i += 1;
                while i < bytes.len() && matches!(bytes[i], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-') {
                    i += 1;
                }
                if let Some(nearest) = nearest_double(&text[start..i]) {
                    let out = rewritten.get_or_insert_with(|| String::with_capacity(text.len() + 16));
                    out.push_str(&text[copied..start]);
                    out.push_str(&nearest);
                    copied = i;
                }
            }
            _ => i += 1,
        }
    }
    match rewritten {
        None => Cow::Borrowed(text),
        Some(mut out) => {
            out.push_str(&text[copied..]);
            Cow::Owned(out)
        }
    }
}

/// The text of a literal's replacement, `None` for a literal serde_json reads as `JSON.parse` does.
/// An integer beyond ±(2^53 − 1) within `u64` / `i64` (which serde_json would keep exact) becomes
/// the double nearest it. A literal beyond the largest double, which `JSON.parse` reads as
/// ±Infinity and serde_json refuses ("number out of range", failing the whole answer every time it
/// came), becomes the largest double of its sign: the nearest a JSON value can hold.
fn nearest_double(token: &str) -> Option<String> {
    let digits = token.strip_prefix('-').unwrap_or(token);
    let whole = digits.bytes().all(|b| b.is_ascii_digit());
    let value = if whole && (16..=20).contains(&digits.len()) {
        if token.starts_with('-') {
            let n: i64 = token.parse().ok()?;
            if n.unsigned_abs() <= MAX_SAFE {
                return None;
            }
            n as f64
        } else {
            // Beyond u64 it fails to parse, and serde_json reads it as a (finite) double already.
            let n: u64 = token.parse().ok()?;
            if n <= MAX_SAFE {
                return None;
            }
            n as f64
        }
    } else if (digits.len() > 308 || digits.contains(['e', 'E'])) && is_json_number(token.as_bytes()) {
        // The only literals that can reach past f64::MAX (about 1.8e308, 309 digits); of a valid
        // one serde_json refuses nothing but that. (Rust's own float parser would add 14 KB of
        // package for this one question.)
        if serde_json::from_str::<f64>(token).is_ok() {
            return None;
        }
        if token.starts_with('-') { -f64::MAX } else { f64::MAX }
    } else {
        return None;
    };
    serde_json::to_string(&value).ok()
}

/// Whether `token` is a number as JSON writes one: `-`?, an integer part without leading zeros, an
/// optional fraction, an optional exponent.
fn is_json_number(token: &[u8]) -> bool {
    let digits = |at: usize| token[at.min(token.len())..].iter().take_while(|b| b.is_ascii_digit()).count();
    let mut at = usize::from(token.first() == Some(&b'-'));
    match digits(at) {
        0 => return false,
        n if n > 1 && token[at] == b'0' => return false,
        n => at += n,
    }
    if token.get(at) == Some(&b'.') {
        match digits(at + 1) {
            0 => return false,
            n => at += 1 + n,
        }
    }
    if matches!(token.get(at), Some(b'e' | b'E')) {
        at += 1;
        if matches!(token.get(at), Some(b'+' | b'-')) {
            at += 1;
        }
        match digits(at) {
            0 => return false,
            n => at += n,
        }
    }
    at == token.len()
}

/// Whether a JS app reads `a` and `b` as one value: numbers by the double `JSON.parse` makes of
/// them (a server's `5.00`, a `jsonb`'s `1.0` and the app's `5`; PostgreSQL writes a large whole
/// `float8` as an integer where its writer wrote `9.568016780861784e18`), arrays and objects item by
/// item. The client's filters and the history checker compare rows with it.
pub fn same_as_js(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_as_js(a, b)),
        (Value::Object(x), Value::Object(y)) => x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_as_js(v, w))),
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::js_safe_text;
    use serde_json::Value;

    fn read(text: &str) -> Value {
        serde_json::from_str(&js_safe_text(text)).unwrap()
    }

    #[test]
    fn integers_beyond_2_53_are_read_as_json_parse_reads_them() {
        let v = read(r#"{"a": 9007199254740993, "b": [18446744073709551615, {"n": -9007199254740993}], "c": -9223372036854775808}"#);
        assert_eq!(v["a"].as_f64(), Some(9007199254740992.0));
        assert!(v["a"].is_f64());
        assert_eq!(v["b"][0].as_f64(), Some(18446744073709551616.0));
        assert_eq!(v["b"][1]["n"].as_f64(), Some(-9007199254740992.0));
        assert_eq!(v["c"].as_f64(), Some(-9223372036854775808.0));
    }

    #[test]
    fn safe_numbers_strings_and_other_literals_are_left_as_written() {
        for text in [
            r#"{"a": 9007199254740991, "b": -9007199254740991, "c": 0.1, "d": 1e300, "e": -0}"#,
            r#"{"s": "9007199254740993", "t": "a \" 9007199254740993 \\", "u": 12345678901234567.5}"#,
            r#"[123456789012345678901234567890, -123456789012345678901234567890, 1.7976931348623157e308]"#,
            r#"{"ключ 9007199254740993": "значение"}"#,
        ] {
            assert!(matches!(js_safe_text(text), std::borrow::Cow::Borrowed(_)), "{text}");
        }
        let v = read(r#"{"s": "9007199254740993", "t": "a \" 9007199254740993", "after": 9007199254740993}"#);
        assert_eq!(v["s"], "9007199254740993");
        assert_eq!(v["t"], "a \" 9007199254740993");
        assert_eq!(v["after"].as_f64(), Some(9007199254740992.0));
    }

    #[test]
    fn numbers_beyond_the_largest_double_are_read_as_the_largest_double_of_their_sign() {
        let huge = format!("1{}", "0".repeat(400));
        let text = format!(r#"{{"a": 1e400, "b": -1E+309, "c": {huge}, "d": -{huge}.5, "e": 1e-400, "f": 1.7976931348623157e308}}"#);
        assert!(serde_json::from_str::<Value>(&text).is_err(), "serde_json refuses them as written");
        let v = read(&text);
        assert_eq!(v["a"].as_f64(), Some(f64::MAX));
        assert_eq!(v["b"].as_f64(), Some(-f64::MAX));
        assert_eq!(v["c"].as_f64(), Some(f64::MAX));
        assert_eq!(v["d"].as_f64(), Some(-f64::MAX));
        assert_eq!(v["e"].as_f64(), Some(0.0), "an underflow reads as 0, as JSON.parse reads it");
        assert_eq!(v["f"].as_f64(), Some(f64::MAX));
        let tiny = format!("0.{}1", "0".repeat(400));
        assert!(matches!(js_safe_text(&format!("[{tiny}, 1e300, 2.5e-3]")), std::borrow::Cow::Borrowed(_)), "finite ones stay");
    }

    #[test]
    fn a_malformed_number_is_left_for_serde_json_to_refuse() {
        for text in ["[1e400e1]", "[--1e400]", "[1e]", "[01e400]", "[1.e400]", "[1e400.5]"] {
            assert!(matches!(js_safe_text(text), std::borrow::Cow::Borrowed(_)), "{text}");
            assert!(serde_json::from_str::<Value>(&js_safe_text(text)).is_err(), "{text}");
        }
    }

    #[test]
    fn an_integer_field_beyond_2_53_is_refused_as_before() {
        #[derive(serde::Deserialize, Debug)]
        struct Seq {
            #[allow(dead_code)]
            seq: i64,
        }
        assert!(serde_json::from_str::<Seq>(&js_safe_text(r#"{"seq": 9007199254740993}"#)).is_err());
        assert!(serde_json::from_str::<Seq>(&js_safe_text(r#"{"seq": 9007199254740991}"#)).is_ok());
    }
}

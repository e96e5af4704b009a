//! JSON text as the wire's readers take it: how deep it nests, and reading what nests deeper than
//! serde_json's default limit.

use serde::de::DeserializeOwned;

/// The deepest JSON a reader here decodes (arrays and objects). serde_json stops at 128 by default,
/// while a `jsonb` value written in plain SQL may nest deeper and `JSON.parse` reads it: a row the
/// client had to decode in wasm (to write over it, rebase a write on it, or read a refusal's server
/// row) failed every time. Deeper than this the decoder's recursion could run the wasm stack out
/// (1 MiB; a browser test decodes a row 500 levels down in a debug build, whose frames are the
/// largest).
pub const MAX_READ_DEPTH: usize = 512;

/// True when arrays and objects in this (valid) JSON nest deeper than `max`. One pass over the
/// bytes; brackets inside strings do not count.
pub fn nesting_exceeds(json: &[u8], max: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in json {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// `text` decoded as `T`, nested up to `MAX_READ_DEPTH` levels (serde_json's own limit of 128 is
/// lifted only for text found to nest no deeper, so the recursion stays bounded).
pub fn read_deep<T: DeserializeOwned>(text: &str) -> serde_json::Result<T> {
    let mut reader = serde_json::Deserializer::from_str(text);
    if !nesting_exceeds(text.as_bytes(), MAX_READ_DEPTH) {
        reader.disable_recursion_limit();
    }
    let value = T::deserialize(&mut reader)?;
    reader.end()?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn nested(levels: usize) -> String {
        format!("{}1{}", "[".repeat(levels), "]".repeat(levels))
    }

    #[test]
    fn text_nested_up_to_the_limit_is_read_and_deeper_text_is_refused() {
        assert!(serde_json::from_str::<Value>(&nested(200)).is_err(), "serde_json alone stops at 128");
        let read: Value = read_deep(&nested(MAX_READ_DEPTH)).unwrap();
        assert_eq!(serde_json::to_string(&read).unwrap(), nested(MAX_READ_DEPTH));
        assert!(read_deep::<Value>(&nested(MAX_READ_DEPTH + 1)).is_err());
        assert!(read_deep::<Value>("[1] trailing").is_err(), "the whole text is read");
    }

    #[test]
    fn brackets_in_strings_do_not_count() {
        assert!(!nesting_exceeds(format!("[\"{}\\\"\"]", "[".repeat(100)).as_bytes(), 2));
        assert!(nesting_exceeds(nested(3).as_bytes(), 2));
        assert!(!nesting_exceeds(nested(2).as_bytes(), 2));
    }
}

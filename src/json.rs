//! Small pieces the routes share for reading and writing JSON bodies.
//!
//! Reading: serde's derived structs also accept a JSON array, filling fields
//! by position, so a `[..]` where an object belongs would pass as one. The
//! routes' one-pass readers (push items, ack batches) deserialize straight
//! into such structs, and must refuse what the per-item readers refuse.
//!
//! Writing: the push and ack answers hold one object per message and are
//! written by hand (serde's formatting was a top symbol of both paths); they
//! share the integer and string writers. Timestamps in answers are written
//! by [`iso_ms`], here because every family answers them (a leaf module: it
//! imports nothing of the crate).

use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};

/// Timestamps as answers show them: milliseconds, UTC, literal `Z`
/// (API.md §6 A-14). Written without a format string: parsing one on
/// every call showed in the profile of small requests (issue 46).
pub fn iso_ms(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// `T` read from a JSON object only.
pub struct ObjectOnly<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Objects<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Objects<T> {
            type Value = ObjectOnly<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ObjectOnly<T>, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(ObjectOnly)
            }
        }
        d.deserialize_map(Objects(PhantomData))
    }
}

/// `v` in decimal, without the formatting machinery.
pub fn decimal(out: &mut Vec<u8>, v: i64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut rest = v.unsigned_abs();
    loop {
        i -= 1;
        digits[i] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if v < 0 {
        out.push(b'-');
    }
    out.extend_from_slice(&digits[i..]);
}

/// A JSON array of one object per item, each opening with the item's
/// `"index"`; `members` writes the rest of the object, from its first comma.
pub fn indexed_objects<T>(
    items: &[T],
    bytes_each: usize,
    index: impl Fn(&T) -> usize,
    mut members: impl FnMut(&mut Vec<u8>, &T),
) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + items.len() * bytes_each);
    out.push(b'[');
    for (n, item) in items.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"index\":");
        decimal(&mut out, index(item) as i64);
        members(&mut out, item);
        out.push(b'}');
    }
    out.push(b']');
    out
}

/// `s` as a JSON string, escaped.
pub fn string(out: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(out, s).expect("writing to a Vec does not fail");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_milliseconds_utc_with_a_literal_z() {
        for text in ["2026-12-06T17:40:00.123456Z", "1999-01-02T03:04:05Z", "2030-07-08T09:10:11.9Z"] {
            let t = chrono::DateTime::parse_from_rfc3339(text).unwrap().with_timezone(&chrono::Utc);
            assert_eq!(iso_ms(t), t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string());
        }
        let t = chrono::DateTime::parse_from_rfc3339("2026-12-06T17:40:00.123456Z").unwrap().with_timezone(&chrono::Utc);
        assert_eq!(iso_ms(t), "2026-12-06T17:40:00.123Z");
    }

    #[test]
    fn decimal_writes_every_i64() {
        for v in [0, 7, 10, -12, 1_234_567_890, i64::MAX, i64::MIN] {
            let mut out = Vec::new();
            decimal(&mut out, v);
            assert_eq!(String::from_utf8(out).unwrap(), v.to_string());
        }
    }

    #[derive(serde::Deserialize, Debug, PartialEq)]
    struct Pair<'a> {
        #[serde(borrow)]
        a: std::borrow::Cow<'a, str>,
        b: Option<i32>,
    }

    #[test]
    fn an_object_reads_as_the_struct_and_keeps_borrowing() {
        let ObjectOnly(p) = serde_json::from_str::<ObjectOnly<Pair>>(r#"{"b":2,"x":[1],"a":"s"}"#).unwrap();
        assert!(matches!(p.a, std::borrow::Cow::Borrowed("s")));
        assert_eq!(p.b, Some(2));
    }

    #[test]
    fn an_array_is_refused_where_a_derived_struct_would_take_it() {
        assert!(serde_json::from_str::<Pair>(r#"["s", 2]"#).is_ok(), "what serde alone accepts");
        assert!(serde_json::from_str::<ObjectOnly<Pair>>(r#"["s", 2]"#).is_err());
        assert!(serde_json::from_str::<ObjectOnly<Pair>>("3").is_err());
    }
}

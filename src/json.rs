//! Small pieces for reading request bodies with serde.
//!
//! Why: serde's derived structs also accept a JSON array, filling fields by
//! position, so a `[..]` where an object belongs would pass as one. The
//! routes' one-pass readers (push items, ack batches) deserialize straight
//! into such structs, and must refuse what the per-item readers refuse.

use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};

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

#[cfg(test)]
mod tests {
    use super::*;

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

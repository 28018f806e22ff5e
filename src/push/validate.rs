//! Validation of the JSON push body (API.md §2.1).
//!
//! Payloads stay raw JSON slices borrowed from the request body: they are
//! checked for well-formedness by the parser and copied once, into the frame.
//! Names and transactionIds borrow from the body too, unless JSON escapes
//! made the parser write a new string: a push of 100 items made 300 small
//! allocations per request here before (docs/PERFORMANCE.md, stop 12).
//! Every refusal names the item index and the field, because a producer with a
//! batch of a thousand items needs to know which one is wrong.

use std::borrow::Cow;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::json::ObjectOnly;
use uuid::Uuid;

/// Longest queue or partition name, in bytes.
pub const MAX_NAME_BYTES: usize = 255;
/// Longest transactionId, in bytes.
pub const MAX_TRANSACTION_ID_BYTES: usize = 1024;
/// The partition an item without one goes to.
pub const DEFAULT_PARTITION: &str = "Default";

/// One push item after validation. Its strings borrow from the body where
/// they can.
#[derive(Debug, Clone, PartialEq)]
pub struct PushItem<'a> {
    pub queue: Cow<'a, str>,
    pub partition: Cow<'a, str>,
    /// `None` when absent or empty: the broker mints one.
    pub transaction_id: Option<Cow<'a, str>>,
    pub trace_id: Option<Uuid>,
    pub payload: &'a str,
    /// Minted by the client (pre-framed binary pushes); else the broker mints.
    pub message_id: Option<Uuid>,
}

#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow)]
    items: Option<&'a RawValue>,
}

/// A well-formed body read in one pass: each item's fields are captured raw
/// as the array goes by. [`Body`]'s passes (the body, the array, each item)
/// read every payload three times, which was a tenth of the broker's CPU in a
/// JSON push of 100 items (docs/PERFORMANCE.md, stop 12); they now run only to
/// name what is wrong with a body this one refuses.
#[derive(Deserialize)]
struct ItemsBody<'a> {
    #[serde(borrow)]
    items: Vec<ObjectOnly<RawItem<'a>>>,
}

#[derive(Deserialize)]
struct RawItem<'a> {
    #[serde(borrow)]
    queue: Option<&'a RawValue>,
    #[serde(borrow)]
    partition: Option<&'a RawValue>,
    #[serde(borrow, rename = "transactionId", alias = "transaction_id")]
    transaction_id: Option<&'a RawValue>,
    #[serde(borrow, rename = "traceId", alias = "trace_id")]
    trace_id: Option<&'a RawValue>,
    #[serde(borrow)]
    payload: Option<&'a RawValue>,
    #[serde(borrow)]
    data: Option<&'a RawValue>,
}

/// Parses and validates a JSON push body. The error is the whole message of
/// the `400` answer.
pub fn parse_push_body(body: &str) -> Result<Vec<PushItem<'_>>, String> {
    if let Ok(parsed) = serde_json::from_str::<ItemsBody<'_>>(body) {
        return check_items(parsed.items.into_iter().map(|ObjectOnly(i)| i));
    }
    let parsed: Body<'_> = serde_json::from_str(body).map_err(|e| format!("bad body: {e}"))?;
    parse_items(parsed.items.ok_or("items: required, an array of push items")?)
}

/// The `items` array of a push (or of a transaction's push operation).
pub fn parse_items(items: &RawValue) -> Result<Vec<PushItem<'_>>, String> {
    if let Ok(items) = serde_json::from_str::<Vec<ObjectOnly<RawItem<'_>>>>(items.get()) {
        return check_items(items.into_iter().map(|ObjectOnly(i)| i));
    }
    let items: Vec<&RawValue> = serde_json::from_str(items.get()).map_err(|_| "items: must be an array".to_string())?;
    items.iter().enumerate().map(|(i, raw)| parse_item(i, raw)).collect()
}

fn check_items<'a>(items: impl Iterator<Item = RawItem<'a>>) -> Result<Vec<PushItem<'a>>, String> {
    items.enumerate().map(|(index, item)| check_item(index, item)).collect()
}

/// One push item, validated; errors name `items[index].field`.
pub fn parse_item<'a>(index: usize, raw: &'a RawValue) -> Result<PushItem<'a>, String> {
    let ObjectOnly(item) = serde_json::from_str::<ObjectOnly<RawItem<'a>>>(raw.get())
        .map_err(|_| format!("items[{index}]: must be an object"))?;
    check_item(index, item)
}

/// The rules for one item's fields.
fn check_item(index: usize, item: RawItem<'_>) -> Result<PushItem<'_>, String> {
    let field = |name: &str, problem: &str| format!("items[{index}].{name}: {problem}");
    let queue = string_field(item.queue).map_err(|p| field("queue", p))?.ok_or_else(|| field("queue", "required, a string"))?;
    check_name(&queue).map_err(|p| field("queue", p))?;
    let partition = match string_field(item.partition).map_err(|p| field("partition", p))? {
        Some(p) => {
            check_name(&p).map_err(|e| field("partition", e))?;
            p
        }
        None => Cow::Borrowed(DEFAULT_PARTITION),
    };
    let transaction_id =
        string_field(item.transaction_id).map_err(|p| field("transactionId", p))?.filter(|t| !t.is_empty());
    if let Some(t) = &transaction_id {
        if t.len() > MAX_TRANSACTION_ID_BYTES {
            return Err(field("transactionId", "longer than 1024 bytes"));
        }
    }
    let trace_id = match string_field(item.trace_id).map_err(|p| field("traceId", p))? {
        None => None,
        Some(t) => Some(Uuid::parse_str(&t).map_err(|_| field("traceId", "must be a UUID"))?),
    };
    let payload = item.payload.or(item.data).map(|p| p.get()).unwrap_or("null");
    if holds_nul(payload) {
        return Err(field(if item.payload.is_some() { "payload" } else { "data" }, NUL_REFUSED));
    }
    if transaction_id.as_ref().is_some_and(|t| t.contains('\0')) {
        return Err(field("transactionId", NUL_REFUSED));
    }
    Ok(PushItem { queue, partition, transaction_id, trace_id, payload, message_id: None })
}

/// The items of a binary body, held to the same rules as JSON ones (the
/// frame already guarantees strings and JSON payloads). A group's items share
/// its names, which are checked once.
pub fn from_binary(items: &[crate::log::binary::BinaryItem]) -> Result<Vec<PushItem<'_>>, String> {
    let mut checked: Option<&crate::log::binary::BinaryItem> = None;
    items
        .iter()
        .enumerate()
        .map(|(index, b)| {
            let field = |name: &str, problem: &str| format!("items[{index}].{name}: {problem}");
            let same = checked.is_some_and(|c| Arc::ptr_eq(&c.queue, &b.queue) && Arc::ptr_eq(&c.partition, &b.partition));
            if !same {
                check_name(&b.queue).map_err(|p| field("queue", p))?;
                check_name(&b.partition).map_err(|p| field("partition", p))?;
                checked = Some(b);
            }
            if b.transaction_id.as_ref().is_some_and(|t| t.len() > MAX_TRANSACTION_ID_BYTES) {
                return Err(field("transactionId", "longer than 1024 bytes"));
            }
            if b.transaction_id.as_ref().is_some_and(|t| t.contains('\0')) {
                return Err(field("transactionId", NUL_REFUSED));
            }
            if holds_nul(&b.payload) {
                return Err(field("payload", NUL_REFUSED));
            }
            Ok(PushItem {
                queue: Cow::Borrowed(&b.queue),
                partition: Cow::Borrowed(&b.partition),
                transaction_id: b.transaction_id.as_deref().map(Cow::Borrowed),
                trace_id: b.trace_id,
                payload: &b.payload,
                message_id: b.message_id,
            })
        })
        .collect()
}

/// A field that, when present and not null, must be a JSON string: borrowed
/// from the body, or a new string when it holds escapes.
fn string_field(raw: Option<&RawValue>) -> Result<Option<Cow<'_, str>>, &'static str> {
    match raw {
        None => Ok(None),
        Some(r) if r.get() == "null" => Ok(None),
        Some(r) => match serde_json::from_str::<&str>(r.get()) {
            Ok(s) => Ok(Some(Cow::Borrowed(s))),
            Err(_) => serde_json::from_str::<String>(r.get()).map(|s| Some(Cow::Owned(s))).map_err(|_| "must be a string"),
        },
    }
}

/// Whether JSON text holds a `\u0000` escape: a NUL character, which
/// PostgreSQL stores neither in `text` nor in `jsonb` (a payload holding one
/// could never be dead-lettered, a KV value or trace never written). A
/// backslash-escaped backslash before it (`\\u0000`) is text, not a NUL.
pub fn holds_nul(json: &str) -> bool {
    let b = json.as_bytes();
    let mut from = 0;
    while let Some(at) = json[from..].find("\\u0000") {
        let i = from + at;
        let backslashes = b[..i].iter().rev().take_while(|&&c| c == b'\\').count();
        if backslashes % 2 == 0 {
            return true;
        }
        from = i + 1;
    }
    false
}

/// The refusal of a field whose JSON holds a NUL character.
pub const NUL_REFUSED: &str = "must not contain a NUL character (\\u0000): PostgreSQL cannot store it";

/// Queue and partition names: 1..=255 bytes, no control characters.
pub fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        Err("must not be empty")
    } else if name.len() > MAX_NAME_BYTES {
        Err("longer than 255 bytes")
    } else if name.chars().any(char::is_control) {
        Err("must not contain control characters")
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nul_escape_is_found_and_an_escaped_backslash_is_not_one() {
        assert!(holds_nul(r#"{"a":"x\u0000y"}"#));
        assert!(holds_nul(r#""\\\u0000""#), "an escaped backslash, then a NUL");
        assert!(!holds_nul(r#""\\u0000""#), "the text \\u0000");
        assert!(!holds_nul(r#"{"a":"\u0001"}"#));
        assert!(!holds_nul("[1,2,3]"));
        assert!(serde_json::from_str::<String>(r#""\\\u0000""#).unwrap().contains('\0'), "agrees with serde");
        assert!(!serde_json::from_str::<String>(r#""\\u0000""#).unwrap().contains('\0'));
    }

    #[test]
    fn an_item_without_partition_goes_to_default_and_payload_stays_raw() {
        let items = parse_push_body(r#"{"items":[{"queue":"q","payload":{"b": 1, "a":[1, 2]}}]}"#).unwrap();
        assert_eq!(items[0].partition, "Default");
        assert_eq!(items[0].payload, r#"{"b": 1, "a":[1, 2]}"#);
        assert_eq!(items[0].transaction_id, None);
    }

    #[test]
    fn strings_borrow_from_the_body_unless_escapes_were_decoded() {
        let body = r#"{"items":[{"queue":"q","partition":"p","transactionId":"t1"},
                                {"queue":"a\"b","partition":"c\\d","transactionId":"t\u00e9"}]}"#;
        let items = parse_push_body(body).unwrap();
        let plain = &items[0];
        assert!(matches!(&plain.queue, Cow::Borrowed("q")));
        assert!(matches!(&plain.partition, Cow::Borrowed("p")));
        assert!(matches!(&plain.transaction_id, Some(Cow::Borrowed("t1"))));
        let escaped = &items[1];
        assert!(matches!(&escaped.queue, Cow::Owned(q) if q == "a\"b"));
        assert!(matches!(&escaped.partition, Cow::Owned(p) if p == "c\\d"));
        assert_eq!(escaped.transaction_id.as_deref(), Some("té"));
    }

    #[test]
    fn binary_names_are_checked_once_per_group_and_errors_name_the_item() {
        use crate::log::binary::BinaryItem;
        let item = |queue: &Arc<str>, partition: &Arc<str>| BinaryItem {
            queue: queue.clone(),
            partition: partition.clone(),
            transaction_id: None,
            message_id: None,
            trace_id: None,
            payload: "1".into(),
        };
        let (q, p, empty): (Arc<str>, Arc<str>, Arc<str>) = ("q".into(), "p".into(), "".into());
        let items = [item(&q, &p), item(&q, &p), item(&q, &empty)];
        assert_eq!(from_binary(&items).unwrap_err(), "items[2].partition: must not be empty");
        assert_eq!(from_binary(&items[..2]).unwrap().len(), 2);
        // Another group's names (another allocation) are checked in turn.
        let bad: Arc<str> = "a\u{7}".into();
        let items = [item(&q, &p), item(&bad, &p)];
        assert_eq!(from_binary(&items).unwrap_err(), "items[1].queue: must not contain control characters");
    }

    #[test]
    fn the_one_pass_read_gives_the_items_the_per_item_read_gives() {
        let body = r#"{"extra":{"items":1},"items":[
            {"queue":"q","payload":{"items":[1,{"queue":"x"}]},"unknown":[{}]},
            {"queue":"q\u0041","partition":"p","transactionId":"t","traceId":null,"data":"d"},
            {"queue":"q","partition":null,"transactionId":"","payload":null}]}"#;
        let fast = parse_push_body(body).unwrap();
        let outer: Body<'_> = serde_json::from_str(body).unwrap();
        let raw: Vec<&RawValue> = serde_json::from_str(outer.items.unwrap().get()).unwrap();
        let slow: Vec<PushItem<'_>> = raw.iter().enumerate().map(|(i, r)| parse_item(i, r).unwrap()).collect();
        assert_eq!(fast, slow);
        assert_eq!(fast[0].payload, r#"{"items":[1,{"queue":"x"}]}"#);
        assert_eq!((&*fast[1].queue, fast[1].payload), ("qA", r#""d""#));
        assert_eq!((&*fast[2].partition, fast[2].transaction_id.as_deref(), fast[2].payload), ("Default", None, "null"));
    }

    #[test]
    fn an_empty_transaction_id_is_minted_later() {
        let items = parse_push_body(r#"{"items":[{"queue":"q","transactionId":""}]}"#).unwrap();
        assert_eq!(items[0].transaction_id, None);
        assert_eq!(items[0].payload, "null");
    }

    #[test]
    fn refusals_name_the_item_and_the_field() {
        let cases = [
            (r#"{"items":[{"queue":"q"},{"queue":5}]}"#, "items[1].queue: must be a string"),
            (r#"{"items":[{"partition":"p"}]}"#, "items[0].queue: required, a string"),
            (r#"{"items":[{"queue":"q","partition":[]}]}"#, "items[0].partition: must be a string"),
            (r#"{"items":[{"queue":"q","transactionId":7}]}"#, "items[0].transactionId: must be a string"),
            (r#"{"items":[{"queue":"q","traceId":"nope"}]}"#, "items[0].traceId: must be a UUID"),
            (r#"{"items":[{"queue":""}]}"#, "items[0].queue: must not be empty"),
            (r#"{"items":[{"queue":"a\u0001b"}]}"#, "items[0].queue: must not contain control characters"),
            (r#"{"items":[3]}"#, "items[0]: must be an object"),
            (r#"{"items":[{"queue":"q"},["q","p"]]}"#, "items[1]: must be an object"),
            (r#"{"items":{}}"#, "items: must be an array"),
            (r#"{}"#, "items: required, an array of push items"),
        ];
        for (body, want) in cases {
            assert_eq!(parse_push_body(body).unwrap_err(), want, "{body}");
        }
        assert!(parse_push_body("{").unwrap_err().starts_with("bad body: "));
    }

    #[test]
    fn a_trace_id_of_any_uuid_version_is_accepted() {
        let body = r#"{"items":[{"queue":"q","traceId":"0198f2c1-9a7b-7d20-8e31-4c5d6e7f8a90"}]}"#;
        assert!(parse_push_body(body).unwrap()[0].trace_id.is_some());
    }
}

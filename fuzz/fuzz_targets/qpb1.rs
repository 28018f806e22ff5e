//! Any bytes as a QPB1 push body: an error or items, never a panic, and the
//! decompression bound always holds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut body = b"QPB1".to_vec();
    body.extend_from_slice(data);
    if let Ok(p) = queen::log::binary::parse_push(&body, 1 << 16) {
        let total: usize = p.items.iter().map(|i| i.payload.len()).sum();
        assert!(total <= 1 << 16 || body.len() > 1 << 16);
    }
});

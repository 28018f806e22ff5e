//! Any bytes as a QTB1 transaction body: an error or a parse, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut body = b"QTB1".to_vec();
    body.extend_from_slice(data);
    let _ = queen::log::binary::parse_transaction(&body, 1 << 16);
});

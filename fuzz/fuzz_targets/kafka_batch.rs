//! Any bytes as the record batches of a Kafka Produce partition: a
//! decode or an error, never a panic, and never a decompression past the
//! bound (kafka::batch::MAX_RECORDS_BYTES).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = queen::kafka::batch::decode_all(data);
});

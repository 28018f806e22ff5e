//! Any bytes through the frame reader: never a panic, and every frame it
//! accepts encodes back to the same bytes and decodes to the same frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use queen::log::FrameReader;

fuzz_target!(|data: &[u8]| {
    let mut consumed = 0;
    for frame in FrameReader::new(data) {
        let Ok(frame) = frame else { break };
        let mut out = Vec::new();
        frame.encode_into(&mut out);
        assert_eq!(&out[..], &data[consumed..consumed + out.len()], "re-encoding changes the bytes");
        consumed += out.len();
        let again = FrameReader::collect_all(&out).expect("a re-encoded frame decodes");
        assert_eq!(again, vec![frame]);
    }
});

//! Segments: the unit of storage. One segment is one zstd frame holding a run
//! of stored frames; PostgreSQL keeps it as an opaque `bytea` and never looks
//! inside. The broker compresses once on push and decompresses on read.

use std::io::Read;

/// Why a segment blob could not be turned back into frames.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    #[error("zstd frame does not decode: {0}")]
    Corrupt(#[from] std::io::Error),
    #[error("zstd frame decompresses past the limit of {limit} bytes")]
    TooLarge { limit: usize },
}

/// Compresses a run of encoded frames into one zstd frame (content size
/// recorded, as clients expect when they decode a shipped segment).
pub fn compress_frames(frames: &[u8], level: i32) -> Vec<u8> {
    let mut c = zstd::bulk::Compressor::new(level).expect("zstd level is validated by config");
    c.include_contentsize(true).expect("content size flag is always accepted");
    c.compress(frames).expect("in-memory zstd compression does not fail")
}

/// Decompresses a segment, refusing to grow beyond `limit` bytes so that a
/// hostile or corrupt blob cannot exhaust memory.
pub fn decompress_frames(blob: &[u8], limit: usize) -> Result<Vec<u8>, SegmentError> {
    let mut out = Vec::with_capacity(blob.len().saturating_mul(4).min(limit));
    let decoder = zstd::stream::read::Decoder::new(blob)?;
    let read = decoder.take(limit as u64 + 1).read_to_end(&mut out)?;
    if read > limit {
        return Err(SegmentError::TooLarge { limit });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compressed_run_decompresses_to_the_same_bytes() {
        let data: Vec<u8> = (0..10_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let blob = compress_frames(&data, 3);
        assert!(blob.len() < data.len());
        assert_eq!(decompress_frames(&blob, 1 << 20).unwrap(), data);
    }

    #[test]
    fn decompression_stops_at_the_limit() {
        let data = vec![0u8; 100_000];
        let blob = compress_frames(&data, 3);
        assert!(matches!(decompress_frames(&blob, 1000), Err(SegmentError::TooLarge { limit: 1000 })));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(decompress_frames(b"not zstd at all", 1000).is_err());
    }
}

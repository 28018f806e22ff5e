//! Segments: the unit of storage. One segment is one zstd frame holding a run
//! of stored frames; PostgreSQL keeps it as an opaque `bytea` and never looks
//! inside. The broker compresses once on push and decompresses on read.

use std::cell::RefCell;
use std::io::Read;

/// Why a segment blob could not be turned back into frames.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    #[error("zstd frame does not decode: {0}")]
    Corrupt(#[from] std::io::Error),
    #[error("zstd frame decompresses past the limit of {limit} bytes")]
    TooLarge { limit: usize },
}

thread_local! {
    /// One compression context per worker thread and level: creating a zstd
    /// context allocates and clears its tables, which cost more than
    /// compressing a small segment (7 % of the broker's CPU at batch 1 when
    /// each call made its own).
    static COMPRESSOR: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
    /// One decompression context per worker thread, for the same reason.
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Compresses a run of encoded frames into one zstd frame (content size
/// recorded, as clients expect when they decode a shipped segment).
pub fn compress_frames(frames: &[u8], level: i32) -> Vec<u8> {
    COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|(l, _)| *l != level) {
            let mut c = zstd::bulk::Compressor::new(level).expect("zstd level is validated by config");
            c.include_contentsize(true).expect("content size flag is always accepted");
            *slot = Some((level, c));
        }
        let (_, c) = slot.as_mut().expect("set above");
        c.compress(frames).expect("in-memory zstd compression does not fail")
    })
}

/// Ceiling on one decompressed stored segment: a reader of stored blobs passes
/// it to [`decompress_frames`] (incoming bodies have their own, configured bound).
pub const SEGMENT_LIMIT: usize = 256 << 20;

/// Decompresses a segment, refusing to grow beyond `limit` bytes so that a
/// hostile or corrupt blob cannot exhaust memory.
///
/// Segments written here are one frame that records its size, so the common
/// case is one call on a reused context into an exactly sized buffer. Anything
/// else (a frame without its size, several concatenated frames, a corrupt
/// header) is streamed under the same limit.
pub fn decompress_frames(blob: &[u8], limit: usize) -> Result<Vec<u8>, SegmentError> {
    if let Ok(Some(size)) = zstd::zstd_safe::get_frame_content_size(blob) {
        if size <= limit as u64 {
            let out = DECOMPRESSOR.with(|cell| {
                let mut slot = cell.borrow_mut();
                if slot.is_none() {
                    *slot = zstd::bulk::Decompressor::new().ok();
                }
                slot.as_mut().and_then(|d| d.decompress(blob, size as usize).ok())
            });
            if let Some(out) = out {
                return Ok(out);
            }
        }
    }
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

    /// Frames without a recorded size (a client's streamed encoder) take the
    /// streaming path, bounded the same way; concatenated frames decode whole.
    #[test]
    fn plain_and_concatenated_frames_decode_under_the_limit() {
        let data = vec![7u8; 50_000];
        let mut plain = Vec::new();
        let mut enc = zstd::stream::write::Encoder::new(&mut plain, 3).unwrap();
        std::io::Write::write_all(&mut enc, &data).unwrap();
        enc.finish().unwrap();
        assert!(zstd::zstd_safe::get_frame_content_size(&plain).unwrap().is_none());
        assert_eq!(decompress_frames(&plain, 1 << 20).unwrap(), data);
        assert!(matches!(decompress_frames(&plain, 1000), Err(SegmentError::TooLarge { limit: 1000 })));

        let mut two = compress_frames(b"first ", 3);
        two.extend(compress_frames(b"second", 1));
        assert_eq!(decompress_frames(&two, 1 << 20).unwrap(), b"first second");
    }

    #[test]
    fn alternating_levels_reuse_one_context_correctly() {
        for level in [1, 3, 1, 19, 3] {
            let blob = compress_frames(b"payload bytes payload bytes", level);
            assert_eq!(decompress_frames(&blob, 1 << 10).unwrap(), b"payload bytes payload bytes");
        }
    }
}

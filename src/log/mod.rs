//! The log's byte formats: stored frames and compressed segments.
//!
//! This module is pure code: it knows nothing about HTTP or PostgreSQL, so the
//! formats that travel between broker, database and clients are tested here in
//! isolation (unit tests and property tests). Everything is little-endian, as
//! API.md §3 lays it out.

pub mod binary;
pub mod frame;
pub mod segment;

pub use frame::{legacy_index_hash, CodecError, TxnHasher, Frame, FrameReader, FrameTooLong};
pub use segment::{compress_frames, decompress_frames, SEGMENT_LIMIT};

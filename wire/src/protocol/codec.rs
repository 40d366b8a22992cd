//! Field encoding of the native protocol: little-endian integers, `u16`-length strings,
//! `u32`-count arrays, and record blobs aligned to 8 bytes within the frame body.
//!
//! Record blobs are never copied: encoding appends them as separate chunks (sent with one
//! vectored write); decoding splits them off the frame buffer, still mutable, so the broker can
//! stamp offsets into the producer's bytes in place.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::batch::BATCH_ALIGN;

/// Why a frame could not be decoded. Never a panic: every read is checked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("frame ends early: needed {needed} more bytes at byte {at}")]
    Truncated { at: usize, needed: usize },
    #[error("string at byte {at} is not UTF-8")]
    InvalidUtf8 { at: usize },
    #[error("array at byte {at} claims {count} elements, more than the frame can hold")]
    TooManyElements { at: usize, count: u32 },
    #[error("{remaining} unexpected bytes after the message")]
    TrailingBytes { remaining: usize },
    #[error("invalid value {value} for {field}")]
    InvalidValue { field: &'static str, value: i64 },
}

/// Records as they travel inside a message: mutable straight after decoding (the broker stamps
/// them in place), shared once frozen (a fetch serving stored bytes), or supplied by the sender
/// from elsewhere (a file range it sends with `sendfile`).
#[derive(Debug, Clone)]
pub enum Records {
    Mutable(BytesMut),
    Shared(Bytes),
    Elsewhere(Elsewhere),
}

/// Records the sender writes from outside the frame's chunks: [`Encoder::put_records`] writes
/// their length and leaves an empty chunk where their bytes go, and [`Encoder::finish_parts`]
/// hands `source` back beside the chunks, in order. Never produced by decoding.
#[derive(Clone)]
pub struct Elsewhere {
    pub len: u32,
    pub source: std::sync::Arc<dyn std::any::Any + Send + Sync>,
}

impl std::fmt::Debug for Elsewhere {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "Elsewhere({} bytes)", self.len)
    }
}

/// A frame as chunks for a vectored write, and the sources of the records it carries from
/// elsewhere: each empty chunk is where the next source's bytes go.
pub struct FrameParts {
    pub chunks: Vec<Bytes>,
    pub elsewhere: Vec<Elsewhere>,
}

impl From<Vec<Bytes>> for FrameParts {
    fn from(chunks: Vec<Bytes>) -> FrameParts {
        FrameParts {
            chunks,
            elsewhere: Vec::new(),
        }
    }
}

impl Records {
    pub fn empty() -> Records {
        Records::Shared(Bytes::new())
    }

    pub fn len(&self) -> usize {
        match self {
            Records::Elsewhere(elsewhere) => elsewhere.len as usize,
            _ => self.as_slice().len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes held here (none for records elsewhere).
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Records::Mutable(bytes) => bytes,
            Records::Shared(bytes) => bytes,
            Records::Elsewhere(_) => &[],
        }
    }

    /// The bytes held here (none for records elsewhere).
    pub fn freeze(self) -> Bytes {
        match self {
            Records::Mutable(bytes) => bytes.freeze(),
            Records::Shared(bytes) => bytes,
            Records::Elsewhere(_) => Bytes::new(),
        }
    }

    /// Mutable bytes; copies only if shared bytes are referenced elsewhere.
    pub fn into_mut(self) -> BytesMut {
        match self {
            Records::Mutable(bytes) => bytes,
            Records::Shared(bytes) => bytes
                .try_into_mut()
                .unwrap_or_else(|shared| BytesMut::from(&shared[..])),
            Records::Elsewhere(_) => BytesMut::new(),
        }
    }
}

impl From<Bytes> for Records {
    fn from(bytes: Bytes) -> Records {
        Records::Shared(bytes)
    }
}

/// Builds one frame body (everything after the length prefix) as a list of chunks.
#[derive(Default)]
pub struct Encoder {
    current: BytesMut,
    chunks: Vec<Bytes>,
    /// Bytes in `chunks`, and of the records elsewhere between them.
    flushed: usize,
    elsewhere: Vec<Elsewhere>,
}

impl Encoder {
    pub fn new() -> Encoder {
        Encoder::default()
    }

    /// Bytes encoded so far.
    pub fn len(&self) -> usize {
        self.flushed + self.current.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn put_u8(&mut self, value: u8) {
        self.current.put_u8(value);
    }
    pub fn put_i8(&mut self, value: i8) {
        self.current.put_i8(value);
    }
    pub fn put_u16(&mut self, value: u16) {
        self.current.put_u16_le(value);
    }
    pub fn put_u32(&mut self, value: u32) {
        self.current.put_u32_le(value);
    }
    pub fn put_i16(&mut self, value: i16) {
        self.current.put_i16_le(value);
    }
    pub fn put_i32(&mut self, value: i32) {
        self.current.put_i32_le(value);
    }
    pub fn put_u64(&mut self, value: u64) {
        self.current.put_u64_le(value);
    }
    pub fn put_i64(&mut self, value: i64) {
        self.current.put_i64_le(value);
    }
    pub fn put_bool(&mut self, value: bool) {
        self.current.put_u8(u8::from(value));
    }

    /// Panics on a string over 64 KiB: names and messages are short by construction.
    pub fn put_str(&mut self, value: &str) {
        let len = u16::try_from(value.len()).expect("protocol strings are below 64 KiB");
        self.put_u16(len);
        self.current.put_slice(value.as_bytes());
    }

    pub fn put_count(&mut self, count: usize) {
        self.put_u32(u32::try_from(count).expect("arrays hold fewer than 2^32 elements"));
    }

    /// Length, zero padding to an 8-byte boundary of the frame body, then the bytes as their own
    /// chunk (no copy).
    pub fn put_records(&mut self, records: Records) {
        self.put_u32(u32::try_from(records.len()).expect("records below 4 GiB"));
        let padding = (BATCH_ALIGN - self.len() % BATCH_ALIGN) % BATCH_ALIGN;
        self.current.put_bytes(0, padding);
        if records.is_empty() {
            return;
        }
        if let Records::Elsewhere(elsewhere) = records {
            let current = self.current.split().freeze();
            self.flushed += current.len() + elsewhere.len as usize;
            if !current.is_empty() {
                self.chunks.push(current);
            }
            self.chunks.push(Bytes::new());
            self.elsewhere.push(elsewhere);
            return;
        }
        let bytes = records.freeze();
        let current = self.current.split().freeze();
        self.flushed += current.len() + bytes.len();
        if !current.is_empty() {
            self.chunks.push(current);
        }
        self.chunks.push(bytes);
    }

    /// The frame: a `u32` length prefix, then the body, as chunks for a vectored write. Panics
    /// if the frame carries records from elsewhere (see [`Encoder::finish_parts`]).
    pub fn finish_frame(self) -> Vec<Bytes> {
        let parts = self.finish_parts();
        assert!(
            parts.elsewhere.is_empty(),
            "a frame with records elsewhere goes through finish_parts"
        );
        parts.chunks
    }

    /// The frame as [`Encoder::finish_frame`] makes it, with the sources of its records from
    /// elsewhere beside it.
    pub fn finish_parts(mut self) -> FrameParts {
        let elsewhere = std::mem::take(&mut self.elsewhere);
        FrameParts {
            chunks: self.finish_chunks(),
            elsewhere,
        }
    }

    fn finish_chunks(mut self) -> Vec<Bytes> {
        let body_len = u32::try_from(self.len()).expect("frames below 4 GiB");
        let mut prefix = BytesMut::with_capacity(4 + self.current.len());
        prefix.put_u32_le(body_len);
        // Small frames go out as one chunk.
        if self.chunks.is_empty() {
            prefix.extend_from_slice(&self.current);
            return vec![prefix.freeze()];
        }
        let mut chunks = Vec::with_capacity(self.chunks.len() + 2);
        chunks.push(prefix.freeze());
        chunks.append(&mut self.chunks);
        if !self.current.is_empty() {
            chunks.push(self.current.freeze());
        }
        chunks
    }
}

/// Reads one frame body. Every read checks the remaining length first.
pub struct Decoder {
    buf: BytesMut,
    consumed: usize,
    /// Head-only decoding (see [`Decoder::head_only`]): the records field is not read.
    head_only: bool,
    /// Where the skipped records field starts in the body and how long it is.
    elided_records: Option<(usize, usize)>,
}

impl Decoder {
    pub fn new(body: BytesMut) -> Decoder {
        Decoder {
            buf: body,
            consumed: 0,
            head_only: false,
            elided_records: None,
        }
    }

    /// A decoder over the first bytes of a body whose one records field is its last: the records
    /// field decodes as empty and [`Decoder::elided_records`] says where its bytes start in the
    /// body and how many there are, so a reader can place them before reading them.
    pub fn head_only(prefix: BytesMut) -> Decoder {
        Decoder {
            head_only: true,
            ..Decoder::new(prefix)
        }
    }

    /// `(offset in the body, length)` of the records field a head-only decoder skipped.
    pub fn elided_records(&self) -> Option<(usize, usize)> {
        self.elided_records
    }

    fn need(&self, needed: usize) -> Result<(), DecodeError> {
        if self.buf.len() < needed {
            return Err(DecodeError::Truncated {
                at: self.consumed,
                needed: needed - self.buf.len(),
            });
        }
        Ok(())
    }

    fn advance(&mut self, len: usize) {
        self.consumed += len;
    }

    pub fn get_u8(&mut self) -> Result<u8, DecodeError> {
        self.need(1)?;
        self.advance(1);
        Ok(self.buf.get_u8())
    }
    pub fn get_i8(&mut self) -> Result<i8, DecodeError> {
        self.need(1)?;
        self.advance(1);
        Ok(self.buf.get_i8())
    }
    pub fn get_u16(&mut self) -> Result<u16, DecodeError> {
        self.need(2)?;
        self.advance(2);
        Ok(self.buf.get_u16_le())
    }
    pub fn get_u32(&mut self) -> Result<u32, DecodeError> {
        self.need(4)?;
        self.advance(4);
        Ok(self.buf.get_u32_le())
    }
    pub fn get_i16(&mut self) -> Result<i16, DecodeError> {
        self.need(2)?;
        self.advance(2);
        Ok(self.buf.get_i16_le())
    }
    pub fn get_i32(&mut self) -> Result<i32, DecodeError> {
        self.need(4)?;
        self.advance(4);
        Ok(self.buf.get_i32_le())
    }
    pub fn get_u64(&mut self) -> Result<u64, DecodeError> {
        self.need(8)?;
        self.advance(8);
        Ok(self.buf.get_u64_le())
    }
    pub fn get_i64(&mut self) -> Result<i64, DecodeError> {
        self.need(8)?;
        self.advance(8);
        Ok(self.buf.get_i64_le())
    }
    pub fn get_bool(&mut self) -> Result<bool, DecodeError> {
        match self.get_u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(DecodeError::InvalidValue {
                field: "bool",
                value: i64::from(other),
            }),
        }
    }

    pub fn get_str(&mut self) -> Result<String, DecodeError> {
        let len = usize::from(self.get_u16()?);
        self.need(len)?;
        let at = self.consumed;
        let bytes = self.buf.split_to(len);
        self.advance(len);
        String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::InvalidUtf8 { at })
    }

    /// An array count, checked against what the frame can hold (each element takes at least
    /// `min_element_len` bytes), so a lying count cannot make the reader allocate.
    pub fn get_count(&mut self, min_element_len: usize) -> Result<usize, DecodeError> {
        let at = self.consumed;
        let count = self.get_u32()?;
        if (count as usize).saturating_mul(min_element_len.max(1)) > self.buf.len() {
            return Err(DecodeError::TooManyElements { at, count });
        }
        Ok(count as usize)
    }

    pub fn get_records(&mut self) -> Result<Records, DecodeError> {
        let len = self.get_u32()? as usize;
        let padding = (BATCH_ALIGN - self.consumed % BATCH_ALIGN) % BATCH_ALIGN;
        if self.head_only {
            if self.elided_records.is_some() {
                return Err(DecodeError::InvalidValue {
                    field: "records",
                    value: 2,
                });
            }
            self.elided_records = Some((self.consumed + padding, len));
            // Nothing follows the records field: the rest of the prefix is records.
            self.buf.clear();
            return Ok(Records::empty());
        }
        self.need(padding + len)?;
        self.buf.advance(padding);
        self.advance(padding);
        let records = self.buf.split_to(len);
        self.advance(len);
        Ok(Records::Mutable(records))
    }

    /// Whether every byte of the body has been read.
    pub fn is_at_end(&self) -> bool {
        self.buf.is_empty()
    }

    /// Ends decoding; leftover bytes mean the peer and we disagree on the message.
    pub fn finish(self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes {
                remaining: self.buf.len(),
            })
        }
    }
}

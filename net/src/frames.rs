//! Length-prefixed frames off a byte stream, in as few reads as the data allows.
//!
//! Reading a frame's 4-byte prefix, then exactly its body, costs two reads per frame and a
//! third that only finds the socket empty (the runtime learns a socket is drained from a read
//! that returns less than it asked for, and an exact read never does). Here every read asks
//! for up to [`READ_AHEAD`] bytes past the frame in hand: the next frame's prefix (or all of
//! a small frame, such as a produce answer) comes along when it has arrived, and a read that
//! finds less than it asked for ends the round. A body is read straight into a buffer of its
//! own; only the few bytes read ahead are copied, into the next frame's buffer.

use bytes::BytesMut;
use strata_wire::protocol::FRAME_PREFIX_LEN;
use tokio::io::{AsyncRead, AsyncReadExt};

/// How far a read may look past the frame in hand: a frame's prefix and header, or a whole
/// small frame (answers to produce requests, fetch requests, heartbeats).
pub const READ_AHEAD: usize = 512;

pub struct FrameReader<R> {
    reader: R,
    /// Bytes read past the previous frame: `ahead[start..end]`.
    ahead: [u8; READ_AHEAD],
    start: usize,
    end: usize,
    /// Kafka's frames give their length big-endian; Strata's little-endian.
    big_endian: bool,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// Frames of the native protocol.
    pub fn new(reader: R) -> Self {
        FrameReader {
            reader,
            ahead: [0; READ_AHEAD],
            start: 0,
            end: 0,
            big_endian: false,
        }
    }

    /// Frames whose length prefix is big-endian (Kafka's protocol).
    pub fn big_endian(reader: R) -> Self {
        FrameReader {
            big_endian: true,
            ..FrameReader::new(reader)
        }
    }

    /// The next frame's length (its prefix); `None` when the stream ends cleanly between
    /// frames. A stream that ends inside a prefix is an `UnexpectedEof` error.
    pub async fn next_len(&mut self) -> std::io::Result<Option<usize>> {
        while self.end - self.start < FRAME_PREFIX_LEN {
            self.ahead.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            let read = self.reader.read(&mut self.ahead[self.end..]).await?;
            if read == 0 {
                return if self.end == 0 {
                    Ok(None)
                } else {
                    Err(std::io::ErrorKind::UnexpectedEof.into())
                };
            }
            self.end += read;
        }
        let prefix: [u8; FRAME_PREFIX_LEN] = self.ahead[self.start..self.start + FRAME_PREFIX_LEN]
            .try_into()
            .expect("a prefix is FRAME_PREFIX_LEN bytes");
        self.start += FRAME_PREFIX_LEN;
        Ok(Some(if self.big_endian {
            u32::from_be_bytes(prefix)
        } else {
            u32::from_le_bytes(prefix)
        } as usize))
    }

    /// The next `len` bytes (a frame's body, after [`next_len`](Self::next_len)) in a buffer
    /// of their own, not zeroed first: a 1 MiB produce would otherwise cost a 1 MiB memset
    /// before the socket copy.
    pub async fn body(&mut self, len: usize) -> std::io::Result<BytesMut> {
        let buffered = (self.end - self.start).min(len);
        if buffered == len {
            let body = BytesMut::from(&self.ahead[self.start..self.start + len]);
            self.start += len;
            return Ok(body);
        }
        // The rest comes from the stream, with room to read ahead behind it.
        let mut body = BytesMut::with_capacity(len + READ_AHEAD);
        body.extend_from_slice(&self.ahead[self.start..self.end]);
        self.start = 0;
        self.end = 0;
        while body.len() < len {
            let room = (len + READ_AHEAD - body.len()) as u64;
            if (&mut self.reader).take(room).read_buf(&mut body).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        let past = body.len() - len;
        self.ahead[..past].copy_from_slice(&body[len..]);
        self.end = past;
        body.truncate(len);
        Ok(body)
    }

    /// Fills `out` from the stream (the first bytes of a body that will not be read whole).
    pub async fn read_exact(&mut self, out: &mut [u8]) -> std::io::Result<()> {
        let buffered = (self.end - self.start).min(out.len());
        out[..buffered].copy_from_slice(&self.ahead[self.start..self.start + buffered]);
        self.start += buffered;
        self.reader.read_exact(&mut out[buffered..]).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{FrameReader, READ_AHEAD};

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut frame = (body.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(body);
        frame
    }

    /// A reader that hands out at most `step` bytes per read and counts the reads.
    struct Trickle<'a> {
        rest: &'a [u8],
        step: usize,
        reads: usize,
    }

    impl tokio::io::AsyncRead for Trickle<'_> {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let take = self.step.min(buf.remaining()).min(self.rest.len());
            let (now, later) = self.rest.split_at(take);
            buf.put_slice(now);
            self.rest = later;
            self.reads += 1;
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn frames_of_every_size_come_out_whole_and_in_order() {
        let bodies: Vec<Vec<u8>> = [
            0usize,
            1,
            7,
            READ_AHEAD - 4,
            READ_AHEAD,
            3 * READ_AHEAD,
            70_000,
        ]
        .iter()
        .enumerate()
        .map(|(index, &len)| (0..len).map(|at| (at * 31 + index) as u8).collect())
        .collect();
        let stream: Vec<u8> = bodies.iter().flat_map(|body| frame(body)).collect();
        for step in [1, 3, 5, 64, 511, 4096, usize::MAX] {
            let mut frames = FrameReader::new(Trickle {
                rest: &stream,
                step,
                reads: 0,
            });
            for body in &bodies {
                let len = frames.next_len().await.unwrap().unwrap();
                assert_eq!(len, body.len(), "step {step}");
                assert_eq!(
                    &frames.body(len).await.unwrap()[..],
                    &body[..],
                    "step {step}"
                );
            }
            assert!(frames.next_len().await.unwrap().is_none(), "a clean end");
        }
    }

    #[tokio::test]
    async fn small_frames_that_arrive_together_take_one_read() {
        let stream: Vec<u8> = (0..5u8).flat_map(|n| frame(&[n; 40])).collect();
        let mut frames = FrameReader::new(Trickle {
            rest: &stream,
            step: usize::MAX,
            reads: 0,
        });
        for n in 0..5u8 {
            let len = frames.next_len().await.unwrap().unwrap();
            assert_eq!(&frames.body(len).await.unwrap()[..], &[n; 40]);
        }
        assert_eq!(frames.reader.reads, 1, "the read ahead took all five");
    }

    #[tokio::test]
    async fn a_large_frame_is_read_into_its_body_and_brings_the_next_prefix() {
        let mut stream = frame(&[9; 100_000]);
        stream.extend(frame(b"next"));
        let mut frames = FrameReader::new(Trickle {
            rest: &stream,
            step: usize::MAX,
            reads: 0,
        });
        let len = frames.next_len().await.unwrap().unwrap();
        let body = frames.body(len).await.unwrap();
        assert!(body.iter().all(|&byte| byte == 9) && body.len() == 100_000);
        assert_eq!(
            frames.reader.reads, 2,
            "the prefix's read, then the rest in one"
        );
        let len = frames.next_len().await.unwrap().unwrap();
        assert_eq!(&frames.body(len).await.unwrap()[..], b"next");
        assert_eq!(
            frames.reader.reads, 2,
            "the next frame came with the last read"
        );
    }

    #[tokio::test]
    async fn a_stream_that_ends_inside_a_frame_is_an_error() {
        for cut in [2, 4 + 10] {
            let stream = frame(&[1; 20]);
            let mut frames = FrameReader::new(&stream[..cut]);
            let error = match frames.next_len().await {
                Ok(Some(len)) => frames.body(len).await.unwrap_err(),
                Ok(None) => panic!("a cut prefix is not a clean end"),
                Err(error) => error,
            };
            assert_eq!(
                error.kind(),
                std::io::ErrorKind::UnexpectedEof,
                "cut at {cut}"
            );
        }
    }

    #[tokio::test]
    async fn the_start_of_a_body_can_be_read_on_its_own() {
        let stream = frame(b"header-and-the-rest");
        let mut frames = FrameReader::new(&stream[..]);
        assert_eq!(frames.next_len().await.unwrap(), Some(19));
        let mut header = [0u8; 6];
        frames.read_exact(&mut header).await.unwrap();
        assert_eq!(&header, b"header");
    }
}

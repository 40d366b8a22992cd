//! Writing a frame that is several buffers (a header and the records it carries, uncopied).

use std::io::IoSlice;

use bytes::{Buf, Bytes};
use tokio::io::AsyncWriteExt;

/// Writes a frame's chunks with vectored writes, handling short writes.
pub async fn write_all_chunks<W: tokio::io::AsyncWrite + Unpin>(
    writer: &mut W,
    mut chunks: Vec<Bytes>,
) -> std::io::Result<()> {
    let mut first = 0;
    while first < chunks.len() {
        // writev takes at most IOV_MAX (1024) buffers; the rest go in the next round.
        let slices: Vec<IoSlice<'_>> = chunks[first..]
            .iter()
            .take(1024)
            .map(|c| IoSlice::new(c))
            .collect();
        let mut written = writer.write_vectored(&slices).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while first < chunks.len() && written >= chunks[first].len() {
            written -= chunks[first].len();
            first += 1;
        }
        if written > 0 {
            chunks[first].advance(written);
        }
    }
    Ok(())
}

//! Fallback backend for hosts without io_uring: positional syscalls on the shard thread.
//!
//! Its reads and syncs block the shard, which io_uring avoids (appends are `pwrite`s on both
//! backends, see `uring`); it exists so that a node on such a host runs instead of failing. [`super::Backend::detect`] says why it was chosen.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::uring::{fd_len, list_dir_blocking, start_writeback, sync_dir_blocking};
use super::{DirectReadBuf, ReadBuf, Storage, StorageFile};

#[derive(Clone, Copy, Debug, Default)]
pub struct BlockingStorage;

pub struct BlockingFile {
    file: File,
    /// The same file opened with `O_DIRECT`, for [`StorageFile::write_direct_at`].
    direct: Option<File>,
}

impl StorageFile for BlockingFile {
    async fn write_all_at(&self, bytes: Bytes, pos: u64) -> io::Result<()> {
        self.file.write_all_at(&bytes, pos)
    }

    async fn write_all_in_order_at(&self, buffers: Vec<Bytes>, pos: u64) -> io::Result<()> {
        super::write_all_vectored_at(self.file.as_raw_fd(), &buffers, pos)
    }

    fn writes_direct(&self) -> bool {
        self.direct.is_some()
    }

    async fn write_direct_at(&self, bytes: Bytes, pos: u64) -> io::Result<()> {
        super::assert_direct_aligned(&bytes, pos);
        match &self.direct {
            Some(direct) => direct
                .write_all_at(&bytes, pos)
                .inspect(|()| super::count_direct_write(bytes.len())),
            None => Err(io::ErrorKind::Unsupported.into()),
        }
    }

    async fn read_at(&self, buf: ReadBuf, pos: u64) -> (io::Result<()>, ReadBuf) {
        read_fully(&self.file, buf, pos)
    }

    async fn read_direct_at(
        &self,
        buf: DirectReadBuf,
        pos: u64,
    ) -> (io::Result<()>, DirectReadBuf) {
        super::assert_direct_read_aligned(&buf, pos);
        match &self.direct {
            Some(direct) => {
                let (result, buf) = read_fully(direct, buf, pos);
                (
                    result.inspect(|()| super::count_direct_read(buf.len())),
                    buf,
                )
            }
            None => (Err(io::ErrorKind::Unsupported.into()), buf),
        }
    }

    async fn start_writeback(&self, pos: u64, len: u64) -> io::Result<()> {
        start_writeback(self.file.as_raw_fd(), pos, len)
    }

    fn share_descriptor(&self) -> Option<std::os::fd::OwnedFd> {
        super::duplicate_descriptor(self.file.as_raw_fd())
    }

    fn is_cached(&self, pos: u64, len: u64) -> bool {
        super::range_is_cached(self.file.as_raw_fd(), pos, len)
    }

    async fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    async fn allocate(&self, pos: u64, len: u64) -> io::Result<()> {
        // SAFETY: plain syscall on an fd we own.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_KEEP_SIZE,
                pos as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    async fn file_len(&self) -> io::Result<u64> {
        fd_len(self.file.as_raw_fd())
    }
}

impl Storage for BlockingStorage {
    type File = BlockingFile;

    async fn open(&self, path: &Path, create: bool) -> io::Result<BlockingFile> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(path)?;
        Ok(BlockingFile { file, direct: None })
    }

    async fn open_direct(&self, path: &Path, create: bool) -> io::Result<BlockingFile> {
        let mut file = self.open(path, create).await?;
        file.direct = super::open_direct_handle(path)?;
        Ok(file)
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    async fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir_all(path)
    }

    async fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        sync_dir_blocking(dir)
    }

    async fn list_dir(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        list_dir_blocking(dir)
    }
}

/// Reads up to `buf.capacity()` bytes of `file` at `pos`, replacing the buffer's contents; short
/// only at the end of the file.
fn read_fully<const ALIGN: usize>(
    file: &File,
    mut buf: ReadBuf<ALIGN>,
    pos: u64,
) -> (io::Result<()>, ReadBuf<ALIGN>) {
    buf.clear();
    let capacity = buf.capacity();
    let mut filled = 0;
    while filled < capacity {
        // SAFETY: the range [filled, capacity) lies inside the buffer's allocation, and the
        // kernel writes at most `capacity - filled` bytes into it.
        let spare = unsafe {
            std::slice::from_raw_parts_mut(buf.spare_mut_ptr().add(filled), capacity - filled)
        };
        match file.read_at(spare, pos + filled as u64) {
            Ok(0) => break,
            Ok(read) if super::ends_direct_read::<ALIGN>(read) => {
                filled += read;
                break;
            }
            Ok(read) => filled += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return (Err(error), buf),
        }
    }
    // SAFETY: the reads above initialised exactly `filled` bytes.
    unsafe { buf.set_len(filled) };
    (Ok(()), buf)
}

//! The storage seam: the only place the partition log touches the operating system.
//!
//! Six file operations (write at, write past the page cache, read at, sync, truncate, allocate)
//! plus the directory calls a log needs when it opens, rolls and deletes segments. Three
//! backends:
//! - [`uring::UringStorage`]: io_uring through tokio-uring for reads and syncs, `pwrite` for
//!   appends (see its docs); the production backend.
//! - [`blocking::BlockingStorage`]: positional `pread`/`pwrite` syscalls, for hosts where io_uring
//!   cannot be set up (old kernel, `kernel.io_uring_disabled`, a seccomp profile).
//! - [`sim::SimStorage`]: in memory, for tests: injects IO errors, tears writes and drops unflushed
//!   data on a simulated crash, deterministically from a seed.
//!
//! Media assumptions (see `docs/format.md`): after `sync_data` returns Ok, the bytes written
//! before it survive power loss; bytes written after the last successful sync may be lost, or
//! survive as a prefix of the writes with the last one torn. A failed sync means the written data
//! may be lost even though reads still return it, so callers must treat it as fatal for the file.

// The shards are single-threaded (thread per core), so the futures here are deliberately not
// `Send`; the lint that asks public async trait methods to promise `Send` does not apply.
#![allow(async_fn_in_trait)]

pub mod any;
pub mod blocking;
pub mod sim;
pub mod uring;

use std::io;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use strata_wire::AlignedVec;

pub use any::{AnyFile, AnyStorage};

/// A read buffer whose start is `ALIGN`-byte aligned: 16 by default, so batches read into it at a
/// batch boundary can be validated and accessed in place; [`DIRECT_BLOCK`] for reads past the
/// page cache ([`DirectReadBuf`]). Converts into `Bytes` without copying.
pub struct ReadBuf<const ALIGN: usize = 16>(AlignedVec<ALIGN>);

/// The buffer of [`StorageFile::read_direct_at`].
pub type DirectReadBuf = ReadBuf<DIRECT_BLOCK>;

impl<const ALIGN: usize> ReadBuf<ALIGN> {
    pub fn with_capacity(capacity: usize) -> ReadBuf<ALIGN> {
        ReadBuf(AlignedVec::with_capacity(capacity))
    }

    pub fn capacity(&self) -> usize {
        self.0.capacity()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }

    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }

    pub fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self.0)
    }

    /// Marks the first `len` bytes as written by the kernel.
    ///
    /// # Safety
    /// The caller guarantees the first `len` bytes were initialised (by a completed read).
    pub(crate) unsafe fn set_len(&mut self, len: usize) {
        assert!(len <= self.0.capacity());
        // SAFETY: the caller guarantees initialisation; the bound is asserted above.
        unsafe { self.0.set_len(len) }
    }

    pub(crate) fn spare_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
}

/// The unit of writes that bypass the page cache: their position, length and buffer address are
/// multiples of it. 4 KiB covers the logical block size of every common disk and file system.
pub const DIRECT_BLOCK: usize = 4096;

/// One open file. Every method is positional: a file has no cursor.
pub trait StorageFile: 'static {
    /// Writes all of `bytes` at `pos`.
    async fn write_all_at(&self, bytes: Bytes, pos: u64) -> io::Result<()>;
    /// Writes `buffers` back to back starting at `pos`, one after another. Measured on ext4 with
    /// 8 x 1 MiB groups: one IORING_OP_WRITEV ran 4-5x slower than these sequential writes, and
    /// all eight submitted at once about 2x slower (buffered writes to one inode serialize in
    /// the kernel's io-wq workers and contend there). Writing on the calling thread, the
    /// backends make it one `pwritev` ([`write_all_vectored_at`]).
    async fn write_all_in_order_at(&self, buffers: Vec<Bytes>, pos: u64) -> io::Result<()> {
        write_each_in_order(self, buffers, pos).await
    }
    /// Whether [`StorageFile::write_direct_at`] bypasses the page cache: the file was opened with
    /// [`Storage::open_direct`] and its file system takes `O_DIRECT`.
    fn writes_direct(&self) -> bool {
        false
    }
    /// Writes `bytes` at `pos` past the page cache (`O_DIRECT`): the data goes from `bytes`
    /// straight to the disk, with no copy into kernel memory, and the call completes when the
    /// disk has it (not yet durable against power loss: that still takes `sync_data`). `pos`,
    /// `bytes.len()` and the address of `bytes` are multiples of [`DIRECT_BLOCK`]. Only called
    /// when [`StorageFile::writes_direct`] is true.
    async fn write_direct_at(&self, bytes: Bytes, pos: u64) -> io::Result<()> {
        let _ = (bytes, pos);
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Reads up to `buf.capacity()` bytes at `pos`, replacing the buffer's contents. A short read
    /// happens only at the end of the file.
    async fn read_at(&self, buf: ReadBuf, pos: u64) -> (io::Result<()>, ReadBuf);
    /// As [`StorageFile::read_at`], past the page cache (`O_DIRECT`): from the disk straight into
    /// `buf`, leaving the page cache as it was. `pos` and `buf.capacity()` are multiples of
    /// [`DIRECT_BLOCK`]. Only called when [`StorageFile::writes_direct`] is true.
    async fn read_direct_at(
        &self,
        buf: DirectReadBuf,
        pos: u64,
    ) -> (io::Result<()>, DirectReadBuf) {
        let _ = pos;
        (Err(io::ErrorKind::Unsupported.into()), buf)
    }
    /// Asks the kernel to start writing `[pos, pos + len)` back to the disk now, without waiting,
    /// so a later `sync_data` finds most of it already written (`sync_file_range(WRITE)`).
    async fn start_writeback(&self, _pos: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    /// `fdatasync`: makes every completed write durable.
    async fn sync_data(&self) -> io::Result<()>;
    /// Cuts the file to `len` bytes (recovery and replication truncation; not the data path).
    async fn truncate(&self, len: u64) -> io::Result<()>;
    /// Reserves disk blocks for `[pos, pos + len)` without changing the file's length.
    async fn allocate(&self, pos: u64, len: u64) -> io::Result<()>;
    /// The file's current length.
    async fn file_len(&self) -> io::Result<u64>;
    /// A descriptor of this file of its own (`dup`), to hand a range of it to the kernel
    /// (`sendfile`) from another task or thread; `None` where the backend has no descriptors
    /// (the simulation) or `dup` failed.
    fn share_descriptor(&self) -> Option<std::os::fd::OwnedFd> {
        None
    }
    /// Whether every page of `[pos, pos + len)` is in the page cache now, so that sending the
    /// range would not wait for the disk (`cachestat(2)`, Linux 6.5); false where unknown.
    fn is_cached(&self, _pos: u64, _len: u64) -> bool {
        false
    }
}

/// [`StorageFile::write_all_in_order_at`] as one [`StorageFile::write_all_at`] per buffer.
pub(crate) async fn write_each_in_order<F: StorageFile + ?Sized>(
    file: &F,
    buffers: Vec<Bytes>,
    pos: u64,
) -> io::Result<()> {
    let mut at = pos;
    for bytes in buffers {
        let len = bytes.len() as u64;
        file.write_all_at(bytes, at).await?;
        at += len;
    }
    Ok(())
}

/// `pwritev` of `buffers` back to back from `pos` on the calling thread, looping over short
/// writes: a group of appends costs one system call, not one per append (with small appends
/// the per-call work of a buffered write, not the copy, was most of it).
pub(crate) fn write_all_vectored_at(
    fd: std::os::fd::RawFd,
    buffers: &[Bytes],
    mut pos: u64,
) -> io::Result<()> {
    /// At most this many buffers per call (the kernel's IOV_MAX).
    const IOV_MAX: usize = 1024;
    let (mut first, mut skip) = (0usize, 0usize);
    while first < buffers.len() {
        let iovecs: Vec<libc::iovec> = buffers[first..]
            .iter()
            .take(IOV_MAX)
            .enumerate()
            .map(|(index, buffer)| {
                let rest = if index == 0 {
                    &buffer[skip..]
                } else {
                    &buffer[..]
                };
                libc::iovec {
                    iov_base: rest.as_ptr() as *mut libc::c_void,
                    iov_len: rest.len(),
                }
            })
            .collect();
        // SAFETY: every iovec points into a live buffer of `buffers` for its length, which the
        // kernel only reads; `fd` stays open for the call (the caller's file owns it).
        let written = unsafe {
            libc::pwritev(
                fd,
                iovecs.as_ptr(),
                iovecs.len() as libc::c_int,
                pos as libc::off_t,
            )
        };
        if written < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        pos += written as u64;
        let mut left = written as usize;
        while left > 0 {
            let rest = buffers[first].len() - skip;
            if left >= rest {
                left -= rest;
                first += 1;
                skip = 0;
            } else {
                skip += left;
                left = 0;
            }
        }
        while first < buffers.len() && buffers[first].len() == skip {
            first += 1;
            skip = 0;
        }
    }
    Ok(())
}

/// See [`StorageFile::share_descriptor`].
pub(crate) fn duplicate_descriptor(fd: std::os::fd::RawFd) -> Option<std::os::fd::OwnedFd> {
    // SAFETY: the caller's file owns `fd` and keeps it open for this call.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    borrowed.try_clone_to_owned().ok()
}

/// See [`StorageFile::is_cached`]: asks `cachestat(2)` how many pages of the range are
/// resident.
pub(crate) fn range_is_cached(fd: std::os::fd::RawFd, pos: u64, len: u64) -> bool {
    if len == 0 {
        return false;
    }
    let page = 4096u64;
    let pages = (pos + len).div_ceil(page) - pos / page;
    page_cache_stat(fd, pos, len).is_some_and(|stat| stat.cached >= pages)
}

/// Pages of a file range in the page cache, as `cachestat(2)` counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PageCacheStat {
    pub cached: u64,
    pub dirty: u64,
}

/// `cachestat(2)` of `[pos, pos + len)` of `fd`; `None` where the kernel has no such call
/// (ENOSYS is remembered, so such kernels pay one failed call) or it failed.
pub(crate) fn page_cache_stat(fd: std::os::fd::RawFd, pos: u64, len: u64) -> Option<PageCacheStat> {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        use std::sync::atomic::{AtomicBool, Ordering};
        /// `__NR_cachestat` on x86_64 and in the generic table (aarch64).
        const SYS_CACHESTAT: libc::c_long = 451;
        static UNSUPPORTED: AtomicBool = AtomicBool::new(false);
        #[repr(C)]
        struct Range {
            off: u64,
            len: u64,
        }
        #[repr(C)]
        #[derive(Default)]
        struct Cachestat {
            nr_cache: u64,
            nr_dirty: u64,
            nr_writeback: u64,
            nr_evicted: u64,
            nr_recently_evicted: u64,
        }
        if UNSUPPORTED.load(Ordering::Relaxed) {
            return None;
        }
        let range = Range { off: pos, len };
        let mut stat = Cachestat::default();
        // SAFETY: cachestat reads `range` and writes `stat`, both live locals of the declared
        // layouts, and only inspects the page cache of `fd`, which the caller keeps open.
        let rc = unsafe {
            libc::syscall(
                SYS_CACHESTAT,
                fd,
                &range as *const Range,
                &mut stat as *mut Cachestat,
                0u32,
            )
        };
        if rc != 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
                UNSUPPORTED.store(true, Ordering::Relaxed);
            }
            return None;
        }
        Some(PageCacheStat {
            cached: stat.nr_cache,
            dirty: stat.nr_dirty,
        })
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (fd, pos, len);
        None
    }
}

/// A shard's view of a file system.
pub trait Storage: Clone + 'static {
    type File: StorageFile;

    /// Opens `path` for reading and writing, creating it when `create` is set.
    async fn open(&self, path: &Path, create: bool) -> io::Result<Self::File>;
    /// Like [`Storage::open`], with a second handle for [`StorageFile::write_direct_at`] where
    /// the file system takes `O_DIRECT` (not tmpfs, for one); where it does not, the file is
    /// opened as by `open` and [`StorageFile::writes_direct`] says so.
    async fn open_direct(&self, path: &Path, create: bool) -> io::Result<Self::File> {
        self.open(path, create).await
    }
    async fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Renames `from` to `to` atomically, replacing `to` if it exists; durable after
    /// [`Storage::sync_dir`].
    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    async fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    async fn remove_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Makes the creation and removal of entries in `dir` durable.
    async fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// The entries of `dir` (file names only), in no particular order.
    async fn list_dir(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;
}

/// IO past the page cache one thread (a shard) has completed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirectIoTotals {
    pub writes: u64,
    /// Padding included.
    pub write_bytes: u64,
    pub reads: u64,
    pub read_bytes: u64,
}

thread_local! {
    static DIRECT_IO: std::cell::Cell<DirectIoTotals> = const {
        std::cell::Cell::new(DirectIoTotals { writes: 0, write_bytes: 0, reads: 0, read_bytes: 0 })
    };
}

fn update_direct_io(update: impl FnOnce(&mut DirectIoTotals)) {
    DIRECT_IO.with(|totals| {
        let mut now = totals.get();
        update(&mut now);
        totals.set(now);
    });
}

/// Counts one completed direct write of `bytes` on this thread.
pub(crate) fn count_direct_write(bytes: usize) {
    update_direct_io(|totals| {
        totals.writes += 1;
        totals.write_bytes += bytes as u64;
    });
}

/// Counts one completed direct read of `bytes` on this thread.
pub(crate) fn count_direct_read(bytes: usize) {
    update_direct_io(|totals| {
        totals.reads += 1;
        totals.read_bytes += bytes as u64;
    });
}

/// Direct IO completed on this thread so far (for `/metrics`).
pub fn direct_io_totals() -> DirectIoTotals {
    DIRECT_IO.with(std::cell::Cell::get)
}

/// Checks the preconditions of [`StorageFile::write_direct_at`].
pub(crate) fn assert_direct_aligned(bytes: &[u8], pos: u64) {
    let block = DIRECT_BLOCK as u64;
    assert!(
        pos.is_multiple_of(block)
            && (bytes.len() as u64).is_multiple_of(block)
            && (bytes.as_ptr() as usize).is_multiple_of(DIRECT_BLOCK),
        "direct writes are whole aligned blocks (pos {pos}, len {}, address {:p})",
        bytes.len(),
        bytes.as_ptr()
    );
}

/// Whether a read of `read` bytes into a `ReadBuf<ALIGN>` was a direct read (whole blocks) that
/// came short at the end of the file: the read loops stop there.
pub(crate) fn ends_direct_read<const ALIGN: usize>(read: usize) -> bool {
    ALIGN == DIRECT_BLOCK && !read.is_multiple_of(DIRECT_BLOCK)
}

/// Checks the preconditions of [`StorageFile::read_direct_at`].
pub(crate) fn assert_direct_read_aligned(buf: &DirectReadBuf, pos: u64) {
    assert!(
        pos.is_multiple_of(DIRECT_BLOCK as u64) && buf.capacity().is_multiple_of(DIRECT_BLOCK),
        "direct reads are whole blocks (pos {pos}, capacity {})",
        buf.capacity()
    );
}

/// Opens `path` with `O_DIRECT` for reading and writing, or says why the file system will not
/// (`None`: it refused the flag, as tmpfs does).
pub fn open_direct_handle(path: &Path) -> io::Result<Option<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(file) => Ok(Some(file)),
        Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::info!(
                    path = %path.display(),
                    "the file system takes no O_DIRECT: appends go through the page cache"
                );
            });
            Ok(None)
        }
        Err(error) => Err(error),
    }
}

/// Runs `work` on a single-threaded runtime for `backend`: tokio-uring for io_uring, a plain
/// current-thread tokio runtime (with a LocalSet, as shards use) for the blocking fallback.
pub fn run_on<F, T>(backend: &Backend, work: impl FnOnce(AnyStorage) -> F) -> T
where
    F: std::future::Future<Output = T>,
{
    match backend {
        Backend::IoUring => tokio_uring::start(work(AnyStorage::Uring(uring::UringStorage))),
        Backend::Blocking { .. } => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a current-thread runtime builds");
            tokio::task::LocalSet::new().block_on(
                &runtime,
                work(AnyStorage::Blocking(blocking::BlockingStorage)),
            )
        }
    }
}

/// Which backend a shard runs on, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    IoUring,
    /// io_uring could not be set up; the reason is what the kernel said.
    Blocking {
        reason: String,
    },
}

impl Backend {
    /// Probes whether this process may create an io_uring instance. `STRATA_IO_BACKEND=blocking`
    /// forces the fallback (to test it, or to work around a broken io_uring).
    pub fn detect() -> Backend {
        if std::env::var("STRATA_IO_BACKEND").is_ok_and(|value| value == "blocking") {
            let reason = "STRATA_IO_BACKEND=blocking".to_string();
            tracing::warn!("using the blocking pread/pwrite backend: {reason}");
            return Backend::Blocking { reason };
        }
        match uring::probe() {
            Ok(()) => Backend::IoUring,
            Err(error) => {
                let reason = match error.raw_os_error() {
                    Some(libc::ENOSYS) => format!("the kernel has no io_uring ({error})"),
                    Some(libc::EPERM) => format!(
                        "io_uring is disabled (kernel.io_uring_disabled or a seccomp profile: {error})"
                    ),
                    Some(libc::ENOMEM) => {
                        format!("io_uring could not lock memory (raise RLIMIT_MEMLOCK: {error})")
                    }
                    _ => format!("io_uring setup failed: {error}"),
                };
                tracing::warn!(
                    "io_uring unavailable, using the blocking pread/pwrite backend: {reason}"
                );
                Backend::Blocking { reason }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn vectored_writes_land_back_to_back_whatever_the_buffers() {
        let file = tempfile::tempfile().unwrap();
        // Empty buffers, odd sizes, and more buffers than one call takes (IOV_MAX).
        let buffers: Vec<Bytes> = (0..2500u32)
            .map(|index| Bytes::from(vec![(index % 251) as u8; (index as usize * 7) % 13]))
            .collect();
        write_all_vectored_at(file.as_raw_fd(), &buffers, 100).unwrap();
        let written = std::fs::read(format!("/proc/self/fd/{}", file.as_raw_fd())).unwrap();
        let expected: Vec<u8> = buffers.iter().flat_map(|buffer| buffer.to_vec()).collect();
        assert_eq!(written.len(), 100 + expected.len());
        assert!(written[..100].iter().all(|byte| *byte == 0));
        assert_eq!(&written[100..], &expected[..]);
    }
}

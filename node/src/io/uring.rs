//! io_uring backend (tokio-uring). Must run inside a tokio-uring runtime (one per shard).
//!
//! Appends are the exception: they are `pwrite`s on the shard thread by default. ext4 takes no
//! non-blocking buffered writes, so io_uring hands every write to an io-wq kernel worker and
//! the shard waits for that thread to be woken, to copy, and to post the completion. At many
//! small requests that hand-off is the broker's bottleneck: 50,000 records/s of 1 KiB in
//! requests of ~2 records, one node `--shards 2`, broker time per produce request was
//! 1.1–1.4 ms through the ring (the queue grew without bound: p50 0.6–0.85 s) against
//! 98–116 µs with `pwrite` (p50 1.9–2.2 ms, p99 6–8 ms), alternating runs. The copy
//! into the page cache is the same work on either thread. Reads (served inline by io_uring when
//! cached), syncs and allocation stay on the ring, so a cold read or an `fdatasync` never
//! blocks the shard; writeback hints go to a thread of the shard's own ([`WritebackHints`]). `STRATA_IO_WRITES=uring` sends appends through the ring again (for
//! filesystems with non-blocking buffered writes, such as XFS, and to measure).

use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use tokio_uring::buf::{IoBuf, IoBufMut};

use super::{DirectReadBuf, ReadBuf, Storage, StorageFile};

/// Checks that this process may set up an io_uring instance.
pub fn probe() -> io::Result<()> {
    tokio_uring::uring_builder().build(8).map(drop)
}

#[derive(Clone, Copy, Debug, Default)]
pub struct UringStorage;

thread_local! {
    /// io_uring operations this thread (a shard) has submitted and not yet seen complete: the
    /// submission queue's depth as the shard uses it (tokio-uring does not expose the ring's).
    static IN_FLIGHT: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// The most in flight at once in the current window, and in the one before it.
    static IN_FLIGHT_MAX: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
    /// When the current window began.
    static WINDOW_START: std::cell::Cell<Option<std::time::Instant>> =
        const { std::cell::Cell::new(None) };
}

/// The peak covers 10 s windows rather than "since the last look": several scrapers (a
/// Prometheus server, the dashboard polling every second) each see the same peak instead of
/// taking it from one another.
const IN_FLIGHT_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// Counts one operation in flight for as long as it lives.
struct InFlight;

impl InFlight {
    fn start() -> InFlight {
        let now = IN_FLIGHT.with(|count| {
            count.set(count.get() + 1);
            count.get()
        });
        IN_FLIGHT_MAX.with(|max| {
            let (current, previous) = max.get();
            max.set((current.max(now), previous));
        });
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.with(|count| count.set(count.get() - 1));
    }
}

/// This thread's io_uring operations in flight now, and the most at once over the current and
/// the previous [`IN_FLIGHT_WINDOW`] (so between 10 and 20 s back).
pub fn take_in_flight() -> (u64, u64) {
    let now = IN_FLIGHT.with(std::cell::Cell::get);
    let started =
        WINDOW_START.with(|start| *start.get().get_or_insert_with(std::time::Instant::now));
    let (mut current, mut previous) = IN_FLIGHT_MAX.with(std::cell::Cell::get);
    if started.elapsed() >= IN_FLIGHT_WINDOW {
        (current, previous) = (now, current);
        IN_FLIGHT_MAX.with(|max| max.set((current, previous)));
        WINDOW_START.with(|start| start.set(Some(std::time::Instant::now())));
    }
    (now, current.max(previous))
}

pub struct UringFile {
    file: tokio_uring::fs::File,
    /// The same file opened with `O_DIRECT`, for [`StorageFile::write_direct_at`] and
    /// [`StorageFile::read_direct_at`].
    direct: Option<tokio_uring::fs::File>,
}

// SAFETY: the pointer is the start of the AlignedVec's heap allocation, which does not move while
// the buffer is owned by an in-flight operation; init and total mirror its length and capacity.
unsafe impl<const ALIGN: usize> IoBuf for ReadBuf<ALIGN> {
    fn stable_ptr(&self) -> *const u8 {
        self.as_slice().as_ptr()
    }

    fn bytes_init(&self) -> usize {
        self.len()
    }

    fn bytes_total(&self) -> usize {
        self.capacity()
    }
}

// SAFETY: as above; `set_init` is only called by tokio-uring after the kernel filled that many bytes.
unsafe impl<const ALIGN: usize> IoBufMut for ReadBuf<ALIGN> {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.spare_mut_ptr()
    }

    unsafe fn set_init(&mut self, pos: usize) {
        if self.len() < pos {
            // SAFETY: tokio-uring guarantees the kernel initialised `pos` bytes.
            unsafe { self.set_len(pos) }
        }
    }
}

/// Whether appends are `pwrite`s on the shard thread (see the module docs); read once.
fn inline_writes() -> bool {
    static INLINE: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
        std::env::var("STRATA_IO_WRITES").map_or(true, |value| value != "uring")
    });
    *INLINE
}

/// `pwrite` of all of `bytes` at `pos` on the calling thread.
fn write_inline(fd: std::os::fd::RawFd, bytes: &[u8], pos: u64) -> io::Result<()> {
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::FileExt;
    // SAFETY: `fd` is open for as long as the caller's file lives, which outlasts this call;
    // ManuallyDrop keeps this borrowed `File` from closing it.
    let file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    file.write_all_at(bytes, pos)
}

impl UringFile {
    /// An io_uring write (`STRATA_IO_WRITES=uring`).
    async fn write_through_ring(&self, bytes: Bytes, pos: u64) -> io::Result<()> {
        let _in_flight = InFlight::start();
        let (result, _) = self.file.write_all_at(bytes, pos).await;
        result
    }
}

impl StorageFile for UringFile {
    async fn write_all_at(&self, bytes: Bytes, pos: u64) -> io::Result<()> {
        if inline_writes() {
            write_inline(self.file.as_raw_fd(), &bytes, pos)
        } else {
            self.write_through_ring(bytes, pos).await
        }
    }

    async fn write_all_in_order_at(&self, buffers: Vec<Bytes>, pos: u64) -> io::Result<()> {
        if inline_writes() {
            return super::write_all_vectored_at(self.file.as_raw_fd(), &buffers, pos);
        }
        super::write_each_in_order(self, buffers, pos).await
    }

    fn writes_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Through the ring: a direct write waits for the disk, which must not block the shard.
    async fn write_direct_at(&self, bytes: Bytes, pos: u64) -> io::Result<()> {
        super::assert_direct_aligned(&bytes, pos);
        let Some(direct) = &self.direct else {
            return Err(io::ErrorKind::Unsupported.into());
        };
        let _in_flight = InFlight::start();
        let len = bytes.len();
        let (result, _) = direct.write_all_at(bytes, pos).await;
        result.inspect(|()| super::count_direct_write(len))
    }

    async fn read_at(&self, buf: ReadBuf, pos: u64) -> (io::Result<()>, ReadBuf) {
        read_through_ring(&self.file, buf, pos).await
    }

    async fn read_direct_at(
        &self,
        buf: DirectReadBuf,
        pos: u64,
    ) -> (io::Result<()>, DirectReadBuf) {
        super::assert_direct_read_aligned(&buf, pos);
        let Some(direct) = &self.direct else {
            return (Err(io::ErrorKind::Unsupported.into()), buf);
        };
        let (result, buf) = read_through_ring(direct, buf, pos).await;
        (
            result.inspect(|()| super::count_direct_read(buf.len())),
            buf,
        )
    }

    /// Handed to this shard's writeback thread ([`WritebackHints`]), not made here.
    async fn start_writeback(&self, pos: u64, len: u64) -> io::Result<()> {
        WRITEBACK_HINTS.with(|hints| hints.send(self.file.as_raw_fd(), pos, len))
    }

    fn share_descriptor(&self) -> Option<std::os::fd::OwnedFd> {
        super::duplicate_descriptor(self.file.as_raw_fd())
    }

    fn is_cached(&self, pos: u64, len: u64) -> bool {
        super::range_is_cached(self.file.as_raw_fd(), pos, len)
    }

    async fn sync_data(&self) -> io::Result<()> {
        let _in_flight = InFlight::start();
        self.file.sync_data().await
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        // tokio-uring 0.5 has no ftruncate opcode; truncation is rare (recovery, replica
        // divergence), so a direct syscall is fine here.
        // SAFETY: the fd is open for as long as `self.file` lives.
        let rc = unsafe { libc::ftruncate(self.file.as_raw_fd(), len as libc::off_t) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    async fn allocate(&self, pos: u64, len: u64) -> io::Result<()> {
        self.file
            .fallocate(pos, len, libc::FALLOC_FL_KEEP_SIZE)
            .await
    }

    async fn file_len(&self) -> io::Result<u64> {
        fd_len(self.file.as_raw_fd())
    }
}

/// Reads up to `buf.capacity()` bytes of `file` at `pos` through the ring, replacing the
/// buffer's contents.
async fn read_through_ring<const ALIGN: usize>(
    file: &tokio_uring::fs::File,
    mut buf: ReadBuf<ALIGN>,
    pos: u64,
) -> (io::Result<()>, ReadBuf<ALIGN>) {
    let _in_flight = InFlight::start();
    buf.clear();
    // A read may return fewer bytes than asked before the end of the file (a signal, a
    // page-cache boundary); keep reading until the buffer is full or the file ends.
    let mut filled = 0;
    loop {
        let want = buf.capacity() - filled;
        if want == 0 {
            return (Ok(()), buf);
        }
        let slice = tokio_uring::buf::BoundedBuf::slice(buf, filled..);
        let (result, slice) = file.read_at(slice, pos + filled as u64).await;
        buf = slice.into_inner();
        match result {
            Ok(0) => return (Ok(()), buf),
            // Part of a block: a direct read (whole blocks) reached the end of the file, and
            // reading on from there would not be block-aligned.
            Ok(read) if super::ends_direct_read::<ALIGN>(read) => return (Ok(()), buf),
            Ok(read) => filled += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return (Err(error), buf),
        }
    }
}

/// Writeback hints waiting for a shard's writeback thread at most; more are dropped (they are
/// hints: the kernel's flusher writes the pages back in time anyway).
const WRITEBACK_HINTS_QUEUED_MAX: usize = 64;

/// A shard's thread for writeback hints (`sync_file_range(WRITE)`, [`start_writeback`]). The
/// call does not wait for the disk, but it waits to hand the pages to the device when the
/// device's queue is full: 3–4 ms at times on a 2-core cloud VM, for 1 MB hints while two
/// producers wrote 2 GB, and on the shard thread that stalled every partition and connection of
/// the shard (docs/performance.md). tokio-uring 0.5 has no opcode for it, so
/// a thread of the shard's own makes the calls, each on a duplicate of the file's descriptor (a
/// segment closed meanwhile stays valid for it). Started on a shard thread's first hint; it
/// inherits that thread's core, and it ends with the thread.
struct WritebackHints {
    sender: Option<std::sync::mpsc::SyncSender<(std::os::fd::OwnedFd, u64, u64)>>,
}

thread_local! {
    static WRITEBACK_HINTS: WritebackHints = WritebackHints::start();
}

impl WritebackHints {
    fn start() -> WritebackHints {
        let (sender, hints) = std::sync::mpsc::sync_channel::<(std::os::fd::OwnedFd, u64, u64)>(
            WRITEBACK_HINTS_QUEUED_MAX,
        );
        let started = std::thread::Builder::new()
            .name("strata-wb-hints".into())
            .spawn(move || {
                for (fd, pos, len) in hints {
                    if let Err(error) = start_writeback(fd.as_raw_fd(), pos, len) {
                        tracing::debug!("sync_file_range hint failed: {error}");
                    }
                }
            });
        match started {
            Ok(_) => WritebackHints {
                sender: Some(sender),
            },
            Err(error) => {
                tracing::warn!("no writeback thread ({error}): hints are made on the shard");
                WritebackHints { sender: None }
            }
        }
    }

    fn send(&self, fd: std::os::fd::RawFd, pos: u64, len: u64) -> io::Result<()> {
        let Some(sender) = &self.sender else {
            return start_writeback(fd, pos, len);
        };
        let Some(duplicate) = super::duplicate_descriptor(fd) else {
            return start_writeback(fd, pos, len);
        };
        // Full: the thread is behind, waiting on the device; this hint is dropped.
        let _ = sender.try_send((duplicate, pos, len));
        Ok(())
    }
}

/// tokio-uring 0.5 has no sync_file_range opcode; with only WRITE set the call queues IO and
/// returns without waiting for it.
pub(crate) fn start_writeback(fd: std::os::fd::RawFd, pos: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on an open fd; no memory is passed.
    let rc = unsafe {
        libc::sync_file_range(
            fd,
            pos as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

pub(crate) fn fd_len(fd: std::os::fd::RawFd) -> io::Result<u64> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `stat` is a valid out-pointer; the fd belongs to an open file.
    let rc = unsafe { libc::fstat(fd, stat.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat returned 0, so it filled the struct.
    Ok(unsafe { stat.assume_init() }.st_size as u64)
}

impl Storage for UringStorage {
    type File = UringFile;

    async fn open(&self, path: &Path, create: bool) -> io::Result<UringFile> {
        let file = tokio_uring::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .open(path)
            .await?;
        Ok(UringFile { file, direct: None })
    }

    async fn open_direct(&self, path: &Path, create: bool) -> io::Result<UringFile> {
        let mut file = self.open(path, create).await?;
        file.direct = super::open_direct_handle(path)?.map(tokio_uring::fs::File::from_std);
        Ok(file)
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        tokio_uring::fs::remove_file(path).await
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        tokio_uring::fs::rename(from, to).await
    }

    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        tokio_uring::fs::create_dir_all(path).await
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

/// Directory fsync and listing have no io_uring opcode; they run on open, roll and delete only.
pub(crate) fn sync_dir_blocking(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

pub(crate) fn list_dir_blocking(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        names.push(PathBuf::from(entry?.file_name()));
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Starts a fresh window with no peak (what came before does not count).
    fn forget_in_flight_peak() {
        IN_FLIGHT_MAX.with(|max| max.set((0, 0)));
        WINDOW_START.with(|start| start.set(Some(std::time::Instant::now())));
    }

    #[test]
    fn the_in_flight_peak_is_the_same_for_every_reader_within_a_window() {
        forget_in_flight_peak();
        let operations: Vec<InFlight> = (0..3).map(|_| InFlight::start()).collect();
        drop(operations);
        // Two scrapers in a row both see the peak; it does not go with the first look.
        assert_eq!(take_in_flight(), (0, 3));
        assert_eq!(take_in_flight(), (0, 3));
        // A window later it is still there (the previous window's), two windows later gone.
        WINDOW_START.with(|start| start.set(Some(std::time::Instant::now() - IN_FLIGHT_WINDOW)));
        assert_eq!(take_in_flight(), (0, 3));
        WINDOW_START.with(|start| start.set(Some(std::time::Instant::now() - IN_FLIGHT_WINDOW)));
        assert_eq!(take_in_flight(), (0, 0));
    }

    /// Dirty pages of `[0, len)` of `fd`.
    fn dirty_pages(fd: std::os::fd::RawFd, len: u64) -> u64 {
        super::super::page_cache_stat(fd, 0, len)
            .expect("cachestat")
            .dirty
    }

    /// A writeback hint is made by the shard's writeback thread, not by the shard thread (where
    /// a full device queue made it wait), and it still starts the pages' writeback at once: the
    /// kernel's own flusher would leave them dirty for 30 s.
    #[test]
    fn writeback_hints_are_made_off_the_shard_thread() {
        let dir = tempfile::tempdir().unwrap();
        let probe_file = dir.path().join("probe");
        std::fs::write(&probe_file, b"").unwrap();
        if probe().is_err()
            || super::super::open_direct_handle(&probe_file)
                .unwrap()
                .is_none()
        {
            return; // no io_uring, or a file system without writeback (tmpfs)
        }
        let threads = || -> Vec<String> {
            std::fs::read_dir("/proc/thread-self/..")
                .unwrap()
                .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
                .map(|name| name.trim().to_string())
                .collect()
        };
        std::thread::spawn(move || {
            tokio_uring::start(async {
                let file = UringStorage
                    .open(&dir.path().join("segment"), true)
                    .await
                    .unwrap();
                let len = 8u64 << 20;
                file.write_all_at(Bytes::from(vec![7u8; len as usize]), 0)
                    .await
                    .unwrap();
                let fd = file.file.as_raw_fd();
                assert!(
                    dirty_pages(fd, len) > 1000,
                    "written through the page cache"
                );
                file.start_writeback(0, len).await.unwrap();
                let started = std::time::Instant::now();
                // The thread names itself once it runs.
                while !threads().contains(&"strata-wb-hints".to_string()) {
                    assert!(
                        started.elapsed() < std::time::Duration::from_secs(3),
                        "no writeback thread"
                    );
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                while dirty_pages(fd, len) > 0 {
                    assert!(
                        started.elapsed() < std::time::Duration::from_secs(3),
                        "the hint did not start the writeback"
                    );
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            });
        })
        .join()
        .unwrap();
    }

    /// A direct read of whole blocks past a file's end (not on a block boundary) returns what
    /// the file holds and no error.
    #[test]
    fn a_direct_read_ends_where_the_file_does() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("segment");
        std::fs::write(&path, vec![5u8; 10_000]).unwrap();
        if probe().is_err() || super::super::open_direct_handle(&path).unwrap().is_none() {
            return; // no io_uring, or a file system without O_DIRECT (tmpfs)
        }
        tokio_uring::start(async {
            let file = UringStorage.open_direct(&path, false).await.unwrap();
            let (result, buf) = file
                .read_direct_at(DirectReadBuf::with_capacity(16_384), 0)
                .await;
            result.unwrap();
            assert_eq!(buf.as_slice(), &[5u8; 10_000][..]);
            let (result, buf) = file
                .read_direct_at(DirectReadBuf::with_capacity(8192), 8192)
                .await;
            result.unwrap();
            assert_eq!(buf.len(), 10_000 - 8192);
        });
    }

    #[test]
    fn appends_are_written_on_the_shard_thread_and_reads_go_through_the_ring() {
        if probe().is_err() || std::env::var_os("STRATA_IO_WRITES").is_some() {
            return; // no io_uring here, or the write path was chosen by hand
        }
        let dir = tempfile::tempdir().unwrap();
        tokio_uring::start(async {
            let file = UringStorage
                .open(&dir.path().join("segment"), true)
                .await
                .unwrap();
            forget_in_flight_peak();
            file.write_all_at(Bytes::from_static(b"appended bytes"), 0)
                .await
                .unwrap();
            assert_eq!(take_in_flight(), (0, 0), "the write never entered the ring");
            let (result, buf) = file.read_at(ReadBuf::with_capacity(64), 0).await;
            result.unwrap();
            assert_eq!(buf.as_slice(), b"appended bytes");
            assert_eq!(take_in_flight(), (0, 1), "the read did");

            // The ring's path, for filesystems that take non-blocking buffered writes.
            forget_in_flight_peak();
            file.write_through_ring(Bytes::from_static(b"through the ring"), 8)
                .await
                .unwrap();
            assert_eq!(take_in_flight(), (0, 1));
            let (result, buf) = file.read_at(ReadBuf::with_capacity(64), 0).await;
            result.unwrap();
            assert_eq!(buf.as_slice(), b"appendedthrough the ring");
        });
    }
}

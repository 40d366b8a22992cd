//! In-memory storage with a crash model and injected faults, for deterministic tests.
//!
//! Each file keeps its durable contents (as of its last successful sync) and the operations since.
//! [`SimStorage::crash`] replaces every file by its durable contents plus a random prefix of the
//! operations that followed, the last write of that prefix torn at a random byte: the page cache
//! lost, in order, whatever had not been synced. Faults make the next matching operation fail with
//! `EIO`; a failed sync leaves the file's unsynced operations undecided, as Linux does.
//! Names are kept the same way: creations, removals and renames since the last `sync_dir` are
//! undecided until it, and a crash keeps a random prefix of them, in order (as a journaling file
//! system commits them), each rename whole.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::Bytes;
use rand::{Rng, SeedableRng, rngs::StdRng};

use super::{DirectReadBuf, ReadBuf, Storage, StorageFile};

/// Which operation a fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultOp {
    Write,
    Read,
    Sync,
}

#[derive(Debug, Clone)]
enum Op {
    Write { pos: u64, bytes: Bytes },
    Truncate { len: u64 },
}

/// A change to the names of files, durable after the next `sync_dir`.
#[derive(Debug, Clone)]
enum NameOp {
    Link(PathBuf, u64),
    Unlink(PathBuf),
    Rename(PathBuf, PathBuf),
}

impl NameOp {
    fn apply(&self, names: &mut BTreeMap<PathBuf, u64>) {
        match self {
            NameOp::Link(path, inode) => {
                names.insert(path.clone(), *inode);
            }
            NameOp::Unlink(path) => {
                names.remove(path);
            }
            NameOp::Rename(from, to) => {
                if let Some(inode) = names.remove(from) {
                    names.insert(to.clone(), inode);
                }
            }
        }
    }
}

#[derive(Default)]
struct Inode {
    data: Vec<u8>,
    durable: Vec<u8>,
    unsynced: Vec<Op>,
    /// Operations ever applied to the file, and how many of the first of them `durable` holds
    /// (`unsynced` is the rest): a sync that took time covers what was written when it began.
    ops_applied: u64,
    ops_durable: u64,
    /// Blocks are reserved up to here (`allocate` keeps the length, as `FALLOC_FL_KEEP_SIZE`).
    reserved: u64,
    reservations: u64,
    /// Writes that lengthened the file past its reservation: a real file system allocates
    /// their blocks as it writes them (or, ext4, as it writes them back).
    unreserved_appends: u64,
}

/// How a file's blocks were reserved ahead of its writes (see [`SimStorage::reservation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// Reserved bytes past the file's length.
    pub past_end: u64,
    /// `allocate` calls so far.
    pub calls: u64,
    /// Writes that lengthened the file past its reservation.
    pub unreserved_appends: u64,
}

impl Inode {
    fn push_unsynced(&mut self, op: Op) {
        self.unsynced.push(op);
        self.ops_applied += 1;
    }

    /// Everything applied is durable, as `data` says.
    fn settle(&mut self) {
        self.durable = self.data.clone();
        self.unsynced.clear();
        self.ops_durable = self.ops_applied;
    }

    fn apply(data: &mut Vec<u8>, op: &Op) {
        match op {
            Op::Write { pos, bytes } => {
                let end = *pos as usize + bytes.len();
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[*pos as usize..end].copy_from_slice(bytes);
            }
            Op::Truncate { len } => data.resize(*len as usize, 0),
        }
    }
}

struct SimFs {
    inodes: BTreeMap<u64, Inode>,
    names: BTreeMap<PathBuf, u64>,
    /// The names as of the last `sync_dir`, and the changes since, in order.
    durable_names: BTreeMap<PathBuf, u64>,
    unsynced_names: Vec<NameOp>,
    dirs: BTreeSet<PathBuf>,
    next_inode: u64,
    /// Fail the operation after this many more of its kind succeed.
    faults: HashMap<FaultOp, u32>,
    /// After this many more changes (writes, truncations, syncs, creations, removals, renames)
    /// every change fails: the process died there (see [`SimStorage::stop_after`]).
    stop_after: Option<u32>,
    stopped: bool,
    rng: StdRng,
    syncs: u64,
    /// Ranges handed to `start_writeback`, in call order.
    writeback_hints: Vec<(u64, u64)>,
    /// Ranges written with `write_direct_at`, in call order, and the address each came from.
    direct_writes: Vec<(u64, u64, usize)>,
    /// Reads done with `read_direct_at`, and their bytes.
    direct_reads: (u64, u64),
    /// Whether `open_direct` pretends the file system refuses `O_DIRECT` (as tmpfs does).
    refuse_direct: bool,
    /// While set, reads wait (a slow disk), until `release_reads` notifies them.
    reads_held: bool,
    reads_released: Rc<tokio::sync::Notify>,
    /// How long a sync takes, if it takes time (see [`SimStorage::set_sync_latency`]).
    sync_latency_us: Option<std::ops::RangeInclusive<u64>>,
    /// Crashes so far: a sync that began before one fails.
    power_cycles: u64,
}

/// A simulated file system. Clones share it.
#[derive(Clone)]
pub struct SimStorage {
    fs: Rc<RefCell<SimFs>>,
}

pub struct SimFile {
    inode: u64,
    fs: Rc<RefCell<SimFs>>,
    direct: bool,
}

impl SimStorage {
    pub fn new(seed: u64) -> SimStorage {
        SimStorage {
            fs: Rc::new(RefCell::new(SimFs {
                inodes: BTreeMap::new(),
                names: BTreeMap::new(),
                durable_names: BTreeMap::new(),
                unsynced_names: Vec::new(),
                dirs: BTreeSet::new(),
                next_inode: 1,
                faults: HashMap::new(),
                stop_after: None,
                stopped: false,
                rng: StdRng::seed_from_u64(seed),
                syncs: 0,
                writeback_hints: Vec::new(),
                direct_writes: Vec::new(),
                direct_reads: (0, 0),
                refuse_direct: false,
                reads_held: false,
                reads_released: Rc::new(tokio::sync::Notify::new()),
                sync_latency_us: None,
                power_cycles: 0,
            })),
        }
    }

    /// Makes the operation of kind `op` fail with EIO after `after` more succeed.
    pub fn fail(&self, op: FaultOp, after: u32) {
        self.fs.borrow_mut().faults.insert(op, after);
    }

    /// Lets `changes` more changes reach the file system, then fails every one after: the
    /// process stops at that step (a crash test then calls [`SimStorage::crash`] and reopens).
    pub fn stop_after(&self, changes: u32) {
        let mut fs = self.fs.borrow_mut();
        fs.stop_after = Some(changes);
        fs.stopped = false;
    }

    /// Whether a change was refused since [`SimStorage::stop_after`].
    pub fn stopped(&self) -> bool {
        self.fs.borrow().stopped
    }

    /// Simulates power loss: every file keeps its synced contents plus a random prefix of the
    /// operations since, the last write torn. Open handles keep working on the new contents
    /// (tests drop them and reopen, as a restarted process would).
    pub fn crash(&self) {
        self.crash_with(false);
    }

    /// Simulates power loss on a disk that persists unsynced writes in any order: every file
    /// keeps its synced contents plus a random subset of the operations since, one of them torn.
    /// Holes appear in the middle of unsynced data, and an index file may keep entries for data
    /// that was lost.
    pub fn crash_reordered(&self) {
        self.crash_with(true);
    }

    fn crash_with(&self, reordered: bool) {
        let mut fs = self.fs.borrow_mut();
        let unsynced = fs.unsynced_names.len();
        let kept = fs.rng.random_range(0..=unsynced);
        let mut names = std::mem::take(&mut fs.durable_names);
        for op in fs.unsynced_names.drain(..).take(kept) {
            op.apply(&mut names);
        }
        fs.durable_names = names.clone();
        fs.names = names;
        let SimFs { inodes, rng, .. } = &mut *fs;
        for inode in inodes.values_mut() {
            let mut data = inode.durable.clone();
            if reordered {
                let mut survivors: Vec<Op> = inode
                    .unsynced
                    .iter()
                    .filter(|_| rng.random_bool(0.5))
                    .cloned()
                    .collect();
                if let Some(Op::Write { pos, bytes }) = survivors.last_mut() {
                    let torn_len = rng.random_range(0..=bytes.len());
                    *bytes = bytes.slice(..torn_len);
                    let _ = pos;
                }
                for op in &survivors {
                    Inode::apply(&mut data, op);
                }
                inode.data = data;
                inode.settle();
                continue;
            }
            let kept = rng.random_range(0..=inode.unsynced.len());
            for (index, op) in inode.unsynced[..kept].iter().enumerate() {
                let torn = match op {
                    Op::Write { pos, bytes } if index + 1 == kept && !bytes.is_empty() => {
                        let torn_len = rng.random_range(0..=bytes.len());
                        Op::Write {
                            pos: *pos,
                            bytes: bytes.slice(..torn_len),
                        }
                    }
                    op => op.clone(),
                };
                Inode::apply(&mut data, &torn);
            }
            inode.data = data;
            inode.settle();
        }
        fs.faults.clear();
        fs.stop_after = None;
        fs.power_cycles += 1;
    }

    /// From now on each `sync_data` takes a time in `micros` (on the runtime's clock, virtual
    /// in a paused runtime) and makes durable what was written when it began: a crash while
    /// it runs finds the writes of that window unsynced.
    pub fn set_sync_latency(&self, micros: std::ops::RangeInclusive<u64>) {
        self.fs.borrow_mut().sync_latency_us = Some(micros);
    }

    /// Number of successful `sync_data` calls so far (group commit tests count them).
    pub fn sync_count(&self) -> u64 {
        self.fs.borrow().syncs
    }

    /// The `(pos, len)` ranges handed to `start_writeback` so far, of every file, in call order.
    pub fn writeback_hints(&self) -> Vec<(u64, u64)> {
        self.fs.borrow().writeback_hints.clone()
    }

    /// The `(pos, len)` ranges written past the page cache so far, of every file, in call order.
    pub fn direct_writes(&self) -> Vec<(u64, u64)> {
        let fs = self.fs.borrow();
        fs.direct_writes
            .iter()
            .map(|(pos, len, _)| (*pos, *len))
            .collect()
    }

    /// The memory each direct write was written from, `(address, len)`, in call order (tests
    /// check which writes needed no copy).
    pub fn direct_write_sources(&self) -> Vec<(usize, usize)> {
        let fs = self.fs.borrow();
        fs.direct_writes
            .iter()
            .map(|(_, len, address)| (*address, *len as usize))
            .collect()
    }

    /// From now on reads wait, as on a disk that is slow to answer, until [`Self::release_reads`].
    pub fn hold_reads(&self) {
        self.fs.borrow_mut().reads_held = true;
    }

    /// Lets the held reads, and every read after, go on.
    pub fn release_reads(&self) {
        let mut fs = self.fs.borrow_mut();
        fs.reads_held = false;
        fs.reads_released.notify_waiters();
    }

    /// How many reads went past the page cache (`read_direct_at`) so far, of every file, and
    /// how many bytes they read.
    pub fn direct_reads(&self) -> (u64, u64) {
        self.fs.borrow().direct_reads
    }

    /// From now on `open_direct` opens files as `open` does, as on a file system without
    /// `O_DIRECT`.
    pub fn refuse_direct(&self) {
        self.fs.borrow_mut().refuse_direct = true;
    }

    /// How a file's blocks were reserved ahead of its writes.
    pub fn reservation(&self, path: &Path) -> Option<Reservation> {
        let fs = self.fs.borrow();
        let inode = &fs.inodes[fs.names.get(path)?];
        Some(Reservation {
            past_end: inode.reserved.saturating_sub(inode.data.len() as u64),
            calls: inode.reservations,
            unreserved_appends: inode.unreserved_appends,
        })
    }

    /// Current contents of a file (tests inspect and damage files through this).
    pub fn contents(&self, path: &Path) -> Option<Vec<u8>> {
        let fs = self.fs.borrow();
        let inode = fs.names.get(path)?;
        Some(fs.inodes[inode].data.clone())
    }

    /// Replaces a file's contents durably (tests use it to garble segment tails).
    pub fn set_contents(&self, path: &Path, data: Vec<u8>) {
        let mut fs = self.fs.borrow_mut();
        let inode = *fs.names.get(path).expect("file exists");
        let inode = fs.inodes.get_mut(&inode).expect("inode exists");
        inode.data = data;
        inode.settle();
    }
}

impl SimFs {
    /// Counts one change against [`SimStorage::stop_after`].
    fn change(&mut self) -> io::Result<()> {
        match &mut self.stop_after {
            Some(0) => {
                self.stopped = true;
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
            Some(left) => {
                *left -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn check_fault(&mut self, op: FaultOp) -> io::Result<()> {
        match self.faults.get_mut(&op) {
            Some(0) => {
                self.faults.remove(&op);
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
            Some(left) => {
                *left -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn inode(&mut self, inode: u64) -> &mut Inode {
        self.inodes
            .get_mut(&inode)
            .expect("open files keep their inode")
    }
}

impl SimFile {
    async fn wait_while_reads_are_held(&self) {
        loop {
            let released = self.fs.borrow().reads_released.clone();
            let notified = released.notified();
            if !self.fs.borrow().reads_held {
                return;
            }
            notified.await;
        }
    }

    fn read_into<const ALIGN: usize>(
        &self,
        mut buf: ReadBuf<ALIGN>,
        pos: u64,
    ) -> (io::Result<()>, ReadBuf<ALIGN>) {
        let mut fs = self.fs.borrow_mut();
        buf.clear();
        if let Err(error) = fs.check_fault(FaultOp::Read) {
            return (Err(error), buf);
        }
        let data = &fs.inode(self.inode).data;
        let start = (pos as usize).min(data.len());
        let end = (start + buf.capacity()).min(data.len());
        buf.extend_from_slice(&data[start..end]);
        (Ok(()), buf)
    }
}

impl StorageFile for SimFile {
    async fn start_writeback(&self, pos: u64, len: u64) -> io::Result<()> {
        self.fs.borrow_mut().writeback_hints.push((pos, len));
        Ok(())
    }

    async fn write_all_at(&self, bytes: Bytes, pos: u64) -> io::Result<()> {
        let mut fs = self.fs.borrow_mut();
        fs.change()?;
        if let Err(error) = fs.check_fault(FaultOp::Write) {
            // A failed write may still have reached the page cache in part.
            let torn = fs.rng.random_range(0..=bytes.len());
            let op = Op::Write {
                pos,
                bytes: bytes.slice(..torn),
            };
            let inode = fs.inode(self.inode);
            Inode::apply(&mut inode.data, &op);
            inode.push_unsynced(op);
            return Err(error);
        }
        let end = pos + bytes.len() as u64;
        let op = Op::Write { pos, bytes };
        let inode = fs.inode(self.inode);
        if end > inode.data.len() as u64 && end > inode.reserved {
            inode.unreserved_appends += 1;
        }
        Inode::apply(&mut inode.data, &op);
        inode.push_unsynced(op);
        Ok(())
    }

    fn writes_direct(&self) -> bool {
        self.direct
    }

    /// As a write through the page cache: the simulated disk loses or tears unsynced writes
    /// either way.
    async fn write_direct_at(&self, bytes: Bytes, pos: u64) -> io::Result<()> {
        super::assert_direct_aligned(&bytes, pos);
        assert!(self.direct, "the file was opened for direct writes");
        let (len, address) = (bytes.len() as u64, bytes.as_ptr() as usize);
        self.write_all_at(bytes, pos).await?;
        self.fs.borrow_mut().direct_writes.push((pos, len, address));
        Ok(())
    }

    async fn read_at(&self, buf: ReadBuf, pos: u64) -> (io::Result<()>, ReadBuf) {
        self.wait_while_reads_are_held().await;
        self.read_into(buf, pos)
    }

    /// As a read through the page cache (the simulation keeps none), counted.
    async fn read_direct_at(
        &self,
        buf: DirectReadBuf,
        pos: u64,
    ) -> (io::Result<()>, DirectReadBuf) {
        super::assert_direct_read_aligned(&buf, pos);
        assert!(self.direct, "the file was opened for direct reads");
        self.wait_while_reads_are_held().await;
        let (result, buf) = self.read_into(buf, pos);
        if result.is_ok() {
            let totals = &mut self.fs.borrow_mut().direct_reads;
            *totals = (totals.0 + 1, totals.1 + buf.len() as u64);
        }
        (result, buf)
    }

    async fn sync_data(&self) -> io::Result<()> {
        let (latency, began) = {
            let mut fs = self.fs.borrow_mut();
            fs.change()?;
            fs.check_fault(FaultOp::Sync)?;
            let Some(range) = fs.sync_latency_us.clone() else {
                fs.syncs += 1;
                fs.inode(self.inode).settle();
                return Ok(());
            };
            let latency = fs.rng.random_range(range);
            let power_cycles = fs.power_cycles;
            let inode = fs.inode(self.inode);
            (
                latency,
                (inode.data.clone(), inode.ops_applied, power_cycles),
            )
        };
        tokio::time::sleep(std::time::Duration::from_micros(latency)).await;
        let (data, ops, power_cycles) = began;
        let mut fs = self.fs.borrow_mut();
        if fs.power_cycles != power_cycles {
            return Err(io::Error::other("the power failed during the sync"));
        }
        fs.syncs += 1;
        let inode = fs.inode(self.inode);
        if ops > inode.ops_durable {
            // A sync that began later may have finished first: only ever more is durable.
            inode.unsynced.drain(..(ops - inode.ops_durable) as usize);
            inode.durable = data;
            inode.ops_durable = ops;
        }
        Ok(())
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        let mut fs = self.fs.borrow_mut();
        fs.change()?;
        let op = Op::Truncate { len };
        let inode = fs.inode(self.inode);
        Inode::apply(&mut inode.data, &op);
        inode.push_unsynced(op);
        // As ext4 does, truncation frees the blocks past the new end, reserved ones too.
        inode.reserved = inode.reserved.min(len);
        Ok(())
    }

    async fn allocate(&self, pos: u64, len: u64) -> io::Result<()> {
        let mut fs = self.fs.borrow_mut();
        let inode = fs.inode(self.inode);
        inode.reserved = inode.reserved.max(pos + len);
        inode.reservations += 1;
        Ok(())
    }

    async fn file_len(&self) -> io::Result<u64> {
        let mut fs = self.fs.borrow_mut();
        Ok(fs.inode(self.inode).data.len() as u64)
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{} not found", path.display()),
    )
}

impl Storage for SimStorage {
    type File = SimFile;

    async fn open(&self, path: &Path, create: bool) -> io::Result<SimFile> {
        let mut fs = self.fs.borrow_mut();
        let parent = path.parent().unwrap_or(Path::new(""));
        if !fs.dirs.contains(parent) {
            return Err(not_found(parent));
        }
        let inode = match fs.names.get(path) {
            Some(inode) => *inode,
            None if create => {
                fs.change()?;
                let inode = fs.next_inode;
                fs.next_inode += 1;
                fs.inodes.insert(inode, Inode::default());
                fs.names.insert(path.to_path_buf(), inode);
                fs.unsynced_names
                    .push(NameOp::Link(path.to_path_buf(), inode));
                inode
            }
            None => return Err(not_found(path)),
        };
        Ok(SimFile {
            inode,
            fs: self.fs.clone(),
            direct: false,
        })
    }

    async fn open_direct(&self, path: &Path, create: bool) -> io::Result<SimFile> {
        let mut file = self.open(path, create).await?;
        file.direct = !self.fs.borrow().refuse_direct;
        Ok(file)
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut fs = self.fs.borrow_mut();
        fs.change()?;
        fs.names.remove(path).ok_or_else(|| not_found(path))?;
        fs.unsynced_names.push(NameOp::Unlink(path.to_path_buf()));
        Ok(())
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut fs = self.fs.borrow_mut();
        fs.change()?;
        let parent = to.parent().unwrap_or(Path::new(""));
        if !fs.dirs.contains(parent) {
            return Err(not_found(parent));
        }
        let inode = fs.names.remove(from).ok_or_else(|| not_found(from))?;
        fs.names.insert(to.to_path_buf(), inode);
        fs.unsynced_names
            .push(NameOp::Rename(from.to_path_buf(), to.to_path_buf()));
        Ok(())
    }

    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut fs = self.fs.borrow_mut();
        for ancestor in path.ancestors() {
            fs.dirs.insert(ancestor.to_path_buf());
        }
        Ok(())
    }

    async fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut fs = self.fs.borrow_mut();
        // Removing a whole tree is made durable at once (the tests that do it start over).
        fs.names.retain(|name, _| !name.starts_with(path));
        fs.durable_names.retain(|name, _| !name.starts_with(path));
        fs.unsynced_names.retain(|op| match op {
            NameOp::Link(name, _) | NameOp::Unlink(name) => !name.starts_with(path),
            NameOp::Rename(from, to) => !from.starts_with(path) && !to.starts_with(path),
        });
        fs.dirs.retain(|dir| !dir.starts_with(path));
        Ok(())
    }

    /// Makes every change to names so far durable, in every directory: a journaling file
    /// system commits them in order, so a sync of one directory's entries commits all before.
    async fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        let mut fs = self.fs.borrow_mut();
        fs.change()?;
        let mut names = std::mem::take(&mut fs.durable_names);
        for op in fs.unsynced_names.drain(..) {
            op.apply(&mut names);
        }
        fs.durable_names = names;
        Ok(())
    }

    async fn list_dir(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let fs = self.fs.borrow();
        if !fs.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        let files = fs.names.keys().filter(|name| name.parent() == Some(dir));
        let subdirs = fs.dirs.iter().filter(|name| name.parent() == Some(dir));
        Ok(files
            .chain(subdirs)
            .filter_map(|name| name.file_name().map(PathBuf::from))
            .collect())
    }
}

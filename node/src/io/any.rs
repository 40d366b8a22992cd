//! The backend chosen at run time ([`super::Backend::detect`]), behind the same traits: one
//! match per IO call, so node code is written once for io_uring and the fallback.

use std::io;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::blocking::{BlockingFile, BlockingStorage};
use super::uring::{UringFile, UringStorage};
use super::{DirectReadBuf, ReadBuf, Storage, StorageFile};

#[derive(Clone, Copy, Debug)]
pub enum AnyStorage {
    Uring(UringStorage),
    Blocking(BlockingStorage),
}

pub enum AnyFile {
    Uring(UringFile),
    Blocking(BlockingFile),
}

macro_rules! each {
    ($value:expr, $name:ident => $body:expr) => {
        match $value {
            AnyFile::Uring($name) => $body,
            AnyFile::Blocking($name) => $body,
        }
    };
}

impl StorageFile for AnyFile {
    async fn write_all_at(&self, bytes: Bytes, pos: u64) -> io::Result<()> {
        each!(self, file => file.write_all_at(bytes, pos).await)
    }

    async fn write_all_in_order_at(&self, buffers: Vec<Bytes>, pos: u64) -> io::Result<()> {
        each!(self, file => file.write_all_in_order_at(buffers, pos).await)
    }

    fn writes_direct(&self) -> bool {
        each!(self, file => file.writes_direct())
    }

    async fn write_direct_at(&self, bytes: Bytes, pos: u64) -> io::Result<()> {
        each!(self, file => file.write_direct_at(bytes, pos).await)
    }

    async fn read_at(&self, buf: ReadBuf, pos: u64) -> (io::Result<()>, ReadBuf) {
        each!(self, file => file.read_at(buf, pos).await)
    }

    async fn read_direct_at(
        &self,
        buf: DirectReadBuf,
        pos: u64,
    ) -> (io::Result<()>, DirectReadBuf) {
        each!(self, file => file.read_direct_at(buf, pos).await)
    }

    async fn start_writeback(&self, pos: u64, len: u64) -> io::Result<()> {
        each!(self, file => file.start_writeback(pos, len).await)
    }

    async fn sync_data(&self) -> io::Result<()> {
        each!(self, file => file.sync_data().await)
    }

    fn share_descriptor(&self) -> Option<std::os::fd::OwnedFd> {
        each!(self, file => file.share_descriptor())
    }

    fn is_cached(&self, pos: u64, len: u64) -> bool {
        each!(self, file => file.is_cached(pos, len))
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        each!(self, file => file.truncate(len).await)
    }

    async fn allocate(&self, pos: u64, len: u64) -> io::Result<()> {
        each!(self, file => file.allocate(pos, len).await)
    }

    async fn file_len(&self) -> io::Result<u64> {
        each!(self, file => file.file_len().await)
    }
}

impl Storage for AnyStorage {
    type File = AnyFile;

    async fn open(&self, path: &Path, create: bool) -> io::Result<AnyFile> {
        match self {
            AnyStorage::Uring(storage) => storage.open(path, create).await.map(AnyFile::Uring),
            AnyStorage::Blocking(storage) => {
                storage.open(path, create).await.map(AnyFile::Blocking)
            }
        }
    }

    async fn open_direct(&self, path: &Path, create: bool) -> io::Result<AnyFile> {
        match self {
            AnyStorage::Uring(storage) => {
                storage.open_direct(path, create).await.map(AnyFile::Uring)
            }
            AnyStorage::Blocking(storage) => storage
                .open_direct(path, create)
                .await
                .map(AnyFile::Blocking),
        }
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        match self {
            AnyStorage::Uring(storage) => storage.remove_file(path).await,
            AnyStorage::Blocking(storage) => storage.remove_file(path).await,
        }
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        match self {
            AnyStorage::Uring(storage) => storage.rename(from, to).await,
            AnyStorage::Blocking(storage) => storage.rename(from, to).await,
        }
    }

    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        match self {
            AnyStorage::Uring(storage) => storage.create_dir_all(path).await,
            AnyStorage::Blocking(storage) => storage.create_dir_all(path).await,
        }
    }

    async fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        match self {
            AnyStorage::Uring(storage) => storage.remove_dir_all(path).await,
            AnyStorage::Blocking(storage) => storage.remove_dir_all(path).await,
        }
    }

    async fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        match self {
            AnyStorage::Uring(storage) => storage.sync_dir(dir).await,
            AnyStorage::Blocking(storage) => storage.sync_dir(dir).await,
        }
    }

    async fn list_dir(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        match self {
            AnyStorage::Uring(storage) => storage.list_dir(dir).await,
            AnyStorage::Blocking(storage) => storage.list_dir(dir).await,
        }
    }
}

//! The seam between the checks and the machine: a root directory that /proc and /sys paths are
//! joined onto, and the data directory's device number (stat on a live host, given in tests).

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use crate::parse::dev_major_minor;

/// A block device number, as in /sys/dev/block/MAJOR:MINOR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevId {
    pub major: u32,
    pub minor: u32,
}

impl std::fmt::Display for DevId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// Where the data directory's device number comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataDevice {
    /// stat(2) the directory (or, if it does not exist yet, its nearest existing ancestor) on
    /// the live filesystem.
    Stat,
    /// A fixture's device: the data directory is then taken as a path on the fixture host as
    /// given, without touching the live filesystem.
    Fixed(DevId),
}

/// The machine being checked.
#[derive(Debug, Clone)]
pub struct Host {
    /// "/" for the live host; a folder laid out like one (proc/..., sys/...) in tests.
    pub root: PathBuf,
    pub data_device: DataDevice,
}

/// The data directory as the checks see it.
pub(crate) struct DataDir {
    /// Absolute and normalized, as a path on the host (for the mountinfo lookup).
    pub path: String,
    pub device: DevId,
    /// Set when the directory does not exist yet and an ancestor was measured instead.
    pub note: Option<String>,
}

impl Host {
    /// The machine this process runs on.
    pub fn live() -> Host {
        Host {
            root: PathBuf::from("/"),
            data_device: DataDevice::Stat,
        }
    }

    /// A fixture root whose data directory sits on `device`.
    pub fn fixture(root: impl Into<PathBuf>, device: DevId) -> Host {
        Host {
            root: root.into(),
            data_device: DataDevice::Fixed(device),
        }
    }

    /// A host path ("/proc/sys/vm/swappiness") under this host's root.
    pub fn path(&self, host_path: &str) -> PathBuf {
        self.root.join(host_path.trim_start_matches('/'))
    }

    /// The trimmed text of a host file, or why it could not be read (said in words, because it
    /// ends up in a report).
    pub(crate) fn read(&self, host_path: &str) -> Result<String, String> {
        std::fs::read_to_string(self.path(host_path))
            .map(|text| text.trim().to_string())
            .map_err(|error| describe(host_path, &error))
    }

    pub(crate) fn exists(&self, host_path: &str) -> bool {
        self.path(host_path).exists()
    }

    /// The names in a host directory, sorted.
    pub(crate) fn list(&self, host_path: &str) -> Result<Vec<String>, String> {
        let entries =
            std::fs::read_dir(self.path(host_path)).map_err(|error| describe(host_path, &error))?;
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        Ok(names)
    }

    pub(crate) fn data_dir(&self, data_dir: &Path) -> Result<DataDir, String> {
        match self.data_device {
            DataDevice::Fixed(device) => Ok(DataDir {
                path: normalize(&Path::new("/").join(data_dir)),
                device,
                note: None,
            }),
            DataDevice::Stat => {
                let absolute = if data_dir.is_absolute() {
                    data_dir.to_path_buf()
                } else {
                    std::env::current_dir()
                        .map_err(|error| format!("no current directory: {error}"))?
                        .join(data_dir)
                };
                let absolute = PathBuf::from(normalize(&absolute));
                // ./strata-data usually does not exist before the first `serve`: the disk it
                // will live on is the nearest ancestor's.
                let mut existing = absolute.as_path();
                while !existing.exists() {
                    existing = existing
                        .parent()
                        .ok_or_else(|| format!("no ancestor of {} exists", absolute.display()))?;
                }
                let metadata = std::fs::metadata(existing)
                    .map_err(|error| describe(&existing.display().to_string(), &error))?;
                let canonical = existing
                    .canonicalize()
                    .map_err(|error| describe(&existing.display().to_string(), &error))?;
                let rest = absolute.strip_prefix(existing).unwrap_or(Path::new(""));
                let (major, minor) = dev_major_minor(metadata.dev());
                let note = (existing != absolute)
                    .then(|| format!("not created yet, measured {}", canonical.display()));
                Ok(DataDir {
                    path: normalize(&canonical.join(rest)),
                    device: DevId { major, minor },
                    note,
                })
            }
        }
    }
}

/// Removes "." and resolves ".." lexically; the result is absolute when the input is.
fn normalize(path: &Path) -> String {
    let mut parts: Vec<String> = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            Component::ParentDir => {
                parts.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    format!("/{}", parts.join("/"))
}

fn describe(path: &str, error: &io::Error) -> String {
    match error.kind() {
        io::ErrorKind::NotFound => format!("{path} absent"),
        io::ErrorKind::PermissionDenied => format!("{path} permission denied"),
        _ => format!("{path}: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_is_lexical() {
        assert_eq!(
            normalize(Path::new("/var/lib/../lib/./strata/")),
            "/var/lib/strata"
        );
        assert_eq!(normalize(Path::new("/")), "/");
    }

    #[test]
    fn a_missing_data_dir_is_measured_at_its_ancestor() {
        let temp = tempfile::tempdir().expect("temp dir");
        let data = temp.path().join("not/yet/here");
        let dir = Host::live().data_dir(&data).expect("an ancestor exists");
        assert!(dir.note.is_some());
        assert!(dir.path.ends_with("/not/yet/here"), "{}", dir.path);
    }
}

//! Architecture invariants that are cheap to check by reading the source.

use std::path::Path;

fn source(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|error| panic!("{path}: {error}"))
}

/// The log's logic (index, segments, recovery, checkpoints) sees files only through the storage
/// trait: it names no runtime and no OS file API, so it runs unchanged on the simulated storage.
/// Only `writer.rs` (the task that owns a log) and `shared_sync.rs` (a shard's sync rounds) may
/// know the runtime.
#[test]
fn the_log_core_knows_no_runtime_and_no_os_files() {
    for path in [
        "node/src/log/mod.rs",
        "node/src/log/segment.rs",
        "node/src/log/index.rs",
        "node/src/log/checkpoint.rs",
        "node/src/log/producers.rs",
    ] {
        let text = source(path);
        for forbidden in ["tokio", "io_uring", "std::fs", "libc::"] {
            assert!(!text.contains(forbidden), "{path} mentions {forbidden}");
        }
    }
}

/// `wire` is pure: no IO, no async, no runtime.
#[test]
fn wire_does_no_io() {
    let manifest = source("wire/Cargo.toml");
    for forbidden in ["tokio", "io-uring", "quinn", "etcd"] {
        assert!(!manifest.contains(forbidden), "wire depends on {forbidden}");
    }
    for path in [
        "wire/src/lib.rs",
        "wire/src/batch/mod.rs",
        "wire/src/batch/builder.rs",
        "wire/src/batch/layout.rs",
        "wire/src/batch/body.rs",
    ] {
        let text = source(path);
        for forbidden in ["std::fs", "std::net", "async fn", "std::thread"] {
            assert!(!text.contains(forbidden), "{path} uses {forbidden}");
        }
    }
}

/// The replication and consumer-group cores are state machines: no runtime, no sockets, no
/// files, no clock (time comes in as `now_ms`). Their simulators depend on it.
#[test]
fn the_replication_and_group_cores_are_sans_io() {
    for path in [
        "node/src/replication/mod.rs",
        "node/src/replication/leader.rs",
        "node/src/replication/epochs.rs",
        "node/src/group/mod.rs",
        "node/src/group/assignor.rs",
    ] {
        let text = source(path);
        for forbidden in [
            "tokio",
            "quinn",
            "io_uring",
            "etcd",
            "std::fs",
            "std::net",
            "Instant::now",
            "SystemTime",
            "async fn",
        ] {
            assert!(!text.contains(forbidden), "{path} mentions {forbidden}");
        }
    }
}

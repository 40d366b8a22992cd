//! `strata-node`: the broker library. `io` is the storage seam (io_uring, blocking, simulated);
//! `log` the partition log; `replication` and `group` the sans-IO cores of replication and
//! consumer groups; `replicator` the drivers of replication's state machines (a follower's loop,
//! a leader's answer to it) over a network and a host they are given; `server` the broker's threads (shards, listeners, control, groups) that
//! drive them; `clock` the one seam for time; `iotune` measures a disk; `memory` sets the
//! allocator for batch buffers.

pub mod clock;
pub mod group;
pub mod io;
pub mod iotune;
pub mod log;
pub mod memory;
pub mod quota;
pub mod replication;
pub mod replicator;
pub mod server;
pub mod share;
pub mod tier;
pub mod txn;

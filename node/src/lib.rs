//! `strata-node`: the broker. So far: the IO seam and the partition log.

pub mod group;
pub mod io;
pub mod iotune;
pub mod log;
pub mod memory;
pub mod replication;
pub mod server;

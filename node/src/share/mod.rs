//! Share groups (KIP-932, queues for Kafka), sans-IO.
//!
//! - [`partition`]: one share group's view of one partition, held by the partition's leader:
//!   records acquired under time-limited locks, acknowledged one by one, delivered again up to
//!   a limit; with Strata's key order, redelivery backoff, delayed delivery and dead letters.
//! - [`group`]: a share group's members and which partitions each fetches from, held by the
//!   group's coordinator.
//!
//! Nothing here knows of sockets, files, runtimes or the coordinator store; time is an argument.

pub mod config;
pub mod group;
pub mod partition;

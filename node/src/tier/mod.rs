//! Tiered storage's pure parts: where the remote tier is ([`location`]), what a partition
//! holds there ([`manifest`]), how a remote segment is read ([`read`]). The tier thread
//! (`server/tier.rs`) talks to the object store; the shard (`server/shard/tiering.rs`) decides
//! what to upload, read and delete.

pub mod location;
pub mod manifest;
pub mod read;

pub use location::RemoteLocation;
pub use manifest::{ManifestError, RemoteManifest, RemoteSegment, SegmentState};

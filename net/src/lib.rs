//! `strata-net`: the framed TCP both ends of Strata's connections share, the broker's listeners
//! and the client alike: length-prefixed frames read in as few reads as the data allows
//! ([`FrameReader`]), a frame's chunks written with vectored writes ([`write_all_chunks`]), and
//! the congestion control a connection asks for ([`apply_tcp_congestion`]). A crate of its own so
//! that the broker depends on the framing, not on the client.

mod chunks;
mod frames;
mod tcp;

pub use chunks::write_all_chunks;
pub use frames::FrameReader;
pub use tcp::{
    DEFAULT_TCP_CONGESTION, HOST_TCP_CONGESTION, apply_tcp_congestion, parse_tcp_congestion,
    tcp_congestion,
};

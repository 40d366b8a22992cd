//! `strata bench`: load against a running cluster, measured honestly.
//!
//! - Open loop with coordinated-omission correction: with `--rate`, every record has an
//!   intended send time and its latency runs from that time, so a stalled broker shows up in the
//!   tail instead of slowing the generator down and hiding.
//! - HDR histograms (`hdrhistogram`), one per producer or consumer task, merged at the end.
//! - End-to-end latency comes from the intended send time (µs since the epoch) that producers
//!   write into the first 8 bytes of every value; consumers subtract it from the time they see
//!   the record. Producer and consumer share this host's clock.
//!
//! The report's JSON field names are a contract (DESIGN §9): `workload`, `records`, `bytes`,
//! `duration_s`, `records_per_s`, `mb_per_s` (MB = 10^6 bytes), `ack_latency_us` and
//! `e2e_latency_us` with `p50`, `p90`, `p99`, `p999`, `p9999`, `max`; added since:
//! `compression`, `sent_batch_bytes`, `compression_ratio`, `host`.

mod config;
mod consume;
mod kafka;
mod kafka_share;
mod measure;
pub mod pacing;
mod plot;
mod produce;
mod report;
mod run;
pub mod scale;

pub use config::{BenchConfig, KeyDistribution, Protocol, TxnSpan, Workload};
pub use plot::plot_svg;
pub use report::{
    DurabilityShare, Histograms, HostState, IntervalHistograms, Percentiles, Report, TimelinePoint,
    progress_bar, summary,
};
pub use run::run;

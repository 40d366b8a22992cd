//! Kafka's wire protocol, translated at the edge (DESIGN §11).
//!
//! Existing Kafka clients (librdkafka and kcat, franz-go, the Java client) speak to a broker's
//! Kafka listener; this crate turns their requests into native Strata requests and the native
//! answers back into Kafka responses, and Kafka record batches into Strata batches and back.
//! It is pure: frames in, frames out, no sockets and no runtime; the broker's listener
//! (`node/src/server/kafka.rs`) runs the native requests it produces.
//!
//! - [`frame`]: request frames decoded (header, then the body at its version), response frames
//!   encoded with the header version their API and version call for; which APIs and versions
//!   are served.
//! - [`translate`]: each supported API's request to its native request, and back.
//! - [`admin`]: the administration APIs (topics, partitions, groups) the same way.
//! - [`records`]: record batch v2 to Strata batches and back.
//! - [`errors`]: Strata's typed error codes as Kafka's.
//! - [`refusal`]: the UNSUPPORTED_VERSION answer to a request of an API or version not served.
//!
//! Message schemas (every version, flexible encodings, tagged fields) come from the
//! `kafka-protocol` crate, generated from Kafka's own JSON definitions.

pub mod admin;
pub mod errors;
pub mod frame;
pub mod records;
pub mod refusal;
pub mod translate;

#[cfg(test)]
mod test_records;

pub use kafka_protocol;

/// Text as Kafka's messages carry it.
pub fn text(value: &str) -> kafka_protocol::protocol::StrBytes {
    kafka_protocol::protocol::StrBytes::from_string(value.to_owned())
}

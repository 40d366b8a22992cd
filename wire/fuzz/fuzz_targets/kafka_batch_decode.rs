//! Fuzz target `kafka_batch_decode`: Kafka record batches (magic 2) as the log takes them from
//! producers and reads them back must never panic, and what is accepted must read consistently.
//!
//! What one input goes through:
//! 1. The input is made a Kafka batch's candidate: byte 16 set to the magic (2), so the bytes
//!    reach the Kafka paths rather than Strata's.
//! 2. `check_produced_batch` (with and without keys required) and `Batch::validate`, as given
//!    and with the CRC repaired (a mutated batch almost always fails its CRC, which would hide
//!    the records' checks from the fuzzer).
//! 3. A batch the produce check accepts, `Batch::validate` accepts too, with as many records
//!    as its header spans offsets; stamping it keeps it valid.
//!
//! Every accepted batch has all its records and headers iterated (and `black_box`ed).

#![no_main]

use std::hint::black_box;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use strata_wire::batch::{self, Batch};

/// Kafka's CRC field and where the bytes it covers start.
const AT_CRC: usize = 17;
const CRC_START: usize = 21;
const AT_MAGIC: usize = 16;

fn read_all(batch: &Batch) {
    for record in batch.records() {
        black_box((record.offset, record.timestamp_ms, record.key, record.nullable_value()));
        for header in record.nullable_headers() {
            black_box(header);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = data.to_vec();
    if input.len() > AT_MAGIC {
        input[AT_MAGIC] = 2;
    }
    let mut repaired = input.clone();
    if repaired.len() > CRC_START {
        let crc = strata_wire::crc32c(&repaired[CRC_START..]);
        repaired[AT_CRC..CRC_START].copy_from_slice(&crc.to_be_bytes());
    }
    for candidate in [input, repaired] {
        let _ = black_box(batch::check_produced_batch(&candidate, true));
        let produced = batch::check_produced_batch(&candidate, false);
        let validated = Batch::validate(Bytes::from(candidate.clone()));
        if let Ok(batch) = &validated {
            read_all(batch);
        }
        if let Ok(produced) = produced {
            let batch = validated.expect("what the produce check takes, a reader takes");
            assert_eq!(batch.record_count(), produced.header.offset_count);
            let mut stamped = candidate[..produced.header.batch_len as usize].to_vec();
            batch::stamp(&mut stamped, 1_000, 7);
            let stamped = Batch::validate(Bytes::from(stamped)).expect("stamping keeps it valid");
            assert_eq!(stamped.base_offset(), 1_000);
            read_all(&stamped);
        }
    }
});

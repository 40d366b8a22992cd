//! The recovery point: how far the log is known to be durable.
//!
//! Written after every successful sync (never before), so whatever it names was on disk when it
//! was written; its own durability does not matter: if it is lost or torn (the CRC tells), an
//! older one or none is used and recovery validates more. On open, everything at or after the
//! recovery point is validated batch by batch; what lies before it is trusted, as in Kafka's
//! recovery-point checkpoint. Without it, a crash could leave an index entry that survived while
//! the data before it did not, and a recovery that started at that entry would never look there.

/// File name inside the partition folder.
pub const FILE_NAME: &str = "recovery-point";
const LEN: usize = 28;

/// Offset `offset` starts at byte `position` of the segment based at `segment_base`, and every
/// byte before it was synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct RecoveryPoint {
    pub offset: u64,
    pub segment_base: u64,
    pub position: u64,
}

impl RecoveryPoint {
    pub fn encode(&self) -> [u8; LEN] {
        let mut bytes = [0u8; LEN];
        bytes[0..8].copy_from_slice(&self.offset.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.segment_base.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.position.to_le_bytes());
        let crc = strata_wire::crc32c(&bytes[..24]);
        bytes[24..28].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    /// `None` for anything but a whole, intact checkpoint.
    pub fn decode(bytes: &[u8]) -> Option<RecoveryPoint> {
        let bytes: &[u8; LEN] = bytes.get(..LEN)?.try_into().ok()?;
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(bytes[24..28].try_into().expect("4 bytes"));
        let point = RecoveryPoint {
            offset: word(0),
            segment_base: word(8),
            position: word(16),
        };
        (strata_wire::crc32c(&bytes[..24]) == crc && point.offset >= point.segment_base)
            .then_some(point)
    }
}

/// How much of a segment recovery may take on trust.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    /// Entirely before the recovery point: walk headers after the last index entry only.
    Whole,
    /// Holds the recovery point: trust index entries up to this position, validate after.
    UpTo(u64),
    /// After the recovery point (or there is none): validate every batch, rebuild the index.
    Nothing,
}

pub fn trust(segment_base: u64, point: Option<RecoveryPoint>) -> Trust {
    match point {
        Some(point) if segment_base < point.segment_base => Trust::Whole,
        Some(point) if segment_base == point.segment_base => Trust::UpTo(point.position),
        _ => Trust::Nothing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let point = RecoveryPoint {
            offset: 1234,
            segment_base: 1000,
            position: 56_789,
        };
        let bytes = point.encode();
        assert_eq!(RecoveryPoint::decode(&bytes), Some(point));
        for at in 0..LEN {
            let mut damaged = bytes;
            damaged[at] ^= 0x10;
            assert_eq!(RecoveryPoint::decode(&damaged), None, "flip at {at}");
        }
        assert_eq!(RecoveryPoint::decode(&bytes[..27]), None);
        assert_eq!(RecoveryPoint::decode(&[0u8; LEN]), None);
    }

    #[test]
    fn trust_by_position_relative_to_the_point() {
        let point = Some(RecoveryPoint {
            offset: 50,
            segment_base: 40,
            position: 900,
        });
        assert_eq!(trust(0, point), Trust::Whole);
        assert_eq!(trust(40, point), Trust::UpTo(900));
        assert_eq!(trust(60, point), Trust::Nothing);
        assert_eq!(trust(0, None), Trust::Nothing);
    }
}

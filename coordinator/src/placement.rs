//! Replica placement and leader choice: pure functions over cluster state, no IO.

use crate::{BrokerInfo, PartitionState};

/// Places `partitions` partitions with `replication_factor` replicas each over `brokers`:
/// replicas of one partition on distinct brokers, and the preferred leader (first replica)
/// rotating so leadership spreads evenly. `start` offsets the rotation (e.g. by topic count) so
/// many small topics do not all lead on the same broker.
pub fn place(
    brokers: &[BrokerInfo],
    partitions: u32,
    replication_factor: u16,
    start: usize,
) -> Result<Vec<PartitionState>, String> {
    if brokers.is_empty() {
        return Err("no live brokers".into());
    }
    if partitions == 0 {
        return Err("a topic needs at least one partition".into());
    }
    let replication_factor = usize::from(replication_factor);
    if replication_factor == 0 || replication_factor > brokers.len() {
        return Err(format!(
            "replication factor {replication_factor} needs 1 to {} live brokers",
            brokers.len()
        ));
    }
    let mut ids: Vec<i32> = brokers.iter().map(|broker| broker.id).collect();
    ids.sort_unstable();
    Ok((0..partitions)
        .map(|partition| {
            let first = (start + partition as usize) % ids.len();
            let replicas: Vec<i32> = (0..replication_factor)
                .map(|k| ids[(first + k) % ids.len()])
                .collect();
            PartitionState {
                partition,
                leader: replicas[0],
                leader_epoch: 0,
                isr: replicas.clone(),
                replicas,
                partition_epoch: 0,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brokers(count: i32) -> Vec<BrokerInfo> {
        (0..count)
            .map(|id| BrokerInfo {
                id,
                host: "127.0.0.1".into(),
                port: 7300,
                shard_ports: vec![],
            })
            .collect()
    }

    #[test]
    fn replicas_distinct_and_leaders_balanced() {
        for broker_count in 1..6 {
            for rf in 1..=broker_count as u16 {
                for partitions in 1..20 {
                    let placed = place(&brokers(broker_count), partitions, rf, 3).unwrap();
                    let mut leaders = vec![0; broker_count as usize];
                    for state in &placed {
                        let mut replicas = state.replicas.clone();
                        replicas.sort_unstable();
                        replicas.dedup();
                        assert_eq!(replicas.len(), usize::from(rf), "distinct replicas");
                        assert!(state.isr.contains(&state.leader));
                        leaders[state.leader as usize] += 1;
                    }
                    let (min, max) = (leaders.iter().min().unwrap(), leaders.iter().max().unwrap());
                    assert!(max - min <= 1, "leaders balanced within one: {leaders:?}");
                }
            }
        }
    }

    #[test]
    fn impossible_requests_are_errors() {
        assert!(place(&brokers(1), 3, 2, 0).is_err());
        assert!(place(&brokers(1), 0, 1, 0).is_err());
        assert!(place(&[], 1, 1, 0).is_err());
    }
}

use super::*;

fn records(offsets: std::ops::Range<u64>) -> Vec<LogRecord> {
    offsets
        .map(|offset| LogRecord {
            offset,
            key: None,
            not_before: None,
            skip: false,
        })
        .collect()
}

fn keyed(pairs: &[(u64, u64)]) -> Vec<LogRecord> {
    pairs
        .iter()
        .map(|&(offset, key)| LogRecord {
            offset,
            key: Some(key),
            not_before: None,
            skip: false,
        })
        .collect()
}

fn settings() -> ShareSettings {
    ShareSettings {
        lock_duration: Duration::from_secs(30),
        ..ShareSettings::default()
    }
}

fn ack(first: u64, last: u64, kind: AckType) -> AckBatch {
    AckBatch {
        first,
        last,
        types: vec![kind],
    }
}

fn offsets(taken: &[Acquired]) -> Vec<u64> {
    taken.iter().flat_map(|run| run.first..=run.last).collect()
}

#[test]
fn records_are_acquired_a_batch_at_a_time_and_each_by_one_member() {
    let now = Instant::now();
    let mut partition = SharePartition::new(0, settings());
    assert_eq!(partition.read_from(now), Some(0));
    let read = records(0..10);
    let first = partition.acquire("a", now, &read, 4);
    assert_eq!(
        first,
        vec![Acquired {
            first: 0,
            last: 3,
            deliveries: 1
        }]
    );
    // The next member reads from the first record it could take.
    assert_eq!(partition.read_from(now), Some(4));
    let second = partition.acquire("b", now, &read[4..], 100);
    assert_eq!(offsets(&second), (4..10).collect::<Vec<_>>());
    assert_eq!(partition.read_from(now), Some(10));
    // A read overlapping what is acquired takes none of it again.
    assert!(partition.acquire("c", now, &read, 100).is_empty());
    assert_eq!(partition.summary().acquired, 10);
}

#[test]
fn accepted_records_move_the_start_and_are_never_delivered_again() {
    let now = Instant::now();
    let mut partition = SharePartition::new(0, settings());
    partition.acquire("a", now, &records(0..5), 100);
    partition
        .acknowledge("a", now, &[ack(0, 2, AckType::Accept)])
        .unwrap();
    assert_eq!(partition.start_offset(), 3);
    // Past every lock: 3 and 4 come back, 0..=2 never.
    let later = now + Duration::from_secs(31);
    assert_eq!(partition.read_from(later), Some(3));
    let again = partition.acquire("b", later, &records(0..5), 100);
    assert_eq!(
        again,
        vec![Acquired {
            first: 3,
            last: 4,
            deliveries: 2
        }]
    );
}

#[test]
fn only_the_holder_acknowledges_and_a_refused_request_changes_nothing() {
    let now = Instant::now();
    let mut partition = SharePartition::new(0, settings());
    partition.acquire("a", now, &records(0..4), 2);
    partition.acquire("b", now, &records(2..4), 2);
    let mixed = [ack(0, 1, AckType::Accept), ack(2, 2, AckType::Accept)];
    assert_eq!(
        partition.acknowledge("a", now, &mixed),
        Err(AckError::NotAcquired(2))
    );
    assert_eq!(partition.state_of(0), Some((RecordState::Acquired, 1)));
    assert_eq!(
        partition.acknowledge("a", now, &[ack(7, 7, AckType::Accept)]),
        Err(AckError::NotAcquired(7))
    );
    let malformed = AckBatch {
        first: 0,
        last: 1,
        types: vec![AckType::Accept; 3],
    };
    assert!(matches!(
        partition.acknowledge("a", now, &[malformed]),
        Err(AckError::Malformed(_))
    ));
    // One type per offset.
    let each = AckBatch {
        first: 0,
        last: 1,
        types: vec![AckType::Accept, AckType::Release],
    };
    partition.acknowledge("a", now, &[each]).unwrap();
    assert_eq!(partition.state_of(1), Some((RecordState::Available, 1)));
    assert_eq!(partition.start_offset(), 1);
}

#[test]
fn release_redelivers_reject_never_does() {
    let now = Instant::now();
    let mut partition = SharePartition::new(0, settings());
    partition.acquire("a", now, &records(0..2), 100);
    partition
        .acknowledge(
            "a",
            now,
            &[ack(0, 0, AckType::Release), ack(1, 1, AckType::Reject)],
        )
        .unwrap();
    assert_eq!(partition.read_from(now), Some(0));
    let again = partition.acquire("b", now, &records(0..2), 100);
    assert_eq!(
        again,
        vec![Acquired {
            first: 0,
            last: 0,
            deliveries: 2
        }]
    );
    assert_eq!(partition.state_of(1), Some((RecordState::Archived, 1)));
}

#[test]
fn an_expired_lock_gives_the_record_to_the_next_member() {
    let now = Instant::now();
    let mut partition = SharePartition::new(0, settings());
    partition.acquire("a", now, &records(0..3), 100);
    assert_eq!(
        partition.poll_timeout(),
        Some(now + Duration::from_secs(30))
    );
    let before = now + Duration::from_secs(29);
    assert!(
        partition
            .acquire("b", before, &records(0..3), 100)
            .is_empty()
    );
    let after = now + Duration::from_secs(30);
    assert_eq!(
        offsets(&partition.acquire("b", after, &records(0..3), 100)),
        [0, 1, 2]
    );
    assert_eq!(partition.counters().lock_expiries, 3);
    // The first holder's late acknowledgement is refused: the records are b's now.
    assert_eq!(
        partition.acknowledge("a", after, &[ack(0, 0, AckType::Accept)]),
        Err(AckError::NotAcquired(0))
    );
}

#[test]
fn renew_extends_the_lock() {
    let now = Instant::now();
    let mut partition = SharePartition::new(0, settings());
    partition.acquire("a", now, &records(0..1), 100);
    let later = now + Duration::from_secs(20);
    partition
        .acknowledge("a", later, &[ack(0, 0, AckType::Renew)])
        .unwrap();
    assert_eq!(
        partition.poll_timeout(),
        Some(later + Duration::from_secs(30))
    );
    let past_first_lock = now + Duration::from_secs(40);
    assert!(
        partition
            .acquire("b", past_first_lock, &records(0..1), 100)
            .is_empty()
    );
    partition
        .acknowledge("a", past_first_lock, &[ack(0, 0, AckType::Accept)])
        .unwrap();
    assert_eq!(partition.start_offset(), 1);
}

#[test]
fn the_delivery_limit_archives_a_record_and_names_it_a_dead_letter() {
    let now = Instant::now();
    let mut partition = SharePartition::new(
        0,
        ShareSettings {
            delivery_limit: 3,
            dead_letters: true,
            ..settings()
        },
    );
    for delivery in 1..=3 {
        let taken = partition.acquire("a", now, &records(0..2), 1);
        assert_eq!(
            taken,
            vec![Acquired {
                first: 0,
                last: 0,
                deliveries: delivery
            }]
        );
        partition
            .acknowledge("a", now, &[ack(0, 0, AckType::Release)])
            .unwrap();
    }
    assert_eq!(
        partition.state_of(0),
        None,
        "archived, and the start moved past"
    );
    assert_eq!(partition.start_offset(), 1);
    assert_eq!(
        partition.take_dead_letters(),
        vec![DeadLetter {
            offset: 0,
            deliveries: 3,
            reason: DeadLetterReason::DeliveryLimit
        }]
    );
    partition.acquire("a", now, &records(1..2), 1);
    partition
        .acknowledge("a", now, &[ack(1, 1, AckType::Reject)])
        .unwrap();
    assert_eq!(
        partition.take_dead_letters()[0].reason,
        DeadLetterReason::Rejected
    );
    assert!(partition.take_dead_letters().is_empty());
}

#[test]
fn expiry_counts_toward_the_delivery_limit() {
    let mut now = Instant::now();
    let mut partition = SharePartition::new(
        0,
        ShareSettings {
            delivery_limit: 2,
            ..settings()
        },
    );
    partition.acquire("a", now, &records(0..1), 1);
    now += Duration::from_secs(30);
    partition.acquire("a", now, &records(0..1), 1);
    now += Duration::from_secs(30);
    partition.handle_timeout(now);
    assert_eq!(partition.start_offset(), 1, "archived after two deliveries");
}

#[test]
fn key_order_holds_a_key_until_its_earlier_record_is_done() {
    let now = Instant::now();
    let mut partition = SharePartition::new(
        0,
        ShareSettings {
            key_ordering: true,
            ..settings()
        },
    );
    // Keys: 0→A 1→B 2→A 3→C 4→B
    let read = keyed(&[(0, 1), (1, 2), (2, 1), (3, 3), (4, 2)]);
    let first = partition.acquire("m1", now, &read, 100);
    assert_eq!(offsets(&first), [0, 1, 3], "one record per key at a time");
    let second = partition.acquire("m2", now, &read, 100);
    assert!(second.is_empty(), "2 and 4 wait for 0 and 1");
    partition
        .acknowledge("m1", now, &[ack(0, 0, AckType::Accept)])
        .unwrap();
    assert_eq!(partition.read_from(now), Some(2));
    let third = partition.acquire("m2", now, &read[2..], 100);
    assert_eq!(offsets(&third), [2]);
    // A released record keeps its key's place: what follows it waits for its redelivery.
    partition
        .acknowledge("m1", now, &[ack(1, 1, AckType::Release)])
        .unwrap();
    let fourth = partition.acquire("m3", now, &read[1..], 100);
    assert_eq!(offsets(&fourth), [1], "1 again, not 4");
}

#[test]
fn key_order_does_not_hold_unkeyed_records() {
    let now = Instant::now();
    let mut partition = SharePartition::new(
        0,
        ShareSettings {
            key_ordering: true,
            ..settings()
        },
    );
    let taken = partition.acquire("a", now, &records(0..5), 100);
    assert_eq!(offsets(&taken), [0, 1, 2, 3, 4]);
}

#[test]
fn redelivery_backs_off_exponentially_up_to_its_cap() {
    let mut now = Instant::now();
    let mut partition = SharePartition::new(
        0,
        ShareSettings {
            delivery_limit: 10,
            redelivery_backoff: Duration::from_millis(100),
            redelivery_backoff_max: Duration::from_millis(300),
            ..settings()
        },
    );
    for (delivery, wait_ms) in [(1u16, 100u64), (2, 200), (3, 300), (4, 300)] {
        let taken = partition.acquire("a", now, &records(0..1), 1);
        assert_eq!(taken[0].deliveries, delivery);
        partition
            .acknowledge("a", now, &[ack(0, 0, AckType::Release)])
            .unwrap();
        assert_eq!(
            partition.poll_timeout(),
            Some(now + Duration::from_millis(wait_ms))
        );
        assert_eq!(partition.read_from(now), Some(1), "0 waits out its backoff");
        assert!(partition.acquire("a", now, &records(0..1), 1).is_empty());
        now += Duration::from_millis(wait_ms);
        assert_eq!(partition.read_from(now), Some(0));
    }
}

#[test]
fn a_delayed_record_is_not_acquired_before_its_time_and_does_not_hold_others() {
    let now = Instant::now();
    let mut partition = SharePartition::new(0, settings());
    let mut read = records(0..3);
    read[1].not_before = Some(now + Duration::from_secs(5));
    assert_eq!(offsets(&partition.acquire("a", now, &read, 100)), [0, 2]);
    assert_eq!(partition.start_offset(), 0);
    assert_eq!(partition.poll_timeout(), Some(now + Duration::from_secs(5)));
    let later = now + Duration::from_secs(5);
    assert_eq!(partition.read_from(later), Some(1));
    assert_eq!(
        offsets(&partition.acquire("b", later, &read[1..], 100)),
        [1]
    );
}

#[test]
fn markers_aborted_records_and_gaps_are_archived_not_delivered() {
    let now = Instant::now();
    let mut partition = SharePartition::new(0, settings());
    // 0 and 1 aborted, 2 their marker, 3 a record, 4 compacted away, 5 a record.
    let mut read = records(0..4);
    for record in &mut read[..3] {
        record.skip = true;
    }
    read.extend(records(5..6));
    let taken = partition.acquire("a", now, &read, 100);
    assert_eq!(offsets(&taken), [3, 5]);
    assert_eq!(partition.start_offset(), 3);
    assert_eq!(partition.state_of(4), Some((RecordState::Archived, 0)));
    // The client acknowledges the gap it saw with the rest.
    partition
        .acknowledge(
            "a",
            now,
            &[AckBatch {
                first: 3,
                last: 5,
                types: vec![AckType::Accept, AckType::Gap, AckType::Accept],
            }],
        )
        .unwrap();
    assert_eq!(partition.start_offset(), 6);
}

#[test]
fn the_window_is_bounded() {
    let now = Instant::now();
    let mut partition = SharePartition::new(
        0,
        ShareSettings {
            max_in_flight: 4,
            ..settings()
        },
    );
    assert_eq!(
        offsets(&partition.acquire("a", now, &records(0..10), 100)),
        [0, 1, 2, 3]
    );
    assert_eq!(partition.read_from(now), None);
    partition
        .acknowledge("a", now, &[ack(0, 0, AckType::Accept)])
        .unwrap();
    assert_eq!(partition.read_from(now), Some(4));
}

#[test]
fn a_member_leaving_releases_what_it_holds() {
    let now = Instant::now();
    let mut partition = SharePartition::new(0, settings());
    partition.acquire("a", now, &records(0..2), 1);
    partition.acquire("b", now, &records(1..2), 1);
    partition.release_member("a", now);
    assert_eq!(partition.state_of(0), Some((RecordState::Available, 1)));
    assert_eq!(partition.state_of(1), Some((RecordState::Acquired, 1)));
}

#[test]
fn a_snapshot_restores_every_acknowledgement_and_delivery_count() {
    let now = Instant::now();
    let mut partition = SharePartition::new(
        10,
        ShareSettings {
            dead_letters: true,
            ..settings()
        },
    );
    partition.acquire("a", now, &records(10..20), 100);
    partition
        .acknowledge(
            "a",
            now,
            &[
                ack(10, 11, AckType::Accept),
                ack(12, 12, AckType::Release),
                ack(13, 13, AckType::Accept),
                ack(14, 14, AckType::Reject),
            ],
        )
        .unwrap();
    let snapshot = partition.snapshot();
    let stored = serde_json::to_string(&snapshot).unwrap();
    let restored = SharePartition::restore(&serde_json::from_str(&stored).unwrap(), settings());
    assert_eq!(restored.start_offset(), 12);
    assert_eq!(restored.state_of(12), Some((RecordState::Available, 1)));
    assert_eq!(restored.state_of(13), Some((RecordState::Acknowledged, 1)));
    assert_eq!(restored.state_of(14), Some((RecordState::Archived, 1)));
    // Acquired when stored: available again, its delivery counted.
    assert_eq!(restored.state_of(15), Some((RecordState::Available, 1)));
    assert_eq!(restored.snapshot(), snapshot);
    // Nothing acknowledged is acquired again.
    let mut restored = restored;
    let taken = restored.acquire("b", now, &records(10..20), 100);
    assert_eq!(offsets(&taken), [12, 15, 16, 17, 18, 19]);
}

#[test]
fn the_log_start_moving_past_the_window_moves_it() {
    let now = Instant::now();
    let mut partition = SharePartition::new(0, settings());
    partition.acquire("a", now, &records(0..5), 100);
    partition.move_start_to(3);
    assert_eq!(partition.start_offset(), 3);
    assert_eq!(partition.state_of(3), Some((RecordState::Acquired, 1)));
    partition.move_start_to(100);
    assert_eq!(partition.start_offset(), 100);
    assert_eq!(partition.end_offset(), 100);
    assert_eq!(partition.read_from(now), Some(100));
}

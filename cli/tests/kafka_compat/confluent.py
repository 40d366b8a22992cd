"""Scenarios for cli/tests/kafka_compat.rs, run through confluent-kafka (librdkafka 2.16):
`python3 confluent.py SCENARIO BOOTSTRAP [ARG...]` prints one JSON object with what it saw."""

import json
import sys
import time

import confluent_kafka
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)

TIMEOUT_S = 30


def admin(bootstrap):
    return AdminClient({"bootstrap.servers": bootstrap})


def error_name(error):
    """A KafkaError (or the exception carrying one) as its code's name."""
    if isinstance(error, KafkaException):
        error = error.args[0]
    return error.name() if error is not None else None


def outcome(futures):
    """The error name of an admin call's one result, None when it succeeded."""
    [future] = futures.values()
    try:
        future.result(TIMEOUT_S)
        return None
    except KafkaException as error:
        return error_name(error)


def produce(bootstrap, topic, records, **config):
    """Produces (key, value, headers) records and waits for each to be acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **config})
    delivered = []
    for key, value, headers in records:
        producer.produce(
            topic,
            key=key,
            value=value,
            headers=headers,
            on_delivery=lambda err, msg: delivered.append(error_name(err)),
        )
    producer.flush(TIMEOUT_S)
    assert delivered == [None] * len(records), delivered
    return delivered


def consume(consumer, count):
    """Up to `count` records (fewer if none come for the timeout)."""
    messages = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(messages) < count and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is None:
            continue
        if message.error():
            raise KafkaException(message.error())
        messages.append(message)
    return messages


def list_topics_and_regex(bootstrap, group):
    """The all-topics Metadata request (list_topics) and a regex subscription's assignment."""
    topics = sorted(admin(bootstrap).list_topics(timeout=TIMEOUT_S).topics)
    produce(bootstrap, "t-one", [(b"k", b"one", None)])
    produce(bootstrap, "t-two", [(b"k", b"two", None)])
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    consumer.subscribe(["^t-.*"])
    values = sorted(message.value().decode() for message in consume(consumer, 2))
    assigned = sorted({tp.topic for tp in consumer.assignment()})
    consumer.close()
    return {"topics": topics, "values": values, "assigned": assigned}


def created_topics(bootstrap):
    """A topic created on first use and one created with the broker's defaults (-1)."""
    produce(bootstrap, "on-first-use", [(None, b"x", None)])
    client = admin(bootstrap)
    futures = client.create_topics([NewTopic("by-defaults", num_partitions=-1, replication_factor=-1)])
    futures["by-defaults"].result(TIMEOUT_S)
    metadata = client.list_topics(timeout=TIMEOUT_S).topics
    return {name: len(metadata[name].partitions) for name in ["on-first-use", "by-defaults"]}


def commit_unknown(bootstrap, group):
    """Offsets committed for a known topic, an unknown one and a partition past the last, in
    one request: the commit callback has each partition's own error."""
    answers = []
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "on_commit": lambda err, partitions: answers.append(partitions),
        }
    )
    asked = [
        TopicPartition("known", 0, 3),
        TopicPartition("nowhere", 0, 5),
        TopicPartition("known", 99, 1),
    ]
    consumer.commit(offsets=asked, asynchronous=True)
    deadline = time.monotonic() + TIMEOUT_S
    while not answers and time.monotonic() < deadline:
        consumer.poll(0.1)
    result = {f"{tp.topic}/{tp.partition}": error_name(tp.error) for tp in answers[0]}
    committed = consumer.committed([TopicPartition("known", 0)], timeout=TIMEOUT_S)
    consumer.close()
    return {"errors": result, "committed": committed[0].offset}


def null_headers(bootstrap):
    """Header values: null, empty and set, produced and consumed back."""
    sent = [("absent", None), ("blank", b""), ("set", b"v")]
    produce(bootstrap, "headers", [(b"k", b"value", sent)])
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "headers-reader", "auto.offset.reset": "earliest"}
    )
    consumer.subscribe(["headers"])
    [message] = consume(consumer, 1)
    consumer.close()
    return {
        "headers": [
            [key, None if value is None else value.decode()] for key, value in message.headers()
        ]
    }


def read_to_end(consumer, topic):
    """Every record of partition 0 from where the consumer starts to the high watermark (as
    it stands when the consumer is first asked): records a poll returns while the assignment
    is still coming are kept too."""
    values = []
    high = None
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None:
            if message.error():
                raise KafkaException(message.error())
            values.append(message.value().decode())
        if not consumer.assignment():
            continue
        if high is None:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S)
        [position] = consumer.position([TopicPartition(topic, 0)])
        if position.offset >= high:
            break
    return values


def group_ids(bootstrap, topic, *groups):
    """Each group reads the topic, commits, and a second member of it resumes after the commit."""
    result = {}
    for group in groups:
        config = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
        first = Consumer(config)
        first.subscribe([topic])
        read = read_to_end(first, topic)
        first.commit(asynchronous=False)
        first.close()
        produce(bootstrap, topic, [(None, f"after-{group}".encode(), None)])
        second = Consumer(config)
        second.subscribe([topic])
        resumed = read_to_end(second, topic)
        second.close()
        result[group] = {"read": sorted(read), "resumed": resumed}
    return result


def configs(bootstrap):
    """IncrementalAlterConfigs APPEND / SUBTRACT, Kafka's settings, validate_only."""
    client = admin(bootstrap)
    client.create_topics(
        [
            NewTopic(
                "configured",
                num_partitions=2,
                replication_factor=1,
                # With settings Kafka Streams puts on its internal topics, which change nothing.
                config={
                    "compression.type": "zstd",
                    "message.format.version": "2.8-IV1",
                    "message.timestamp.type": "CreateTime",
                    "segment.index.bytes": "1048576",
                },
            )
        ]
    )["configured"].result(TIMEOUT_S)

    def alter(name, op, value, validate_only=False):
        resource = ConfigResource(
            ConfigResource.Type.TOPIC,
            "configured",
            incremental_configs=[ConfigEntry(name, value, incremental_operation=op)],
        )
        futures = client.incremental_alter_configs([resource], validate_only=validate_only)
        return outcome(futures)

    def described():
        resource = ConfigResource(ConfigResource.Type.TOPIC, "configured")
        entries = list(client.describe_configs([resource]).values())[0].result(TIMEOUT_S)
        keys = ["cleanup.policy", "compression.type", "message.format.version", "retention.ms", "message.timestamp.type"]
        return {key: entries[key].value for key in keys}

    result = {
        "append_delete": alter("cleanup.policy", AlterConfigOpType.APPEND, "delete"),
        "subtract_compact": alter("cleanup.policy", AlterConfigOpType.SUBTRACT, "compact"),
        "append_compact": alter("cleanup.policy", AlterConfigOpType.APPEND, "compact"),
        "append_retention": alter("retention.ms", AlterConfigOpType.APPEND, "5"),
        "validate_only_set": alter("retention.ms", AlterConfigOpType.SET, "60000", validate_only=True),
        "validate_only_bad": alter("retention.ms", AlterConfigOpType.SET, "soon", validate_only=True),
    }
    result["after_validate_only"] = described()
    result["set_compression"] = alter("compression.type", AlterConfigOpType.SET, "lz4")
    result["described"] = described()

    def create(topic, validate_only, **config):
        futures = client.create_topics(
            [NewTopic(topic, num_partitions=3, replication_factor=1, config=config)],
            validate_only=validate_only,
        )
        return outcome(futures)

    result["validate_create"] = create("dry-run", True)
    result["validate_create_bad"] = create("dry-run-bad", True, **{"retention.ms": "soon"})
    result["validate_create_existing"] = create("configured", True)
    result["create_log_append_time"] = create("appended", False, **{"message.timestamp.type": "LogAppendTime"})
    result["create_bad_timestamp_type"] = create("bad-time", False, **{"message.timestamp.type": "Whenever"})
    result["topics"] = sorted(client.list_topics(timeout=TIMEOUT_S).topics)
    return result


def assigned(bootstrap):
    """CreateTopics with replica assignments: one the broker can take, one naming a broker
    that is not registered, and the same as a dry run."""
    client = admin(bootstrap)

    def create(topic, assignment, validate_only=False):
        futures = client.create_topics(
            [NewTopic(topic, num_partitions=len(assignment), replica_assignment=assignment)],
            validate_only=validate_only,
        )
        return outcome(futures)

    def grow(count, assignment, validate_only=False):
        futures = client.create_partitions(
            [NewPartitions("placed", count, replica_assignment=assignment)],
            validate_only=validate_only,
        )
        return outcome(futures)

    result = {
        "placed": create("placed", [[1], [1], [1]]),
        "unknown_broker": create("elsewhere", [[1], [7]]),
        "unknown_broker_dry_run": create("elsewhere", [[7]], validate_only=True),
        "grown": grow(5, [[1], [1]]),
        "grown_short": grow(7, [[1]]),
        "grown_elsewhere_dry_run": grow(6, [[9]], validate_only=True),
    }
    metadata = client.list_topics(timeout=TIMEOUT_S).topics
    result["partitions"] = {
        name: sorted(p.replicas for p in topic.partitions.values()) for name, topic in metadata.items()
    }
    return result


def invalid_topic(bootstrap):
    """Records for a topic whose name no topic may have, beside a good one, with topics
    created on first use: the bad ones fail (not retried until their timeout)."""
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 60000})
    reports = {}
    for topic in ["bad$#!", "good"]:
        producer.produce(
            topic,
            value=b"v",
            on_delivery=lambda err, msg, topic=topic: reports.setdefault(topic, error_name(err)),
        )
    left = producer.flush(TIMEOUT_S)
    return {"reports": reports, "left": left}


def compressed(bootstrap, topic):
    """Uncompressed batches produced to a topic whose compression.type names a codec."""
    produce(bootstrap, topic, [(None, b"a" * 1000, None) for _ in range(50)], **{"compression.type": "none"})
    return {"produced": 50}


def read_keyed(bootstrap, topic, partition=0):
    """Every record of a partition from its start to its high watermark, as
    [offset, key, value or None], read by assignment (no group). When compaction removed the
    last records, librdkafka's position stays where they were (below the high watermark, as on
    Kafka, whose cleaner leaves a gap there): reading also ends after 2 s without a record."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False})
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=TIMEOUT_S)
    consumer.assign([TopicPartition(topic, partition, low)])
    records = []
    deadline = time.monotonic() + TIMEOUT_S
    last_record = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - last_record < 2.0:
        message = consumer.poll(0.2)
        if message is not None:
            if message.error():
                raise KafkaException(message.error())
            last_record = time.monotonic()
            value = message.value()
            records.append([message.offset(), message.key().decode(), None if value is None else value.decode()])
        [position] = consumer.position([TopicPartition(topic, partition)])
        if position.offset >= high:
            break
    consumer.close()
    return records


def wait_for_records(bootstrap, topic, count, patience_s):
    """Reads the partition until it holds `count` records (the cleaner's work), or gives up."""
    deadline = time.monotonic() + patience_s
    while True:
        records = read_keyed(bootstrap, topic)
        if len(records) == count or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def compacted(bootstrap, topic, delete_retention_ms, replication_factor="-1"):
    """A compacted topic created through CreateTopics: 100 keys written 100 times (zstd) and
    then tombstones for 10 of them; what reading from the start gives once the cleaner has run, and
    once the tombstones' delete.retention.ms has passed."""
    client = admin(bootstrap)
    client.create_topics(
        [
            NewTopic(
                topic,
                num_partitions=1,
                replication_factor=int(replication_factor),
                config={
                    "cleanup.policy": "compact",
                    "segment.ms": "1000",
                    "segment.bytes": "262144",
                    "min.cleanable.dirty.ratio": "0.01",
                    "delete.retention.ms": delete_retention_ms,
                },
            )
        ]
    )[topic].result(TIMEOUT_S)
    records = [
        (f"key{key}".encode(), f"v{version}-{key}".encode(), None)
        for version in range(100)
        for key in range(100)
    ]
    # zstd, as many producers of compacted topics send: the cleaner rewrites Kafka batches.
    produce(bootstrap, topic, records, acks="all", **{"compression.type": "zstd"})
    produce(bootstrap, topic, [(f"key{key}".encode(), None, None) for key in range(10)], acks="all")
    refused = []
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, value=b"no key", on_delivery=lambda err, msg: refused.append(error_name(err)))
    producer.flush(TIMEOUT_S)
    cleaned = wait_for_records(bootstrap, topic, 100, 30)
    forgotten = wait_for_records(bootstrap, topic, 90, 30 + int(delete_retention_ms) / 1000)
    return {"refused": refused, "cleaned": cleaned, "forgotten": forgotten}


def create_compacted(bootstrap, topic, delete_retention_ms):
    """A compacted topic created through CreateTopics, as `compacted` creates one."""
    client = admin(bootstrap)
    client.create_topics(
        [
            NewTopic(
                topic,
                num_partitions=1,
                replication_factor=-1,
                config={
                    "cleanup.policy": "compact",
                    "segment.ms": "1000",
                    "min.cleanable.dirty.ratio": "0.01",
                    "delete.retention.ms": delete_retention_ms,
                },
            )
        ]
    )[topic].result(TIMEOUT_S)
    return {"created": topic}


def wait_for(bootstrap, topic, count, patience_s):
    """The partition's records once it holds `count` of them (or when patience runs out)."""
    return wait_for_records(bootstrap, topic, int(count), float(patience_s))


def read(bootstrap, topic):
    """The records of partition 0 from its start, as [offset, key, value or None]."""
    return read_keyed(bootstrap, topic)


def broker_bytes(stats, field):
    """A client's bytes to or from its brokers (librdkafka's statistics), bootstrap included."""
    return sum(broker[field] for broker in stats["brokers"].values())


def log_line(i):
    """A record as a service's log has them: text that compresses as logs do."""
    return (
        f"2026-03-01T12:{i % 60:02d}:{i % 59:02d}Z INFO GET /api/v1/items?id={i} status=200 "
        f"duration_ms={i % 97} region=eu-west-1 user_agent=\"Mozilla/5.0 (X11; Linux x86_64)\""
    ).encode()


def codecs(bootstrap, count):
    """For each codec: a topic, `count` log lines produced with it and read back from the
    start; the producer's bytes sent and the consumer's bytes received (client statistics)."""
    count = int(count)
    results = {}
    client = admin(bootstrap)
    names = [f"as-sent-{codec}" for codec in ("none", "gzip", "snappy", "lz4", "zstd")]
    for future in client.create_topics([NewTopic(name, 1, 1) for name in names]).values():
        future.result(TIMEOUT_S)
    for name in names:
        codec = name.removeprefix("as-sent-")
        stats = {}
        producer = Producer({
            "bootstrap.servers": bootstrap,
            "compression.type": codec,
            "linger.ms": 100,
            "batch.size": 1_000_000,
            "statistics.interval.ms": 100,
            "stats_cb": lambda text: stats.update(producer=json.loads(text)),
        })
        sent = [log_line(i) for i in range(count)]
        for i, value in enumerate(sent):
            producer.produce(name, key=str(i % 100).encode(), value=value, partition=0)
            if i % 1000 == 0:
                producer.poll(0)
        assert producer.flush(TIMEOUT_S) == 0
        # Statistics once every request has its answer.
        stats.clear()
        while "producer" not in stats:
            producer.poll(0.1)
        consumer = Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{name}",
            "enable.auto.commit": False,
            "statistics.interval.ms": 100,
            "stats_cb": lambda text: stats.update(consumer=json.loads(text)),
        })
        consumer.assign([TopicPartition(name, 0, 0)])
        got = [message.value() for message in consume(consumer, count)]
        stats.pop("consumer", None)
        while "consumer" not in stats:
            consumer.poll(0.1)
        consumer.close()
        results[codec] = {
            "same": got == sent,
            "got": len(got),
            "sent_bytes": broker_bytes(stats["producer"], "txbytes"),
            "received_bytes": broker_bytes(stats["consumer"], "rxbytes"),
        }
    return results


def log_append_time(bootstrap, topic):
    """Records produced with an old timestamp to a topic that sets LogAppendTime: what a
    consumer reads as their timestamps, and the wall clock around the produce."""
    client = admin(bootstrap)
    topic_config = {"message.timestamp.type": "LogAppendTime"}
    client.create_topics([NewTopic(topic, 1, 1, config=topic_config)])[topic].result(TIMEOUT_S)
    before_ms = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "zstd"})
    reported = []
    for i in range(20):
        producer.produce(
            topic,
            value=f"record {i}".encode(),
            timestamp=1_000 + i,
            on_delivery=lambda err, msg: reported.append(
                [msg.timestamp()[0] == confluent_kafka.TIMESTAMP_LOG_APPEND_TIME, msg.timestamp()[1]]
            ),
        )
    assert producer.flush(TIMEOUT_S) == 0
    after_ms = int(time.time() * 1000)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "lat", "check.crcs": True})
    consumer.assign([TopicPartition(topic, 0, 0)])
    read = [
        [message.timestamp()[0] == confluent_kafka.TIMESTAMP_LOG_APPEND_TIME, message.timestamp()[1]]
        for message in consume(consumer, 20)
    ]
    consumer.close()
    return {"before_ms": before_ms, "after_ms": after_ms, "read": read, "reported": reported}


def odd_records():
    """Keys, values and headers as Kafka allows them: null keys, null and empty values,
    repeated header keys, null header values."""
    return [
        (None, b"no key", None),
        (b"k1", None, None),
        (b"k2", b"", [("h", b"1"), ("h", None), ("h", b"")]),
        (None, None, [("only", None)]),
        (b"k3", b"v3", [("trace", b"abc"), ("span", b"def")]),
    ]


def write_odd(bootstrap, topic, codec):
    """`odd_records`, produced with `codec`."""
    produce(bootstrap, topic, odd_records(), **{"compression.type": codec})
    return {"produced": len(odd_records())}


def encoded(value):
    return None if value is None else value.decode()


def read_all(bootstrap, topic, count, isolation="read_uncommitted"):
    """The first `count` records of partition 0, each as offset, key, value and headers (None
    for a null), in the isolation level asked for."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"read-all-{topic}",
        "enable.auto.commit": False,
        "isolation.level": isolation,
        "check.crcs": True,
    })
    consumer.assign([TopicPartition(topic, 0, 0)])
    read = [
        [
            message.offset(),
            encoded(message.key()),
            encoded(message.value()),
            [[key, encoded(value)] for key, value in (message.headers() or [])],
        ]
        for message in consume(consumer, int(count))
    ]
    consumer.close()
    return {"read": read}


def produce_until(bootstrap, topic, stop_file, codec):
    """Produces numbered records (acks=all, idempotent, `codec`) to the topic's partitions
    until `stop_file` exists, riding out leader changes; then the (partition, offset, value)
    of every acknowledged record, and how many failed."""
    import os

    acked, failed = [], []

    def report(err, msg):
        if err is None:
            acked.append([msg.partition(), msg.offset(), msg.value().decode()])
        else:
            failed.append(error_name(err))

    producer = Producer({
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "compression.type": codec,
        "linger.ms": 20,
        "message.timeout.ms": 60000,
    })
    sent = 0
    while not os.path.exists(stop_file):
        for _ in range(50):
            producer.produce(topic, key=str(sent % 31).encode(), value=f"record-{sent}".encode(), on_delivery=report)
            sent += 1
        producer.poll(0.02)
    assert producer.flush(90) == 0
    return {"sent": sent, "acked": acked, "failed": failed}


SCENARIOS = {
    "produce_until": produce_until,
    "codecs": codecs,
    "log_append_time": log_append_time,
    "write_odd": write_odd,
    "read_all": read_all,
    "compacted": compacted,
    "read": read,
    "create_compacted": create_compacted,
    "wait_for": wait_for,
    "list_topics_and_regex": list_topics_and_regex,
    "created_topics": created_topics,
    "commit_unknown": commit_unknown,
    "null_headers": null_headers,
    "group_ids": group_ids,
    "configs": configs,
    "compressed": compressed,
    "assigned": assigned,
    "invalid_topic": invalid_topic,
}

if __name__ == "__main__":
    scenario, bootstrap, *args = sys.argv[1:]
    version = tuple(int(part) for part in confluent_kafka.libversion()[0].split(".")[:2])
    assert version >= (2, 16), confluent_kafka.libversion()
    print(json.dumps(SCENARIOS[scenario](bootstrap, *args)))

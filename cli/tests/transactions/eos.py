"""Exactly-once pieces for the fault test, through confluent-kafka (librdkafka).

Usage: eos.py ROLE BOOTSTRAP [ARGS...]

Roles:
  feed IN COUNT RATE          an idempotent producer (acks=all) writing COUNT records to IN,
                              RATE a second, keys k0..k29, values "<key>:<n>" with n counting
                              per key; prints {"acked": N} at the end.
  app IN OUT GROUP TXN_ID IDLE_S
                              consume-transform-produce: reads IN (read_committed, group
                              GROUP), writes each record's value prefixed "T:" under its key to
                              the same partition of OUT and commits the consumed offsets in the
                              same transaction (transactional.id TXN_ID); exits 0 once nothing
                              new came for IDLE_S seconds. One transaction in ten is
                              aborted on purpose once its records are written (and its
                              input read again), so aborted records are always in OUT.
  watch OUT SECONDS PATH      a read_committed reader of every partition of OUT from the start,
                              for SECONDS; writes what it saw, in order, to PATH as JSON
                              ({partition: [values]}), rewritten every second.
  dump TOPIC ISOLATION        every record of TOPIC to its end: {partition: [[key, value]]}.
"""

import json
import os
import random
import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

ROLE, BOOTSTRAP = sys.argv[1], sys.argv[2]
ARGS = sys.argv[3:]


def feed():
    topic, count, rate = ARGS[0], int(ARGS[1]), float(ARGS[2])
    producer = Producer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 300000,
        }
    )
    acked = [0]
    failed = []

    def delivered(error, _message):
        if error is None:
            acked[0] += 1
        else:
            failed.append(str(error))

    per_key = {}
    started = time.time()
    for i in range(count):
        key = f"k{i % 30}"
        n = per_key.get(key, 0)
        per_key[key] = n + 1
        producer.produce(topic, key=key, value=f"{key}:{n}", on_delivery=delivered)
        producer.poll(0)
        ahead = started + (i + 1) / rate - time.time()
        if ahead > 0:
            time.sleep(ahead)
    producer.flush(300)
    return {"acked": acked[0], "failed": failed[:5]}


def app():
    topic_in, topic_out, group, txn_id, idle_s = ARGS[0], ARGS[1], ARGS[2], ARGS[3], float(ARGS[4])
    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10000,
        }
    )
    producer = Producer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "transactional.id": txn_id,
            "transaction.timeout.ms": 10000,
            "linger.ms": 5,
        }
    )
    producer.init_transactions(60)
    consumer.subscribe([topic_in])
    last_new = time.time()
    transactions = 0
    while time.time() - last_new < idle_s:
        messages = consumer.consume(num_messages=100, timeout=0.5)
        messages = [m for m in messages if m.error() is None]
        if not messages:
            continue
        last_new = time.time()
        producer.begin_transaction()
        for message in messages:
            producer.produce(
                topic_out,
                key=message.key(),
                value=b"T:" + message.value(),
                partition=message.partition(),
            )
        positions = consumer.position(consumer.assignment())
        producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 60)
        try:
            if random.random() < 0.1:
                producer.flush(60)
                producer.abort_transaction(60)
                rewind(consumer)
                continue
            producer.commit_transaction(60)
        except KafkaException as error:
            if error.args[0].txn_requires_abort():
                producer.abort_transaction(60)
                rewind(consumer)
                continue
            raise
        transactions += 1
    consumer.close()
    return {"transactions": transactions}


def rewind(consumer):
    """Back to the committed offsets: what an aborted transaction read is read again."""
    for tp in consumer.assignment():
        committed = consumer.committed([tp], 30)[0]
        consumer.seek(TopicPartition(tp.topic, tp.partition, max(committed.offset, 0)))


def watch():
    topic, seconds, path = ARGS[0], float(ARGS[1]), ARGS[2]
    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": "watch-" + uuid.uuid4().hex,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    metadata = consumer.list_topics(topic, timeout=30)
    partitions = sorted(metadata.topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    seen = {p: [] for p in partitions}
    deadline = time.time() + seconds
    written = time.time()
    while time.time() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            seen[message.partition()].append(message.value().decode())
        if time.time() - written > 1:
            save(path, seen)
            written = time.time()
    save(path, seen)
    consumer.close()
    return {"seen": sum(len(v) for v in seen.values())}


def save(path, seen):
    with open(path + ".tmp", "w") as out:
        json.dump(seen, out)
    os.replace(path + ".tmp", path)


def dump():
    topic, isolation = ARGS[0], ARGS[1]
    consumer = Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": "dump-" + uuid.uuid4().hex,
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
    )
    metadata = consumer.list_topics(topic, timeout=30)
    partitions = sorted(metadata.topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    records = {p: [] for p in partitions}
    at_end = set()
    deadline = time.time() + 120
    while len(at_end) < len(partitions) and time.time() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        if message.error():
            if message.error().code() == KafkaError._PARTITION_EOF:
                at_end.add(message.partition())
                continue
            raise KafkaException(message.error())
        at_end.discard(message.partition())
        records[message.partition()].append([message.key().decode(), message.value().decode()])
    consumer.close()
    return records


print(json.dumps({"feed": feed, "app": app, "watch": watch, "dump": dump}[ROLE]()), flush=True)

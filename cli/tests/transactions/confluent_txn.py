"""Transactions through confluent-kafka (librdkafka) against a Strata Kafka listener.

Usage: confluent_txn.py MODE BOOTSTRAP TOPIC [ARGS...]; prints one JSON object.

Modes:
  basic       init_transactions; abort a transaction over two partitions; commit one; open a
              third and, while it is open, read what read_committed and read_uncommitted see
              and the partitions' LSO and high watermark; then commit it.
  open        init_transactions, write ARGS[0] records in a transaction and never end it
              (the process is killed, or exits without a word to the broker).
  fence       two producers with one transactional id: the older is fenced.
  consume     read (ARGS[0] = committed|uncommitted) everything up to the end.
  ends        each partition's end as read_committed (the LSO) and read_uncommitted (the high
              watermark) consumers are told it.
  compacted   to partition 0 of a compacted topic: keys a and b in an aborted transaction, a and
              c in a committed one, then c again from a plain producer.
  secured     as SCRAM user STRATA_SASL ("user:password", over SASL_PLAINTEXT): init_transactions
              with id ARGS[0], a record to partition 0, offsets sent for group ARGS[1], commit;
              each step's error name (null: done), stopping at the first refusal.
"""

import json
import os
import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

MODE, BOOTSTRAP, TOPIC = sys.argv[1], sys.argv[2], sys.argv[3]
ARGS = sys.argv[4:]


def sasl():
    """SCRAM settings from STRATA_SASL, when the test set it."""
    if "STRATA_SASL" not in os.environ:
        return {}
    user, password = os.environ["STRATA_SASL"].split(":", 1)
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": password,
    }


def producer(txn_id, **extra):
    config = {
        **sasl(),
        "bootstrap.servers": BOOTSTRAP,
        "transactional.id": txn_id,
        "transaction.timeout.ms": 60000,
        "linger.ms": 5,
    }
    config.update(extra)
    return Producer(config)


def consumer(isolation):
    return Consumer(
        {
            "bootstrap.servers": BOOTSTRAP,
            "group.id": "txn-reader-" + uuid.uuid4().hex,
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )


def read_all(isolation, partitions=(0, 1), idle_s=3.0):
    """Every value readable at `isolation`, per partition, until each reached its end."""
    reader = consumer(isolation)
    reader.assign([TopicPartition(TOPIC, p, 0) for p in partitions])
    values = {p: [] for p in partitions}
    at_end = set()
    deadline = time.time() + 30
    last_message = time.time()
    while time.time() < deadline:
        message = reader.poll(0.2)
        if message is None:
            if len(at_end) == len(partitions) and time.time() - last_message > idle_s:
                break
            continue
        if message.error():
            if message.error().code() == -191:  # _PARTITION_EOF
                at_end.add(message.partition())
                continue
            raise KafkaException(message.error())
        last_message = time.time()
        values[message.partition()].append(message.value().decode())
    reader.close()
    return values


def offsets(isolation, partitions=(0, 1)):
    """The end a consumer at `isolation` sees, and the high watermark."""
    reader = consumer(isolation)
    ends = {}
    for p in partitions:
        low, high = reader.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)
        ends[p] = high
    reader.close()
    return ends


def ends():
    return {
        "committed": offsets("read_committed"),
        "uncommitted": offsets("read_uncommitted"),
    }


def basic():
    out = {}
    txn = producer("txn-basic")
    txn.init_transactions(30)
    txn.begin_transaction()
    for i in range(5):
        txn.produce(TOPIC, value=f"aborted-{i}", partition=i % 2)
    txn.flush()
    txn.abort_transaction(30)
    txn.begin_transaction()
    for i in range(6):
        txn.produce(TOPIC, value=f"committed-{i}", partition=i % 2)
    txn.commit_transaction(30)
    txn.begin_transaction()
    for i in range(4):
        txn.produce(TOPIC, value=f"open-{i}", partition=i % 2)
    txn.flush()
    out["while_open_committed"] = read_all("read_committed")
    out["while_open_uncommitted"] = read_all("read_uncommitted")
    out["while_open_ends"] = ends()
    txn.commit_transaction(30)
    out["after_committed"] = read_all("read_committed")
    out["after_uncommitted"] = read_all("read_uncommitted")
    return out


def open_txn():
    txn = producer(ARGS[1] if len(ARGS) > 1 else "txn-open", **{"transaction.timeout.ms": int(ARGS[2]) if len(ARGS) > 2 else 60000})
    txn.init_transactions(30)
    txn.begin_transaction()
    for i in range(int(ARGS[0])):
        txn.produce(TOPIC, value=f"left-open-{i}", partition=i % 2)
    txn.flush()
    return {"produced": int(ARGS[0])}


def fence():
    out = {}
    old = producer("txn-fence")
    old.init_transactions(30)
    old.begin_transaction()
    old.produce(TOPIC, value="old-1", partition=0)
    old.flush()
    new = producer("txn-fence")
    new.init_transactions(30)  # fences `old` and aborts its transaction
    new.begin_transaction()
    new.produce(TOPIC, value="new-1", partition=0)
    new.commit_transaction(30)
    try:
        old.produce(TOPIC, value="old-2", partition=0)
        old.commit_transaction(30)
        out["old"] = "committed"
    except KafkaException as error:
        out["old"] = error.args[0].name()
        out["old_fatal"] = error.args[0].fatal()
    out["committed"] = read_all("read_committed")
    return out


def secured():
    txn_id, group = ARGS[0], ARGS[1]
    steps = {}
    txn = producer(txn_id)
    try:
        txn.init_transactions(20)
        steps["init"] = None
    except KafkaException as error:
        steps["init"] = error.args[0].name()
        return steps
    txn.begin_transaction()
    txn.produce(TOPIC, value=b"paid", partition=0)
    metadata = Consumer({**sasl(), "bootstrap.servers": BOOTSTRAP, "group.id": group}).consumer_group_metadata()
    try:
        txn.send_offsets_to_transaction([TopicPartition(TOPIC, 0, 1)], metadata, 20)
        steps["offsets"] = None
    except KafkaException as error:
        steps["offsets"] = error.args[0].name()
        txn.abort_transaction(20)
        return steps
    try:
        txn.commit_transaction(20)
        steps["commit"] = None
    except KafkaException as error:
        steps["commit"] = error.args[0].name()
    return steps


def compacted():
    txn = producer("txn-compacted")
    txn.init_transactions(30)
    txn.begin_transaction()
    for key in ("a", "b"):
        txn.produce(TOPIC, key=key, value=f"aborted-{key}", partition=0)
    txn.flush()
    txn.abort_transaction(30)
    txn.begin_transaction()
    for key in ("a", "c"):
        txn.produce(TOPIC, key=key, value=f"committed-{key}", partition=0)
    txn.commit_transaction(30)
    plain = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 5})
    plain.produce(TOPIC, key="c", value="plain-c", partition=0)
    plain.flush(30)
    return {}


MODES = {
    "compacted": compacted,
    "secured": secured,
    "basic": basic,
    "open": open_txn,
    "fence": fence,
    "consume": lambda: read_all("read_" + ARGS[0]),
    "ends": lambda: ends(),
}

print(json.dumps(MODES[MODE]()))

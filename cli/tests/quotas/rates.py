"""A Kafka client (confluent-kafka) producing or consuming for a while, printing one JSON line:
the bytes acknowledged (or consumed) by each second since it started, and the longest throttle
the broker reported (librdkafka's statistics).

usage: rates.py BOOTSTRAP produce CLIENT_ID TOPIC SECONDS RECORD_BYTES [PACE_BYTES_PER_SEC]
       rates.py BOOTSTRAP consume CLIENT_ID TOPIC SECONDS
"""

import json
import sys
import time

from confluent_kafka import Consumer, Producer

bootstrap, mode, client_id, topic, seconds = sys.argv[1:6]
seconds = float(seconds)
throttle = [0]


def stats(text):
    for broker in json.loads(text).get("brokers", {}).values():
        throttle[0] = max(throttle[0], broker.get("throttle", {}).get("max", 0))


common = {
    "bootstrap.servers": bootstrap,
    "client.id": client_id,
    "statistics.interval.ms": 500,
    "stats_cb": stats,
}
start = time.monotonic()
per_second = [0] * (int(seconds) + 1)


def count(size):
    at = int(time.monotonic() - start)
    if at < len(per_second):
        per_second[at] += size


if mode == "produce":
    record_bytes = int(sys.argv[6])
    pace = float(sys.argv[7]) if len(sys.argv) > 7 else None
    # Batches of 64 KiB: a throttled client's requests stay small beside its rate, so a
    # second's measure is not one request more or less.
    producer = Producer({**common, "linger.ms": 5, "batch.size": 65536,
                         "compression.type": "none"})
    payload = b"x" * record_bytes
    sent = 0

    def acked(error, message):
        if error is None:
            count(len(message.value()))

    while time.monotonic() - start < seconds:
        if pace is not None and sent > pace * (time.monotonic() - start):
            producer.poll(0.001)
            continue
        try:
            producer.produce(topic, payload, callback=acked)
            sent += record_bytes
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    # What is still queued in the client would take a throttled producer long to send.
    producer.purge(in_queue=True, in_flight=False)
    producer.flush(30)
else:
    consumer = Consumer({**common, "group.id": client_id, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    while time.monotonic() - start < seconds:
        message = consumer.poll(0.1)
        if message is not None and message.error() is None:
            count(len(message.value()))
    consumer.close()

print(json.dumps({"per_second": per_second, "max_throttle_ms": throttle[0]}))

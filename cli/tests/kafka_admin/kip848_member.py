"""A librdkafka (confluent-kafka 2.16) member of a KIP-848 consumer group
(group.protocol=consumer), for cli/tests/kafka_admin.rs.

    python3 kip848_member.py BOOTSTRAP GROUP TOPICS_OR_REGEXES SECONDS

Subscribes to the comma-separated names (one starting with ^ is a regular expression, matched
by the broker), polls for
SECONDS and prints one JSON line: the records read, the partitions they came from, and each
assignment it held, in order ("TOPIC-PARTITION" names), as AdminSurface's group-member step
prints them.
"""
import json
import sys
import time

from confluent_kafka import Consumer

bootstrap, group, subscription, seconds = sys.argv[1:5]
consumer = Consumer({
    "bootstrap.servers": bootstrap,
    "group.id": group,
    "group.protocol": "consumer",
    "auto.offset.reset": "earliest",
})
consumer.subscribe(subscription.split(","))
records = 0
seen = set()
assignments = []
start = time.monotonic()
while time.monotonic() - start < float(seconds):
    message = consumer.poll(0.2)
    if message is not None and message.error() is None:
        records += 1
        seen.add(f"{message.topic()}-{message.partition()}")
    current = sorted(f"{p.topic}-{p.partition}" for p in consumer.assignment())
    if not assignments or assignments[-1] != current:
        assignments.append(current)
        print("ASSIGNED " + ",".join(current), file=sys.stderr, flush=True)
consumer.close()
print(json.dumps({"records": records, "partitions_seen": sorted(seen),
                  "assignments": assignments}))

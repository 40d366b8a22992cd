"""librdkafka's share consumer (confluent-kafka's ShareConsumer) taking a topic's records, as
ShareConsumers.java's `take` does with Kafka's Java client: explicit acknowledgement, every
record ACCEPTed, commit_sync after each poll, until COUNT distinct offsets were accepted; at most
BATCH records a poll, 100 ms apart (a slow consumer whose brokers can fail under it).

usage: librdkafka_take.py BOOTSTRAP GROUP TOPIC COUNT TIMEOUT_S BATCH

Prints, one line each, flushed:
  ACCEPTED 1 <partition> <offset> <delivery count> <value>
  COMMIT 1 <topic>-<partition> OK | COMMIT 1 <topic>-<partition> ERROR <why> | COMMIT 1 NONE
  DONE <distinct offsets accepted> | TIMEOUT <accepted> of <count>
"""

import sys
import time

from confluent_kafka import KafkaException, ShareConsumer


def say(line):
    print(line, flush=True)


def main():
    bootstrap, group, topic = sys.argv[1:4]
    count, timeout_s, batch = int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6])
    consumer = ShareConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": group + "-librdkafka",
            "share.acknowledgement.mode": "explicit",
            "max.poll.records": batch,
        }
    )
    consumer.subscribe([topic])
    accepted = set()
    deadline = time.monotonic() + timeout_s
    while len(accepted) < count:
        time.sleep(0.1)
        if time.monotonic() > deadline:
            say(f"TIMEOUT {len(accepted)} of {count}")
            return 2
        try:
            messages = consumer.poll(1.0)
        except KafkaException as error:
            say(f"INFO poll {error}")
            continue
        taken = 0
        for message in messages:
            if message.error() is not None:
                say(f"INFO {message.error()}")
                continue
            consumer.acknowledge(message)
            value = (message.value() or b"").decode()
            say(
                f"ACCEPTED 1 {message.partition()} {message.offset()} "
                f"{message.delivery_count()} {value}"
            )
            accepted.add(message.offset())
            taken += 1
        if taken == 0:
            continue
        try:
            results = consumer.commit_sync(30)
        except KafkaException as error:
            say(f"COMMIT 1 ERROR {error}")
            continue
        if not results:
            say("COMMIT 1 NONE")
        for partition, error in results.items():
            outcome = " OK" if error is None else f" ERROR {error}"
            say(f"COMMIT 1 {partition.topic}-{partition.partition}{outcome}")
    consumer.close()
    say(f"DONE {len(accepted)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

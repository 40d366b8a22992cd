"""Strata's Kafka admin APIs through the two Python admin clients, for cli/tests/kafka_admin.rs.

    python3 python_admin.py prepare BOOTSTRAP TOPIC GROUP
    python3 python_admin.py BOOTSTRAP TOPIC GROUP
    python3 python_admin.py move BOOTSTRAP TOPIC

`prepare` creates TOPIC (3 partitions, replication factor 1), produces 300 keyed records (about
100 to each partition) and runs a consumer group GROUP that commits offsets for all three
partitions and leaves; it prints the committed offsets as JSON. The script then drives kafka-python 3.0 (KafkaAdminClient) and
confluent-kafka 2.16 (AdminClient, librdkafka) and prints one JSON object to stdout:

    {"kafka_python": {"cluster": ..., "leaders": ..., ...}, "confluent": {...}}

Each slot holds what its call returned, or {"error": "<exception type>: <message>"} when the
call raised (the traceback goes to stderr), so the Rust test can tell which call failed and
why. Per-partition maps are keyed "TOPIC-PARTITION". The calls change the data: kafka-python
deletes records below offset 10 of partition 0 and the group's offset of partition 1,
confluent-kafka deletes records below offset 20 of partition 2.

`move` (three brokers, TOPIC with one partition of two replicas) reverses partition 0's
replicas with kafka-python's AlterPartitionReassignments, waits until ListPartitionReassignments
no longer lists it, reads the partition with DescribeTopicPartitions before and after, then asks
confluent-kafka for a preferred election and waits for the new first replica to lead. It prints
{"before": {...}, "reassigned": ..., "after": {...}, "elected": ..., "leader": ID}.
"""
import json
import sys
import time
import traceback

from confluent_kafka import ElectionType as ConfluentElectionType
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, OffsetSpec, ResourceType
from kafka import TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.errors import for_code
from kafka.protocol.admin import ElectionType

TIMEOUT_S = 15


def slot(call):
    """What call() returns, or its exception as an {"error": ...} result."""
    try:
        return call()
    except Exception as error:
        traceback.print_exc()
        return {"error": f"{type(error).__name__}: {error}"}


def key(topic, partition):
    return f"{topic}-{partition}"


def kafka_python(bootstrap, topic, group):
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=TIMEOUT_S * 1000)
    try:
        return {
            "cluster": slot(lambda: kp_cluster(admin)),
            "leaders": slot(lambda: kp_leaders(admin, topic)),
            "log_dirs": slot(lambda: kp_log_dirs(admin, topic)),
            "producers": slot(lambda: kp_producers(admin, topic)),
            "reassignments": slot(lambda: kp_reassignments(admin)),
            "delete_records": slot(lambda: kp_delete_records(admin, topic)),
            "delete_group_offsets": slot(lambda: kp_delete_group_offsets(admin, topic, group)),
            "group_offsets": slot(lambda: kp_group_offsets(admin, group)),
            "elect_leaders": slot(lambda: kp_elect_leaders(admin, topic)),
        }
    finally:
        admin.close()


def kp_cluster(admin):
    cluster = admin.describe_cluster()
    return {
        "cluster_id": cluster["cluster_id"],
        "controller_id": cluster["controller_id"],
        "broker_ids": sorted(broker["broker_id"] for broker in cluster["brokers"]),
    }


def kp_leaders(admin, topic):
    leaders = {}
    for described in admin.describe_topic_partitions([topic])["topics"]:
        # A topic-level error comes back as data, not as an exception.
        if described["error_code"]:
            raise for_code(described["error_code"])(f"describing {described['name']}")
        for partition in described["partitions"]:
            leaders[key(topic, partition["partition_index"])] = partition["leader_id"]
    return leaders


def kp_log_dirs(admin, topic):
    sizes = {}
    for broker in admin.describe_log_dirs([topic]):
        for log_dir in broker["log_dirs"]:
            for described in log_dir["topics"]:
                for partition in described["partitions"]:
                    sizes[key(described["name"], partition["partition_index"])] = partition["partition_size"]
    return sizes


def kp_producers(admin, topic):
    states = admin.describe_producers([TopicPartition(topic, 0)])
    return {
        key(tp.topic, tp.partition): [producer.producer_id for producer in state.active_producers]
        for tp, state in states.items()
    }


def kp_reassignments(admin):
    return {
        key(tp.topic, tp.partition): reassignment
        for tp, reassignment in admin.list_partition_reassignments().items()
    }


def kp_delete_records(admin, topic):
    deleted = admin.delete_records({TopicPartition(topic, 0): 10})
    return {key(tp.topic, tp.partition): result["low_watermark"] for tp, result in deleted.items()}


def kp_delete_group_offsets(admin, topic, group):
    errors = admin.delete_group_offsets(group, [TopicPartition(topic, 1)])
    # NoError (errno 0) becomes null so that a success reads as "no error".
    return {
        key(tp.topic, tp.partition): None if error.errno == 0 else error.__name__
        for tp, error in errors.items()
    }


def kp_group_offsets(admin, group):
    offsets = admin.list_group_offsets(group)[group]
    return {key(tp.topic, tp.partition): committed.offset for tp, committed in offsets.items()}


def kp_elect_leaders(admin, topic):
    # raise_errors=False: the per-partition error (ElectionNotNeeded where the preferred
    # replica already leads) is the result.
    response = admin.elect_leaders(ElectionType.PREFERRED, {topic: [0]}, raise_errors=False)
    if getattr(response, "error_code", 0):
        raise for_code(response.error_code)("ElectLeaders")
    return {
        key(result.topic, partition.partition_id): (
            None if partition.error_code == 0 else for_code(partition.error_code).__name__
        )
        for result in response.replica_election_results
        for partition in result.partition_result
    }


def confluent(bootstrap, topic):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return {
        "cluster": slot(lambda: ck_cluster(admin)),
        "delete_records": slot(lambda: ck_delete_records(admin, topic)),
        "earliest": slot(lambda: ck_list_offsets(admin, topic, OffsetSpec.earliest())),
        "latest": slot(lambda: ck_list_offsets(admin, topic, OffsetSpec.latest())),
        "max_timestamp": slot(lambda: ck_list_offsets(admin, topic, OffsetSpec.max_timestamp())),
        "elect_leaders": slot(lambda: ck_elect_leaders(admin, topic)),
        "broker_configs": slot(lambda: ck_broker_configs(admin)),
    }


def ck_cluster(admin):
    cluster = admin.describe_cluster().result(timeout=TIMEOUT_S)
    return {
        "cluster_id": cluster.cluster_id,
        "controller_id": cluster.controller.id if cluster.controller else None,
        "node_ids": sorted(node.id for node in cluster.nodes),
    }


def ck_delete_records(admin, topic):
    futures = admin.delete_records([ConfluentTopicPartition(topic, 2, 20)])
    return {
        key(tp.topic, tp.partition): future.result(timeout=TIMEOUT_S).low_watermark
        for tp, future in futures.items()
    }


def ck_list_offsets(admin, topic, spec):
    futures = admin.list_offsets({ConfluentTopicPartition(topic, 2): spec})
    (future,) = futures.values()
    info = future.result(timeout=TIMEOUT_S)
    return {"offset": info.offset, "timestamp": info.timestamp, "leader_epoch": info.leader_epoch}


def ck_elect_leaders(admin, topic, partition=1):
    results = admin.elect_leaders(
        ConfluentElectionType.PREFERRED, [ConfluentTopicPartition(topic, partition)]
    ).result(timeout=TIMEOUT_S)
    # Each value is None or the partition's KafkaError (the docstring's "KafkaException" is not
    # what 2.16 delivers).
    return {
        key(tp.topic, tp.partition): None if error is None else error.name()
        for tp, error in results.items()
    }


def ck_broker_configs(admin):
    resource = ConfigResource(ResourceType.BROKER, "1")
    entries = admin.describe_configs([resource])[resource].result(timeout=TIMEOUT_S)
    return {
        name: {"value": entries[name].value, "read_only": entries[name].is_read_only}
        if name in entries else None
        for name in ("num.partitions", "log.retention.ms")
    }


def described_partition(admin, topic):
    """Partition 0 of topic as DescribeTopicPartitions gives it: leader and replicas."""
    described = admin.describe_topic_partitions([topic])["topics"][0]
    partition = next(p for p in described["partitions"] if p["partition_index"] == 0)
    return {"leader": partition["leader_id"], "replicas": partition["replica_nodes"]}


def wait_until(condition, what, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


def move(bootstrap, topic):
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=TIMEOUT_S * 1000)
    try:
        before = described_partition(admin, topic)
        reversed_replicas = list(reversed(before["replicas"]))
        accepted = admin.alter_partition_reassignments(
            {TopicPartition(topic, 0): reversed_replicas})
        reassigned = {key(tp.topic, tp.partition): None if error is None else error.__name__
                      for tp, error in accepted.items()}
        wait_until(lambda: not admin.list_partition_reassignments(),
                   "the reassignment to leave the listing")
        wait_until(lambda: described_partition(admin, topic)["replicas"] == reversed_replicas,
                   "the reversed replicas")
        after = described_partition(admin, topic)
        confluent_admin = AdminClient({"bootstrap.servers": bootstrap})
        elected = ck_elect_leaders(confluent_admin, topic, 0)
        # kafka-python asks any broker, and each broker's view of the leader moves on its own:
        # the election is seen once three reads in a row agree.
        seen = []

        def settled():
            seen.append(described_partition(admin, topic)["leader"])
            return seen[-3:] == [reversed_replicas[0]] * 3

        wait_until(settled, "the preferred replica to lead")
        return {
            "before": before,
            "reassigned": reassigned,
            "after": after,
            "elected": elected,
            "leader": seen[-1],
        }
    finally:
        admin.close()


def prepare(bootstrap, topic, group):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    admin.create_topics([NewTopic(topic, 3, 1)])
    admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for i in range(300):
        producer.send(topic, key=b"k%d" % i, value=b"v%d" % i)
    producer.flush()
    producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False)
    consumed = 0
    while consumed < 300:
        for records in consumer.poll(timeout_ms=2000).values():
            consumed += len(records)
    consumer.commit()
    committed = {key(tp.topic, tp.partition): consumer.committed(tp)
                 for tp in consumer.assignment()}
    consumer.close()
    print(json.dumps(committed, sort_keys=True))


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "prepare":
        prepare(*sys.argv[2:])
        return
    if len(sys.argv) == 4 and sys.argv[1] == "move":
        print(json.dumps(slot(lambda: move(*sys.argv[2:])), sort_keys=True))
        return
    if len(sys.argv) != 4:
        sys.exit("usage: python_admin.py [prepare] BOOTSTRAP TOPIC GROUP")
    bootstrap, topic, group = sys.argv[1:]
    print(json.dumps({
        "kafka_python": slot(lambda: kafka_python(bootstrap, topic, group)),
        "confluent": slot(lambda: confluent(bootstrap, topic)),
    }, sort_keys=True))


if __name__ == "__main__":
    main()

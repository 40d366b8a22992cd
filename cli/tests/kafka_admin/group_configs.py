"""Group configs (Kafka's GROUP config resources) through confluent-kafka's AdminClient, for
cli/tests/kafka_admin.rs.

    python3 group_configs.py BOOTSTRAP GROUP

confluent-kafka 2.16 (librdkafka) sends GROUP resources as Kafka's config resource type 32.
Against GROUP, in order: sets share.auto.offset.reset=earliest and
share.record.lock.duration.ms=5000 (IncrementalAlterConfigs, SET) and describes the group's
configs; sets share.delivery.count.limit=3 with validate_only and describes again (nothing may
change); sets share.isolation.level=bogus, then a name no group has, each refused; deletes
share.record.lock.duration.ms and describes once more. Prints one JSON object:

    {"set": true, "described": {NAME: {"value": ..., "source": "GROUP_CONFIG"}, ...},
     "validated": true, "after_validate": {...}, "bogus": {"error": "INVALID_CONFIG", ...},
     "unknown": {...}, "deleted": true, "after_delete": {...}}

Each slot holds what its call returned, or {"error": "<Kafka error name>", "message": ...} when
it raised a KafkaException ({"error": "<exception type>: <message>"} for anything else; the
traceback goes to stderr).
"""
import json
import sys
import traceback

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)

TIMEOUT_S = 15


def slot(call):
    try:
        return call()
    except KafkaException as error:
        kafka_error = error.args[0]
        return {"error": kafka_error.name(), "message": kafka_error.str()}
    except Exception as error:
        traceback.print_exc()
        return {"error": f"{type(error).__name__}: {error}"}


def alter(admin, group, operations, validate_only=False):
    """IncrementalAlterConfigs of GROUP: operations is [(name, value, AlterConfigOpType)]."""
    entries = [
        ConfigEntry(name, value, incremental_operation=operation)
        for name, value, operation in operations
    ]
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    futures = admin.incremental_alter_configs([resource], validate_only=validate_only)
    for future in futures.values():
        future.result(timeout=TIMEOUT_S)
    return True


def describe(admin, group):
    """Every config of GROUP: {name: {"value": ..., "source": ConfigSource name}}."""
    resource = ConfigResource(ResourceType.GROUP, group)
    described = {}
    for future in admin.describe_configs([resource]).values():
        for name, entry in future.result(timeout=TIMEOUT_S).items():
            # confluent-kafka gives the source as librdkafka's number.
            source = ConfigSource(int(entry.source)).name
            described[name] = {"value": entry.value, "source": source}
    return described


def main():
    bootstrap, group = sys.argv[1:3]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    set_op, delete_op = AlterConfigOpType.SET, AlterConfigOpType.DELETE
    result = {}
    result["set"] = slot(
        lambda: alter(
            admin,
            group,
            [
                ("share.auto.offset.reset", "earliest", set_op),
                ("share.record.lock.duration.ms", "5000", set_op),
            ],
        )
    )
    result["described"] = slot(lambda: describe(admin, group))
    result["validated"] = slot(
        lambda: alter(
            admin, group, [("share.delivery.count.limit", "3", set_op)], validate_only=True
        )
    )
    result["after_validate"] = slot(lambda: describe(admin, group))
    result["bogus"] = slot(
        lambda: alter(admin, group, [("share.isolation.level", "bogus", set_op)])
    )
    result["unknown"] = slot(
        lambda: alter(admin, group, [("share.no.such.config", "1", set_op)])
    )
    result["deleted"] = slot(
        lambda: alter(admin, group, [("share.record.lock.duration.ms", None, delete_op)])
    )
    result["after_delete"] = slot(lambda: describe(admin, group))
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()

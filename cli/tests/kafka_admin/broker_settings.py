"""Broker settings changed live through the two Python admin clients, for cli/tests/kafka_admin.rs.

    python3 broker_settings.py confluent BOOTSTRAP BROKER NAME=VALUE...
    python3 broker_settings.py kafka-python BOOTSTRAP BROKER NAME=VALUE...

`confluent` sends IncrementalAlterConfigs (SET) through confluent-kafka 2.16's AdminClient;
`kafka-python` sends the legacy AlterConfigs through kafka-python 3.0's KafkaAdminClient, which
first checks each name is a setting the broker describes as changing live, then adds the
broker's other settings set live for it (AlterConfigs replaces them all). BROKER is a broker id, or "" for every broker. Prints
{"altered": true}, or {"error": "<exception type>: <message>"} when the call raised.
"""
import json
import sys
import traceback

TIMEOUT_S = 15


def confluent(bootstrap, broker, settings):
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = [
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        for name, value in settings.items()
    ]
    resource = ConfigResource(ResourceType.BROKER, broker, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=TIMEOUT_S)


def kafka_python(bootstrap, broker, settings):
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=TIMEOUT_S * 1000)
    try:
        resource = ConfigResource(ConfigResourceType.BROKER, broker, configs=settings)
        results = admin.alter_configs([resource], incremental=False)
        # {"broker": {NAME: "OK" or the error}}
        result = results["broker"][broker]
        if result != "OK":
            raise RuntimeError(result)
    finally:
        admin.close()


def main():
    client, bootstrap, broker = sys.argv[1:4]
    settings = dict(pair.split("=", 1) for pair in sys.argv[4:])
    try:
        {"confluent": confluent, "kafka-python": kafka_python}[client](bootstrap, broker, settings)
        print(json.dumps({"altered": True}))
    except Exception as error:
        traceback.print_exc()
        print(json.dumps({"error": f"{type(error).__name__}: {error}"}))


if __name__ == "__main__":
    main()

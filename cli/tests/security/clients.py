"""Secured round trips for cli/tests/security.rs, through a Kafka client library:
`python3 clients.py LIBRARY BOOTSTRAP TOPIC GROUP SECURITY_JSON` produces three records to TOPIC,
consumes them back in consumer group GROUP and prints one JSON object with what it saw.
LIBRARY is `confluent` (confluent-kafka, librdkafka 2.16), `confluent-slow` (the same, 2.5 s
between records, to outlive a short SASL session) or `kafka-python`. SECURITY_JSON
names: protocol (SASL_SSL, SSL, ...), and as needed mechanism, user, password, ca, cert, key.
A failure prints {"error": "..."} with the client's own words and exits 0: refusals are results."""

import json
import sys
import time

TIMEOUT_S = 30
VALUES = [b"one", b"two", b"three"]


def confluent_config(bootstrap, security):
    config = {"bootstrap.servers": bootstrap, "security.protocol": security["protocol"]}
    if "mechanism" in security:
        config.update(
            {
                "sasl.mechanisms": security["mechanism"],
                "sasl.username": security["user"],
                "sasl.password": security["password"],
            }
        )
    if "ca" in security:
        config["ssl.ca.location"] = security["ca"]
    if "cert" in security:
        config["ssl.certificate.location"] = security["cert"]
        config["ssl.key.location"] = security["key"]
    return config


def confluent(bootstrap, topic, group, security, pause_s=0.0):
    from confluent_kafka import Consumer, Producer

    errors = []
    config = confluent_config(bootstrap, security)
    config["error_cb"] = lambda error: errors.append(str(error))
    producer = Producer({**config, "linger.ms": 5, "message.timeout.ms": 15000})
    delivered = []
    for value in VALUES:
        producer.produce(topic, value=value, on_delivery=lambda err, msg: delivered.append(err))
        if pause_s:
            # Each record on its own, the session's lifetime apart (re-authentication).
            producer.flush(TIMEOUT_S)
            time.sleep(pause_s)
    producer.flush(TIMEOUT_S)
    if len(delivered) != len(VALUES) or any(delivered):
        refused = [e.name() for e in delivered if e]
        return {"error": "; ".join(errors + refused), "refused": refused}
    consumer = Consumer({**config, "group.id": group, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    values = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(values) < len(VALUES) and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is None:
            continue
        if message.error():
            errors.append(message.error().name())
            if "AUTHORIZATION" in message.error().name():
                break  # refused for good: nothing more will come
            continue
        values.append(message.value().decode())
    consumer.close()
    return {"values": values, "errors": errors}


def kafka_python(bootstrap, topic, group, security):
    from kafka import KafkaConsumer, KafkaProducer

    config = {"bootstrap_servers": bootstrap, "security_protocol": security["protocol"]}
    if "mechanism" in security:
        config.update(
            {
                "sasl_mechanism": security["mechanism"],
                "sasl_plain_username": security["user"],
                "sasl_plain_password": security["password"],
            }
        )
    if "ca" in security:
        config["ssl_cafile"] = security["ca"]
    if "cert" in security:
        config["ssl_certfile"] = security["cert"]
        config["ssl_keyfile"] = security["key"]
    try:
        producer = KafkaProducer(**config)
        for value in VALUES:
            producer.send(topic, value).get(timeout=TIMEOUT_S)
        producer.close()
        consumer = KafkaConsumer(
            topic,
            group_id=group,
            auto_offset_reset="earliest",
            consumer_timeout_ms=10000,
            **config,
        )
        values = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(values) < len(VALUES) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                values.extend(record.value.decode() for record in records)
        consumer.close()
        return {"values": values, "errors": []}
    except Exception as error:  # a refusal is a result here
        return {"error": f"{type(error).__name__}: {error}"}


if __name__ == "__main__":
    library, bootstrap, topic, group, security = sys.argv[1:]
    run = {
        "confluent": confluent,
        "confluent-slow": lambda *args: confluent(*args, pause_s=2.5),
        "kafka-python": kafka_python,
    }[library]
    print(json.dumps(run(bootstrap, topic, group, json.loads(security))))

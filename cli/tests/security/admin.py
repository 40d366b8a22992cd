"""Users and ACLs through confluent-kafka's AdminClient (librdkafka 2.16), for
cli/tests/security.rs: `python3 admin.py BOOTSTRAP SECURITY_JSON COMMAND [ARG...]` prints one
JSON object. Commands:
  user USER PASSWORD MECHANISM        AlterUserScramCredentials (an upsertion)
  delete-user USER MECHANISM          AlterUserScramCredentials (a deletion)
  users                               DescribeUserScramCredentials of every user
  acls-create JSON_LIST               CreateAcls: [[type, name, pattern, principal, operation, permission], ...]
  acls                                DescribeAcls of everything
  acls-delete JSON_FILTER             DeleteAcls: [type, name, pattern, principal, operation, permission], null = any
  create-topic TOPIC                  CreateTopics (one partition)
  topics                              Metadata: the topics listed
Errors are results ({"error": ...}), not crashes."""

import json
import os
import sys

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from clients import confluent_config  # noqa: E402

# How long a call may take: a refused login makes librdkafka retry until then.
TIMEOUT_S = float(os.environ.get("ADMIN_TIMEOUT_S", "30"))


def error_name(error):
    if isinstance(error, KafkaException):
        error = error.args[0]
    return error.name() if hasattr(error, "name") else str(error)


def enum(kind, name):
    if name is None:
        return kind.ANY
    # librdkafka calls the cluster resource BROKER.
    if kind is ResourceType and name.upper() == "CLUSTER":
        return ResourceType.BROKER
    return kind[name.upper()]


def run(client, command, args):
    if command == "user":
        user, password, mechanism = args
        info = ScramCredentialInfo(ScramMechanism[mechanism.replace("-", "_")], 4096)
        futures = client.alter_user_scram_credentials(
            [UserScramCredentialUpsertion(user, info, password.encode())]
        )
        return {"result": [wait(future) for future in futures.values()]}
    if command == "delete-user":
        user, mechanism = args
        futures = client.alter_user_scram_credentials(
            [UserScramCredentialDeletion(user, ScramMechanism[mechanism.replace("-", "_")])]
        )
        return {"result": [wait(future) for future in futures.values()]}
    if command == "users":
        described = client.describe_user_scram_credentials().result(TIMEOUT_S)
        return {
            "users": {
                user: sorted(str(info.mechanism).split(".")[-1] for info in description.scram_credential_infos)
                for user, description in described.items()
            }
        }
    if command == "acls-create":
        bindings = [
            AclBinding(
                enum(ResourceType, kind), name, enum(ResourcePatternType, pattern), principal, "*",
                enum(AclOperation, operation), enum(AclPermissionType, permission),
            )
            for kind, name, pattern, principal, operation, permission in json.loads(args[0])
        ]
        futures = client.create_acls(bindings)
        return {"result": [wait(future) for future in futures.values()]}
    if command == "acls":
        described = client.describe_acls(
            AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                             AclOperation.ANY, AclPermissionType.ANY)
        ).result(TIMEOUT_S)
        return {"acls": sorted(describe(binding) for binding in described)}
    if command == "acls-delete":
        kind, name, pattern, principal, operation, permission = json.loads(args[0])
        futures = client.delete_acls([
            AclBindingFilter(enum(ResourceType, kind), name, enum(ResourcePatternType, pattern),
                             principal, None, enum(AclOperation, operation),
                             enum(AclPermissionType, permission))
        ])
        [future] = futures.values()
        return {"deleted": sorted(describe(binding) for binding in future.result(TIMEOUT_S))}
    if command == "create-topic":
        futures = client.create_topics([NewTopic(args[0], num_partitions=1, replication_factor=1)])
        return {"result": [wait(future) for future in futures.values()]}
    if command == "topics":
        return {"topics": sorted(client.list_topics(timeout=TIMEOUT_S).topics)}
    raise SystemExit(f"unknown command {command}")


def describe(binding):
    return " ".join(
        [str(binding.restype).split(".")[-1], binding.name, str(binding.resource_pattern_type).split(".")[-1],
         binding.principal, str(binding.operation).split(".")[-1], str(binding.permission_type).split(".")[-1]]
    )


def wait(future):
    try:
        future.result(TIMEOUT_S)
        return None
    except KafkaException as error:
        return error_name(error)


if __name__ == "__main__":
    bootstrap, security, command, *args = sys.argv[1:]
    client = AdminClient(confluent_config(bootstrap, json.loads(security)))
    try:
        print(json.dumps(run(client, command, args)))
    except KafkaException as error:
        print(json.dumps({"error": error_name(error)}))

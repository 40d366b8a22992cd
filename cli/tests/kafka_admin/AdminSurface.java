// The Java client's (kafka-clients 4.3) admin and data surface against a Strata broker, for
// cli/tests/kafka_admin.rs: `java AdminSurface BOOTSTRAP STEP [ARGS...]` does one thing per run
// with an Admin, a KafkaProducer or a KafkaConsumer and prints exactly one JSON object line to
// stdout. A failure the client reports as a Kafka exception is a result, not a crash:
// {"error": "<simple class name of the root cause>", "message": "..."}, exit status 0, so the
// Rust test can assert on which error the broker produced. Only bad arguments or a broken JVM
// exit non-zero.
//
// There is no JSON library on the classpath (only kafka-clients and its codecs), so the JSON is
// written by hand with the small helpers at the bottom. Maps are printed in a sorted order so
// the output of a run does not depend on hash order.
import java.io.PrintStream;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Comparator;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.stream.Collectors;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.GroupListing;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.LogDirDescription;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.PartitionReassignment;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.ReplicaInfo;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.clients.consumer.CloseOptions;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.ElectionType;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.quota.ClientQuotaAlteration;
import org.apache.kafka.common.quota.ClientQuotaEntity;
import org.apache.kafka.common.quota.ClientQuotaFilter;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class AdminSurface {
    private static final String USAGE = """
        usage: AdminSurface BOOTSTRAP STEP [ARGS...]
          describe-cluster | create-topic NAME PARTITIONS RF [KEY=VALUE...] | describe-topics NAME...
          delete-topic NAME | list-topics | describe-configs topic|broker NAME
          alter-config topic|broker NAME KEY VALUE|--delete | list-groups | describe-group GROUP
          group-offsets GROUP | delete-offsets GROUP TOPIC PARTITION... | log-dirs BROKER_ID...
          delete-records TOPIC PARTITION BEFORE_OFFSET | elect-leaders preferred|unclean TOPIC PARTITION...
          reassign TOPIC PARTITION REPLICA,REPLICA...|cancel | list-reassignments
          list-offsets TOPIC PARTITION earliest|latest|max-timestamp|earliest-local|latest-tiered|TIMESTAMP_MS
          describe-producers TOPIC PARTITION | describe-quotas
          list-transactions [PATTERN [RUNNING_LONGER_THAN_MS]] | describe-transactions ID...
          describe-features
          alter-quota user|client-id|user+client-id NAME|default [CLIENT|default] KEY=VALUE|KEY=--delete...
          produce TOPIC COUNT none|gzip|snappy|lz4|zstd [idempotent=true|false] [partition=N]
          consume-assign TOPIC PARTITION FROM_OFFSET COUNT | consume-beginning TOPIC PARTITION COUNT
          group-member GROUP TOPIC SECONDS [classic|consumer] [SESSION_TIMEOUT_MS]""";

    // A client's plain close() may wait up to its whole API timeout for a broker the test has
    // already stopped; five seconds is plenty for a clean close and keeps a run short.
    private static final Duration CLOSE_TIMEOUT = Duration.ofSeconds(5);
    // How long a consume step keeps polling for records that never come.
    private static final Duration CONSUME_DEADLINE = Duration.ofSeconds(30);
    private static final Duration POLL = Duration.ofMillis(200);

    private static final Comparator<TopicPartition> BY_TOPIC_PARTITION =
        Comparator.comparing(TopicPartition::topic).thenComparingInt(TopicPartition::partition);

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println(USAGE);
            System.exit(2);
        }
        // The test reads stdout as exactly one JSON line: keep the real stdout for that line and
        // send anything else that might print to System.out (a logging backend, say) to stderr.
        PrintStream stdout = System.out;
        System.setOut(System.err);
        String bootstrap = args[0], step = args[1];
        List<String> rest = List.of(args).subList(2, args.length);
        String json;
        try {
            json = run(bootstrap, step, rest);
        } catch (ExecutionException | KafkaException error) {
            json = errorJson(error);
        }
        stdout.println(json);
        stdout.flush();
        // A client thread that outlived its close timeout must not keep the JVM (and the test) up.
        System.exit(0);
    }

    private static String run(String bootstrap, String step, List<String> a) throws Exception {
        switch (step) {
            case "produce":
                return produce(bootstrap, a);
            case "round-trip":
                return roundTrip(bootstrap, a.get(0), Integer.parseInt(a.get(1)), a.get(2));
            case "consume-assign":
                return consume(bootstrap, a.get(0), Integer.parseInt(a.get(1)),
                    Optional.of(Long.parseLong(a.get(2))), Integer.parseInt(a.get(3)));
            case "consume-beginning":
                return consume(bootstrap, a.get(0), Integer.parseInt(a.get(1)),
                    Optional.empty(), Integer.parseInt(a.get(2)));
            case "group-member":
                return groupMember(bootstrap, a.get(0), a.get(1), Integer.parseInt(a.get(2)),
                    a.size() > 3 ? a.get(3) : "classic", a.size() > 4 ? a.get(4) : null);
            default:
                try (var admin = new Closing<>(Admin.create(clientConfig(bootstrap)),
                        client -> client.close(CLOSE_TIMEOUT))) {
                    return adminStep(admin.client(), step, a);
                }
        }
    }

    private static String adminStep(Admin admin, String step, List<String> a) throws Exception {
        return switch (step) {
            case "describe-cluster" -> describeCluster(admin);
            case "describe-features" -> describeFeatures(admin);
            case "create-topic" -> createTopic(admin, a);
            case "describe-topics" -> describeTopics(admin, a);
            case "delete-topic" -> {
                admin.deleteTopics(List.of(a.get(0))).all().get();
                yield object("deleted", "true");
            }
            case "list-topics" -> object("topics",
                strings(admin.listTopics().names().get().stream().sorted().toList()));
            case "describe-configs" -> describeConfigs(admin, resource(a.get(0), a.get(1)));
            case "alter-config" -> alterConfig(admin, resource(a.get(0), a.get(1)), a.get(2), a.get(3));
            case "list-groups" -> listGroups(admin);
            case "describe-group" -> describeGroup(admin, a.get(0));
            case "group-offsets" -> groupOffsets(admin, a.get(0));
            case "delete-offsets" -> {
                Set<TopicPartition> partitions = new HashSet<>();
                for (String partition : a.subList(2, a.size())) {
                    partitions.add(new TopicPartition(a.get(1), Integer.parseInt(partition)));
                }
                admin.deleteConsumerGroupOffsets(a.get(0), partitions).all().get();
                yield object("deleted", "true");
            }
            case "log-dirs" -> logDirs(admin, a);
            case "delete-records" -> {
                TopicPartition partition = new TopicPartition(a.get(0), Integer.parseInt(a.get(1)));
                long before = Long.parseLong(a.get(2));
                long lowWatermark = admin.deleteRecords(Map.of(partition, RecordsToDelete.beforeOffset(before)))
                    .lowWatermarks().get(partition).get().lowWatermark();
                yield object("low_watermark", Long.toString(lowWatermark));
            }
            case "elect-leaders" -> electLeaders(admin, a);
            case "reassign" -> reassign(admin, a);
            case "list-reassignments" -> listReassignments(admin);
            case "list-offsets" -> listOffsets(admin, a);
            case "describe-producers" -> describeProducers(admin, a);
            case "list-transactions" -> listTransactions(admin, a);
            case "describe-transactions" -> describeTransactions(admin, a);
            case "describe-quotas" -> describeQuotas(admin);
            case "alter-quota" -> alterQuota(admin, a);
            default -> throw new IllegalArgumentException("unknown step " + step + "\n" + USAGE);
        };
    }

    // ---- admin steps -------------------------------------------------------------------------

    /** What `kafka-features.sh describe` shows: each feature's supported range and level. */
    private static String describeFeatures(Admin admin) throws Exception {
        var metadata = admin.describeFeatures().featureMetadata().get();
        Map<String, String> features = new TreeMap<>();
        for (var entry : metadata.supportedFeatures().entrySet()) {
            var finalized = metadata.finalizedFeatures().get(entry.getKey());
            features.put(entry.getKey(), object(
                "min", Short.toString(entry.getValue().minVersion()),
                "max", Short.toString(entry.getValue().maxVersion()),
                "level", finalized == null ? "0" : Short.toString(finalized.maxVersionLevel())));
        }
        return object(features);
    }

    private static String describeCluster(Admin admin) throws Exception {
        DescribeClusterResult cluster = admin.describeCluster();
        List<String> nodes = new ArrayList<>();
        for (Node node : cluster.nodes().get().stream().sorted(Comparator.comparingInt(Node::id)).toList()) {
            nodes.add(object(
                "id", Integer.toString(node.id()),
                "host", quote(node.host()),
                "port", Integer.toString(node.port()),
                "rack", quote(node.rack())));
        }
        Node controller = cluster.controller().get();
        return object(
            "cluster_id", quote(cluster.clusterId().get()),
            // No controller comes back as null or Node.noNode(), whose id is -1.
            "controller", Integer.toString(controller == null ? -1 : controller.id()),
            "nodes", array(nodes));
    }

    private static String createTopic(Admin admin, List<String> a) throws Exception {
        Map<String, String> configs = new HashMap<>();
        for (String pair : a.subList(3, a.size())) {
            int equals = pair.indexOf('=');
            if (equals < 0) {
                throw new IllegalArgumentException("config must be key=value: " + pair);
            }
            configs.put(pair.substring(0, equals), pair.substring(equals + 1));
        }
        // -1: the broker's default (num.partitions, default.replication.factor).
        int partitions = Integer.parseInt(a.get(1));
        short replicationFactor = Short.parseShort(a.get(2));
        NewTopic topic = new NewTopic(a.get(0),
                partitions < 0 ? Optional.empty() : Optional.of(partitions),
                replicationFactor < 0 ? Optional.empty() : Optional.of(replicationFactor))
            .configs(configs);
        admin.createTopics(List.of(topic)).all().get();
        return object("created", "true");
    }

    private static String describeTopics(Admin admin, List<String> names) throws Exception {
        Map<String, TopicDescription> described = admin.describeTopics(names).allTopicNames().get();
        List<String> topics = new ArrayList<>();
        for (String name : names) {
            TopicDescription topic = described.get(name);
            List<String> partitions = new ArrayList<>();
            for (TopicPartitionInfo partition : topic.partitions()) {
                Node leader = partition.leader();
                partitions.add(object(
                    "partition", Integer.toString(partition.partition()),
                    // The client reports a partition without a leader as a null node; print
                    // Kafka's own "no leader" id rather than break the int shape.
                    "leader", Integer.toString(leader == null ? -1 : leader.id()),
                    "replicas", numbers(partition.replicas().stream().map(Node::id).toList()),
                    "isr", numbers(partition.isr().stream().map(Node::id).toList())));
            }
            topics.add(object("name", quote(topic.name()), "partitions", array(partitions)));
        }
        return object("topics", array(topics));
    }

    private static ConfigResource resource(String type, String name) {
        return new ConfigResource(switch (type) {
            case "topic" -> ConfigResource.Type.TOPIC;
            case "broker" -> ConfigResource.Type.BROKER;
            default -> throw new IllegalArgumentException("resource type must be topic or broker: " + type);
        }, name);
    }

    private static String describeConfigs(Admin admin, ConfigResource resource) throws Exception {
        Map<String, String> configs = new TreeMap<>();
        for (ConfigEntry entry : admin.describeConfigs(List.of(resource)).all().get().get(resource).entries()) {
            configs.put(entry.name(), object(
                "value", quote(entry.value()),
                "read_only", Boolean.toString(entry.isReadOnly()),
                "source", quote(entry.source().name())));
        }
        return object("configs", object(configs));
    }

    private static String alterConfig(Admin admin, ConfigResource resource, String key, String value)
            throws Exception {
        // DELETE ignores the value; the stock kafka-configs tool sends an empty one, so do we.
        AlterConfigOp op = value.equals("--delete")
            ? new AlterConfigOp(new ConfigEntry(key, ""), AlterConfigOp.OpType.DELETE)
            : new AlterConfigOp(new ConfigEntry(key, value), AlterConfigOp.OpType.SET);
        admin.incrementalAlterConfigs(Map.of(resource, List.of(op))).all().get();
        return object("altered", "true");
    }

    private static String listGroups(Admin admin) throws Exception {
        List<String> groups = new ArrayList<>();
        List<GroupListing> listings = admin.listGroups().all().get().stream()
            .sorted(Comparator.comparing(GroupListing::groupId)).toList();
        for (GroupListing group : listings) {
            groups.add(object(
                "group", quote(group.groupId()),
                "state", quote(group.groupState().map(Object::toString).orElse(null)),
                "type", quote(group.type().map(Object::toString).orElse(null))));
        }
        return object("groups", array(groups));
    }

    private static String describeGroup(Admin admin, String groupId) throws Exception {
        ConsumerGroupDescription group =
            admin.describeConsumerGroups(List.of(groupId)).describedGroups().get(groupId).get();
        List<String> members = new ArrayList<>();
        List<MemberDescription> sorted = group.members().stream()
            .sorted(Comparator.comparing(MemberDescription::consumerId)).toList();
        for (MemberDescription member : sorted) {
            members.add(object(
                "member", quote(member.consumerId()),
                "client", quote(member.clientId()),
                "partitions", strings(names(member.assignment().topicPartitions()))));
        }
        return object(
            "group", quote(group.groupId()),
            "state", quote(Objects.toString(group.groupState(), null)),
            "members", array(members),
            "type", quote(Objects.toString(group.type(), null)));
    }

    private static String groupOffsets(Admin admin, String group) throws Exception {
        Map<TopicPartition, OffsetAndMetadata> offsets =
            admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
        Map<String, String> fields = new LinkedHashMap<>();
        for (TopicPartition partition : sorted(offsets.keySet())) {
            // The client maps "no committed offset" (-1) to a null entry.
            OffsetAndMetadata committed = offsets.get(partition);
            fields.put(partition.toString(), committed == null ? "null" : Long.toString(committed.offset()));
        }
        return object("offsets", object(fields));
    }

    private static String logDirs(Admin admin, List<String> brokerIds) throws Exception {
        List<Integer> ids = brokerIds.stream().map(Integer::parseInt).toList();
        Map<Integer, Map<String, LogDirDescription>> described = admin.describeLogDirs(ids).allDescriptions().get();
        Map<String, String> brokers = new LinkedHashMap<>();
        for (Integer broker : new TreeMap<>(described).keySet()) {
            Map<String, String> dirs = new TreeMap<>();
            described.get(broker).forEach((path, dir) -> {
                Map<String, String> partitions = new LinkedHashMap<>();
                for (TopicPartition partition : sorted(dir.replicaInfos().keySet())) {
                    ReplicaInfo replica = dir.replicaInfos().get(partition);
                    partitions.put(partition.toString(), object(
                        "size", Long.toString(replica.size()),
                        "offset_lag", Long.toString(replica.offsetLag())));
                }
                dirs.put(path, object(
                    "error", quote(dir.error() == null ? null : dir.error().getClass().getSimpleName()),
                    "partitions", object(partitions)));
            });
            brokers.put(broker.toString(), object(dirs));
        }
        return object("brokers", object(brokers));
    }

    private static String electLeaders(Admin admin, List<String> a) throws Exception {
        ElectionType type = switch (a.get(0)) {
            case "preferred" -> ElectionType.PREFERRED;
            case "unclean" -> ElectionType.UNCLEAN;
            default -> throw new IllegalArgumentException("election type must be preferred or unclean: " + a.get(0));
        };
        Set<TopicPartition> partitions = new HashSet<>();
        for (String partition : a.subList(2, a.size())) {
            partitions.add(new TopicPartition(a.get(1), Integer.parseInt(partition)));
        }
        // partitions() succeeds with a per-partition outcome, where all() would fail on the first
        // partition error; ElectionNotNeededException (leader already preferred) is such an
        // outcome and the test wants to see it by name.
        Map<TopicPartition, Optional<Throwable>> outcomes = admin.electLeaders(type, partitions).partitions().get();
        Map<String, String> results = new LinkedHashMap<>();
        for (TopicPartition partition : sorted(outcomes.keySet())) {
            results.put(partition.toString(),
                quote(outcomes.get(partition).map(error -> error.getClass().getSimpleName()).orElse(null)));
        }
        return object("results", object(results));
    }

    private static String reassign(Admin admin, List<String> a) throws Exception {
        TopicPartition partition = new TopicPartition(a.get(0), Integer.parseInt(a.get(1)));
        // An empty target cancels the partition's ongoing reassignment.
        Optional<NewPartitionReassignment> target = a.get(2).equals("cancel")
            ? Optional.empty()
            : Optional.of(new NewPartitionReassignment(
                List.of(a.get(2).split(",")).stream().map(Integer::parseInt).toList()));
        admin.alterPartitionReassignments(Map.of(partition, target)).all().get();
        return object("reassigned", "true");
    }

    private static String listReassignments(Admin admin) throws Exception {
        Map<TopicPartition, PartitionReassignment> ongoing = admin.listPartitionReassignments().reassignments().get();
        Map<String, String> reassignments = new LinkedHashMap<>();
        for (TopicPartition partition : sorted(ongoing.keySet())) {
            PartitionReassignment reassignment = ongoing.get(partition);
            reassignments.put(partition.toString(), object(
                "replicas", numbers(reassignment.replicas()),
                "adding", numbers(reassignment.addingReplicas()),
                "removing", numbers(reassignment.removingReplicas())));
        }
        return object("reassignments", object(reassignments));
    }

    private static String listOffsets(Admin admin, List<String> a) throws Exception {
        TopicPartition partition = new TopicPartition(a.get(0), Integer.parseInt(a.get(1)));
        OffsetSpec spec = switch (a.get(2)) {
            case "earliest" -> OffsetSpec.earliest();
            case "latest" -> OffsetSpec.latest();
            case "max-timestamp" -> OffsetSpec.maxTimestamp();
            case "earliest-local" -> OffsetSpec.earliestLocal();
            case "latest-tiered" -> OffsetSpec.latestTiered();
            default -> OffsetSpec.forTimestamp(Long.parseLong(a.get(2)));
        };
        ListOffsetsResultInfo info = admin.listOffsets(Map.of(partition, spec)).partitionResult(partition).get();
        return object(
            "offset", Long.toString(info.offset()),
            "timestamp", Long.toString(info.timestamp()),
            "leader_epoch", info.leaderEpoch().map(Object::toString).orElse("null"));
    }

    private static String describeProducers(Admin admin, List<String> a) throws Exception {
        TopicPartition partition = new TopicPartition(a.get(0), Integer.parseInt(a.get(1)));
        List<ProducerState> active = admin.describeProducers(List.of(partition))
            .partitionResult(partition).get().activeProducers().stream()
            .sorted(Comparator.comparingLong(ProducerState::producerId)).toList();
        List<String> producers = new ArrayList<>();
        for (ProducerState producer : active) {
            producers.add(object(
                "producer_id", Long.toString(producer.producerId()),
                "epoch", Integer.toString(producer.producerEpoch()),
                "last_sequence", Integer.toString(producer.lastSequence()),
                "last_timestamp", Long.toString(producer.lastTimestamp()),
                "current_txn_start_offset", producer.currentTransactionStartOffset().isPresent()
                    ? Long.toString(producer.currentTransactionStartOffset().getAsLong()) : "null"));
        }
        return object("producers", array(producers));
    }

    /**
     * What `kafka-transactions.sh list` shows; with arguments, only the ids matching the
     * pattern a[0] (ListTransactions v2, KIP-1152) that have run longer than a[1] ms (v1,
     * KIP-994).
     */
    private static String listTransactions(Admin admin, List<String> a) throws Exception {
        var options = new org.apache.kafka.clients.admin.ListTransactionsOptions();
        if (a.size() > 0) {
            options.filterOnTransactionalIdPattern(a.get(0));
        }
        if (a.size() > 1) {
            options.filterOnDuration(Long.parseLong(a.get(1)));
        }
        List<String> listed = new ArrayList<>();
        for (TransactionListing listing : admin.listTransactions(options).all().get().stream()
                .sorted(Comparator.comparing(TransactionListing::transactionalId)).toList()) {
            listed.add(object(
                "transactional_id", quote(listing.transactionalId()),
                "producer_id", Long.toString(listing.producerId()),
                "state", quote(listing.state().toString())));
        }
        return object("transactions", array(listed));
    }

    /** What `kafka-transactions.sh describe` shows, per id. */
    private static String describeTransactions(Admin admin, List<String> ids) throws Exception {
        Map<String, TransactionDescription> described = admin.describeTransactions(ids).all().get();
        Map<String, String> fields = new TreeMap<>();
        for (var entry : described.entrySet()) {
            TransactionDescription description = entry.getValue();
            fields.put(entry.getKey(), object(
                "state", quote(description.state().toString()),
                "producer_id", Long.toString(description.producerId()),
                "producer_epoch", Integer.toString(description.producerEpoch()),
                "timeout_ms", Long.toString(description.transactionTimeoutMs()),
                "started", Boolean.toString(description.transactionStartTimeMs().isPresent()),
                "partitions", strings(description.topicPartitions().stream()
                    .sorted(BY_TOPIC_PARTITION).map(TopicPartition::toString).toList())));
        }
        return object(new LinkedHashMap<>(fields));
    }

    private static String describeQuotas(Admin admin) throws Exception {
        Map<ClientQuotaEntity, Map<String, Double>> described =
            admin.describeClientQuotas(ClientQuotaFilter.all()).entities().get();
        // Keyed by the entity's JSON so the list comes out in a stable order.
        Map<String, String> quotas = new TreeMap<>();
        described.forEach((entity, values) -> {
            // A null entity name is the default entity; it prints as null.
            Map<String, String> entries = new TreeMap<>();
            entity.entries().forEach((type, name) -> entries.put(type, quote(name)));
            Map<String, String> numbers = new TreeMap<>();
            values.forEach((key, value) -> numbers.put(key, value.toString()));
            String entityJson = object(entries);
            quotas.put(entityJson, object("entity", entityJson, "values", object(numbers)));
        });
        return object("quotas", array(quotas.values()));
    }

    private static String alterQuota(Admin admin, List<String> a) throws Exception {
        // ClientQuotaEntity takes a null name for the default entity, which Map.of refuses.
        Map<String, String> entity = new HashMap<>();
        int next = 1;
        switch (a.get(0)) {
            case "user" -> entity.put(ClientQuotaEntity.USER, entityName(a.get(next++)));
            case "client-id" -> entity.put(ClientQuotaEntity.CLIENT_ID, entityName(a.get(next++)));
            case "user+client-id" -> {
                entity.put(ClientQuotaEntity.USER, entityName(a.get(next++)));
                entity.put(ClientQuotaEntity.CLIENT_ID, entityName(a.get(next++)));
            }
            default -> throw new IllegalArgumentException(
                "entity type must be user, client-id or user+client-id: " + a.get(0));
        }
        List<ClientQuotaAlteration.Op> ops = new ArrayList<>();
        for (String pair : a.subList(next, a.size())) {
            int equals = pair.indexOf('=');
            if (equals < 0) {
                throw new IllegalArgumentException("quota must be key=value or key=--delete: " + pair);
            }
            String key = pair.substring(0, equals), value = pair.substring(equals + 1);
            // A null value removes the quota.
            ops.add(new ClientQuotaAlteration.Op(key, value.equals("--delete") ? null : Double.valueOf(value)));
        }
        admin.alterClientQuotas(List.of(new ClientQuotaAlteration(new ClientQuotaEntity(entity), ops))).all().get();
        return object("altered", "true");
    }

    private static String entityName(String name) {
        return name.equals("default") ? null : name;
    }

    // ---- producer and consumer steps ---------------------------------------------------------

    private static String produce(String bootstrap, List<String> a) throws Exception {
        String topic = a.get(0);
        int count = Integer.parseInt(a.get(1));
        Properties config = new Properties();
        config.put("bootstrap.servers", bootstrap);
        config.put("request.timeout.ms", "15000");
        // The producer has no default.api.timeout.ms; max.block.ms bounds its metadata waits.
        config.put("max.block.ms", "30000");
        config.put("compression.type", a.get(2));
        Integer onlyPartition = null;
        for (String option : a.subList(3, a.size())) {
            if (option.startsWith("idempotent=")) {
                config.put("enable.idempotence", option.substring("idempotent=".length()));
            } else if (option.startsWith("partition=")) {
                onlyPartition = Integer.valueOf(option.substring("partition=".length()));
            } else {
                throw new IllegalArgumentException("unknown produce option " + option);
            }
        }
        // Otherwise the 4.x defaults stand: idempotence on, acks=all.
        List<Future<RecordMetadata>> sends = new ArrayList<>();
        TreeMap<Integer, long[]> ranges = new TreeMap<>();
        try (var producer = new Closing<>(
                new KafkaProducer<>(config, new StringSerializer(), new StringSerializer()),
                client -> client.close(CLOSE_TIMEOUT))) {
            for (int i = 0; i < count; i++) {
                sends.add(producer.client().send(new ProducerRecord<>(topic, onlyPartition, "k" + i, "v" + i)));
            }
            producer.client().flush();
            for (Future<RecordMetadata> send : sends) {
                RecordMetadata acked = send.get();
                ranges.merge(acked.partition(), new long[] {acked.offset(), acked.offset()},
                    (seen, one) -> new long[] {Math.min(seen[0], one[0]), Math.max(seen[1], one[1])});
            }
        }
        Map<String, String> offsets = new LinkedHashMap<>();
        ranges.forEach((partition, range) ->
            offsets.put(partition.toString(), numbers(List.of(range[0], range[1]))));
        return object("acked", Integer.toString(sends.size()), "offsets", object(offsets));
    }

    /** A client's metric of the group and name given, as a number (0 when it has none). */
    private static double metric(Map<org.apache.kafka.common.MetricName, ? extends org.apache.kafka.common.Metric> metrics,
            String group, String name) {
        return metrics.entrySet().stream()
            .filter(entry -> entry.getKey().group().equals(group) && entry.getKey().name().equals(name))
            .mapToDouble(entry -> ((Number) entry.getValue().metricValue()).doubleValue())
            .sum();
    }

    /**
     * COUNT log lines produced to partition 0 of TOPIC with CODEC, then read back from its start
     * without a group: whether they came back the same, and the bytes the producer sent and the
     * consumer received (the clients' own network metrics).
     */
    private static String roundTrip(String bootstrap, String topic, int count, String codec) throws Exception {
        Properties config = new Properties();
        config.put("bootstrap.servers", bootstrap);
        config.put("compression.type", codec);
        config.put("linger.ms", "50");
        config.put("batch.size", "1000000");
        List<String> sent = new ArrayList<>();
        double sentBytes;
        try (var producer = new Closing<>(
                new KafkaProducer<>(config, new StringSerializer(), new StringSerializer()),
                client -> client.close(CLOSE_TIMEOUT))) {
            List<Future<RecordMetadata>> sends = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                String line = "2026-03-01T12:00:" + (i % 60) + "Z INFO GET /api/v1/items?id=" + i
                    + " status=200 duration_ms=" + (i % 97) + " region=eu-west-1";
                sent.add(line);
                sends.add(producer.client().send(new ProducerRecord<>(topic, 0, "k" + (i % 100), line)));
            }
            producer.client().flush();
            for (Future<RecordMetadata> send : sends) {
                send.get();
            }
            sentBytes = metric(producer.client().metrics(), "producer-metrics", "outgoing-byte-total");
        }
        List<String> got = new ArrayList<>();
        double receivedBytes;
        TopicPartition assigned = new TopicPartition(topic, 0);
        try (var consumer = new Closing<>(
                new KafkaConsumer<>(clientConfig(bootstrap), new StringDeserializer(), new StringDeserializer()),
                client -> client.close(CloseOptions.timeout(CLOSE_TIMEOUT)))) {
            KafkaConsumer<String, String> client = consumer.client();
            client.assign(List.of(assigned));
            client.seekToBeginning(List.of(assigned));
            long deadline = System.nanoTime() + CONSUME_DEADLINE.toNanos();
            while (got.size() < count && System.nanoTime() < deadline) {
                for (ConsumerRecord<String, String> record : client.poll(POLL)) {
                    got.add(record.value());
                }
            }
            receivedBytes = metric(client.metrics(), "consumer-metrics", "incoming-byte-total");
        }
        return object(
            "same", Boolean.toString(got.equals(sent)),
            "got", Integer.toString(got.size()),
            "sent_bytes", Long.toString((long) sentBytes),
            "received_bytes", Long.toString((long) receivedBytes));
    }

    /** Reads COUNT records of one partition without a group, from FROM or the log start. */
    private static String consume(String bootstrap, String topic, int partition, Optional<Long> from, int count)
            throws Exception {
        TopicPartition assigned = new TopicPartition(topic, partition);
        List<String> records = new ArrayList<>();
        try (var consumer = new Closing<>(
                new KafkaConsumer<>(clientConfig(bootstrap), new StringDeserializer(), new StringDeserializer()),
                client -> client.close(CloseOptions.timeout(CLOSE_TIMEOUT)))) {
            KafkaConsumer<String, String> client = consumer.client();
            client.assign(List.of(assigned));
            if (from.isPresent()) {
                client.seek(assigned, from.get());
            } else {
                client.seekToBeginning(List.of(assigned));
            }
            long deadline = System.nanoTime() + CONSUME_DEADLINE.toNanos();
            while (records.size() < count && System.nanoTime() < deadline) {
                for (ConsumerRecord<String, String> record : client.poll(POLL)) {
                    // A poll can return more than was asked for; the test asked for COUNT.
                    if (records.size() < count) {
                        records.add(object(
                            "offset", Long.toString(record.offset()),
                            "key", quote(record.key()),
                            "value", quote(record.value())));
                    }
                }
            }
        }
        return object("records", array(records));
    }

    /**
     * One member of GROUP subscribed to TOPIC for SECONDS. Every change of assignment after a poll
     * is recorded (starting from the empty assignment before the first poll, so an unassigned
     * stretch during a rebalance shows up as []) and announced on stderr as it happens, so a test
     * can start or stop other members at the right moment. partitions_seen are the partitions
     * records came from.
     */
    private static String groupMember(String bootstrap, String group, String topic, int seconds, String protocol,
            String sessionTimeoutMs) throws Exception {
        Properties config = clientConfig(bootstrap);
        config.put("group.id", group);
        config.put("group.protocol", protocol);
        // A member killed outright is noticed only when its session times out (45 s by default).
        // KIP-848 members have the broker's session timeout (group.consumer.session.timeout.ms)
        // and refuse one of their own.
        if (sessionTimeoutMs != null && protocol.equals("classic")) {
            config.put("session.timeout.ms", sessionTimeoutMs);
            config.put("heartbeat.interval.ms", "1000");
        }
        config.put("auto.offset.reset", "earliest");
        config.put("enable.auto.commit", "true");
        int records = 0;
        Set<TopicPartition> seen = new HashSet<>();
        List<String> assignments = new ArrayList<>();
        try (var consumer = new Closing<>(
                new KafkaConsumer<>(config, new StringDeserializer(), new StringDeserializer()),
                client -> client.close(CloseOptions.timeout(CLOSE_TIMEOUT)))) {
            KafkaConsumer<String, String> client = consumer.client();
            client.subscribe(List.of(topic));
            Set<TopicPartition> previous = Set.of();
            long deadline = System.nanoTime() + Duration.ofSeconds(seconds).toNanos();
            while (System.nanoTime() < deadline) {
                for (ConsumerRecord<String, String> record : client.poll(POLL)) {
                    records++;
                    seen.add(new TopicPartition(record.topic(), record.partition()));
                }
                Set<TopicPartition> current = Set.copyOf(client.assignment());
                if (!current.equals(previous)) {
                    previous = current;
                    List<String> names = names(current);
                    assignments.add(strings(names));
                    System.err.println("ASSIGNED " + String.join(",", names));
                    System.err.flush();
                }
            }
        }
        return object(
            "records", Integer.toString(records),
            "partitions_seen", strings(names(seen)),
            "assignments", array(assignments));
    }

    // ---- plumbing ----------------------------------------------------------------------------

    /** The settings every admin and consumer client of a run shares. */
    private static Properties clientConfig(String bootstrap) {
        Properties config = new Properties();
        config.put("bootstrap.servers", bootstrap);
        config.put("request.timeout.ms", "15000");
        config.put("default.api.timeout.ms", "30000");
        return config;
    }

    /** Lets try-with-resources close a client with a short timeout instead of its plain close(). */
    private record Closing<T>(T client, java.util.function.Consumer<T> closer) implements AutoCloseable {
        @Override
        public void close() {
            closer.accept(client);
        }
    }

    private static List<TopicPartition> sorted(Collection<TopicPartition> partitions) {
        return partitions.stream().sorted(BY_TOPIC_PARTITION).toList();
    }

    /** "topic-partition", as TopicPartition prints itself and as the test names partitions. */
    private static List<String> names(Collection<TopicPartition> partitions) {
        return sorted(partitions).stream().map(TopicPartition::toString).toList();
    }

    private static String errorJson(Throwable error) {
        // Futures wrap the broker's error in an ExecutionException, and some client errors wrap
        // another one; the innermost exception is the one that names what went wrong.
        Throwable root = error;
        while (root.getCause() != null && root.getCause() != root) {
            root = root.getCause();
        }
        return object("error", quote(root.getClass().getSimpleName()), "message", quote(root.getMessage()));
    }

    // ---- JSON --------------------------------------------------------------------------------
    // Values handed to object() and array() are already JSON; quote() makes a string one.

    private static String quote(String text) {
        if (text == null) {
            return "null";
        }
        StringBuilder json = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            switch (c) {
                case '"' -> json.append("\\\"");
                case '\\' -> json.append("\\\\");
                case '\n' -> json.append("\\n");
                case '\r' -> json.append("\\r");
                case '\t' -> json.append("\\t");
                default -> {
                    if (c < 0x20) {
                        json.append(String.format("\\u%04x", (int) c));
                    } else {
                        json.append(c);
                    }
                }
            }
        }
        return json.append('"').toString();
    }

    /** An object from alternating keys and JSON values. */
    private static String object(String... keysAndValues) {
        Map<String, String> fields = new LinkedHashMap<>();
        for (int i = 0; i < keysAndValues.length; i += 2) {
            fields.put(keysAndValues[i], keysAndValues[i + 1]);
        }
        return object(fields);
    }

    /** An object with the map's keys, in the map's order, and its JSON values. */
    private static String object(Map<String, String> fields) {
        return fields.entrySet().stream()
            .map(field -> quote(field.getKey()) + ": " + field.getValue())
            .collect(Collectors.joining(", ", "{", "}"));
    }

    private static String array(Collection<String> values) {
        return values.stream().collect(Collectors.joining(", ", "[", "]"));
    }

    private static String strings(Collection<String> values) {
        return array(values.stream().map(AdminSurface::quote).toList());
    }

    private static String numbers(Collection<? extends Number> values) {
        return array(values.stream().map(Object::toString).toList());
    }
}

// Share groups (KIP-932) through the Java client's KafkaShareConsumer (kafka-clients 4.3), for
// cli/tests/share_groups.rs: `java ShareConsumers BOOTSTRAP COMMAND [ARGS...]` does one scenario
// step per run and prints one machine-readable line per event to stdout, space-separated, the
// record's value always last:
//
//   PRODUCED <partition> <offset> <value>
//   CONFIGURED <group> <key>=<value>...
//   <KIND> <consumer> <partition> <offset> <deliveryCount> <value>
//       KIND: DELIVERED (implicit mode: accepted by the next poll or the commit before close),
//             ACCEPTED | RELEASED | REJECTED (explicit mode: the acknowledgement given),
//             ACQUIRED (`hold`: delivered and never acknowledged)
//   COMMIT <consumer> <topic>-<partition> OK | COMMIT <consumer> <topic>-<partition> ERROR <class> <message>
//   COMMIT <consumer> NONE               (commitSync returned an empty map)
//   HOLDING <records>                    (`hold`: the consumer now sleeps until it is killed)
//   CLOSED <consumer>
//   DONE <distinct offsets>              (the step's stop condition was met)
//   TIMEOUT <what>                       (it was not met in time; exit status 2)
//   ERROR <consumer> <class> <message>   (a consumer thread failed; exit status 1)
//   INFO ...                             (the Admin's view of the group; never asserted)
//
// deliveryCount is the broker's count (ConsumerRecord.deliveryCount()), -1 when it sent none.
// Commands (TIMEOUT_S bounds each consuming step):
//   configure GROUP KEY=VALUE...                   Admin.incrementalAlterConfigs on the GROUP
//   produce TOPIC SPEC...                          SPEC: a value, or PREFIX*N for PREFIX-0..PREFIX-(N-1);
//                                                  all to partition 0, in order
//   implicit GROUP TOPIC CONSUMERS COUNT TIMEOUT_S CONSUMERS share consumers, one thread each, in
//                                                  implicit mode, until COUNT distinct offsets came
//   drain GROUP TOPIC SENTINEL TIMEOUT_S           one implicit consumer until SENTINEL came
//   explicit GROUP TOPIC SENTINEL TIMEOUT_S        explicit mode: REJECT values containing
//                                                  "poison", RELEASE any other record the first
//                                                  time, ACCEPT it when it comes again; commitSync
//                                                  after each poll; until SENTINEL is ACCEPTED
//   limit GROUP TOPIC HOT_PREFIX SENTINEL TIMEOUT_S explicit mode: RELEASE values starting with
//                                                  HOT_PREFIX on every delivery, ACCEPT the rest;
//                                                  until SENTINEL is ACCEPTED
//   hold GROUP TOPIC TIMEOUT_S                     explicit mode: poll until records come, print
//                                                  them and HOLDING, then sleep forever without
//                                                  acknowledging or closing (the test kills it)
//   produce-keyed TOPIC COUNT KEYS                 COUNT records to partition 0, value v-i with key
//                                                  k-n, n drawn from 0..KEYS (seeded), in order
//   keyed GROUP TOPIC CONSUMERS COUNT PROCESS_MS TIMEOUT_S
//                                                  CONSUMERS explicit-mode consumers, a thread
//                                                  each, at most 5 records a poll; each record
//                                                  is processed for PROCESS_MS between a
//                                                  `START <c> <offset> <key> <nanos>` and an
//                                                  `END ...` line, then accepted; until COUNT
//                                                  distinct offsets were accepted; prints
//                                                  `ELAPSED-MS <ms>` from the first poll
//   produce-delayed TOPIC VALUE DELAY_MS           one record to partition 0 with the header
//                                                  strata.deliver.after.ms = now + DELAY_MS;
//                                                  prints `PRODUCED 0 <offset> <value>` and
//                                                  `AFTER <unix ms>`
//   timed GROUP TOPIC COUNT TIMEOUT_S              explicit mode: RELEASE each record at its
//                                                  first delivery, ACCEPT it at its next, until
//                                                  COUNT distinct offsets were accepted; prints
//                                                  `AT <RELEASED|ACCEPTED> <offset> <count> <unix ms>`
//   renew GROUP TOPIC HOLD_MS RENEW_MS TIMEOUT_S   explicit mode (KIP-1222): consumer 0 polls until
//                                                  records come (ACQUIRED lines), RENEWs them every
//                                                  RENEW_MS (a commitSync each: `RENEWED <n>`; the
//                                                  next poll hands them back) for HOLD_MS, then
//                                                  ACCEPTs them (ACCEPTED lines) and
//                                                  commits; consumer 1 polls the same group all
//                                                  along, accepting what it gets (ACCEPTED 1 ...),
//                                                  until 1 s after consumer 0 accepted
//   take GROUP TOPIC COUNT TIMEOUT_S [BATCH]       explicit mode: ACCEPT everything until COUNT
//                                                  distinct offsets were accepted, commitSync
//                                                  after each poll (BATCH: at most BATCH a poll,
//                                                  100 ms apart)
// The Admin's share group calls, each a step of its own; a refusal is printed, not fatal:
//   list-groups                                    `LISTED <share|all> <group> type=<type>
//                                                  state=<state>`: ListGroupsOptions.forShareGroups()
//                                                  then every group
//   describe-offsets GROUP [TOPIC PARTITION]       listShareGroupOffsets (every share-partition, or
//                                                  the one named): `OFFSET <group> <topic>-<p>
//                                                  start=<offset|-> epoch=<e|-> lag=<n|->`, then
//                                                  `OFFSETS <count>`
//   alter-offsets GROUP TOPIC PARTITION OFFSET     `ALTERED <group> <topic>-<p>` or `ALTER-FAILED
//                                                  <group> <class> <message>`
//   delete-offsets GROUP TOPIC                     `DELETED-OFFSETS <group> <topic>` or
//                                                  `DELETE-OFFSETS-FAILED <group> <class> <message>`
//   delete-group GROUP                             deleteShareGroups: `DELETED-GROUP <group>` or
//                                                  `DELETE-GROUP-FAILED <group> <class> <message>`
import java.io.PrintStream;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.BiFunction;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeConfigsOptions;
import org.apache.kafka.clients.admin.DescribeShareGroupsOptions;
import org.apache.kafka.clients.admin.GroupListing;
import org.apache.kafka.clients.admin.ListGroupsOptions;
import org.apache.kafka.clients.admin.ListShareGroupOffsetsOptions;
import org.apache.kafka.clients.admin.ListShareGroupOffsetsSpec;
import org.apache.kafka.clients.admin.ShareGroupDescription;
import org.apache.kafka.clients.admin.ShareMemberDescription;
import org.apache.kafka.clients.admin.SharePartitionOffsetInfo;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class ShareConsumers {
    private static final Duration POLL = Duration.ofMillis(200);
    private static final Duration CLOSE_TIMEOUT = Duration.ofSeconds(10);
    // The informational Admin calls: short, so a broker that does not answer them costs little.
    private static final int INFO_TIMEOUT_MS = 10_000;

    // The lines the test reads; System.out goes to stderr so nothing else lands among them.
    private static PrintStream lines;

    public static void main(String[] args) throws Exception {
        lines = System.out;
        System.setOut(System.err);
        if (args.length < 2) {
            System.err.println("usage: ShareConsumers BOOTSTRAP COMMAND [ARGS...] (see the header)");
            System.exit(64);
        }
        String bootstrap = args[0];
        List<String> a = List.of(args).subList(2, args.length);
        int status = switch (args[1]) {
            case "configure" -> configure(bootstrap, a.get(0), a.subList(1, a.size()));
            case "produce" -> produce(bootstrap, a.get(0), a.subList(1, a.size()));
            case "produce-keyed" -> produceKeyed(bootstrap, a.get(0), Integer.parseInt(a.get(1)),
                Integer.parseInt(a.get(2)));
            case "produce-delayed" -> produceDelayed(bootstrap, a.get(0), a.get(1),
                Long.parseLong(a.get(2)));
            case "timed" -> timed(bootstrap, a.get(0), a.get(1), Integer.parseInt(a.get(2)),
                seconds(a.get(3)));
            case "keyed" -> keyed(bootstrap, a.get(0), a.get(1), Integer.parseInt(a.get(2)),
                Integer.parseInt(a.get(3)), Integer.parseInt(a.get(4)), seconds(a.get(5)));
            case "implicit" -> implicit(bootstrap, a.get(0), a.get(1), Integer.parseInt(a.get(2)),
                Integer.parseInt(a.get(3)), null, seconds(a.get(4)));
            case "drain" -> implicit(bootstrap, a.get(0), a.get(1), 1, Integer.MAX_VALUE, a.get(2),
                seconds(a.get(3)));
            case "explicit" -> explicit(bootstrap, a.get(0), a.get(1), a.get(2), seconds(a.get(3)),
                (record, seenBefore) -> record.value().contains("poison") ? AcknowledgeType.REJECT
                    : seenBefore == 0 ? AcknowledgeType.RELEASE : AcknowledgeType.ACCEPT);
            case "limit" -> {
                String hot = a.get(2);
                yield explicit(bootstrap, a.get(0), a.get(1), a.get(3), seconds(a.get(4)),
                    (record, seenBefore) -> record.value().startsWith(hot)
                        ? AcknowledgeType.RELEASE : AcknowledgeType.ACCEPT);
            }
            case "hold" -> hold(bootstrap, a.get(0), a.get(1), seconds(a.get(2)));
            case "renew" -> renew(bootstrap, a.get(0), a.get(1), Long.parseLong(a.get(2)),
                Long.parseLong(a.get(3)), seconds(a.get(4)));
            case "take" -> take(bootstrap, a.get(0), a.get(1), Integer.parseInt(a.get(2)),
                seconds(a.get(3)), a.size() > 4 ? Integer.parseInt(a.get(4)) : 0);
            case "list-groups" -> listGroups(bootstrap);
            case "describe-offsets" -> describeOffsets(bootstrap, a.get(0),
                a.size() > 2 ? new TopicPartition(a.get(1), Integer.parseInt(a.get(2))) : null);
            case "alter-offsets" -> alterOffsets(bootstrap, a.get(0),
                new TopicPartition(a.get(1), Integer.parseInt(a.get(2))), Long.parseLong(a.get(3)));
            case "delete-offsets" -> deleteOffsets(bootstrap, a.get(0), a.get(1));
            case "delete-group" -> deleteGroup(bootstrap, a.get(0));
            default -> {
                System.err.println("unknown command " + args[1]);
                yield 64;
            }
        };
        lines.flush();
        // A client thread that outlived its close must not keep the JVM (and the test) up.
        System.exit(status);
    }

    private static long seconds(String text) {
        return (long) (Double.parseDouble(text) * 1000);
    }

    private static void print(String line) {
        synchronized (lines) {
            lines.println(line);
            lines.flush();
        }
    }

    private static void printDelivery(String kind, int consumer, ConsumerRecord<String, String> record) {
        String count = record.deliveryCount().map(String::valueOf).orElse("-1");
        print(kind + " " + consumer + " " + record.partition() + " " + record.offset() + " " + count
            + " " + record.value());
    }

    private static String oneLine(Throwable error) {
        Throwable root = error;
        while (root.getCause() != null && root.getCause() != root) {
            root = root.getCause();
        }
        String message = String.valueOf(root.getMessage()).replace('\n', ' ');
        return root.getClass().getSimpleName() + " " + message;
    }

    // ---- Admin ------------------------------------------------------------------------------

    private static Admin admin(String bootstrap) {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        return Admin.create(props);
    }

    /** Sets KEY=VALUE pairs on the group's configuration; the broker must accept them. */
    private static int configure(String bootstrap, String group, List<String> pairs) throws Exception {
        ConfigResource resource = new ConfigResource(ConfigResource.Type.GROUP, group);
        List<AlterConfigOp> ops = new ArrayList<>();
        for (String pair : pairs) {
            String[] kv = pair.split("=", 2);
            ops.add(new AlterConfigOp(new ConfigEntry(kv[0], kv[1]), AlterConfigOp.OpType.SET));
        }
        try (Admin admin = admin(bootstrap)) {
            admin.incrementalAlterConfigs(Map.of(resource, ops)).all().get();
            print("CONFIGURED " + group + " " + String.join(" ", pairs));
            try {
                Config config = admin.describeConfigs(List.of(resource),
                        new DescribeConfigsOptions().timeoutMs(INFO_TIMEOUT_MS))
                    .all().get().get(resource);
                for (ConfigEntry entry : config.entries()) {
                    if (entry.name().startsWith("share.")) {
                        print("INFO config " + entry.name() + " " + entry.value() + " " + entry.source());
                    }
                }
            } catch (Exception error) {
                print("INFO describe-configs failed " + oneLine(error));
            }
        }
        return 0;
    }

    /** The Admin's view of the group: its description, its listing, its start offsets. */
    private static void info(String bootstrap, String group, String topic) {
        try (Admin admin = admin(bootstrap)) {
            try {
                ShareGroupDescription description = admin.describeShareGroups(List.of(group),
                        new DescribeShareGroupsOptions().timeoutMs(INFO_TIMEOUT_MS))
                    .all().get().get(group);
                print("INFO describe " + group + " state=" + description.groupState()
                    + " members=" + description.members().size()
                    + " epoch=" + description.groupEpoch()
                    + " coordinator=" + (description.coordinator() == null ? "-" : description.coordinator().id()));
                for (ShareMemberDescription member : description.members()) {
                    print("INFO member " + member.consumerId() + " client=" + member.clientId()
                        + " epoch=" + member.memberEpoch()
                        + " assignment=" + member.assignment().topicPartitions());
                }
            } catch (Exception error) {
                print("INFO describe failed " + oneLine(error));
            }
            try {
                Collection<GroupListing> listed = admin.listGroups(
                        ListGroupsOptions.forShareGroups().timeoutMs(INFO_TIMEOUT_MS))
                    .all().get();
                for (GroupListing listing : listed) {
                    print("INFO listed " + listing.groupId() + " type=" + listing.type().orElse(null)
                        + " state=" + listing.groupState().orElse(null));
                }
            } catch (Exception error) {
                print("INFO list-groups failed " + oneLine(error));
            }
            try {
                TopicPartition partition = new TopicPartition(topic, 0);
                Map<TopicPartition, SharePartitionOffsetInfo> offsets = admin.listShareGroupOffsets(
                        Map.of(group, new ListShareGroupOffsetsSpec().topicPartitions(List.of(partition))),
                        new ListShareGroupOffsetsOptions().timeoutMs(INFO_TIMEOUT_MS))
                    .partitionsToOffsetInfo(group).get();
                SharePartitionOffsetInfo at = offsets.get(partition);
                print("INFO start-offset " + partition + " "
                    + (at == null ? "-" : at.startOffset() + " lag=" + at.lag().map(String::valueOf).orElse("-")));
            } catch (Exception error) {
                print("INFO list-share-group-offsets failed " + oneLine(error));
            }
        }
    }

    // ---- Producer ---------------------------------------------------------------------------

    private static int produce(String bootstrap, String topic, List<String> specs) throws Exception {
        List<String> values = new ArrayList<>();
        for (String spec : specs) {
            int star = spec.lastIndexOf('*');
            if (star > 0) {
                int count = Integer.parseInt(spec.substring(star + 1));
                for (int i = 0; i < count; i++) {
                    values.add(spec.substring(0, star) + "-" + i);
                }
            } else {
                values.add(spec);
            }
        }
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class);
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class);
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            List<java.util.concurrent.Future<RecordMetadata>> sent = new ArrayList<>();
            for (String value : values) {
                sent.add(producer.send(new ProducerRecord<>(topic, 0, null, value)));
            }
            for (int i = 0; i < values.size(); i++) {
                RecordMetadata metadata = sent.get(i).get();
                print("PRODUCED " + metadata.partition() + " " + metadata.offset() + " " + values.get(i));
            }
        }
        return 0;
    }

    // ---- Share consumers --------------------------------------------------------------------

    private static KafkaShareConsumer<String, String> consumer(String bootstrap, String group,
            String mode, String clientId) {
        return consumer(bootstrap, group, mode, clientId, 0);
    }

    private static KafkaShareConsumer<String, String> consumer(String bootstrap, String group,
            String mode, String clientId, int maxPollRecords) {
        Properties props = new Properties();
        if (maxPollRecords > 0) {
            props.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, maxPollRecords);
        }
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, clientId);
        props.put(ConsumerConfig.SHARE_ACKNOWLEDGEMENT_MODE_CONFIG, mode);
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class);
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class);
        return new KafkaShareConsumer<>(props);
    }

    /** commitSync's answer, one COMMIT line per partition. */
    private static void commit(int index, KafkaShareConsumer<String, String> consumer) {
        Map<TopicIdPartition, Optional<KafkaException>> result = consumer.commitSync();
        if (result.isEmpty()) {
            print("COMMIT " + index + " NONE");
        }
        for (Map.Entry<TopicIdPartition, Optional<KafkaException>> entry : result.entrySet()) {
            TopicIdPartition partition = entry.getKey();
            String name = partition.topic() + "-" + partition.partition();
            print("COMMIT " + index + " " + name + entry.getValue()
                .map(error -> " ERROR " + oneLine(error)).orElse(" OK"));
        }
    }

    /**
     * CONSUMERS implicit-mode consumers, a thread each, until COUNT distinct offsets came (or,
     * with SENTINEL, until a record of that value came); each record is accepted by the
     * consumer's next poll or its close. The Admin's view is printed while all are members.
     */
    private static int implicit(String bootstrap, String group, String topic, int consumers,
            int count, String sentinel, long timeoutMs) throws Exception {
        long deadline = System.currentTimeMillis() + timeoutMs;
        Set<Long> distinct = ConcurrentHashMap.newKeySet();
        AtomicBoolean met = new AtomicBoolean();
        AtomicBoolean failed = new AtomicBoolean();
        CountDownLatch stopped = new CountDownLatch(consumers);
        CountDownLatch mayClose = new CountDownLatch(1);
        List<Thread> threads = new ArrayList<>();
        for (int i = 0; i < consumers; i++) {
            int index = i;
            Thread thread = new Thread(() -> {
                KafkaShareConsumer<String, String> consumer = null;
                try {
                    consumer = consumer(bootstrap, group, "implicit", group + "-" + index);
                    consumer.subscribe(List.of(topic));
                    while (!met.get() && !failed.get() && System.currentTimeMillis() < deadline) {
                        for (ConsumerRecord<String, String> record : consumer.poll(POLL)) {
                            printDelivery("DELIVERED", index, record);
                            distinct.add(record.offset());
                            if (distinct.size() >= count
                                    || (sentinel != null && sentinel.equals(record.value()))) {
                                met.set(true);
                            }
                        }
                    }
                } catch (Exception error) {
                    failed.set(true);
                    print("ERROR " + index + " " + oneLine(error));
                } finally {
                    stopped.countDown();
                }
                try {
                    mayClose.await();
                    if (consumer != null) {
                        // commitSync accepts what the last poll delivered (implicit mode); a
                        // close alone would release it: Kafka's client sends on close only
                        // what is already acknowledged.
                        consumer.commitSync(CLOSE_TIMEOUT);
                        consumer.close(CLOSE_TIMEOUT);
                        print("CLOSED " + index);
                    }
                } catch (Exception error) {
                    failed.set(true);
                    print("ERROR " + index + " " + oneLine(error));
                }
            }, "share-consumer-" + index);
            threads.add(thread);
            thread.start();
        }
        stopped.await(timeoutMs + 30_000, TimeUnit.MILLISECONDS);
        if (met.get()) {
            info(bootstrap, group, topic);
        }
        mayClose.countDown();
        for (Thread thread : threads) {
            thread.join(CLOSE_TIMEOUT.toMillis() + 5_000);
        }
        if (failed.get()) {
            return 1;
        }
        if (!met.get()) {
            print("TIMEOUT " + distinct.size() + " distinct offsets of "
                + (sentinel == null ? String.valueOf(count) : "a sentinel " + sentinel));
            return 2;
        }
        print("DONE " + distinct.size());
        return 0;
    }

    /**
     * One explicit-mode consumer acknowledging each record as `decide` says (given how many
     * times this consumer saw its offset before), with commitSync after each poll, until
     * SENTINEL is accepted.
     */
    private static int explicit(String bootstrap, String group, String topic, String sentinel,
            long timeoutMs, BiFunction<ConsumerRecord<String, String>, Integer, AcknowledgeType> decide) {
        long deadline = System.currentTimeMillis() + timeoutMs;
        Map<Long, Integer> seen = new HashMap<>();
        boolean done = false;
        // Closed only on success: on a timeout or an error the process exits at once.
        KafkaShareConsumer<String, String> consumer = consumer(bootstrap, group, "explicit", group + "-0");
        consumer.subscribe(List.of(topic));
        while (!done) {
            if (System.currentTimeMillis() > deadline) {
                print("TIMEOUT the sentinel " + sentinel + " was not accepted; " + seen.size()
                    + " distinct offsets came");
                return 2;
            }
            ConsumerRecords<String, String> records = consumer.poll(POLL);
            for (ConsumerRecord<String, String> record : records) {
                int before = seen.getOrDefault(record.offset(), 0);
                seen.put(record.offset(), before + 1);
                AcknowledgeType type = decide.apply(record, before);
                consumer.acknowledge(record, type);
                printDelivery(kind(type), 0, record);
                if (type == AcknowledgeType.ACCEPT && sentinel.equals(record.value())) {
                    done = true;
                }
            }
            if (!records.isEmpty()) {
                commit(0, consumer);
            }
        }
        info(bootstrap, group, topic);
        consumer.close(CLOSE_TIMEOUT);
        print("CLOSED 0");
        print("DONE " + seen.size());
        return 0;
    }

    private static String kind(AcknowledgeType type) {
        return switch (type) {
            case ACCEPT -> "ACCEPTED";
            case RELEASE -> "RELEASED";
            case REJECT -> "REJECTED";
            default -> type.toString();
        };
    }

    /** Acquires records and never acknowledges them, nor closes: the test kills this process. */
    private static int hold(String bootstrap, String group, String topic, long timeoutMs) throws Exception {
        long deadline = System.currentTimeMillis() + timeoutMs;
        KafkaShareConsumer<String, String> consumer = consumer(bootstrap, group, "explicit", group + "-holder");
        consumer.subscribe(List.of(topic));
        while (System.currentTimeMillis() < deadline) {
            ConsumerRecords<String, String> records = consumer.poll(POLL);
            if (records.isEmpty()) {
                continue;
            }
            for (ConsumerRecord<String, String> record : records) {
                printDelivery("ACQUIRED", 0, record);
            }
            print("HOLDING " + records.count());
            while (true) {
                Thread.sleep(60_000);
            }
        }
        print("TIMEOUT no records came");
        return 2;
    }

    private static int renew(String bootstrap, String group, String topic, long holdMs, long renewMs,
            long timeoutMs) throws Exception {
        long deadline = System.currentTimeMillis() + timeoutMs;
        AtomicLong doneAt = new AtomicLong(Long.MAX_VALUE);
        AtomicReference<Throwable> failed = new AtomicReference<>();
        CountDownLatch holding = new CountDownLatch(1);
        Thread other = new Thread(() -> {
            try {
                holding.await();
                try (KafkaShareConsumer<String, String> consumer =
                        consumer(bootstrap, group, "explicit", group + "-other")) {
                    consumer.subscribe(List.of(topic));
                    while (System.currentTimeMillis() < Math.min(deadline, doneAt.get() + 1000)) {
                        for (ConsumerRecord<String, String> record : consumer.poll(POLL)) {
                            consumer.acknowledge(record, AcknowledgeType.ACCEPT);
                            printDelivery("ACCEPTED", 1, record);
                        }
                        consumer.commitSync();
                    }
                }
            } catch (Throwable error) {
                failed.set(error);
            }
        });
        other.start();
        try (KafkaShareConsumer<String, String> consumer = consumer(bootstrap, group, "explicit", group + "-holder")) {
            consumer.subscribe(List.of(topic));
            ConsumerRecords<String, String> records = ConsumerRecords.empty();
            while (records.isEmpty()) {
                if (System.currentTimeMillis() >= deadline) {
                    print("TIMEOUT no records came");
                    return 2;
                }
                records = consumer.poll(POLL);
            }
            for (ConsumerRecord<String, String> record : records) {
                printDelivery("ACQUIRED", 0, record);
            }
            holding.countDown();
            long until = System.currentTimeMillis() + holdMs;
            while (System.currentTimeMillis() < until) {
                Thread.sleep(renewMs);
                for (ConsumerRecord<String, String> record : records) {
                    consumer.acknowledge(record, AcknowledgeType.RENEW);
                }
                commit(0, consumer);
                print("RENEWED " + records.count());
                // Renewed records are handed back by the next poll, to be acknowledged again.
                ConsumerRecords<String, String> back = ConsumerRecords.empty();
                while (back.isEmpty() && System.currentTimeMillis() < deadline) {
                    back = consumer.poll(POLL);
                }
                records = back;
            }
            for (ConsumerRecord<String, String> record : records) {
                consumer.acknowledge(record, AcknowledgeType.ACCEPT);
                printDelivery("ACCEPTED", 0, record);
            }
            commit(0, consumer);
            doneAt.set(System.currentTimeMillis());
        }
        other.join();
        if (failed.get() != null) {
            print("ERROR 1 " + oneLine(failed.get()));
            return 1;
        }
        print("DONE");
        return 0;
    }

    /** One record held back DELAY_MS by Strata's delivery-delay header. */
    private static int produceDelayed(String bootstrap, String topic, String value, long delayMs)
            throws Exception {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class);
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class);
        long after = System.currentTimeMillis() + delayMs;
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            ProducerRecord<String, String> record = new ProducerRecord<>(topic, 0, null, value);
            record.headers().add("strata.deliver.after.ms",
                Long.toString(after).getBytes(java.nio.charset.StandardCharsets.UTF_8));
            RecordMetadata metadata = producer.send(record).get();
            print("PRODUCED " + metadata.partition() + " " + metadata.offset() + " " + value);
            print("AFTER " + after);
        }
        return 0;
    }

    /** Releases each record once and accepts it when it comes again, printing when. */
    private static int timed(String bootstrap, String group, String topic, int count,
            long timeoutMs) {
        long deadline = System.currentTimeMillis() + timeoutMs;
        Set<Long> released = new java.util.HashSet<>();
        Set<Long> accepted = new java.util.HashSet<>();
        try (KafkaShareConsumer<String, String> consumer =
                consumer(bootstrap, group, "explicit", group + "-timed")) {
            consumer.subscribe(List.of(topic));
            while (accepted.size() < count) {
                if (System.currentTimeMillis() > deadline) {
                    print("TIMEOUT " + accepted.size() + " distinct offsets of " + count + " accepted");
                    return 2;
                }
                for (ConsumerRecord<String, String> record : consumer.poll(POLL)) {
                    String deliveries = record.deliveryCount().map(String::valueOf).orElse("-1");
                    boolean first = released.add(record.offset());
                    AcknowledgeType type = first ? AcknowledgeType.RELEASE : AcknowledgeType.ACCEPT;
                    print("AT " + (first ? "RELEASED" : "ACCEPTED") + " " + record.offset() + " "
                        + deliveries + " " + System.currentTimeMillis());
                    consumer.acknowledge(record, type);
                    if (!first) {
                        accepted.add(record.offset());
                    }
                }
                consumer.commitSync();
            }
        }
        print("DONE " + accepted.size());
        return 0;
    }

    /** COUNT records to partition 0 of TOPIC, value v-i and a key of KEYS drawn at random. */
    private static int produceKeyed(String bootstrap, String topic, int count, int keys)
            throws Exception {
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class);
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class);
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            List<java.util.concurrent.Future<RecordMetadata>> sent = new ArrayList<>();
            // Keys drawn at random (seeded): records of one key lie close together, as they
            // do in real traffic, so consumers taking neighbouring records meet the same key.
            java.util.Random random = new java.util.Random(42);
            for (int i = 0; i < count; i++) {
                String key = "k-" + random.nextInt(keys);
                sent.add(producer.send(new ProducerRecord<>(topic, 0, key, "v-" + i)));
            }
            for (int i = 0; i < count; i++) {
                RecordMetadata metadata = sent.get(i).get();
                print("PRODUCED " + metadata.partition() + " " + metadata.offset() + " v-" + i);
            }
        }
        return 0;
    }

    /**
     * CONSUMERS explicit-mode consumers process records for PROCESS_MS each, printing when each
     * record's processing starts and ends, until COUNT distinct offsets were accepted.
     */
    private static int keyed(String bootstrap, String group, String topic, int consumers,
            int count, int processMs, long timeoutMs) throws Exception {
        long deadline = System.currentTimeMillis() + timeoutMs;
        Set<Long> accepted = ConcurrentHashMap.newKeySet();
        AtomicBoolean failed = new AtomicBoolean();
        List<Thread> threads = new ArrayList<>();
        long start = System.nanoTime();
        for (int c = 0; c < consumers; c++) {
            final int index = c;
            Thread thread = new Thread(() -> {
                try (KafkaShareConsumer<String, String> consumer =
                        consumer(bootstrap, group, "explicit", group + "-" + index, 5)) {
                    consumer.subscribe(List.of(topic));
                    while (accepted.size() < count && !failed.get()) {
                        if (System.currentTimeMillis() > deadline) {
                            return;
                        }
                        for (ConsumerRecord<String, String> record : consumer.poll(POLL)) {
                            print("START " + index + " " + record.offset() + " " + record.key()
                                + " " + System.nanoTime());
                            Thread.sleep(processMs);
                            print("END " + index + " " + record.offset() + " " + record.key()
                                + " " + System.nanoTime());
                            consumer.acknowledge(record, AcknowledgeType.ACCEPT);
                            accepted.add(record.offset());
                        }
                        consumer.commitAsync();
                    }
                    consumer.commitSync();
                } catch (Exception error) {
                    failed.set(true);
                    print("ERROR " + index + " " + oneLine(error));
                }
            });
            thread.start();
            threads.add(thread);
        }
        for (Thread thread : threads) {
            thread.join();
        }
        if (failed.get()) {
            return 1;
        }
        if (accepted.size() < count) {
            print("TIMEOUT " + accepted.size() + " distinct offsets of " + count + " accepted");
            return 2;
        }
        print("ELAPSED-MS " + (System.nanoTime() - start) / 1_000_000);
        print("DONE " + accepted.size());
        return 0;
    }

    /**
     * Accepts everything until COUNT distinct offsets were accepted, committing after each poll;
     * with BATCH, at most BATCH records a poll and a pause of 100 ms after each (a slow consumer
     * whose brokers can fail under it).
     */
    private static int take(String bootstrap, String group, String topic, int count, long timeoutMs,
            int batch) throws InterruptedException {
        long start = System.currentTimeMillis();
        long deadline = start + timeoutMs;
        Set<Long> accepted = new java.util.HashSet<>();
        // Closed only on success: on a timeout or an error the process exits at once.
        KafkaShareConsumer<String, String> consumer = batch > 0
            ? consumer(bootstrap, group, "explicit", group + "-taker", batch)
            : consumer(bootstrap, group, "explicit", group + "-taker");
        consumer.subscribe(List.of(topic));
        while (accepted.size() < count) {
            if (batch > 0) {
                Thread.sleep(100);
            }
            if (System.currentTimeMillis() > deadline) {
                print("TIMEOUT " + accepted.size() + " distinct offsets of " + count + " accepted");
                return 2;
            }
            ConsumerRecords<String, String> records = consumer.poll(POLL);
            for (ConsumerRecord<String, String> record : records) {
                consumer.acknowledge(record, AcknowledgeType.ACCEPT);
                printDelivery("ACCEPTED", 1, record);
                accepted.add(record.offset());
            }
            if (!records.isEmpty()) {
                commit(1, consumer);
            }
        }
        print("INFO elapsed-ms " + (System.currentTimeMillis() - start));
        info(bootstrap, group, topic);
        consumer.close(CLOSE_TIMEOUT);
        print("CLOSED 1");
        print("DONE " + accepted.size());
        return 0;
    }

    // ---- The Admin's share group calls -----------------------------------------------------

    private static void listed(String scope, Collection<GroupListing> groups) {
        for (GroupListing listing : groups) {
            print("LISTED " + scope + " " + listing.groupId()
                + " type=" + listing.type().map(Object::toString).orElse("-")
                + " state=" + listing.groupState().map(Object::toString).orElse("-"));
        }
    }

    /** The share groups (forShareGroups), then every group, as the brokers list them. */
    private static int listGroups(String bootstrap) throws Exception {
        try (Admin admin = admin(bootstrap)) {
            listed("share", admin.listGroups(ListGroupsOptions.forShareGroups()).all().get());
            listed("all", admin.listGroups(new ListGroupsOptions()).all().get());
        }
        return 0;
    }

    /** The group's share-partition start offsets: every one with state, or PARTITION's. */
    private static int describeOffsets(String bootstrap, String group, TopicPartition partition)
            throws Exception {
        ListShareGroupOffsetsSpec spec = new ListShareGroupOffsetsSpec();
        if (partition != null) {
            spec = spec.topicPartitions(List.of(partition));
        }
        try (Admin admin = admin(bootstrap)) {
            Map<TopicPartition, SharePartitionOffsetInfo> offsets = admin
                .listShareGroupOffsets(Map.of(group, spec)).partitionsToOffsetInfo(group).get();
            for (Map.Entry<TopicPartition, SharePartitionOffsetInfo> entry : offsets.entrySet()) {
                SharePartitionOffsetInfo info = entry.getValue();
                print("OFFSET " + group + " " + entry.getKey()
                    + " start=" + (info == null ? "-" : String.valueOf(info.startOffset()))
                    + " epoch=" + (info == null ? "-" : info.leaderEpoch().map(String::valueOf).orElse("-"))
                    + " lag=" + (info == null ? "-" : info.lag().map(String::valueOf).orElse("-")));
            }
            print("OFFSETS " + offsets.size());
        }
        return 0;
    }

    private static int alterOffsets(String bootstrap, String group, TopicPartition partition,
            long offset) {
        try (Admin admin = admin(bootstrap)) {
            admin.alterShareGroupOffsets(group, Map.of(partition, offset)).all().get();
            print("ALTERED " + group + " " + partition);
        } catch (Exception error) {
            print("ALTER-FAILED " + group + " " + oneLine(error));
        }
        return 0;
    }

    private static int deleteOffsets(String bootstrap, String group, String topic) {
        try (Admin admin = admin(bootstrap)) {
            admin.deleteShareGroupOffsets(group, Set.of(topic)).all().get();
            print("DELETED-OFFSETS " + group + " " + topic);
        } catch (Exception error) {
            print("DELETE-OFFSETS-FAILED " + group + " " + oneLine(error));
        }
        return 0;
    }

    private static int deleteGroup(String bootstrap, String group) {
        try (Admin admin = admin(bootstrap)) {
            admin.deleteShareGroups(List.of(group)).all().get();
            print("DELETED-GROUP " + group);
        } catch (Exception error) {
            print("DELETE-GROUP-FAILED " + group + " " + oneLine(error));
        }
        return 0;
    }
}

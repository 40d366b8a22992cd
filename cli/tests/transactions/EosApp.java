// The exactly-once consume-transform-produce application of the fault test, on the Java
// client (kafka-clients 4.3): reads IN with read_committed in group GROUP, writes each
// record's value prefixed "J:" under its key to the same partition of OUT, and commits the
// consumed offsets in the same transaction (transactional.id TXN_ID). One transaction in ten is
// aborted on purpose once its records are written (its input is read again). Exits once
// nothing new came for IDLE_S seconds, printing {"transactions": N}.
//
// Usage: EosApp BOOTSTRAP IN OUT GROUP TXN_ID IDLE_S

import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Random;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class EosApp {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], in = args[1], out = args[2], group = args[3], txnId = args[4];
        long idleMs = (long) (Double.parseDouble(args[5]) * 1000);
        Properties consumerProps = new Properties();
        consumerProps.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        consumerProps.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        consumerProps.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        consumerProps.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        consumerProps.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        consumerProps.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000");
        consumerProps.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
        consumerProps.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
        Properties producerProps = new Properties();
        producerProps.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        producerProps.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        producerProps.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "10000");
        producerProps.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        producerProps.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
        producerProps.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
        Random random = new Random();
        int transactions = 0;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerProps);
             KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProps)) {
            producer.initTransactions();
            consumer.subscribe(List.of(in));
            long lastNew = System.currentTimeMillis();
            while (System.currentTimeMillis() - lastNew < idleMs) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(500));
                if (records.isEmpty()) {
                    continue;
                }
                lastNew = System.currentTimeMillis();
                producer.beginTransaction();
                Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                for (ConsumerRecord<byte[], byte[]> record : records) {
                    byte[] value = ("J:" + new String(record.value())).getBytes();
                    producer.send(new ProducerRecord<>(out, record.partition(), record.key(), value));
                    offsets.put(new TopicPartition(record.topic(), record.partition()),
                            new OffsetAndMetadata(record.offset() + 1));
                }
                producer.sendOffsetsToTransaction(offsets, consumer.groupMetadata());
                try {
                    if (random.nextInt(10) == 0) {
                        producer.flush();
                        producer.abortTransaction();
                        rewind(consumer);
                        continue;
                    }
                    producer.commitTransaction();
                    transactions++;
                } catch (ProducerFencedException fenced) {
                    throw fenced;
                } catch (KafkaException error) {
                    producer.abortTransaction();
                    rewind(consumer);
                }
            }
        }
        System.out.println("{\"transactions\": " + transactions + "}");
    }

    /** Back to the committed offsets: what an aborted transaction read is read again. */
    static void rewind(KafkaConsumer<byte[], byte[]> consumer) {
        Map<TopicPartition, OffsetAndMetadata> committed = consumer.committed(consumer.assignment());
        for (TopicPartition partition : consumer.assignment()) {
            OffsetAndMetadata offset = committed.get(partition);
            if (offset == null) {
                consumer.seekToBeginning(List.of(partition));
            } else {
                consumer.seek(partition, offset.offset());
            }
        }
    }
}

// A secured round trip for cli/tests/security.rs through the Java client (kafka-clients):
// `java SecureRoundTrip BOOTSTRAP TOPIC GROUP PROPERTIES_FILE` produces three records with the
// default (idempotent) producer, consumes them back in consumer group GROUP and prints one JSON
// object, as clients.py does. PROPERTIES_FILE holds the client's security settings. A refusal
// is a result: {"error": "..."}.
import java.io.FileInputStream;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class SecureRoundTrip {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], group = args[2];
        Properties security = new Properties();
        try (FileInputStream in = new FileInputStream(args[3])) {
            security.load(in);
        }
        try {
            Properties producerConfig = new Properties();
            producerConfig.putAll(security);
            producerConfig.put("bootstrap.servers", bootstrap);
            producerConfig.put("delivery.timeout.ms", "20000");
            producerConfig.put("request.timeout.ms", "10000");
            producerConfig.put("max.block.ms", "15000");
            try (KafkaProducer<String, String> producer =
                    new KafkaProducer<>(producerConfig, new StringSerializer(), new StringSerializer())) {
                for (String value : new String[] {"one", "two", "three"}) {
                    producer.send(new ProducerRecord<>(topic, value)).get();
                }
            }
            Properties consumerConfig = new Properties();
            consumerConfig.putAll(security);
            consumerConfig.put("bootstrap.servers", bootstrap);
            consumerConfig.put("group.id", group);
            consumerConfig.put("auto.offset.reset", "earliest");
            List<String> values = new ArrayList<>();
            try (KafkaConsumer<String, String> consumer =
                    new KafkaConsumer<>(consumerConfig, new StringDeserializer(), new StringDeserializer())) {
                consumer.subscribe(List.of(topic));
                long deadline = System.currentTimeMillis() + 30000;
                while (values.size() < 3 && System.currentTimeMillis() < deadline) {
                    for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofSeconds(1))) {
                        values.add(record.value());
                    }
                }
            }
            StringBuilder json = new StringBuilder("{\"values\": [");
            for (int i = 0; i < values.size(); i++) {
                json.append(i == 0 ? "" : ", ").append('"').append(values.get(i)).append('"');
            }
            System.out.println(json.append("], \"errors\": []}"));
        } catch (Exception error) {
            Throwable cause = error.getCause() != null ? error.getCause() : error;
            String message = (cause.getClass().getSimpleName() + ": " + cause.getMessage())
                .replace("\\", "\\\\").replace("\"", "'");
            System.out.println("{\"error\": \"" + message + "\"}");
        }
        System.exit(0);
    }
}

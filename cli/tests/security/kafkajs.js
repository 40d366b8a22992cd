// A secured round trip for cli/tests/security.rs through kafkajs:
// `node kafkajs.js BOOTSTRAP TOPIC GROUP SECURITY_JSON` (as clients.py) prints one JSON object.
const fs = require('fs');
const { Kafka, logLevel } = require('kafkajs');

const [bootstrap, topic, group, securityJson] = process.argv.slice(2);
const security = JSON.parse(securityJson);
const values = ['one', 'two', 'three'];

const config = { clientId: 'strata-security-test', brokers: [bootstrap], logLevel: logLevel.NOTHING };
if (security.protocol.endsWith('SSL')) {
  config.ssl = { ca: [fs.readFileSync(security.ca)] };
  if (security.cert) {
    config.ssl.cert = fs.readFileSync(security.cert);
    config.ssl.key = fs.readFileSync(security.key);
  }
}
if (security.mechanism) {
  config.sasl = {
    mechanism: security.mechanism.toLowerCase(),
    username: security.user,
    password: security.password,
  };
}

(async () => {
  const kafka = new Kafka(config);
  try {
    const producer = kafka.producer();
    await producer.connect();
    await producer.send({ topic, messages: values.map((value) => ({ value })) });
    await producer.disconnect();
    const consumer = kafka.consumer({ groupId: group });
    await consumer.connect();
    await consumer.subscribe({ topic, fromBeginning: true });
    const seen = [];
    await new Promise((resolve, reject) => {
      const timer = setTimeout(resolve, 30000);
      consumer.run({
        eachMessage: async ({ message }) => {
          seen.push(message.value.toString());
          if (seen.length >= values.length) {
            clearTimeout(timer);
            resolve();
          }
        },
      }).catch(reject);
    });
    await consumer.disconnect();
    console.log(JSON.stringify({ values: seen, errors: [] }));
  } catch (error) {
    console.log(JSON.stringify({ error: `${error.name}: ${error.message}` }));
  }
  process.exit(0);
})();

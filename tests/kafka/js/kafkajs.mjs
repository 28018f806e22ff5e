// kafkajs against the broker's Kafka listener: produce N messages with a
// key and a header over 4 partitions, then consume them as a group and
// print what was consumed as one JSON line. Usage: node kafkajs.mjs BOOTSTRAP TOPIC N
import { Kafka, logLevel } from 'kafkajs';

const [bootstrap, topic, count] = process.argv.slice(2);
const n = Number(count);
const kafka = new Kafka({ clientId: 'kafkajs-check', brokers: [bootstrap], logLevel: logLevel.ERROR });
const deadline = setTimeout(() => { console.error('timed out'); process.exit(2); }, 90000);

const producer = kafka.producer({ allowAutoTopicCreation: true });
await producer.connect();
const messages = Array.from({ length: n }, (_, i) => ({
  key: `k${i}`, value: `v${i}`, partition: i % 4, headers: { h: `x${i}` },
}));
const sent = await producer.send({ topic, messages });
await producer.disconnect();

const consumer = kafka.consumer({ groupId: 'kafkajs-group', sessionTimeout: 10000, heartbeatInterval: 500 });
await consumer.connect();
await consumer.subscribe({ topic, fromBeginning: true });
const got = [];
await new Promise((resolve) => {
  consumer.run({
    eachMessage: async ({ partition, message }) => {
      got.push({ partition, offset: Number(message.offset), key: message.key.toString(),
                 value: message.value.toString(), h: message.headers.h.toString() });
      if (got.length === n) resolve();
    },
  });
});
await consumer.disconnect();
clearTimeout(deadline);
console.log(JSON.stringify({ sent, got }));

// A kafkajs producer as an application runs one: one record every `interval_ms` for `seconds`,
// each send awaited on its own (several in flight), then every outcome printed as one JSON line:
// {"i": n, "partition": p or null, "sent": epoch ms, "acked": epoch ms or null, "error": message or null}.
// Usage: node produce.js CONFIG_JSON, CONFIG_JSON: {brokers, topic, seconds, interval_ms,
// wait_s, request_timeout_ms, partitions (optional: record i goes to partition i % partitions),
// client_id (optional)}.
const { Kafka, logLevel } = require("kafkajs");

const config = JSON.parse(process.argv[2]);

async function main() {
  const kafka = new Kafka({
    clientId: config.client_id || "heal-kafkajs",
    brokers: config.brokers,
    requestTimeout: config.request_timeout_ms,
    connectionTimeout: 3000,
    retry: { retries: 30, initialRetryTime: 100, maxRetryTime: 1000 },
    logLevel: logLevel.NOTHING,
  });
  const producer = kafka.producer({ allowAutoTopicCreation: false, idempotent: false });
  await producer.connect();
  const outcomes = [];
  const pending = [];
  const started = Date.now();
  for (let i = 0; Date.now() - started < config.seconds * 1000; i++) {
    const outcome = { i, partition: null, sent: Date.now(), acked: null, error: null };
    outcomes.push(outcome);
    const message = { value: `v${i}` };
    if (config.partitions) message.partition = outcome.partition = i % config.partitions;
    pending.push(producer.send({ topic: config.topic, acks: -1, messages: [message] })
      .then(() => { outcome.acked = Date.now(); }, (err) => { outcome.error = String(err); }));
    await new Promise((resolve) => setTimeout(resolve, config.interval_ms));
  }
  // Bounded: a send still unresolved `wait_s` after the last one is reported as not acknowledged.
  await Promise.race([Promise.all(pending), new Promise((resolve) => setTimeout(resolve, config.wait_s * 1000))]);
  for (const outcome of outcomes) process.stdout.write(JSON.stringify(outcome) + "\n");
}

main().then(() => process.exit(0), (err) => { process.stderr.write(String(err.stack || err) + "\n"); process.exit(1); });

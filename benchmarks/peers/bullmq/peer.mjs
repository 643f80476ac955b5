// BullMQ's side of benchmarks/peers/bullmq_bench.py: `node peer.mjs producer` reads
// commands on stdin and answers each with one line; `node peer.mjs worker` runs a
// Worker. The Redis URL is in PEERS_REDIS_URL, the variant in PEERS_VARIANT.
//
//   noops N          add N no-op jobs one by one (Queue.add, awaited each)   -> ok
//   bulk N           add N no-op jobs in one Queue.addBulk call              -> ok
//   record SEQ S     add record(SEQ) delayed by S seconds (due now if 0)     -> due time, epoch s
import { createInterface } from "node:readline";
import { performance } from "node:perf_hooks";
import { Queue, Worker } from "bullmq";
import IORedis from "ioredis";

const QUEUE = "peers-bench";
const DONE_KEY = "peers-bench:done";
const RECORD_KEY = "peers-bench:started";
const url = process.env.PEERS_REDIS_URL;
const tuned = process.env.PEERS_VARIANT === "tuned";
// Tuned: 50 jobs at once (the docs' concurrency example, for I/O-bound jobs; default 1).
const CONCURRENCY = tuned ? 50 : 1;

function nowSeconds() {
  return (performance.timeOrigin + performance.now()) / 1000;
}

function connect() {
  // Workers need maxRetriesPerRequest: null (BullMQ's connection docs).
  return new IORedis(url, { maxRetriesPerRequest: null });
}

async function producer() {
  const queue = new Queue(QUEUE, { connection: connect() });
  const lines = createInterface({ input: process.stdin });
  for await (const line of lines) {
    const [command, a, b] = line.trim().split(" ");
    if (command === "noops") {
      for (let i = 0; i < Number(a); i++) await queue.add("noop", {});
      console.log("ok");
    } else if (command === "bulk") {
      await queue.addBulk(Array.from({ length: Number(a) }, () => ({ name: "noop", data: {} })));
      console.log("ok");
    } else if (command === "record") {
      const delay = Number(b);
      const due = nowSeconds() + delay;
      const opts = delay ? { delay: delay * 1000 } : {};
      await queue.add("record", { seq: Number(a) }, opts);
      console.log(String(due));
    } else {
      console.log(`error: unknown command ${command}`);
    }
  }
  await queue.close();
}

async function worker() {
  const client = connect();
  const w = new Worker(
    QUEUE,
    async (job) => {
      if (job.name === "record") {
        const started = nowSeconds();
        await client.rpush(RECORD_KEY, `${job.data.seq} ${started}`);
      } else {
        await client.incr(DONE_KEY);
      }
    },
    { connection: connect(), concurrency: CONCURRENCY },
  );
  const stop = async () => {
    await w.close();
    client.disconnect();
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

if (process.argv[2] === "producer") await producer();
else await worker();

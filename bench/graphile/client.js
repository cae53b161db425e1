// graphile-worker 0.17 client for pgdq's `make bench`; one workload part per run.
//   node client.js setup CONN
//   node client.js enqueue CONN TOTAL BATCH CLIENTS I
//   node client.js offer CONN TOTAL CLIENTS I
//   node client.js drain CONN LOCAL_QUEUE_SIZE CONCURRENCY
//   node client.js lateness CONN TOTAL   (prints {"lateness_ms": [...]})
// Prints one JSON line: {"done": n, "start": seconds, "end": seconds} on the
// monotonic clock (the same clock as Python's time.perf_counter on Linux).
"use strict";
const { Logger, makeWorkerUtils, run } = require("graphile-worker");

const logger = new Logger(() => () => {}); // silent: logging every job would dominate

const now = () => Number(process.hrtime.bigint()) / 1e9;
const [mode, connectionString, ...args] = process.argv.slice(2);
const report = (done, start, end) => console.log(JSON.stringify({ done, start, end }));

async function enqueue(total, batch, clients, i) {
  const utils = await makeWorkerUtils({ connectionString, logger });
  const mine = [];
  for (let k = i; k < total; k += clients) mine.push(k);
  const start = now();
  for (let s = 0; s < mine.length; s += batch) {
    await utils.addJobs(mine.slice(s, s + batch).map((n) => ({ identifier: "noop", payload: { n } })));
  }
  const end = now();
  await utils.release();
  report(mine.length, start, end);
}

async function offer(total, clients, i) {
  const utils = await makeWorkerUtils({ connectionString, logger });
  let done = 0;
  const start = now();
  for (let k = i; k < total; k += clients) {
    await utils.addJob("noop", { n: k });
    done++;
  }
  const end = now();
  await utils.release();
  report(done, start, end);
}

// Work until no job is left; localQueueSize > 1 turns on batched fetching and
// batched completion (the documented fast path), 1 means one job per fetch.
async function drain(localQueueSize, concurrency) {
  let done = 0;
  const preset = localQueueSize > 1 ? { worker: { localQueue: { size: localQueueSize }, completeJobBatchDelay: 0 } } : {};
  const start = now(); // before run(): jobs start flowing as soon as it connects
  const runner = await run({
    connectionString,
    concurrency,
    noHandleSignals: true,
    logger,
    crontab: "",
    pollInterval: 1000,
    preset,
    taskList: { noop: async () => { done++; } },
  });
  const utils = await makeWorkerUtils({ connectionString, logger });
  for (;;) {
    const { rows } = await utils.withPgClient((c) => c.query("SELECT count(*)::int AS n FROM graphile_worker._private_jobs"));
    if (rows[0].n === 0) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  const end = now();
  await runner.stop();
  await utils.release();
  report(done, start, end);
}

// W4: `total` jobs at distinct times over the next 10 s while the worker idles;
// lateness = handler start - run_at (same machine clock), in milliseconds.
async function lateness(total) {
  const late = [];
  const runner = await run({
    connectionString,
    concurrency: 10,
    noHandleSignals: true,
    logger,
    crontab: "",
    taskList: { noop: async (_payload, helpers) => { late.push(Date.now() - helpers.job.run_at.getTime()); } },
  });
  await new Promise((r) => setTimeout(r, 500)); // idle first
  const utils = await makeWorkerUtils({ connectionString, logger });
  const base = Date.now() + 1000;
  const jobs = [];
  for (let i = 0; i < total; i++) jobs.push({ identifier: "noop", payload: { i }, runAt: new Date(base + (i * 10000) / total) });
  await utils.addJobs(jobs);
  const deadline = Date.now() + 30000;
  while (late.length < total && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  await runner.stop();
  await utils.release();
  console.log(JSON.stringify({ lateness_ms: late }));
}

async function main() {
  if (mode === "setup") {
    const utils = await makeWorkerUtils({ connectionString, logger });
    await utils.migrate();
    await utils.release();
    return;
  }
  const nums = args.map(Number);
  if (mode === "enqueue") return enqueue(...nums);
  if (mode === "offer") return offer(...nums);
  if (mode === "drain") return drain(...nums);
  if (mode === "lateness") return lateness(...nums);
  throw new Error(`unknown mode ${mode}`);
}

main().catch((e) => { console.error(e); process.exit(1); });

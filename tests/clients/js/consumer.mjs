// A consumer written as a nats.js user writes one. js mode: consumers.get() and
// consume({max_messages: 256, expires: 5000}), ack each message; core mode: a plain
// subscription. v3 (@nats-io/jetstream with @nats-io/transport-node) or v2 (nats),
// chosen by the first argument. Any disconnect, reconnect or consumer status that
// reports trouble (heartbeats_missed, no_responders, consumer_not_found, ...) is
// counted and fails the run. Payloads are numbers 1..EXPECT; "p" is a probe (answered
// with PROBED, once). STALL_AT=N STALL_SECS=S (environment): a blocked downstream,
// the N-th message's handling (before its ack) blocks S seconds once, between STALLED
// and RESUMED on stdout.
//
// usage: node consumer.mjs v3|v2 js URL STREAM CONSUMER EXPECT DEADLINE_SECS
//        node consumer.mjs v3|v2 core URL SUBJECT - EXPECT DEADLINE_SECS
// prints: RESULT received=N dups=N errors=N disconnects=N max_gap_ms=N resume_unix_ms=N
const [flavour, mode, url, stream, durable, expectS, secsS] = process.argv.slice(2);
const expect = Number(expectS);
const deadline = Date.now() + Number(secsS) * 1000;
let stallAt = Number(process.env.STALL_AT ?? 0);
const stallSecs = Number(process.env.STALL_SECS ?? 0);

let connect, jetstream;
if (flavour === "v3") {
  ({ connect } = await import("@nats-io/transport-node"));
  ({ jetstream } = await import("@nats-io/jetstream"));
} else {
  const nats = await import("nats");
  connect = nats.connect;
  jetstream = (nc) => nc.jetstream();
}

const TROUBLE = new Set([
  "heartbeats_missed", "no_responders", "consumer_not_found", "stream_not_found",
  "consumer_deleted", "exceeded_limits",
]);
let errors = 0, disconnects = 0, dups = 0, maxGap = 0, resume = 0;
const seen = new Set();
const firstReply = new Map();

const nc = await connect({ servers: url, name: `js-${flavour}-${durable}`, maxReconnectAttempts: -1 });
(async () => {
  for await (const s of nc.status()) {
    if (s.type === "disconnect" || s.type === "reconnect") {
      disconnects++;
      console.error(`ERROR connection ${s.type}`);
    } else if (s.type === "error") {
      errors++;
      console.error(`ERROR connection error ${s.data ?? s.error ?? ""}`);
    }
  }
})();
let iter;
if (mode === "core") {
  iter = nc.subscribe(stream);
  await nc.flush();
} else {
  const js = jetstream(nc);
  const consumer = await js.consumers.get(stream, durable);
  iter = await consumer.consume({ max_messages: 256, expires: 5000 });
  (async () => {
    for await (const s of await iter.status()) {
      if (TROUBLE.has(s.type)) {
        errors++;
        console.error(`ERROR consumer status ${JSON.stringify(s)}`);
      }
    }
  })();
}
console.log("READY");

let last = Date.now();
let probed = false;
const timer = setInterval(() => {
  if (Date.now() > deadline) (iter.stop ?? iter.unsubscribe).call(iter);
}, 200);
for await (const m of iter) {
  const text = new TextDecoder().decode(m.data);
  if (text === "p") {
    if (!probed) {
      probed = true;
      console.log("PROBED");
    }
    continue;
  }
  const now = Date.now();
  if (seen.size > 0 && now - last > maxGap) {
    maxGap = now - last;
    resume = now;
  }
  last = now;
  const n = Number(text);
  if (seen.has(n)) {
    dups++;
    console.error(`DUP ${n} first=${firstReply.get(n)} again=${m.reply ?? ""}`);
  } else {
    firstReply.set(n, m.reply ?? "");
  }
  seen.add(n);
  if (stallAt > 0 && seen.size === stallAt) {
    stallAt = 0;
    console.log("STALLED");
    await new Promise((r) => setTimeout(r, stallSecs * 1000));
    console.log("RESUMED");
  }
  if (mode !== "core") m.ack();
  if (seen.size >= expect) break;
}
clearInterval(timer);
await nc.flush().catch(() => { errors++; });
console.log(`RESULT received=${seen.size} dups=${dups} errors=${errors} disconnects=${disconnects} max_gap_ms=${maxGap} resume_unix_ms=${resume}`);
process.exit(seen.size < expect || errors > 0 || disconnects > 0 ? 1 : 0);

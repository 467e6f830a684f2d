"""A nats-py JetStream pull consumer in the usual fetch loop: pull_subscribe_bind, then
fetch(64, timeout=1) and ack each message. A fetch that times out with nothing is normal;
any other error, disconnect or reconnect is counted and fails the run.

usage: consumer.py URL STREAM CONSUMER EXPECT DEADLINE_SECS
prints: RESULT received=N dups=N errors=N disconnects=N max_gap_ms=N resume_unix_ms=N
"""

import asyncio
import sys
import time

import nats
from nats.errors import TimeoutError as NatsTimeout


async def main(url, stream, durable, expect, secs):
    counts = {"errors": 0, "disconnects": 0}

    async def on_disconnect():
        counts["disconnects"] += 1
        print("ERROR disconnected", file=sys.stderr, flush=True)

    async def on_reconnect():
        counts["disconnects"] += 1
        print("ERROR reconnected", file=sys.stderr, flush=True)

    async def on_error(e):
        counts["errors"] += 1
        print(f"ERROR async: {e!r}", file=sys.stderr, flush=True)

    nc = await nats.connect(url, name=f"py-{durable}", max_reconnect_attempts=-1,
                            disconnected_cb=on_disconnect, reconnected_cb=on_reconnect,
                            error_cb=on_error)
    js = nc.jetstream()
    psub = await js.pull_subscribe_bind(durable=durable, stream=stream)
    print("READY", flush=True)
    seen, dups, max_gap, resume = set(), 0, 0.0, 0.0
    last = time.time()
    deadline = time.time() + secs
    while len(seen) < expect and time.time() < deadline:
        try:
            msgs = await psub.fetch(64, timeout=1)
        except NatsTimeout:
            continue
        except Exception as e:  # noqa: BLE001 - every other error counts
            counts["errors"] += 1
            print(f"ERROR fetch: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            continue
        for m in msgs:
            now = time.time()
            if now - last > max_gap:
                max_gap, resume = now - last, now
            last = now
            n = int(m.data.decode())
            if n in seen:
                dups += 1
            seen.add(n)
            await m.ack()
    print(f"RESULT received={len(seen)} dups={dups} errors={counts['errors']} "
          f"disconnects={counts['disconnects']} max_gap_ms={int(max_gap * 1000)} "
          f"resume_unix_ms={int(resume * 1000)}", flush=True)
    ok = len(seen) >= expect and counts["errors"] == 0 and counts["disconnects"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    a = sys.argv[1:]
    sys.exit(asyncio.run(main(a[0], a[1], a[2], int(a[3]), int(a[4]))))

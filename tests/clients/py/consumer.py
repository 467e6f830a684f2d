"""A consumer written as a nats-py user writes one. js mode: pull_subscribe_bind, then
fetch(64, timeout=1) and ack each message; core mode: a plain subscription. A fetch that
times out with nothing is normal; any other error, disconnect or reconnect is counted and
fails the run. Payloads are numbers 1..EXPECT; "p" is a probe (answered with PROBED, once).
STALL_AT=N STALL_SECS=S (environment): a blocked downstream, the N-th message's handling
(before its ack) blocks S seconds once, between STALLED and RESUMED on stdout.

usage: consumer.py js URL STREAM CONSUMER EXPECT DEADLINE_SECS
       consumer.py core URL SUBJECT - EXPECT DEADLINE_SECS
prints: RESULT received=N dups=N errors=N disconnects=N max_gap_ms=N resume_unix_ms=N
"""

import asyncio
import os
import sys
import time

import nats
from nats.errors import TimeoutError as NatsTimeout


async def main(mode, url, stream, durable, expect, secs):
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
    state = {"seen": set(), "dups": 0, "max_gap": 0.0, "resume": 0.0,
             "last": time.time(), "probed": False}

    first = {}

    def record(data, reply):
        if data == b"p":
            if not state["probed"]:
                state["probed"] = True
                print("PROBED", flush=True)
            return
        now = time.time()
        if state["seen"] and now - state["last"] > state["max_gap"]:
            state["max_gap"], state["resume"] = now - state["last"], now
        state["last"] = now
        n = int(data.decode())
        if n in state["seen"]:
            state["dups"] += 1
            print(f"DUP {n} first={first.get(n)} again={reply}", file=sys.stderr, flush=True)
        else:
            first[n] = reply
        state["seen"].add(n)

    deadline = time.time() + secs
    stall = {"at": int(os.environ.get("STALL_AT", 0)), "secs": int(os.environ.get("STALL_SECS", 0))}
    if mode == "core":
        sub = await nc.subscribe(stream)
        await nc.flush()
        print("READY", flush=True)
        while len(state["seen"]) < expect and time.time() < deadline:
            try:
                m = await sub.next_msg(timeout=1)
            except NatsTimeout:
                continue
            record(m.data, m.reply)
    else:
        js = nc.jetstream()
        psub = await js.pull_subscribe_bind(durable=durable, stream=stream)
        print("READY", flush=True)
        while len(state["seen"]) < expect and time.time() < deadline:
            try:
                msgs = await psub.fetch(64, timeout=1)
            except NatsTimeout:
                continue
            except Exception as e:  # noqa: BLE001 - every other error counts
                counts["errors"] += 1
                print(f"ERROR fetch: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                continue
            for m in msgs:
                record(m.data, m.reply)
                if stall["at"] and len(state["seen"]) == stall["at"]:
                    stall["at"] = 0
                    print("STALLED", flush=True)
                    await asyncio.sleep(stall["secs"])
                    print("RESUMED", flush=True)
                await m.ack()
    seen, dups = state["seen"], state["dups"]
    max_gap, resume = state["max_gap"], state["resume"]
    print(f"RESULT received={len(seen)} dups={dups} errors={counts['errors']} "
          f"disconnects={counts['disconnects']} max_gap_ms={int(max_gap * 1000)} "
          f"resume_unix_ms={int(resume * 1000)}", flush=True)
    ok = len(seen) >= expect and counts["errors"] == 0 and counts["disconnects"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    a = sys.argv[1:]
    sys.exit(asyncio.run(main(a[0], a[1], a[2], a[3], int(a[4]), int(a[5]))))

"""nats-py's push consumer with idle heartbeats, bound to an existing durable, acking by
hand when told, through natsproxy.

nats-py compares every idle heartbeat's Nats-Last-Consumer with the consumer sequence
of the last message it got, and reports ConsumerSequenceMismatchError to the error
callback when they differ. Any library error, disconnect or reconnect is counted.

usage: redelivery.py URL STREAM DURABLE SUBJECT
stdin: "ack" acks the last message got, flushes, and prints ACKED; "end" ends.
prints: READY; GOT <payload> <delivered count> <consumer seq> per message;
RESULT got=N errors=N disconnects=N
"""

import asyncio
import sys

import nats


async def main(url, stream, durable, subject):
    counts = {"errors": 0, "disconnects": 0, "got": 0}
    closing = {"now": False}

    def error(what):
        counts["errors"] += 1
        print(f"ERROR {what}", file=sys.stderr, flush=True)

    async def on_error(e):
        # vars(): a ConsumerSequenceMismatchError's sequences are attributes only.
        error(f"async: {type(e).__name__}: {vars(e) or e!r}")

    async def on_disconnect():
        if closing["now"]:
            return  # our own close
        counts["disconnects"] += 1
        print("ERROR disconnected", file=sys.stderr, flush=True)

    async def on_reconnect():
        counts["disconnects"] += 1
        print("ERROR reconnected", file=sys.stderr, flush=True)

    nc = await nats.connect(url, name="py-redelivery", max_reconnect_attempts=-1,
                            disconnected_cb=on_disconnect, reconnected_cb=on_reconnect,
                            error_cb=on_error)
    js = nc.jetstream()
    last = {"msg": None}

    async def cb(msg):
        counts["got"] += 1
        last["msg"] = msg
        md = msg.metadata
        print(f"GOT {msg.data.decode()} {md.num_delivered} {md.sequence.consumer}", flush=True)

    await js.subscribe(subject, durable=durable, stream=stream, manual_ack=True, cb=cb)
    print("READY", flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = (await reader.readline()).decode().strip()
        if line == "ack" and last["msg"] is not None:
            await last["msg"].ack()
            await nc.flush()
            print("ACKED", flush=True)
        elif line in ("end", ""):
            break
    closing["now"] = True
    await nc.close()
    print(f"RESULT got={counts['got']} errors={counts['errors']} "
          f"disconnects={counts['disconnects']}", flush=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    asyncio.run(main(a[0], a[1], a[2], a[3]))

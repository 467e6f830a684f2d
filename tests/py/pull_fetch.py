"""A nats-py JetStream pull consumer in the usual `fetch` loop, for the proxy's tests.

Usage: pull_fetch.py NATS_URL
Prints one line per message ("<payload> <delivery count>") and acks it. A fetch timeout
(no messages) is normal; any other exception is printed as "ERR <type>: <text>" and ends
the loop, as an application that treats errors as fatal would.
"""

import asyncio
import sys

import nats
from nats.errors import TimeoutError as NatsTimeout


async def main(url: str) -> int:
    nc = await nats.connect(url, name="py-consumer", max_reconnect_attempts=-1)
    js = nc.jetstream()
    psub = await js.pull_subscribe_bind(durable="CV", stream="LOGS")
    print("READY", flush=True)
    while True:
        try:
            msgs = await psub.fetch(100, timeout=5)
        except NatsTimeout:
            continue
        except Exception as e:  # noqa: BLE001 - any other error ends the consumer
            print(f"ERR {type(e).__name__}: {e}", flush=True)
            return 1
        for m in msgs:
            print(f"{m.data.decode()} {m.metadata.num_delivered}", flush=True)
            await m.ack()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1])))

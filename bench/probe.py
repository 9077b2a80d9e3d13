"""Raw capacity probe: how fast a simulated host can be crawled on this machine.

A host's nominal capacity (workers / service time) is not what a client can
reach here: the server and the client share 2 cores, and every request costs
some CPU on both sides. The probe measures the reachable ceiling with the
cheapest possible client, so that crawl figures are ratios to something real:
an asyncio HTTP/1.1 client with one keep-alive connection per request in
flight, holding exactly ``concurrency`` requests in flight (for a queue host:
its number of workers, so that nothing ever waits in the host's queue).

Run alone: ``python -m bench.probe http://127.0.0.1:PORT 8 2000``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit


class _Probe:
    """Shared state of the connections of one probe."""

    def __init__(self, url: str, pages: int, path_prefix: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.pages = pages
        self.path_prefix = path_prefix
        self.next_index = 0
        self.first_sent: float | None = None
        self.done_times: list[float] = []
        self.statuses: Counter[int] = Counter()

    async def connection_loop(self) -> None:
        """One keep-alive connection, one request at a time, until done."""
        reader, writer = await asyncio.open_connection(self.host, self.port)
        host_header = f"{self.host}:{self.port}"
        try:
            while self.next_index < self.pages:
                index = self.next_index
                self.next_index += 1
                if self.first_sent is None:
                    self.first_sent = time.time()
                writer.write(
                    f"GET {self.path_prefix}{index} HTTP/1.1\r\nHost: {host_header}"
                    "\r\nAccept: */*\r\n\r\n".encode()
                )
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                        break
                if length:
                    await reader.readexactly(length)
                self.statuses[status] += 1
                if status == 200:
                    self.done_times.append(time.time())
        finally:
            writer.close()


async def probe_async(
    url: str, concurrency: int, pages: int, *, path_prefix: str = "/probe/"
) -> dict[str, Any]:
    """Fetch ``pages`` pages with exactly ``concurrency`` in flight.

    Times are epoch seconds (``time.time()``), comparable with the server's
    ``first_arrival_epoch`` to align timelines on host-time.
    """
    state = _Probe(url, pages, path_prefix)
    started = time.time()
    await asyncio.gather(*(state.connection_loop() for _ in range(concurrency)))
    done = state.done_times
    elapsed = done[-1] - state.first_sent if done and state.first_sent else 0.0
    return {
        "pages": len(done),
        "pages_per_second": len(done) / elapsed if elapsed > 0 else 0.0,
        "elapsed": elapsed,
        "wall": time.time() - started,
        "first_sent_epoch": state.first_sent,
        "concurrency": concurrency,
        "status_counts": {str(k): v for k, v in state.statuses.items()},
        "done_epochs": done,
    }


def probe(url: str, concurrency: int, pages: int, **kwargs: Any) -> dict[str, Any]:
    """Synchronous wrapper of :func:`probe_async` (runs its own event loop).

    Inside a running event loop (e.g. a test under pytest-twisted's asyncio
    reactor) the probe runs in a worker thread with a loop of its own.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(probe_async(url, concurrency, pages, **kwargs))
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(
            asyncio.run, probe_async(url, concurrency, pages, **kwargs)
        ).result()


if __name__ == "__main__":
    result = probe(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    result.pop("done_epochs")
    print(result)

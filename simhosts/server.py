"""The simulated-hosts server process (see :mod:`simhosts` for the hosts).

Runs in the subprocess that :class:`simhosts.SimHosts` starts; the reactor is
imported only here, so the parent-side API works under any reactor, or none.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import threading
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from simhosts.config import CONTROL_PATHS, draw_service, load_config


def _format_seconds(value: float) -> bytes:
    """Retry-After value: an integer when it is one (the common form)."""
    return (str(int(value)) if float(value).is_integer() else str(value)).encode()


class _Job:
    """A request held by a host, from arrival to answer."""

    __slots__ = ("arrival", "cancelled", "overrides", "record", "request")

    def __init__(
        self, request: Any, record: list[Any], overrides: dict[str, Any] | None
    ) -> None:
        self.request = request
        self.record = record
        self.overrides = overrides
        self.arrival = time.monotonic()
        self.cancelled = False


class Host:
    """The state and service model of one simulated host."""

    def __init__(self, config: dict[str, Any], reactor: Any) -> None:
        self.config = config
        self.reactor = reactor
        self.name: str = config["name"]
        self.kind: str = config["kind"]
        self.service_time = float(config["service_time"])
        self.retry_after_header = _format_seconds(float(config["retry_after"]))
        self.workers = int(config.get("workers", 0))
        self.queue_size = int(config.get("queue_size", 0))
        self.schedule = [
            (float(start), float(end), float(service))
            for start, end, service in config.get("schedule", [])
        ]
        self.rate = float(config.get("rate", 0))
        self.service_dist: dict[str, Any] = config.get(
            "service_dist", {"kind": "constant"}
        )
        self.rng = random.Random(config.get("seed", 1))
        robots = config.get("robots_txt")
        self.robots_txt = robots.encode() if isinstance(robots, str) else None
        # Service state survives /_reset: requests in service keep their
        # workers; only the records and the host clock start over.
        self.busy = 0
        self.queue: deque[_Job] = deque()
        self.in_service = 0
        self.window: deque[float] = deque()
        self.reset()

    def reset(self) -> None:
        self.records: list[list[Any]] = []
        self.connections = 0
        self.start_monotonic: float | None = None
        self.first_arrival_epoch: float | None = None
        self.max_concurrency = 0
        self.status_counts: Counter[int] = Counter()

    def host_time(self, now: float) -> float:
        if self.start_monotonic is None:
            self.start_monotonic = now
            self.first_arrival_epoch = time.time()
        return now - self.start_monotonic

    def stats(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "arrivals": self.records,
            "max_concurrency": self.max_concurrency,
            "status_counts": {str(k): v for k, v in self.status_counts.items()},
            "requests": len(self.records),
            "first_arrival_epoch": self.first_arrival_epoch,
            "connections": self.connections,
        }

    def held(self) -> int:
        if self.kind == "queue":
            return self.busy + len(self.queue)
        return self.in_service

    def service_time_at(self, host_time: float) -> float:
        for start, end, service in self.schedule:
            if start <= host_time < end:
                return service
        return self.service_time

    # -- arrival -----------------------------------------------------------

    def arrive(self, request: Any) -> None:
        now = time.monotonic()
        t = self.host_time(now)
        overrides = _parse_overrides(request) if b"?" in request.uri else None
        record: list[Any] = [round(t, 6), request.uri.decode("latin-1"), 0, 0, 0.0]
        self.records.append(record)
        job = _Job(request, record, overrides)

        if request.path == b"/robots.txt":
            if self.robots_txt is None:
                self.respond(job, 404, b"Not Found", content_type=b"text/plain")
            else:
                self.respond(job, 200, self.robots_txt, content_type=b"text/plain")
            return

        if self.kind == "queue":
            if self.busy < self.workers:
                self.busy += 1
                self.admit(job)
                self.start_service(job, t)
            elif len(self.queue) < self.queue_size:
                self.queue.append(job)
                self.admit(job)
            else:
                record[2] = self.held()
                self.respond_overloaded(job, 503)
        elif self.kind == "ratelimit":
            cutoff = now - 1.0
            window = self.window
            while window and window[0] <= cutoff:
                window.popleft()
            if len(window) >= self.rate:
                record[2] = self.held()
                self.respond_overloaded(job, 429)
            else:
                window.append(now)
                self.in_service += 1
                self.admit(job)
                self.start_service(job, t)
        else:
            self.in_service += 1
            self.admit(job)
            self.start_service(job, t)

    def admit(self, job: _Job) -> None:
        held = self.held()
        job.record[2] = held
        self.max_concurrency = max(self.max_concurrency, held)
        # Only held requests need to know about a client that goes away: a
        # queued one must give up its place, a served one must not be written.
        job.request.notifyFinish().addErrback(self._client_gone, job)

    def _client_gone(self, _failure: Any, job: _Job) -> None:
        job.cancelled = True
        if self.kind == "queue":
            # Not in the queue if already in service: the worker stays busy.
            with contextlib.suppress(ValueError):
                self.queue.remove(job)

    def start_service(self, job: _Job, host_time: float) -> None:
        service = self.service_time_at(host_time)
        if self.service_dist["kind"] != "constant":
            service = draw_service(
                self.service_dist, service, self.service_time, self.rng
            )
        if job.overrides and "delay" in job.overrides:
            service += job.overrides["delay"]
        if service <= 0:
            self.finish_service(job)
        else:
            self.reactor.callLater(service, self.finish_service, job)

    def finish_service(self, job: _Job) -> None:
        if self.kind == "queue":
            # Hand the worker to the next queued request before answering, so
            # the host never idles a worker while work is waiting.
            if self.queue:
                following = self.queue.popleft()
                now = time.monotonic()
                self.start_service(following, self.host_time(now))
            else:
                self.busy -= 1
        else:
            self.in_service -= 1
        if job.cancelled:
            return
        self.respond_served(job)

    # -- answers -------------------------------------------------------------

    def respond_overloaded(self, job: _Job, status: int) -> None:
        self.respond(
            job,
            status,
            b"Overloaded",
            extra=[(b"Retry-After", self.retry_after_header)],
        )

    def respond_served(self, job: _Job) -> None:
        overrides = job.overrides
        if not overrides:
            self.respond(job, 200, _page(job.request.path))
            return
        if overrides.get("drop"):
            self.status_counts[0] += 1
            job.record[4] = round(time.monotonic() - job.arrival, 6)
            job.request.channel.transport.abortConnection()
            return
        status = overrides.get("status", 200)
        extra = list(overrides.get("headers", ()))
        if "redirect" in overrides:
            status = overrides.get("status", 302)
            extra.append((b"Location", overrides["redirect"]))
        if "body_size" in overrides:
            body = b"x" * overrides["body_size"]
        else:
            body = _page(job.request.path)
        self.respond(job, status, body, extra=extra)

    def respond(
        self,
        job: _Job,
        status: int,
        body: bytes,
        *,
        content_type: bytes = b"text/html; charset=utf-8",
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        request = job.request
        request.setResponseCode(status)
        request.setHeader(b"Content-Type", content_type)
        request.setHeader(b"Content-Length", b"%d" % len(body))
        if extra:
            for name, value in extra:
                request.responseHeaders.addRawHeader(name, value)
        request.write(body)
        request.finish()
        job.record[3] = status
        job.record[4] = round(time.monotonic() - job.arrival, 6)
        self.status_counts[status] += 1


def _page(path: bytes) -> bytes:
    return b"<html><body><p>%s</p></body></html>" % path


def _parse_overrides(request: Any) -> dict[str, Any] | None:
    query = request.uri.split(b"?", 1)[1].decode("latin-1")
    params = parse_qs(query)
    overrides: dict[str, Any] = {}
    if "status" in params:
        overrides["status"] = int(params["status"][0])
    if "delay" in params:
        overrides["delay"] = float(params["delay"][0])
    if "redirect" in params:
        overrides["redirect"] = params["redirect"][0].encode("latin-1")
    if "body_size" in params:
        overrides["body_size"] = int(params["body_size"][0])
    if params.get("drop", ["0"])[0] not in ("0", ""):
        overrides["drop"] = True
    if "header" in params:
        headers = []
        for header in params["header"]:
            name, _, value = header.partition(":")
            headers.append((name.strip().encode(), value.strip().encode()))
        overrides["headers"] = headers
    return overrides or None


class HostResource(Resource):
    """Every path of one host's port: control endpoints, else the host model."""

    # A leaf resource: no child lookup per request, every path lands here.
    isLeaf = True

    def __init__(self, host: Host) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.host = host

    def render(self, request: Any) -> Any:
        path = request.path
        if path in CONTROL_PATHS:
            return self.render_control(request, path)
        self.host.arrive(request)
        return NOT_DONE_YET

    def render_control(self, request: Any, path: bytes) -> bytes:
        host = self.host
        if path == b"/_stats":
            data: Any = host.stats()
        elif path == b"/_reset":
            host.reset()
            data = {"reset": host.name}
        else:
            data = host.config
        request.setHeader(b"Content-Type", b"application/json")
        return json.dumps(data).encode()


class QuietSite(Site):
    """A Site without access log (formatting a log line per request would cost
    more than serving the request) that counts its connections."""

    def __init__(self, resource: HostResource) -> None:
        super().__init__(resource)  # type: ignore[no-untyped-call]
        self.displayTracebacks = False
        self.host = resource.host

    def buildProtocol(self, addr: Any) -> Any:
        self.host.connections += 1
        return super().buildProtocol(addr)  # type: ignore[no-untyped-call]

    def log(self, request: Any) -> None:
        pass


def serve(hosts: list[dict[str, Any]], *, watch_stdin: bool = False) -> None:
    """Listen for every host, print the ports line, run until stopped."""
    # Imported here: importing the reactor installs the default one, which
    # must not happen in a parent process that uses another (e.g. pytest's
    # asyncio reactor).
    from twisted.internet import reactor as installed

    reactor: Any = installed
    ports: dict[str, int] = {}
    for config in hosts:
        host = Host(config, reactor)
        listening = reactor.listenTCP(
            int(config["port"]),
            QuietSite(HostResource(host)),
            backlog=512,
            interface="127.0.0.1",
        )
        ports[host.name] = listening.getHost().port

    if watch_stdin:
        # The parent keeps our stdin open; EOF means it is gone (even if it was
        # killed), so we stop instead of lingering as an orphan.
        def wait_for_eof() -> None:
            try:
                while sys.stdin.buffer.read(65536):
                    pass
            finally:
                reactor.callFromThread(reactor.stop)

        threading.Thread(target=wait_for_eof, daemon=True).start()

    sys.stdout.write(json.dumps({"ports": ports, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    reactor.run()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m simhosts",
        description="Simulated web hosts for the tests and the benchmark.",
    )
    parser.add_argument(
        "--config",
        required=True,
        help="JSON file with the host configs, or '-' for one JSON line on stdin",
    )
    parser.add_argument(
        "--watch-stdin",
        action="store_true",
        help="exit when stdin reaches EOF (used by SimHosts to die with its parent)",
    )
    args = parser.parse_args(argv)
    if args.config == "-":
        data = json.loads(sys.stdin.buffer.readline())
    else:
        data = json.loads(Path(args.config).read_text())
    serve(load_config(data), watch_stdin=args.watch_stdin)

"""Simulated web hosts for the tests and the benchmark.

One Twisted web server process listens on 127.0.0.1 with one port per simulated
host. Each host models a server whose capacity is known exactly, so that a
crawl's throughput can be compared with it:

``queue``
    ``workers`` parallel workers, each taking ``service_time`` seconds per
    request, and a FIFO queue of ``queue_size`` requests (default 16) in front
    of them. A request that finds the queue full is answered at once with
    ``503`` and ``Retry-After``: the host of the guide
    "Adapting Crawl Rate to Host Latency" (capacity = workers / service_time).
    ``schedule`` (a list of ``[t_start, t_end, service_time]``) changes the
    service time for requests that *start service* at host-time ``t`` in
    ``[t_start, t_end)``. ``service_dist`` makes the service time of each
    request random around that base (drawn from an RNG seeded by ``seed``,
    default 1, so runs are reproducible):

    * ``{"kind": "constant"}`` (the default): the base, exactly;
    * ``{"kind": "lognormal", "sigma": 0.6}``: base x exp(N(0, sigma)), so
      the base is the median;
    * ``{"kind": "bimodal", "fast": 0.005, "slow": 0.08, "fast_share":
      0.7}``: *fast* or *slow* seconds (cache hits and misses), scaled by
      base / the scenario's ``service_time`` during a ``schedule`` entry;
    * ``{"kind": "heavy_tailed", "share": 0.05, "low": 10, "high": 50}``: a
      *share* of requests take *low* to *high* times the base (uniform), the
      others the base.
``ratelimit``
    At most ``rate`` requests in any sliding 1-second window are served (after
    ``service_time``, with unlimited parallelism); the others get ``429`` with
    ``Retry-After`` at once.
``unlimited``
    Every request is served after ``service_time`` (may be 0).

Every host also accepts:

* ``retry_after`` (default 1): value of the ``Retry-After`` header of 503/429;
* ``robots_txt``: body served at ``/robots.txt`` (else ``/robots.txt`` is 404).
  ``/robots.txt`` is recorded but answered at once, outside the host's limits;
* ``port``: port to listen on (default 0: any free port).

Per-request overrides, as query parameters (for tests): ``status=<int>`` (answer
with that status after the normal service), ``delay=<seconds>`` (extra service
time), ``header=<Name>:<Value>`` (repeatable), ``redirect=<url>`` (302 to it),
``body_size=<bytes>``, ``drop=1`` (abort the connection instead of answering,
which the client sees as a download error).

Host-time 0 is the arrival of the first recorded request (or of the first one
after ``/_reset``). For each recorded request the host keeps ``[t, path,
concurrent, status, response_time]`` where ``concurrent`` is the number of
requests the host holds right after this arrival, this one included if it was
admitted (queue host: in service + queued; shed requests are not held, so their
value is the full count that caused the shedding), ``status`` is what was sent
(0 if nothing was: dropped, or the client went away) and ``response_time`` the
seconds between arrival and answer as measured by the server.

Control endpoints on every port, never recorded and never limited:
``/_stats`` (JSON: ``name``, ``kind``, ``arrivals``, ``max_concurrency``,
``status_counts``, ``requests``, ``first_arrival_epoch`` and ``connections``,
the TCP connections accepted), ``/_reset`` and ``/_config``.

Run it as ``python -m bench.simhosts --config hosts.json`` (or ``--config -``
to read one JSON line from stdin); the process prints ``{"ports": {name:
port}}`` as one JSON line on stdout once it is listening. A JSON config is a
list of host dicts or ``{"hosts": [...]}``. From Python, use :class:`SimHosts`.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import math
import os
import random
import select
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter, deque
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs

from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

CONTROL_PATHS = (b"/_stats", b"/_reset", b"/_config")
KINDS = ("queue", "ratelimit", "unlimited")
PROJECT_ROOT = Path(__file__).resolve().parent.parent


SERVICE_DISTS = ("constant", "lognormal", "bimodal", "heavy_tailed")


def validate_service_dist(name: str, dist: Any) -> dict[str, Any]:
    """Return *dist* with defaults filled in; raise ValueError naming the field."""
    if not isinstance(dist, dict):
        raise ValueError(f"host {name!r}: 'service_dist' must be a dict, not {dist!r}")
    dist = dict(dist)
    kind = dist.setdefault("kind", "constant")
    if kind not in SERVICE_DISTS:
        raise ValueError(
            f"host {name!r}: service_dist 'kind' must be one of {SERVICE_DISTS}, "
            f"not {kind!r}"
        )

    def number(field: str, default: float, low: float, high: float) -> None:
        value = dist.setdefault(field, default)
        if not isinstance(value, int | float) or not low <= float(value) <= high:
            raise ValueError(
                f"host {name!r}: service_dist {kind!r} needs {field!r} in "
                f"[{low}, {high}], not {value!r}"
            )

    if kind == "lognormal":
        number("sigma", 0.6, 0.0, 5.0)
    elif kind == "bimodal":
        number("fast", 0.005, 0.0, 3600.0)
        number("slow", 0.08, 0.0, 3600.0)
        number("fast_share", 0.7, 0.0, 1.0)
    elif kind == "heavy_tailed":
        number("share", 0.05, 0.0, 1.0)
        number("low", 10.0, 0.0, 1e6)
        number("high", 50.0, 0.0, 1e6)
        if dist["high"] < dist["low"]:
            raise ValueError(
                f"host {name!r}: service_dist 'high' ({dist['high']!r}) is below "
                f"'low' ({dist['low']!r})"
            )
    return dist


def draw_service(dist: dict[str, Any], base: float, nominal: float, rng: Any) -> float:
    """One request's service time for a validated *dist* around *base*.

    *nominal* is the host's own ``service_time``: bimodal times scale with
    ``base / nominal`` (a slowdown slows hits and misses alike).
    """
    kind = dist["kind"]
    if kind == "lognormal":
        return base * math.exp(rng.gauss(0.0, dist["sigma"]))
    if kind == "bimodal":
        scale = base / nominal if nominal > 0 else 1.0
        value = dist["fast"] if rng.random() < dist["fast_share"] else dist["slow"]
        return float(value) * scale
    if kind == "heavy_tailed":
        if rng.random() < dist["share"]:
            return base * rng.uniform(dist["low"], dist["high"])
        return base
    return base


def validate_host_config(config: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of one host's config with defaults filled in.

    Raises :class:`ValueError` naming the host and the field on a bad value, so
    that a broken test or benchmark config fails before the server starts.
    """
    host = dict(config)
    name = host.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"host config needs a non-empty 'name': {config!r}")
    kind = host.get("kind")
    if kind not in KINDS:
        raise ValueError(f"host {name!r}: 'kind' must be one of {KINDS}, not {kind!r}")
    host.setdefault("service_time", 0.0)
    host.setdefault("retry_after", 1)
    host.setdefault("port", 0)
    if float(host["service_time"]) < 0:
        raise ValueError(f"host {name!r}: negative service_time")
    if kind == "queue":
        host.setdefault("queue_size", 16)
        host.setdefault("schedule", [])
        if int(host.get("workers", 0)) < 1:
            raise ValueError(f"host {name!r}: kind 'queue' needs 'workers' >= 1")
        host["service_dist"] = validate_service_dist(
            name, host.get("service_dist", {"kind": "constant"})
        )
        host.setdefault("seed", 1)
        for entry in host["schedule"]:
            if len(entry) != 3:
                raise ValueError(
                    f"host {name!r}: schedule entries are [t_start, t_end, "
                    f"service_time], not {entry!r}"
                )
    elif kind == "ratelimit" and float(host.get("rate", 0)) <= 0:
        raise ValueError(f"host {name!r}: kind 'ratelimit' needs 'rate' > 0")
    return host


def load_config(data: Any) -> list[dict[str, Any]]:
    """Accept a list of host configs or ``{"hosts": [...]}``; validate them."""
    hosts = data["hosts"] if isinstance(data, dict) else data
    if not isinstance(hosts, list) or not hosts:
        raise ValueError("config must be a non-empty list of hosts")
    validated = [validate_host_config(host) for host in hosts]
    names = [host["name"] for host in validated]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate host names in {names}")
    return validated


# --------------------------------------------------------------------------
# Server side (runs in the subprocess; the reactor is imported only there, so
# the parent-side API works under any reactor, or none).
# --------------------------------------------------------------------------


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
        prog="python -m bench.simhosts", description=__doc__.splitlines()[0]
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


# --------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------


class SimHosts:
    """Run simulated hosts in a subprocess and talk to them.

    Usage::

        with SimHosts([{"name": "A", "kind": "queue", "workers": 8,
                        "service_time": 0.02}]) as hosts:
            url = hosts.url("A", "/page/1")
            ...
            hosts.stats("A")["max_concurrency"]

    The subprocess is stopped by :meth:`stop`, by leaving the ``with`` block,
    at interpreter exit, and on its own when this process dies (it watches its
    stdin, which only this process holds open).
    """

    def __init__(self, hosts: list[dict[str, Any]], *, startup_timeout: float = 20.0):
        self.hosts = load_config(hosts)
        self.startup_timeout = startup_timeout
        self.ports: dict[str, int] = {}
        self.process: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None

    def __enter__(self) -> SimHosts:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> SimHosts:
        if self.process is not None:
            raise RuntimeError("SimHosts already started")
        # stderr goes to a file, not a pipe: nobody reads it while the server
        # runs, and a full pipe would block the server.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.simhosts", "--config", "-", "--watch-stdin"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=PROJECT_ROOT,
        )
        atexit.register(self.stop)
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"hosts": self.hosts}).encode() + b"\n")
        self.process.stdin.flush()
        try:
            line = self._read_ports_line()
            self.ports = {
                name: int(port) for name, port in json.loads(line)["ports"].items()
            }
        except Exception as exc:
            error = self._stderr_tail()
            self.stop()
            raise RuntimeError(
                f"simulated hosts failed to start: {exc}\n{error}"
            ) from exc
        return self

    def _read_ports_line(self) -> bytes:
        assert self.process is not None
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + self.startup_timeout
        data = b""
        while b"\n" not in data:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no ports line within {self.startup_timeout} s")
            readable, _, _ = select.select([fd], [], [], remaining)
            if readable:
                chunk = os.read(fd, 4096)
                if not chunk:
                    raise RuntimeError(
                        f"server exited with code {self.process.wait()} before "
                        "listening"
                    )
                data += chunk
        return data.split(b"\n", 1)[0]

    def _stderr_tail(self, lines: int = 20) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        text: str = self._stderr.read().decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        process, self.process = self.process, None
        atexit.unregister(self.stop)
        if process is None:
            return
        # Closing stdin asks the server to stop; terminate and kill are the
        # fallbacks if it does not within a few seconds.
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def port(self, name: str) -> int:
        try:
            return self.ports[name]
        except KeyError:
            raise KeyError(
                f"no simulated host {name!r}; hosts: {sorted(self.ports)}"
            ) from None

    def netloc(self, name: str) -> str:
        """``127.0.0.1:PORT``, the host's default throttling scope id."""
        return f"127.0.0.1:{self.port(name)}"

    def url(self, name: str, path: str = "/") -> str:
        if not path.startswith("/"):
            path = "/" + path
        return f"http://{self.netloc(name)}{path}"

    def _get_json(self, name: str, path: str) -> Any:
        with urllib.request.urlopen(self.url(name, path), timeout=10) as response:
            return json.loads(response.read())

    def stats(self, name: str) -> dict[str, Any]:
        """The host's ``/_stats``: arrivals, max concurrency, status counts."""
        result: dict[str, Any] = self._get_json(name, "/_stats")
        return result

    def reset(self, name: str | None = None) -> None:
        """Clear the records and host-time of one host (or of all)."""
        for host in [name] if name is not None else list(self.ports):
            self._get_json(host, "/_reset")

    def config(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._get_json(name, "/_config")
        return result

    def cpu_seconds(self) -> float | None:
        """CPU time (user + system) the server has used so far; Linux only."""
        if self.process is None:
            return None
        try:
            fields = (
                Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1]
            )
            utime, stime = fields.split()[11:13]
        except (OSError, IndexError, ValueError):
            return None
        return (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()

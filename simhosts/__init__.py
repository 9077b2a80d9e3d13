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

Run it as ``python -m simhosts --config hosts.json`` (or ``--config -``
to read one JSON line from stdin); the process prints ``{"ports": {name:
port}}`` as one JSON line on stdout once it is listening. A JSON config is a
list of host dicts or ``{"hosts": [...]}``. From Python, use :class:`SimHosts`.
"""

from simhosts.client import SimHosts
from simhosts.config import (
    CONTROL_PATHS,
    KINDS,
    SERVICE_DISTS,
    draw_service,
    load_config,
    validate_host_config,
    validate_service_dist,
)
from simhosts.server import Host, HostResource, QuietSite, main, serve

__all__ = [
    "CONTROL_PATHS",
    "KINDS",
    "SERVICE_DISTS",
    "Host",
    "HostResource",
    "QuietSite",
    "SimHosts",
    "draw_service",
    "load_config",
    "main",
    "serve",
    "validate_host_config",
    "validate_service_dist",
]

"""Parent side of the simulated hosts: start the server process, talk to it."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from simhosts.config import load_config

PROJECT_ROOT = Path(__file__).resolve().parent.parent


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
            [sys.executable, "-m", "simhosts", "--config", "-", "--watch-stdin"],
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

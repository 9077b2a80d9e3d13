"""A real ``redis-server`` for the shared-state tests.

:class:`RedisServer` starts the Debian package's ``redis-server`` on a free
127.0.0.1 port, in a temporary directory, with persistence off (``--save ""
--appendonly no``), and stops it; :meth:`RedisServer.stop` and
:meth:`RedisServer.start` again on the same port simulate a Redis lost and
restarted (empty) mid-crawl. The fixtures of ``tests/conftest.py`` skip
their tests, with a message saying how to install it, when there is no
``redis-server`` (``.ci/run`` installs it).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

INSTALL_HINT = (
    "redis-server is not installed: the shared-state tests (THROTTLING_STATE_URL) "
    "need it; install it with 'apt-get install -y redis-server' (.ci/run does)"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1."""

    def __init__(self, executable: str) -> None:
        self.executable = executable
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="throttling-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.process = subprocess.Popen(
            [
                self.executable,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def stop(self) -> None:
        process = self.process
        self.process = None
        if process is None:
            return
        process.kill()
        process.wait(10)

    def client(self) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


def find_redis_server() -> str | None:
    return shutil.which("redis-server")

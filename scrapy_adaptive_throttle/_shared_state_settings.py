"""The settings of the shared scope state (see :ref:`shared-state`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ._redis_client import URL_SCHEMES, redact_url
from ._settings import SettingsReader, to_float, to_int

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

#: Seconds a lease outlives :setting:`DOWNLOAD_TIMEOUT`: a request is
#: reserved a little before its download starts (downloader middlewares)
#: and released a little after it ends.
LEASE_MARGIN = 5.0


@dataclass(frozen=True)
class SharedStateSettings:
    """The shared-state settings of a crawl, read and validated once."""

    #: :setting:`THROTTLING_STATE_URL` (``None``: in-process state).
    url: str | None
    #: :setting:`THROTTLING_STATE_PREFIX`.
    prefix: str
    #: :setting:`THROTTLING_STATE_PROCESSES`.
    processes: int
    #: Seconds a lease lives: :setting:`DOWNLOAD_TIMEOUT` + :data:`LEASE_MARGIN`.
    lease_ttl: float

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> SharedStateSettings:
        """Read and validate *settings*; raise :exc:`ValueError` on bad input."""
        read = SettingsReader(settings)
        url = read.raw("THROTTLING_STATE_URL")
        if url is not None:
            if not isinstance(url, str) or not url.strip():
                raise ValueError(
                    f"Invalid THROTTLING_STATE_URL value {url!r}: expected a "
                    "redis://, rediss:// or unix:// URL, or None"
                )
            url = url.strip()
            scheme = urlsplit(url).scheme
            if scheme not in URL_SCHEMES:
                raise ValueError(
                    f"Invalid THROTTLING_STATE_URL value {redact_url(url)!r}: "
                    "expected a redis://, rediss:// or unix:// URL, or None"
                )
        prefix = read.raw("THROTTLING_STATE_PREFIX")
        if not isinstance(prefix, str) or not prefix or prefix != prefix.strip():
            raise ValueError(
                f"Invalid THROTTLING_STATE_PREFIX value {prefix!r}: expected a "
                "non-empty string without surrounding spaces"
            )
        processes = to_int(
            read.raw("THROTTLING_STATE_PROCESSES"),
            "THROTTLING_STATE_PROCESSES",
            minimum=1,
        )
        timeout = to_float(
            settings.get("DOWNLOAD_TIMEOUT", 180), "DOWNLOAD_TIMEOUT", minimum=0.0
        )
        return cls(
            url=url,
            prefix=prefix,
            processes=processes,
            lease_ttl=timeout + LEASE_MARGIN,
        )

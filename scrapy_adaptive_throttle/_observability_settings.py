"""The settings of the diagnostics extension, read and validated once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ._settings import (
    ThrottlingSettings,
    report_invalid_setting,
    to_bool,
    to_float,
    to_int,
)

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

__all__ = ["ObservabilitySettings"]


@dataclass(frozen=True)
class ObservabilitySettings:
    """The settings of this extension, read and validated once."""

    progress: bool
    progress_interval: float
    timeline_file: str | None
    timeline_interval: float
    timeline_scopes: int
    stats_scopes: int
    debug: bool

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ObservabilitySettings:
        throttling = ThrottlingSettings.from_crawler(crawler)
        try:
            return cls._read(crawler.settings, throttling)
        except ValueError as exc:
            report_invalid_setting(exc)
            raise

    @classmethod
    def _read(
        cls, settings: BaseSettings, throttling: ThrottlingSettings
    ) -> ObservabilitySettings:
        timeline = settings.get("THROTTLING_TIMELINE_FILE")
        if timeline is not None and not isinstance(timeline, (str, Path)):
            raise ValueError(
                f"Invalid THROTTLING_TIMELINE_FILE value {timeline!r}: expected a path"
            )
        return cls(
            progress=to_bool(
                settings.get("THROTTLING_PROGRESS", True), "THROTTLING_PROGRESS"
            ),
            progress_interval=to_float(
                settings.get("LOGSTATS_INTERVAL", 60.0), "LOGSTATS_INTERVAL"
            ),
            timeline_file=str(timeline) if timeline else None,
            timeline_interval=to_float(
                settings.get("THROTTLING_TIMELINE_INTERVAL", 1.0),
                "THROTTLING_TIMELINE_INTERVAL",
                minimum=0.01,
            ),
            timeline_scopes=to_int(
                settings.get("THROTTLING_TIMELINE_SCOPES", 10),
                "THROTTLING_TIMELINE_SCOPES",
                minimum=1,
            ),
            stats_scopes=to_int(
                settings.get("THROTTLING_STATS_SCOPES", 10), "THROTTLING_STATS_SCOPES"
            ),
            debug=throttling.debug,
        )

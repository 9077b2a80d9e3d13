"""Every documented form of a setting works in a real crawl.

The reference chapter documents ``RANDOMIZE_DOWNLOAD_DELAY = [-0.1, 0.3]``
(delays between ``delay * 0.9`` and ``delay * 1.3``) and this plugin's docs
``DOWNLOAD_DELAY_JITTER = [0, 0.5]``; Scrapy's own downloader cannot read a
list there (TypeError in ``Downloader.__init__``). Spacing is measured at
the server, on both reactors, with pages found from a callback.
"""

from __future__ import annotations

import itertools

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.engine_crawls import ADDON, REACTORS, crawl_follow

ON_BOTH_REACTORS = pytest.mark.parametrize("reactor", REACTORS)
DELAY = 0.2
#: Timer slack below the lower bound, and arrival jitter above the upper.
EARLY, LATE = 0.005, 0.06


def gaps(stats):
    times = sorted(record[0] for record in stats["arrivals"])
    return [later - earlier for earlier, later in itertools.pairwise(times)]


@ON_BOTH_REACTORS
@pytest.mark.parametrize(
    ("setting", "value"),
    [("DOWNLOAD_DELAY_JITTER", [0, 0.5]), ("RANDOMIZE_DOWNLOAD_DELAY", [-0.1, 0.3])],
)
@pytest.mark.filterwarnings(
    # Scrapy 2.19's own deprecation of the setting, said by its downloader.
    "ignore:The RANDOMIZE_DOWNLOAD_DELAY setting is deprecated"
)
@deferred_f_from_coro_f
async def test_a_low_high_jitter_spaces_requests_within_its_range(
    simhosts, reactor, setting, value
):
    hosts = simhosts({"name": "A", "kind": "unlimited", "service_time": 0.005})
    result = await crawl_follow(
        reactor,
        {
            "ADDONS": ADDON,
            "DOWNLOAD_DELAY": DELAY,
            setting: value,
            "CLOSESPIDER_TIMEOUT": 60,
        },
        [hosts.url("A")],
        depth=2,
        fanout=4,
    )
    assert result["finish_reason"] == "finished"
    assert result["lost"] == []
    assert len(result["responses"]) == 1 + 4 + 16
    spacing = gaps(hosts.stats("A"))
    assert len(spacing) == 20
    low, high = value
    assert min(spacing) >= DELAY * (1 + low) - EARLY
    assert max(spacing) <= DELAY * (1 + high) + LATE
    # The delay really is randomised, not fixed at one end of the range.
    assert max(spacing) - min(spacing) > 0.01

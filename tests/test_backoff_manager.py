"""Backoff at the manager and scope-manager level, with a fake clock.

The manager is built from a crawler (``get_crawler``), its clock replaced by a
hand-advanced one; responses and exceptions are real Scrapy objects. Nothing
here downloads: the real crawls are in ``test_backoff_crawl.py``.
"""

from __future__ import annotations

import logging
import math
from email.utils import formatdate
from time import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy import Request
from scrapy.exceptions import DownloadFailedError, DownloadTimeoutError
from scrapy.http import Response
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_adaptive_throttle import ThrottlingManager
from tests.fake_clock import FakeClock

SCOPE = "example.com"
URL = f"https://{SCOPE}/page"


def make_manager(**settings: Any) -> tuple[ThrottlingManager, FakeClock]:
    base = {"BACKOFF_JITTER": 0, "DOWNLOAD_DELAY_JITTER": 0, "DOWNLOAD_DELAY": 0}
    crawler = get_crawler(settings_dict={**base, **settings})
    manager = ThrottlingManager(crawler)
    clock = FakeClock()
    manager.clock = clock
    return manager, clock


def response(
    status: int = 200, headers: dict[str, Any] | None = None, **meta: Any
) -> Response:
    return Response(
        URL, status=status, headers=headers, request=Request(URL, meta=meta)
    )


def state(manager: ThrottlingManager, scope: str = SCOPE) -> dict[str, Any]:
    return manager.get_scope_state(scope)


def stats(manager: ThrottlingManager) -> dict[str, Any]:
    assert manager.crawler.stats is not None
    return {
        key: value
        for key, value in manager.crawler.stats.get_stats().items()
        if key.startswith("throttling/")
    }


def can_send(manager: ThrottlingManager, now: float, scope: str = SCOPE) -> float:
    return float(manager.get_scope_manager(scope).can_send(now))


# -- exponential steps and recovery ---------------------------------------------


def test_triggers_grow_the_delay_exponentially_up_to_the_cap() -> None:
    manager, _ = make_manager(BACKOFF_MAX_DELAY=10.0)
    delays = []
    for _ in range(6):
        manager.apply_backoff(SCOPE, now=0.0)
        delays.append(state(manager)["delay"])
    assert delays == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert state(manager)["backoff_level"] == 6


def test_a_step_spaces_the_next_send_from_the_trigger() -> None:
    manager, _ = make_manager()
    manager.apply_backoff(SCOPE, now=5.0)
    manager.apply_backoff(SCOPE, now=5.0)
    assert can_send(manager, 5.0) == pytest.approx(2.0)
    assert can_send(manager, 7.0) == 0.0
    scope_manager = manager.get_scope_manager(SCOPE)
    scope_manager.record_sent(7.0)
    assert can_send(manager, 8.0) == pytest.approx(1.0)


def test_recovery_takes_one_step_per_quiet_window() -> None:
    manager, _ = make_manager(BACKOFF_WINDOW=10.0, DOWNLOAD_DELAY=0.25)
    for _ in range(4):  # 1, 2, 4, 8
        manager.apply_backoff(SCOPE, now=0.0)
    seen = []
    for now in (9.9, 10.0, 19.9, 20.0, 30.0, 40.0, 50.0):
        can_send(manager, now)
        seen.append((state(manager)["delay"], state(manager)["backoff_level"]))
    assert seen == [
        (8.0, 4),
        (4.0, 3),
        (4.0, 3),
        (2.0, 2),
        (1.0, 1),
        (0.25, 0),  # back to the configured delay
        (0.25, 0),
    ]


def test_a_new_trigger_restarts_the_recovery_countdown() -> None:
    manager, _ = make_manager(BACKOFF_WINDOW=10.0)
    manager.apply_backoff(SCOPE, now=0.0)
    manager.apply_backoff(SCOPE, now=0.0)  # delay 2
    manager.apply_backoff(SCOPE, now=9.0)  # delay 4, countdown from 9
    can_send(manager, 18.9)
    assert state(manager)["delay"] == 4.0
    can_send(manager, 19.0)
    assert state(manager)["delay"] == 2.0


def test_idle_windows_are_caught_up_at_once() -> None:
    manager, _ = make_manager(BACKOFF_WINDOW=1.0)
    for _ in range(3):
        manager.apply_backoff(SCOPE, now=0.0)
    can_send(manager, 100.0)
    assert state(manager)["backoff_level"] == 0
    assert state(manager)["delay"] == 0.0
    assert stats(manager)["throttling/backoff/recovery_count"] == 3


def test_windows_before_a_trigger_count_as_recovery() -> None:
    manager, _ = make_manager(BACKOFF_WINDOW=10.0)
    manager.apply_backoff(SCOPE, now=0.0)
    manager.apply_backoff(SCOPE, now=0.0)  # delay 2, level 2
    manager.apply_backoff(SCOPE, now=25.0)  # two quiet windows, then a step
    assert (state(manager)["delay"], state(manager)["backoff_level"]) == (1.0, 1)
    assert stats(manager)["throttling/backoff/recovery_count"] == 2


def test_jitter_stays_within_its_range() -> None:
    manager, _ = make_manager(BACKOFF_JITTER=[0.0, 0.5], BACKOFF_MAX_DELAY=1000)
    for step in range(1, 8):
        manager.apply_backoff(SCOPE, now=0.0)
        nominal = 2.0 ** (step - 1)
        assert nominal <= state(manager)["delay"] <= nominal * 1.5


# -- holds --------------------------------------------------------------------


def test_a_server_delay_holds_without_growing_the_delay() -> None:
    manager, _ = make_manager()
    manager.apply_backoff({SCOPE: {"delay": 30.0}}, now=100.0)
    assert can_send(manager, 100.0) == pytest.approx(30.0)
    assert can_send(manager, 129.0) == pytest.approx(1.0)
    assert can_send(manager, 130.0) == 0.0
    assert state(manager, SCOPE)["delay"] == 0.0
    assert stats(manager)["throttling/backoff/server_delay_count"] == 1


def test_a_server_delay_is_capped_at_the_max_delay() -> None:
    manager, _ = make_manager(BACKOFF_MAX_DELAY=5.0)
    manager.apply_backoff({SCOPE: {"delay": 3600.0}}, now=0.0)
    assert can_send(manager, 0.0) == pytest.approx(5.0)


def test_delay_scope_is_a_trusted_uncapped_trigger() -> None:
    manager, clock = make_manager(BACKOFF_MAX_DELAY=5.0)
    clock.now = 10.0
    manager.delay_scope(SCOPE, 600.0)
    assert can_send(manager, 10.0) == pytest.approx(600.0)
    assert state(manager)["backoff_level"] == 1
    assert stats(manager) == {
        "throttling/backoff/count": 1,
        "throttling/backoff/delay_scope_count": 1,
    }


@pytest.mark.parametrize("delay", [-1.0, math.nan, math.inf, "soon", None])
def test_delay_scope_rejects_invalid_delays(delay: Any) -> None:
    manager, _ = make_manager()
    with pytest.raises(ValueError, match="Invalid delay for scope"):
        manager.delay_scope(SCOPE, delay)


def test_delay_scope_with_a_scope_manager_without_cap() -> None:
    class OldScopeManager:
        def __init__(self, crawler: Any, config: dict[str, Any]) -> None:
            self.calls: list[tuple[Any, ...]] = []

        def record_backoff(self, delay: Any = None, now: Any = None) -> None:
            self.calls.append((delay, now))

        # The three methods every scope manager needs (checked at start-up).
        def can_send(self, now: Any = None, amount: Any = None) -> float:
            return 0.0

        def record_sent(self, now: Any = None, amount: Any = None) -> None:
            pass

        def record_done(self, now: Any = None) -> None:
            pass

    manager, clock = make_manager(THROTTLING_SCOPE_MANAGER=OldScopeManager)
    clock.now = 3.0
    manager.delay_scope(SCOPE, 7)
    assert manager.get_scope_manager(SCOPE).calls == [(7.0, 3.0)]


@pytest.mark.parametrize("delay", [0, -5, "junk", math.nan, math.inf, True])
def test_an_unusable_delay_takes_an_exponential_step(delay: Any) -> None:
    manager, _ = make_manager()
    manager.apply_backoff({SCOPE: {"delay": delay}}, now=0.0)
    assert state(manager)["delay"] == 1.0
    assert state(manager)["backoff_wait"] == 0.0
    assert "throttling/backoff/server_delay_count" not in stats(manager)


def test_quota_only_entries_are_no_trigger() -> None:
    manager, _ = make_manager(THROTTLING_SCOPES={"cost": {"quota": 10.0}})
    manager.apply_backoff({"cost": {"consumed": 2.0}}, now=0.0)
    assert state(manager, "cost")["backoff_level"] == 0
    assert stats(manager) == {}


# -- from responses and exceptions -------------------------------------------------


def test_backoff_codes_trigger_and_others_do_not() -> None:
    manager, _ = make_manager()
    triggered = {}
    for status in (200, 404, 500, 429, 503, 520):
        triggered[status] = _run(manager.get_response_backoff(response(status)))
    assert triggered == {
        200: None,
        404: None,
        500: None,
        429: [SCOPE],
        503: [SCOPE],
        520: [SCOPE],
    }


def test_throttling_dont_track_never_triggers() -> None:
    manager, _ = make_manager()
    ignored = response(429, {"Retry-After": "5"}, throttling_dont_track=True)
    assert _run(manager.get_response_backoff(ignored)) is None
    request = Request(URL, meta={"throttling_dont_track": True})
    assert _run(manager.get_exception_backoff(request, DownloadTimeoutError())) is None
    exhausted = response(200, {"RateLimit": '"a";r=0;t=5'}, throttling_dont_track=True)
    assert _run(manager.get_response_backoff(exhausted)) is None


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "2"}, 2.0),
        ({"Retry-After": "1.5"}, 1.5),
        ({"RateLimit-Reset": "7"}, 7.0),
        ({"Retry-After": "2", "RateLimit-Reset": "7"}, 7.0),
        ({"RateLimit": '"default";r=0;t=4'}, 4.0),
        ({"RateLimit": '"default";r=3;t=4'}, None),
        ({"RateLimit": '"burst";r=0', "RateLimit-Policy": '"burst";q=100;w=60'}, 60.0),
        ({"Retry-After": "garbage"}, None),
        ({"Retry-After": "-3", "RateLimit-Reset": "nan"}, None),
        ({"Retry-After": b"\xff\xfe"}, None),
        ({}, None),
    ],
)
def test_get_response_delay(headers: dict[str, Any], expected: float | None) -> None:
    manager, _ = make_manager()
    assert manager.get_response_delay(response(429, headers)) == expected


HEADER_NAMES = ["Retry-After", "RateLimit-Reset", "RateLimit", "RateLimit-Policy"]
HEADER_VALUES = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=40).map(str.encode),
    st.sampled_from(["0", "-1", "nan", "inf", "1e309", "9" * 400, "r=0;t=-1"]).map(
        str.encode
    ),
)


@settings(max_examples=300, deadline=None)
@given(
    status=st.sampled_from([200, 429, 503]),
    headers=st.dictionaries(
        st.sampled_from([*HEADER_NAMES, "RateLimit-Remaining"]), HEADER_VALUES
    ),
)
def test_no_header_value_breaks_backoff(status: int, headers: dict[str, bytes]) -> None:
    manager, _ = make_manager()
    resp = response(status, headers)
    for delay in (
        manager.get_response_delay(resp),
        manager.get_exhausted_quota_delay(resp),
    ):
        assert delay is None or 0 < delay < math.inf
    backoff = _run(manager.get_response_backoff(resp))
    manager.apply_backoff(backoff, now=0.0)
    assert 0 <= can_send(manager, 0.0) <= 300.0


def test_retry_after_http_date() -> None:
    manager, _ = make_manager()
    date = formatdate(time() + 60, usegmt=True)
    delay = manager.get_response_delay(response(503, {"Retry-After": date}))
    assert delay is not None
    assert 55 < delay <= 60
    past = formatdate(time() - 60, usegmt=True)
    assert manager.get_response_delay(response(503, {"Retry-After": past})) is None


def test_a_server_delay_becomes_a_hold() -> None:
    manager, _ = make_manager()
    backoff = _run(manager.get_response_backoff(response(503, {"Retry-After": "2"})))
    assert backoff == {SCOPE: {"delay": 2.0}}


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"RateLimit": '"default";r=0;t=5'}, {SCOPE: {"delay": 5.0}}),
        ({"RateLimit": "limit=10, remaining=0, reset=3"}, {SCOPE: {"delay": 3.0}}),
        ({"RateLimit-Remaining": "0", "RateLimit-Reset": "4"}, {SCOPE: {"delay": 4.0}}),
        ({"RateLimit": '"default";r=1;t=5'}, None),
        ({"RateLimit-Remaining": "2", "RateLimit-Reset": "4"}, None),
        ({"RateLimit-Reset": "4"}, None),
        ({"Retry-After": "4"}, None),
        ({"RateLimit": "garbage;;;"}, None),
    ],
)
def test_an_exhausted_quota_on_a_success_holds_the_scope(
    headers: dict[str, Any], expected: Any
) -> None:
    manager, _ = make_manager()
    assert _run(manager.get_response_backoff(response(200, headers))) == expected


def test_an_exhausted_quota_split_over_header_lines() -> None:
    manager, _ = make_manager()
    headers = {"RateLimit": ['"a";r=4;t=1', '"b";r=0;t=9']}
    assert manager.get_exhausted_quota_delay(response(200, headers)) == 9.0


def test_an_exhausted_quota_holds_only_scopes_that_back_off_on_429() -> None:
    manager, _ = make_manager(
        THROTTLING_SCOPES={"other": {"backoff": {"http_codes": [503]}}}
    )
    resp = Response(
        URL,
        headers={"RateLimit": '"a";r=0;t=5'},
        request=Request(URL, meta={"throttling_scopes": [SCOPE, "other"]}),
    )
    assert _run(manager.get_response_backoff(resp)) == {SCOPE: {"delay": 5.0}}


def test_backoff_exceptions_trigger_and_others_do_not() -> None:
    manager, _ = make_manager()
    request = Request(URL)
    assert _run(manager.get_exception_backoff(request, DownloadFailedError())) == [
        SCOPE
    ]
    assert _run(manager.get_exception_backoff(request, ValueError())) is None


def test_per_scope_backoff_overrides_every_key() -> None:
    manager, _ = make_manager(
        THROTTLING_SCOPES={
            SCOPE: {
                "backoff": {
                    "http_codes": [503, 418],
                    "exceptions": ["builtins.OSError"],
                    "delay_factor": 3.0,
                    "min_delay": 5.0,
                    "max_delay": 50.0,
                    "jitter": [0.0, 0.0],
                }
            }
        }
    )
    request = Request(URL)
    assert _run(manager.get_response_backoff(response(429))) is None
    assert _run(manager.get_response_backoff(response(418))) == [SCOPE]
    assert _run(manager.get_exception_backoff(request, DownloadFailedError())) is None
    assert _run(manager.get_exception_backoff(request, ConnectionError())) == [SCOPE]
    delays = []
    for _ in range(4):
        manager.apply_backoff(SCOPE, now=0.0)
        delays.append(state(manager)["delay"])
    assert delays == [5.0, 15.0, 45.0, 50.0]
    manager.apply_backoff({SCOPE: {"delay": 500.0}}, now=0.0)
    assert can_send(manager, 0.0) == pytest.approx(50.0)
    # Another scope keeps the global settings.
    other = Request("https://other.example/")
    assert _run(manager.get_exception_backoff(other, DownloadFailedError())) == [
        "other.example"
    ]


def test_every_scope_of_the_request_backs_off() -> None:
    manager, _ = make_manager()
    resp = Response(
        URL,
        status=429,
        request=Request(URL, meta={"throttling_scopes": {"a": 1.0, "b": None}}),
    )
    assert _run(manager.get_response_backoff(resp)) == ["a", "b"]


# -- process_response / process_exception, stats and logs -----------------------


@deferred_f_from_coro_f
async def test_stats_by_cause() -> None:
    manager, _ = make_manager()
    await manager.process_response(response(429))
    await manager.process_response(response(503, {"Retry-After": "3"}))
    await manager.process_response(response(200))
    await manager.process_response(response(200, {"RateLimit": '"q";r=0;t=1'}))
    await manager.process_exception(Request(URL), DownloadTimeoutError())
    await manager.process_exception(Request(URL), ValueError())
    assert stats(manager) == {
        "throttling/backoff/count": 4,
        "throttling/backoff/status/429_count": 1,
        "throttling/backoff/status/503_count": 1,
        "throttling/backoff/status/200_count": 1,
        "throttling/backoff/exception/scrapy.exceptions.DownloadTimeoutError_count": 1,
        "throttling/backoff/server_delay_count": 2,
    }


@deferred_f_from_coro_f
async def test_debug_log_names_the_scope_and_the_delay(caplog: Any) -> None:
    manager, clock = make_manager(THROTTLING_DEBUG=True, BACKOFF_WINDOW=1.0)
    with caplog.at_level(logging.DEBUG, logger="scrapy_adaptive_throttle"):
        await manager.process_response(response(429))
        await manager.process_response(response(429))
        await manager.process_response(response(503, {"Retry-After": "3"}))
        clock.now = 1.0
        can_send(manager, 1.0)
        manager.delay_scope(SCOPE, 9.0)
    messages = [record.getMessage() for record in caplog.records]
    assert messages == [
        f"Backoff step for scope {SCOPE} (status/429): delay 1.000s (level 1)",
        f"Backoff step for scope {SCOPE} (status/429): delay 2.000s (level 2)",
        f"Backoff hold for scope {SCOPE} (status/503): nothing sent for 3.000s "
        "(Retry-After: 3)",
        f"Backoff recovery for scope {SCOPE}: 1 step(s), delay 1.000s (level 2)",
        f"Backoff hold for scope {SCOPE} (delay_scope): nothing sent for 9.000s",
    ]


@deferred_f_from_coro_f
async def test_no_debug_log_without_throttling_debug(caplog: Any) -> None:
    manager, _ = make_manager()
    with caplog.at_level(logging.DEBUG, logger="scrapy_adaptive_throttle"):
        await manager.process_response(response(429))
        can_send(manager, 100.0)
    assert caplog.records == []


# -- the pace learned from 429s ---------------------------------------------------


@deferred_f_from_coro_f
async def test_a_retry_refused_again_teaches_no_pace() -> None:
    """A page the server always refuses: its retry's 429 holds the scope and
    counts as a refusal, but sets no pace from the rate reached by then
    (which would cap the scope until probes, windows later). A refusal of
    another request still learns, with the retry's refusal taken out of
    the count."""
    manager, clock = make_manager(THROTTLING_SCOPE_MANAGER=_PLAIN)
    scope = manager.get_scope_manager(SCOPE)
    refused = Response(
        URL, status=429, headers={"Retry-After": "1"}, request=Request(URL)
    )
    await manager.process_response(refused)  # the count starts
    assert refused.request.meta["_throttling_refused"] == URL
    for step in range(10):
        clock.now = 1.5 + step * 0.05
        scope.record_sent(clock.now)
    clock.now = 2.0
    # RetryMiddleware's copy of the refused request, refused again.
    retry = refused.request.copy()
    await manager.process_response(
        Response(URL, status=429, headers={"Retry-After": "1"}, request=retry)
    )
    assert state(manager)["learned_interval"] == 0.0
    assert "throttling/rate_limit/learned_count" not in stats(manager)
    assert stats(manager)["throttling/backoff/status/429_count"] == 2
    assert can_send(manager, 2.5) > 0  # its Retry-After holds the scope
    clock.now = 2.1
    await manager.process_response(response(429, {"Retry-After": "1"}))
    # 10 sends in the second before, minus the retry's refusal and the
    # refused request's own send (its send time unknown here).
    assert state(manager)["learned_accepted"] == 8
    assert state(manager)["learned_interval"] == pytest.approx(1.02 / 8)
    assert stats(manager)["throttling/rate_limit/learned_count"] == 1


@deferred_f_from_coro_f
async def test_a_retry_failed_again_is_not_a_new_trigger() -> None:
    """A page that always fails (502, no Retry-After): its first answer
    steps the scope's delay up, its retries' answers do not (each would
    double the delay and restart the recovery countdown: 3 windows at 1, 2
    and 4 s instead of one at 1 s). A server-given hold is still honoured,
    and another request's failure is a trigger as before."""
    manager, clock = make_manager()
    failed = Response(URL, status=502, request=Request(URL))
    await manager.process_response(failed)
    assert (state(manager)["delay"], state(manager)["backoff_level"]) == (1.0, 1)
    clock.now = 1.0
    await manager.process_response(
        Response(URL, status=502, request=failed.request.copy())
    )
    assert (state(manager)["delay"], state(manager)["backoff_level"]) == (1.0, 1)
    assert stats(manager)["throttling/backoff/repeated_count"] == 1
    assert stats(manager)["throttling/backoff/count"] == 1
    # A second retry, answered 503 with Retry-After: the hold only.
    clock.now = 2.0
    retry = failed.request.copy()
    await manager.process_response(
        Response(URL, status=503, headers={"Retry-After": "5"}, request=retry)
    )
    assert (state(manager)["delay"], state(manager)["backoff_level"]) == (1.0, 1)
    assert can_send(manager, 6.5) > 0
    assert can_send(manager, 7.1) == 0
    # Another page's 502: a trigger.
    await manager.process_response(response(502))
    assert (state(manager)["delay"], state(manager)["backoff_level"]) == (2.0, 2)


@deferred_f_from_coro_f
async def test_meta_passed_on_to_a_new_request_does_not_make_it_a_repeat() -> None:
    """A spider that yields ``Request(other, meta=response.meta)``: the
    other page's first 502 is a trigger, though the meta says its parent
    had one (a redirect to another URL is a new page the same way)."""
    manager, clock = make_manager()
    failed = Response(URL, status=502, request=Request(URL))
    await manager.process_response(failed)
    clock.now = 1.0
    other = f"https://{SCOPE}/child"
    child = Request(other, meta=dict(failed.request.meta))
    await manager.process_response(Response(other, status=502, request=child))
    assert (state(manager)["delay"], state(manager)["backoff_level"]) == (2.0, 2)
    assert "throttling/backoff/repeated_count" not in stats(manager)


@deferred_f_from_coro_f
async def test_a_retry_that_fails_again_with_an_exception_is_not_a_new_trigger() -> (
    None
):
    """The same for download exceptions (a page that always times out): the
    first failure steps the delay, its retry's failure does not."""
    manager, clock = make_manager()
    request = Request(URL)
    await manager.process_exception(request, DownloadTimeoutError())
    assert (state(manager)["delay"], state(manager)["backoff_level"]) == (1.0, 1)
    clock.now = 1.0
    await manager.process_exception(request.copy(), DownloadTimeoutError())
    assert (state(manager)["delay"], state(manager)["backoff_level"]) == (1.0, 1)
    assert stats(manager)["throttling/backoff/repeated_count"] == 1
    await manager.process_exception(Request(URL), DownloadTimeoutError())
    assert (state(manager)["delay"], state(manager)["backoff_level"]) == (2.0, 2)


_PLAIN = "scrapy_adaptive_throttle.ThrottlingScopeManager"


# -- the chapter's extension points --------------------------------------------------


class UpstreamStatusManager(ThrottlingManager):
    """The reference chapter's example, with our import and a test host."""

    async def get_response_backoff(self, response: Response) -> Any:
        if (
            response.request is None
            or response.request.url.split("/")[2] != SCOPE
            or response.status != 200
        ):
            return await super().get_response_backoff(response)
        upstream_status_code = int(
            response.headers.get("X-Upstream-Status-Code", b"200")
        )
        upstream_response = response.__class__(
            response.url,
            status=upstream_status_code,
            headers=response.headers,
            body=response.body,
        )
        return await super().get_response_backoff(upstream_response)


@deferred_f_from_coro_f
async def test_a_rebuilt_response_counts_for_the_request_being_processed() -> None:
    crawler = get_crawler(settings_dict={"BACKOFF_JITTER": 0})
    manager = UpstreamStatusManager(crawler)
    await manager.process_response(response(200, {"X-Upstream-Status-Code": "429"}))
    assert state(manager)["delay"] == 1.0
    await manager.process_response(
        response(200, {"X-Upstream-Status-Code": "503", "Retry-After": "7"})
    )
    assert state(manager)["backoff_wait"] == pytest.approx(7.0, abs=0.5)
    await manager.process_response(
        response(200, {"X-Upstream-Status-Code": "429"}, throttling_dont_track=True)
    )
    assert state(manager)["backoff_level"] == 2


def _run(coroutine: Any) -> Any:
    """Run a coroutine that never really awaits (the backoff hooks here)."""
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the coroutine suspended")

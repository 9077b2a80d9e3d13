"""Reading and validating every setting of the plugin, in one place.

Settings are read once per crawler into frozen dataclasses. An invalid value
raises :exc:`ValueError` naming the setting, the scope (for
:setting:`THROTTLING_SCOPES` entries) and the value, so a typo stops the crawl
at start-up instead of silently changing how hard a site is hit.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from scrapy.settings import SETTINGS_PRIORITIES, BaseSettings
from scrapy.utils.misc import load_object

from ._algorithms import BackoffPolicy, JitterRange

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: Defaults of every setting this plugin adds. They are registered by the
#: add-on and are also the fallback when a component is built without it.
DEFAULTS: dict[str, Any] = {
    "THROTTLING_MANAGER": "scrapy_adaptive_throttle.ThrottlingManager",
    "THROTTLING_SCOPE_MANAGER": "scrapy_adaptive_throttle.ThrottlingScopeManager",
    # The reference chapter's default: the tutorial's test site may be
    # crawled fast, every other host keeps the conservative defaults.
    "THROTTLING_SCOPES": {"quotes.toscrape.com": {"concurrency": 16, "delay": 0.0}},
    "THROTTLING_WINDOW": 60.0,
    "THROTTLING_SCOPE_CONCURRENCY": 1,
    "THROTTLING_SCOPE_LIMIT": 100_000,
    "THROTTLING_SCOPE_MAX_IDLE": 3600.0,
    "THROTTLING_ROBOTSTXT_OBEY": True,
    "THROTTLING_ROBOTSTXT_MAX_DELAY": 60.0,
    "REDIRECT_MAX_DELAY": 120.0,
    "THROTTLING_DEBUG": False,
    "THROTTLING_LATENCY_TOLERANCE": 1.5,
    "THROTTLING_LATENCY_WINDOW": 30.0,
    "THROTTLING_LATENCY_INITIAL_CONCURRENCY": 2,
    "BACKOFF_HTTP_CODES": [429, 502, 503, 504, 520, 521, 522, 523, 524],
    "BACKOFF_EXCEPTIONS": [
        "scrapy.exceptions.DownloadFailedError",
        "scrapy.exceptions.DownloadTimeoutError",
        "scrapy.exceptions.ResponseDataLossError",
    ],
    "BACKOFF_DELAY_FACTOR": 2.0,
    "BACKOFF_MAX_DELAY": 300.0,
    "BACKOFF_MIN_DELAY": 1.0,
    "BACKOFF_JITTER": 0.1,
    "BACKOFF_WINDOW": 60.0,
    "RAMPUP_BACKOFF_TARGET": 1,
    "DELAYED_REQUESTS_WARN_THRESHOLD": 500,
    # Shared state (see _shared_state.py): unset, every process on its own.
    "THROTTLING_STATE_URL": None,
    "THROTTLING_STATE_PREFIX": "throttling",
    "THROTTLING_STATE_PROCESSES": 1,
}

#: Keys accepted in a :setting:`THROTTLING_SCOPES` entry.
SCOPE_KEYS = frozenset(
    {
        "concurrency",
        "min_concurrency",
        "delay",
        "jitter",
        "quota",
        "window",
        "rampup",
        "manager",
        "backoff",
        "ignore_robots_txt",
        "latency_tolerance",
        "latency_window",
        "initial_concurrency",
    }
)
BACKOFF_KEYS = frozenset(
    {"http_codes", "exceptions", "delay_factor", "max_delay", "min_delay", "jitter"}
)
RAMPUP_KEYS = frozenset({"backoff_target", "delay_factor", "min_delay"})

_HOSTNAME_RE = re.compile(
    r"^(?=.{1,253}\.?$)(?:(?!-)[a-z0-9-]{1,63}(?<!-)\.)+(?!-)[a-z0-9-]{1,63}(?<!-)\.?$",
    re.IGNORECASE,
)


def classify_scope(scope_id: str) -> str:
    """Return ``"ip"``, ``"domain"`` or ``"other"`` for a scope id.

    ``127.0.0.1:8080`` and ``[::1]:80`` are IP scopes, ``example.com`` and
    ``example.com:8080`` domain scopes; a scope that names a host after an
    ``@`` (scrapy-zyte-api's download slots, ``zyte-api@example.com``) has
    that host's kind; anything else (``localhost``, ``api``,
    ``api.example.com/fast``) is another kind of scope.
    """
    host = scope_id.rpartition("@")[2]
    if host.startswith("["):
        end = host.find("]")
        if end > 0:
            host = host[1:end]
    if _is_ip(host):
        return "ip"
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
        if _is_ip(host):
            return "ip"
    if "." in host and _HOSTNAME_RE.match(host):
        return "domain"
    return "other"


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def report_invalid_setting(error: ValueError) -> None:
    """Log *error* (an invalid setting found while the crawl starts) once, at
    ERROR, as the whole story, before it is raised.

    Scrapy 2.19's ``scrapy crawl`` runs the crawl's start-up in an asyncio
    task and lets asyncio print whatever ends it as a "Task exception was
    never retrieved" traceback, burying the one line that matters. The task
    that fails is the current one: once done, its exception is marked as
    retrieved, so the user sees this line and the exit status 1 (Scrapy's
    ``bootstrap_failed``). Anything else that ended the task is still handed
    to the event loop's exception handler. Programmatic callers (a
    ``CrawlerRunner``, tests) still get the exception itself.
    """
    logger.error("%s", error)
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running event loop
        return
    if task is None:
        return

    def retrieve(done: asyncio.Task[Any]) -> None:
        if done.cancelled():
            return
        exception = done.exception()
        if exception is not None and exception is not error:
            done.get_loop().call_exception_handler(
                {
                    "message": "Task exception was never retrieved",
                    "exception": exception,
                    "future": done,
                }
            )

    task.add_done_callback(retrieve)


class _Reader:
    """Typed, validated access to setting values with precise errors."""

    def __init__(self, settings: BaseSettings) -> None:
        self.settings = settings

    def raw(self, name: str) -> Any:
        # attributes.get avoids the deprecation warning Scrapy 2.19 emits for
        # some settings (CONCURRENT_REQUESTS_PER_IP) on every get().
        attribute = self.settings.attributes.get(name)
        if attribute is None or attribute.value is None:
            return DEFAULTS.get(name)
        return attribute.value

    def is_set_above_default(self, name: str) -> bool:
        priority = self.settings.getpriority(name)
        return priority is not None and priority > SETTINGS_PRIORITIES["default"]


def _where(setting: str, scope: str | None, key: str | None) -> str:
    if scope is None:
        return setting
    return f"{setting}[{scope!r}][{key!r}]"


def _invalid(
    setting: str, scope: str | None, key: str | None, value: Any, expected: str
) -> ValueError:
    return ValueError(
        f"Invalid {_where(setting, scope, key)} value {value!r}: {expected}"
    )


def to_float(
    value: Any,
    setting: str,
    *,
    scope: str | None = None,
    key: str | None = None,
    minimum: float = 0.0,
    exclusive_minimum: bool = False,
) -> float:
    """Return *value* as a finite float >= *minimum* (or > it), else raise."""
    if isinstance(value, bool):
        raise _invalid(setting, scope, key, value, "expected a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise _invalid(setting, scope, key, value, "expected a number") from None
    if not math.isfinite(number):
        raise _invalid(setting, scope, key, value, "expected a finite number")
    if number < minimum or (exclusive_minimum and number == minimum):
        bound = ">" if exclusive_minimum else ">="
        raise _invalid(
            setting, scope, key, value, f"expected a number {bound} {minimum}"
        )
    return number


def to_int(
    value: Any,
    setting: str,
    *,
    scope: str | None = None,
    key: str | None = None,
    minimum: int = 0,
) -> int:
    """Return *value* as an int >= *minimum*, else raise.

    Integral strings and floats (``"4"``, ``4.0``) are accepted, as Scrapy's
    ``getint`` does; ``"abc"``, ``2.5`` and booleans are not.
    """
    if isinstance(value, bool):
        raise _invalid(setting, scope, key, value, "expected an integer")
    if isinstance(value, int):
        number = value
    else:
        try:
            as_float = float(value)
        except (TypeError, ValueError):
            raise _invalid(setting, scope, key, value, "expected an integer") from None
        if not as_float.is_integer():
            raise _invalid(setting, scope, key, value, "expected an integer")
        number = int(as_float)
    if number < minimum:
        raise _invalid(setting, scope, key, value, f"expected an integer >= {minimum}")
    return number


def to_bool(
    value: Any, setting: str, *, scope: str | None = None, key: str | None = None
) -> bool:
    """Return *value* as a bool (``True``/``False``, 0/1 and their strings)."""
    if isinstance(value, bool):
        return value
    if value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in {"true", "false", "0", "1"}:
        return value.strip().lower() in {"true", "1"}
    raise _invalid(setting, scope, key, value, "expected True or False")


def to_jitter(
    value: Any,
    setting: str,
    *,
    scope: str | None = None,
    key: str | None = None,
    allow_bool: bool = False,
) -> JitterRange:
    """Return a jitter as a ``(low, high)`` range of offsets.

    A number ``j`` means ``±j``; a ``[low, high]`` pair is taken as is; with
    *allow_bool* (:setting:`RANDOMIZE_DOWNLOAD_DELAY`) ``True`` means ±50%.
    """
    if isinstance(value, bool):
        if not allow_bool:
            raise _invalid(
                setting, scope, key, value, "expected a number or [low, high]"
            )
        return (-0.5, 0.5) if value else (0.0, 0.0)
    if (
        isinstance(value, str)
        and allow_bool
        and value.strip().lower() in {"true", "false"}
    ):
        return (-0.5, 0.5) if value.strip().lower() == "true" else (0.0, 0.0)
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != 2:
            raise _invalid(setting, scope, key, value, "expected a [low, high] pair")
        low = to_float(value[0], setting, scope=scope, key=key, minimum=-1.0)
        high = to_float(value[1], setting, scope=scope, key=key, minimum=-1.0)
        if low > high:
            raise _invalid(setting, scope, key, value, "low must not exceed high")
        return (low, high)
    magnitude = to_float(value, setting, scope=scope, key=key)
    if magnitude > 1:
        raise _invalid(
            setting, scope, key, value, "expected a fraction between 0 and 1"
        )
    return (-magnitude, magnitude)


def to_target(
    value: Any, setting: str, *, scope: str | None = None, key: str | None = None
) -> tuple[float, float]:
    """Return a rampup backoff target as a ``(low, high)`` range."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != 2:
            raise _invalid(
                setting, scope, key, value, "expected a number or [low, high]"
            )
        low = to_float(value[0], setting, scope=scope, key=key)
        high = to_float(value[1], setting, scope=scope, key=key)
        if low > high:
            raise _invalid(setting, scope, key, value, "low must not exceed high")
        return (low, high)
    number = to_float(value, setting, scope=scope, key=key)
    return (number, number)


def to_class(
    value: Any, setting: str, *, scope: str | None = None, key: str | None = None
) -> type:
    """Load a class given as a class or an import path."""
    if isinstance(value, type):
        return value
    if not isinstance(value, str):
        raise _invalid(setting, scope, key, value, "expected a class or an import path")
    try:
        loaded = load_object(value)
    except (ImportError, NameError, ValueError, AttributeError) as exc:
        raise _invalid(
            setting, scope, key, value, f"cannot import it ({exc})"
        ) from None
    if not isinstance(loaded, type):
        raise _invalid(setting, scope, key, value, "it is not a class")
    return loaded


#: The methods every scope manager must have: the manager falls back to
#: defaults for the rest of ``ThrottlingScopeManagerProtocol``, not for these.
SCOPE_MANAGER_METHODS = ("can_send", "record_sent", "record_done")


def to_scope_manager_class(
    value: Any, setting: str, *, scope: str | None = None, key: str | None = None
) -> type:
    """Load a scope manager class, checking it implements the protocol.

    Checked at start-up because the first call would otherwise come with the
    first request of the scope, deep in the scheduler, where the mistake (a
    manager class given as a scope manager, say) fails every request of the
    scope instead of the crawl's start.
    """
    cls = to_class(value, setting, scope=scope, key=key)
    missing = [
        name for name in SCOPE_MANAGER_METHODS if not callable(getattr(cls, name, None))
    ]
    if missing:
        raise _invalid(
            setting,
            scope,
            key,
            value,
            "it does not implement ThrottlingScopeManagerProtocol "
            f"(missing: {', '.join(missing)})",
        )
    return cls


def to_exceptions(
    value: Any, setting: str, *, scope: str | None = None, key: str | None = None
) -> tuple[type[BaseException], ...]:
    """Load a list of exception classes (classes or import paths)."""
    if isinstance(value, str) or not isinstance(value, Sequence | set | frozenset):
        raise _invalid(
            setting, scope, key, value, "expected a list of exception classes"
        )
    classes: list[type[BaseException]] = []
    for item in value:
        cls = to_class(item, setting, scope=scope, key=key)
        if not issubclass(cls, BaseException):
            raise _invalid(setting, scope, key, item, "it is not an exception class")
        classes.append(cls)
    return tuple(classes)


def to_codes(
    value: Any, setting: str, *, scope: str | None = None, key: str | None = None
) -> frozenset[int]:
    """Load a list of HTTP status codes."""
    if isinstance(value, str) or not isinstance(value, Sequence | set | frozenset):
        raise _invalid(
            setting, scope, key, value, "expected a list of HTTP status codes"
        )
    codes = set()
    for item in value:
        code = to_int(item, setting, scope=scope, key=key, minimum=100)
        if code > 999:
            raise _invalid(setting, scope, key, item, "expected an HTTP status code")
        codes.add(code)
    return frozenset(codes)


@dataclass(frozen=True, slots=True)
class RampupSettings:
    """Resolved ``"rampup"`` configuration of a scope."""

    target: tuple[float, float] = (1.0, 1.0)
    delay_factor: float = 0.5
    min_delay: float = 0.0


@dataclass(frozen=True, slots=True)
class ScopeSettings:
    """Resolved configuration of one scope (or of the default scopes of a kind).

    ``concurrency`` is ``None`` when the scope has no concurrency limit.
    """

    kind: str
    concurrency: int | None
    explicit_concurrency: bool
    min_concurrency: int
    delay: float
    explicit_delay: bool
    jitter: JitterRange
    quota: float | None
    window: float
    rampup: RampupSettings | None
    backoff: BackoffPolicy
    http_codes: frozenset[int]
    exceptions: tuple[type[BaseException], ...]
    ignore_robots_txt: bool
    latency_tolerance: float
    latency_window: float
    initial_concurrency: int
    manager: type | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ThrottlingSettings:
    """Every throttling setting of a crawl, read and validated once."""

    manager_cls: type
    scope_manager_cls: type
    window: float
    scope_concurrency: int
    scope_limit: int
    scope_max_idle: float
    robotstxt_obey: bool
    robotstxt_max_delay: float
    redirect_max_delay: float
    debug: bool
    total_concurrency: int
    domain_concurrency: int
    ip_concurrency: int
    warn_threshold: int
    user_agent: str
    defaults: Mapping[str, ScopeSettings]
    scopes: Mapping[str, ScopeSettings]
    common: _Common
    #: Whether :setting:`THROTTLING_SCOPES` comes from the user's settings
    #: (not the default).
    scopes_set: bool
    #: Ids of the ``"other"`` scopes that came from a ``download_slot`` set by
    #: another component (see :meth:`add_slot_scope`).
    slot_scopes: set[str] = field(default_factory=set)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ThrottlingSettings:
        """Return the settings of *crawler*, read once and cached on it."""
        cached = getattr(crawler, "_throttling_settings", None)
        if isinstance(cached, ThrottlingSettings):
            return cached
        try:
            resolved = cls.from_settings(crawler.settings)
        except ValueError as exc:
            report_invalid_setting(exc)
            raise
        crawler._throttling_settings = resolved  # type: ignore[attr-defined]
        return resolved

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> ThrottlingSettings:
        """Read and validate *settings*; raise :exc:`ValueError` on bad input."""
        read = _Reader(settings)
        total = to_int(read.raw("CONCURRENT_REQUESTS"), "CONCURRENT_REQUESTS")
        domain = to_int(
            read.raw("CONCURRENT_REQUESTS_PER_DOMAIN"),
            "CONCURRENT_REQUESTS_PER_DOMAIN",
        )
        ip = to_int(
            read.raw("CONCURRENT_REQUESTS_PER_IP") or 0, "CONCURRENT_REQUESTS_PER_IP"
        )
        scope_concurrency = to_int(
            read.raw("THROTTLING_SCOPE_CONCURRENCY"), "THROTTLING_SCOPE_CONCURRENCY"
        )
        download_delay = to_float(read.raw("DOWNLOAD_DELAY") or 0, "DOWNLOAD_DELAY")
        jitter = _default_jitter(read)
        backoff = BackoffPolicy(
            delay_factor=to_float(
                read.raw("BACKOFF_DELAY_FACTOR"), "BACKOFF_DELAY_FACTOR", minimum=1.0
            ),
            min_delay=to_float(read.raw("BACKOFF_MIN_DELAY"), "BACKOFF_MIN_DELAY"),
            max_delay=to_float(read.raw("BACKOFF_MAX_DELAY"), "BACKOFF_MAX_DELAY"),
            jitter=to_jitter(read.raw("BACKOFF_JITTER"), "BACKOFF_JITTER"),
            window=to_float(read.raw("BACKOFF_WINDOW"), "BACKOFF_WINDOW"),
        )
        if backoff.min_delay > backoff.max_delay:
            raise ValueError(
                f"Invalid BACKOFF_MIN_DELAY value {backoff.min_delay!r}: it exceeds "
                f"BACKOFF_MAX_DELAY ({backoff.max_delay!r})"
            )
        rampup_target = to_target(
            read.raw("RAMPUP_BACKOFF_TARGET"), "RAMPUP_BACKOFF_TARGET"
        )
        tolerance = to_float(
            read.raw("THROTTLING_LATENCY_TOLERANCE"),
            "THROTTLING_LATENCY_TOLERANCE",
            minimum=1.0,
        )
        latency_window = to_float(
            read.raw("THROTTLING_LATENCY_WINDOW"),
            "THROTTLING_LATENCY_WINDOW",
            minimum=0.0,
            exclusive_minimum=True,
        )
        initial = to_int(
            read.raw("THROTTLING_LATENCY_INITIAL_CONCURRENCY"),
            "THROTTLING_LATENCY_INITIAL_CONCURRENCY",
            minimum=1,
        )
        window = to_float(read.raw("THROTTLING_WINDOW"), "THROTTLING_WINDOW")
        scope_manager_cls = to_scope_manager_class(
            read.raw("THROTTLING_SCOPE_MANAGER"), "THROTTLING_SCOPE_MANAGER"
        )
        common = _Common(
            domain=domain,
            ip=ip,
            scope_concurrency=scope_concurrency,
            delay=download_delay,
            jitter=jitter,
            window=window,
            backoff=backoff,
            http_codes=to_codes(read.raw("BACKOFF_HTTP_CODES"), "BACKOFF_HTTP_CODES"),
            exceptions=to_exceptions(
                read.raw("BACKOFF_EXCEPTIONS"), "BACKOFF_EXCEPTIONS"
            ),
            rampup_target=rampup_target,
            tolerance=tolerance,
            latency_window=latency_window,
            initial=initial,
            scope_manager_cls=scope_manager_cls,
        )
        defaults = {
            kind: common.resolve(kind, None, {})
            for kind in ("domain", "ip", "other", "slot")
        }
        raw_scopes = read.raw("THROTTLING_SCOPES")
        if isinstance(raw_scopes, BaseSettings):
            raw_scopes = raw_scopes.copy_to_dict()
        if not isinstance(raw_scopes, Mapping):
            raise _invalid(
                "THROTTLING_SCOPES", None, None, raw_scopes, "expected a dict"
            )
        scopes: dict[str, ScopeSettings] = {}
        for scope_id, config in raw_scopes.items():
            if not isinstance(scope_id, str) or not scope_id:
                raise _invalid(
                    "THROTTLING_SCOPES",
                    None,
                    None,
                    scope_id,
                    "scope ids must be non-empty strings",
                )
            if not isinstance(config, Mapping):
                raise ValueError(
                    f"Invalid THROTTLING_SCOPES[{scope_id!r}] value {config!r}: "
                    "expected a dict of scope settings"
                )
            scopes[scope_id] = common.resolve(
                classify_scope(scope_id), scope_id, config
            )
        user_agent = read.raw("ROBOTSTXT_USER_AGENT") or read.raw("USER_AGENT") or ""
        return cls(
            manager_cls=to_class(read.raw("THROTTLING_MANAGER"), "THROTTLING_MANAGER"),
            scope_manager_cls=scope_manager_cls,
            window=window,
            scope_concurrency=scope_concurrency,
            scope_limit=to_int(
                read.raw("THROTTLING_SCOPE_LIMIT"), "THROTTLING_SCOPE_LIMIT"
            ),
            scope_max_idle=to_float(
                read.raw("THROTTLING_SCOPE_MAX_IDLE"), "THROTTLING_SCOPE_MAX_IDLE"
            ),
            robotstxt_obey=to_bool(
                read.raw("ROBOTSTXT_OBEY") or False, "ROBOTSTXT_OBEY"
            )
            and to_bool(
                read.raw("THROTTLING_ROBOTSTXT_OBEY"), "THROTTLING_ROBOTSTXT_OBEY"
            ),
            redirect_max_delay=to_float(
                read.raw("REDIRECT_MAX_DELAY"), "REDIRECT_MAX_DELAY"
            ),
            robotstxt_max_delay=to_float(
                read.raw("THROTTLING_ROBOTSTXT_MAX_DELAY"),
                "THROTTLING_ROBOTSTXT_MAX_DELAY",
            ),
            debug=to_bool(read.raw("THROTTLING_DEBUG"), "THROTTLING_DEBUG"),
            total_concurrency=total,
            domain_concurrency=domain,
            ip_concurrency=ip,
            warn_threshold=to_int(
                read.raw("DELAYED_REQUESTS_WARN_THRESHOLD"),
                "DELAYED_REQUESTS_WARN_THRESHOLD",
            ),
            user_agent=str(user_agent),
            defaults=defaults,
            scopes=scopes,
            common=common,
            scopes_set=read.is_set_above_default("THROTTLING_SCOPES"),
        )

    def scope(self, scope_id: str) -> ScopeSettings:
        """Return the settings of *scope_id*: its own entry, else its kind's."""
        configured = self.scopes.get(scope_id)
        if configured is not None:
            return configured
        kind = classify_scope(scope_id)
        if kind == "other" and scope_id in self.slot_scopes:
            kind = "slot"
        return self.defaults[kind]

    def add_slot_scope(self, scope_id: str) -> None:
        """Record *scope_id* as the scope of a ``download_slot`` set by
        another component: unless configured in :setting:`THROTTLING_SCOPES`
        or named after a host, such a scope has no limit of its own."""
        self.slot_scopes.add(scope_id)

    def resolve_scope(self, scope_id: str, config: Mapping[str, Any]) -> ScopeSettings:
        """Return the settings for a scope manager built with *config*.

        *config* is normally the scope's own entry plus ``"id"`` (then the
        settings resolved at start-up are reused); any other dict is
        validated and resolved now.
        """
        known = self.scope(scope_id)
        if len(config) - ("id" in config) == len(known.raw) and all(
            known.raw.get(key) == value for key, value in config.items() if key != "id"
        ):
            return known
        return self.common.resolve(known.kind, scope_id, config)


#: The scope managers of this package, which read no key beyond SCOPE_KEYS.
_BUILTIN_SCOPE_MANAGERS = frozenset(
    {
        "scrapy_adaptive_throttle._scope_manager.ThrottlingScopeManager",
        "scrapy_adaptive_throttle._latency_scope_manager.LatencyScopeManager",
    }
)


def _is_builtin_scope_manager(cls: type) -> bool:
    return f"{cls.__module__}.{cls.__qualname__}" in _BUILTIN_SCOPE_MANAGERS


def _default_jitter(read: _Reader) -> JitterRange:
    # RANDOMIZE_DOWNLOAD_DELAY wins only when the user set it: its default
    # (True) means the same ±50% as DOWNLOAD_DELAY_JITTER's default (0.5).
    if read.is_set_above_default("RANDOMIZE_DOWNLOAD_DELAY"):
        return to_jitter(
            read.raw("RANDOMIZE_DOWNLOAD_DELAY"),
            "RANDOMIZE_DOWNLOAD_DELAY",
            allow_bool=True,
        )
    value = read.raw("DOWNLOAD_DELAY_JITTER")
    return to_jitter(0.5 if value is None else value, "DOWNLOAD_DELAY_JITTER")


@dataclass(frozen=True)
class _Common:
    """Global values that scope entries fall back to."""

    domain: int
    ip: int
    scope_concurrency: int
    delay: float
    jitter: JitterRange
    window: float
    backoff: BackoffPolicy
    http_codes: frozenset[int]
    exceptions: tuple[type[BaseException], ...]
    rampup_target: tuple[float, float]
    tolerance: float
    latency_window: float
    initial: int
    scope_manager_cls: type

    def default_concurrency(self, kind: str) -> int:
        # "slot": a download slot that another plugin set and that names no
        # host (a proxy, an account). The request's host scope still applies,
        # so this one limits nothing unless configured.
        if kind == "slot":
            return 0
        if kind == "ip":
            return self.ip or self.domain
        if kind == "domain":
            return self.domain
        return self.scope_concurrency

    def resolve(
        self, kind: str, scope: str | None, config: Mapping[str, Any]
    ) -> ScopeSettings:
        setting = "THROTTLING_SCOPES"
        manager: type | None = None
        if config.get("manager") is not None:
            manager = to_scope_manager_class(
                config["manager"], setting, scope=scope, key="manager"
            )
        unknown = set(config) - SCOPE_KEYS - {"id"}
        # A custom scope manager gets its entry whole, its own keys included,
        # and validates them itself; the built-in ones know every key they
        # read, so anything else is a typo.
        if unknown and _is_builtin_scope_manager(manager or self.scope_manager_cls):
            name = sorted(unknown)[0]
            raise ValueError(
                f"Unknown key {name!r} in THROTTLING_SCOPES[{scope!r}] "
                f"(value {config[name]!r}); accepted keys: "
                f"{', '.join(sorted(SCOPE_KEYS))} (a custom scope manager, set "
                "with 'manager' or THROTTLING_SCOPE_MANAGER, may accept others)"
            )

        def number(key: str, default: float, **kwargs: Any) -> float:
            if config.get(key) is None:
                return default
            return to_float(config[key], setting, scope=scope, key=key, **kwargs)

        def integer(key: str, default: int, **kwargs: Any) -> int:
            if config.get(key) is None:
                return default
            return to_int(config[key], setting, scope=scope, key=key, **kwargs)

        explicit_concurrency = config.get("concurrency") is not None
        concurrency = integer("concurrency", self.default_concurrency(kind))
        min_concurrency = integer("min_concurrency", 1, minimum=1)
        if not explicit_concurrency and concurrency:
            # A floor above the default for the scope's kind (e.g. with
            # rampup, which starts at the floor) raises the scope's limit to
            # it: only a floor above an explicit concurrency contradicts it.
            concurrency = max(concurrency, min_concurrency)
        if concurrency and min_concurrency > concurrency:
            raise ValueError(
                f"Invalid THROTTLING_SCOPES[{scope!r}]['min_concurrency'] value "
                f"{min_concurrency!r}: it exceeds the scope's concurrency "
                f"({concurrency})"
            )
        jitter = self.jitter
        if config.get("jitter") is not None:
            jitter = to_jitter(config["jitter"], setting, scope=scope, key="jitter")
        quota: float | None = None
        if config.get("quota") is not None:
            quota = number("quota", 0.0, exclusive_minimum=True)
        rampup = self._rampup(scope, config.get("rampup"))
        backoff, codes, exceptions = self._backoff(scope, config.get("backoff"))
        ignore = False
        if config.get("ignore_robots_txt") is not None:
            ignore = to_bool(
                config["ignore_robots_txt"],
                setting,
                scope=scope,
                key="ignore_robots_txt",
            )
        initial = integer("initial_concurrency", self.initial, minimum=1)
        return ScopeSettings(
            kind=kind,
            concurrency=concurrency or None,
            explicit_concurrency=explicit_concurrency,
            min_concurrency=min_concurrency,
            delay=number("delay", 0.0 if kind == "slot" else self.delay),
            explicit_delay=config.get("delay") is not None,
            jitter=jitter,
            quota=quota,
            window=number("window", self.window),
            rampup=rampup,
            backoff=backoff,
            http_codes=codes,
            exceptions=exceptions,
            ignore_robots_txt=ignore,
            latency_tolerance=number("latency_tolerance", self.tolerance, minimum=1.0),
            latency_window=number(
                "latency_window", self.latency_window, exclusive_minimum=True
            ),
            initial_concurrency=initial,
            manager=manager,
            raw=dict(config),
        )

    def _rampup(self, scope: str | None, value: Any) -> RampupSettings | None:
        setting = "THROTTLING_SCOPES"
        if value is None or value is False:
            return None
        if value is True:
            return RampupSettings(target=self.rampup_target)
        if not isinstance(value, Mapping):
            raise _invalid(
                setting, scope, "rampup", value, "expected True, False or a dict"
            )
        unknown = set(value) - RAMPUP_KEYS
        if unknown:
            raise _invalid(
                setting,
                scope,
                "rampup",
                value,
                f"unknown key {sorted(unknown)[0]!r}; "
                f"accepted: {', '.join(sorted(RAMPUP_KEYS))}",
            )
        target = self.rampup_target
        if value.get("backoff_target") is not None:
            target = to_target(
                value["backoff_target"], setting, scope=scope, key="rampup"
            )
        factor = 0.5
        if value.get("delay_factor") is not None:
            factor = to_float(
                value["delay_factor"],
                setting,
                scope=scope,
                key="rampup",
                exclusive_minimum=True,
            )
            if factor >= 1:
                raise _invalid(
                    setting, scope, "rampup", value, "delay_factor must be below 1"
                )
        min_delay = 0.0
        if value.get("min_delay") is not None:
            min_delay = to_float(value["min_delay"], setting, scope=scope, key="rampup")
        return RampupSettings(target=target, delay_factor=factor, min_delay=min_delay)

    def _backoff(
        self, scope: str | None, value: Any
    ) -> tuple[BackoffPolicy, frozenset[int], tuple[type[BaseException], ...]]:
        setting = "THROTTLING_SCOPES"
        if value is None:
            return self.backoff, self.http_codes, self.exceptions
        if not isinstance(value, Mapping):
            raise _invalid(setting, scope, "backoff", value, "expected a dict")
        unknown = set(value) - BACKOFF_KEYS
        if unknown:
            raise _invalid(
                setting,
                scope,
                "backoff",
                value,
                f"unknown key {sorted(unknown)[0]!r}; "
                f"accepted: {', '.join(sorted(BACKOFF_KEYS))}",
            )
        policy = self.backoff
        changes: dict[str, Any] = {}
        if value.get("delay_factor") is not None:
            changes["delay_factor"] = to_float(
                value["delay_factor"], setting, scope=scope, key="backoff", minimum=1.0
            )
        for key in ("min_delay", "max_delay"):
            if value.get(key) is not None:
                changes[key] = to_float(value[key], setting, scope=scope, key="backoff")
        if value.get("jitter") is not None:
            changes["jitter"] = to_jitter(
                value["jitter"], setting, scope=scope, key="backoff"
            )
        policy = replace(policy, **changes)
        if policy.min_delay > policy.max_delay:
            raise _invalid(
                setting, scope, "backoff", value, "min_delay exceeds max_delay"
            )
        codes = self.http_codes
        if value.get("http_codes") is not None:
            codes = to_codes(value["http_codes"], setting, scope=scope, key="backoff")
        exceptions = self.exceptions
        if value.get("exceptions") is not None:
            exceptions = to_exceptions(
                value["exceptions"], setting, scope=scope, key="backoff"
            )
        return policy, codes, exceptions

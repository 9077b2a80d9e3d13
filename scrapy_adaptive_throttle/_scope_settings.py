"""The settings of one scope: its kind, its entry's keys, and their
resolution against the global settings into a frozen :class:`ScopeSettings`."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ._algorithms import BackoffPolicy, JitterRange
from ._setting_values import (
    invalid_value,
    to_bool,
    to_codes,
    to_exceptions,
    to_float,
    to_int,
    to_jitter,
    to_scope_manager_class,
    to_target,
)

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


#: The scope managers of this package, which read no key beyond SCOPE_KEYS.
_BUILTIN_SCOPE_MANAGERS = frozenset(
    {
        "scrapy_adaptive_throttle._scope_manager.ThrottlingScopeManager",
        "scrapy_adaptive_throttle._latency_scope_manager.LatencyScopeManager",
    }
)


def _is_builtin_scope_manager(cls: type) -> bool:
    return f"{cls.__module__}.{cls.__qualname__}" in _BUILTIN_SCOPE_MANAGERS


@dataclass(frozen=True)
class GlobalScopeSettings:
    """The global settings that scope entries fall back to, and the
    resolution of an entry against them (:meth:`resolve`)."""

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
            raise invalid_value(
                setting, scope, "rampup", value, "expected True, False or a dict"
            )
        unknown = set(value) - RAMPUP_KEYS
        if unknown:
            raise invalid_value(
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
                raise invalid_value(
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
            raise invalid_value(setting, scope, "backoff", value, "expected a dict")
        unknown = set(value) - BACKOFF_KEYS
        if unknown:
            raise invalid_value(
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
            raise invalid_value(
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

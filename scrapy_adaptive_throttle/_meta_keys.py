"""Every request meta key the package reads or writes, as named constants.

The documented keys (:reqmeta:`throttling_scopes`, :reqmeta:`throttling_delay`,
:reqmeta:`throttling_dont_track`) are the user's; the keys of Scrapy and its
built-in components are read as they are; the ``_throttling_*`` keys are the
package's own bookkeeping, kept in the meta (plain, serialisable values) so
that they survive a ``JOBDIR`` and follow a request through retries and
redirects. :func:`dont_track` reads the two keys that exclude a request
from the state changes.
"""

from __future__ import annotations

from typing import Any

# The documented keys (docs/reference/meta.rst).

#: The scopes of a request, set by the user (:reqmeta:`throttling_scopes`).
SCOPES_META_KEY = "throttling_scopes"
#: A wait before this request alone is sent (:reqmeta:`throttling_delay`);
#: also written for a redirect that carries a ``Retry-After``.
DELAY_META_KEY = "throttling_delay"
#: The request's outcome changes no throttling state
#: (:reqmeta:`throttling_dont_track`).
DONT_TRACK_META_KEY = "throttling_dont_track"

# Keys of Scrapy and its built-in components.

#: AutoThrottle's exclusion, mapped to :data:`DONT_TRACK_META_KEY`.
AUTOTHROTTLE_DONT_ADJUST_DELAY_META_KEY = "autothrottle_dont_adjust_delay"
#: Scrapy's download slot, which another component may have set (a scope).
DOWNLOAD_SLOT_META_KEY = "download_slot"
#: The seconds Scrapy's downloader measured from send to response headers.
DOWNLOAD_LATENCY_META_KEY = "download_latency"
#: Set by RobotsTxtMiddleware on its own robots.txt downloads.
DONT_OBEY_ROBOTSTXT_META_KEY = "dont_obey_robotstxt"
#: RedirectMiddleware does not follow this request's redirects.
DONT_REDIRECT_META_KEY = "dont_redirect"

# The package's own bookkeeping.

#: The scopes resolved for a request (and their quota amounts), stored once
#: so that the queue, the gate and the middleware agree on them.
RESOLVED_SCOPES_META_KEY = "_throttling_resolved_scopes"
#: The ``download_slot`` value stamped by the downloader, so that a retried
#: or redirected copy is not mistaken for a user-set slot.
SLOT_STAMP_META_KEY = "_throttling_slot_stamp"
#: The request's :reqmeta:`throttling_delay` has been waited.
DELAYED_META_KEY = "_throttling_delayed"
#: When the request's :reqmeta:`throttling_delay` ends, in wall-clock seconds
#: (so that a crawl paused and resumed with ``JOBDIR`` still holds it).
DELAY_DEADLINE_META_KEY = "_throttling_delay_deadline"
#: The request had a backoff answer (a status of BACKOFF_HTTP_CODES) or
#: exception: a retry of it answered or failing so again is not a new
#: trigger (only its server hold applies) and teaches no pace: a page the
#: server always refuses or fails says nothing new of its load or rate. Its
#: value is the request's URL, so that a spider passing ``response.meta``
#: on to new requests does not pass the mark on.
REFUSED_META_KEY = "_throttling_refused"


def dont_track(meta: dict[str, Any]) -> bool:
    """Whether a request's outcome must not change throttling state:
    :reqmeta:`throttling_dont_track`, or AutoThrottle's
    ``autothrottle_dont_adjust_delay``, which the reference chapter maps to
    it (so spiders written for AutoThrottle keep their exclusions)."""
    return bool(
        meta.get(DONT_TRACK_META_KEY)
        or meta.get(AUTOTHROTTLE_DONT_ADJUST_DELAY_META_KEY)
    )

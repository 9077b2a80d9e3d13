"""The private request meta keys the plugin stamps on requests.

The documented, user-facing keys (``throttling_scopes``,
``throttling_delay``, ``throttling_dont_track``, ...) are described in
``docs/reference/meta.rst``; these are bookkeeping that travels with a
request (through retries, redirects and a JOBDIR) and must keep their names.
"""

from __future__ import annotations

__all__ = ["DELAYED_META_KEY", "DELAY_DEADLINE_META_KEY", "SLOT_STAMP_META_KEY"]

#: The ``download_slot`` value stamped by the downloader, so that a retried or
#: redirected copy is not mistaken for a user-set slot.
SLOT_STAMP_META_KEY = "_throttling_slot_stamp"
#: Set once the request's ``throttling_delay`` has elapsed (or was invalid).
DELAYED_META_KEY = "_throttling_delayed"
#: The wall-clock deadline of the request's ``throttling_delay``.
DELAY_DEADLINE_META_KEY = "_throttling_delay_deadline"

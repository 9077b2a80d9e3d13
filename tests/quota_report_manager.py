"""A manager that reports each answer's real quota use, as an API that
returns what a call cost would let it: every request of a scope with an
amount is estimated at that amount and reported as costing
:data:`ACTUAL_COST` (``consumed`` is the difference), through
:func:`~scrapy_adaptive_throttle.update_scope_backoff` from the response
hook, as docs/usage/quotas.rst shows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_adaptive_throttle import ThrottlingManager, update_scope_backoff

if TYPE_CHECKING:
    from scrapy.http import Response

#: What every request really costs, in quota units.
ACTUAL_COST = 3.0


class CostReportingManager(ThrottlingManager):
    async def get_response_backoff(self, response: Response) -> Any:
        backoff = await super().get_response_backoff(response)
        request = response.request
        scopes = {} if request is None else request.meta.get("throttling_scopes")
        if not isinstance(scopes, dict):
            return backoff
        for scope, amount in scopes.items():
            if isinstance(amount, (int, float)):
                backoff = update_scope_backoff(
                    backoff, scope, consumed=ACTUAL_COST - amount
                )
        return backoff

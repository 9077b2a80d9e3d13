"""The Lua scripts of the shared scope state (see :mod:`._shared_state`).

Each update is one script, so it is atomic, and reads the time with Redis's
``TIME``, so that the machines' clocks do not matter.
"""

from __future__ import annotations

# Times in the scripts are microseconds of the Redis server's clock (exact
# in Lua's doubles), durations are passed in microseconds too.
_NOW_PREAMBLE = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
"""

#: KEYS: the lease keys of R releases, then the lease, next-send and hold
#: key of each scope. ARGV: token, lease TTL, R, the R released tokens, then
#: the limit (-1: none) and the spacing of each scope. Returns ``{status,
#: wait}``: status 1 = leased (every scope), 0 = not leased, -i = not leased
#: and scope i is at its limit; wait = microseconds until every time gate
#: opens. Releases go first, batched into the next check (see
#: SharedState.release).
ACQUIRE_SCRIPT = (
    _NOW_PREAMBLE
    + """
local ttl = tonumber(ARGV[2])
local released = tonumber(ARGV[3])
for i = 1, released do redis.call('ZREM', KEYS[i], ARGV[3 + i]) end
local base = 3 + released
local scopes = (#KEYS - released) / 3
local blocked = 0
local wait = 0
for i = 1, scopes do
  local k = released + 3 * (i - 1)
  local lease = KEYS[k + 1]
  redis.call('ZREMRANGEBYSCORE', lease, '-inf', now)
  local limit = tonumber(ARGV[base + 2 * i - 1])
  if blocked == 0 and limit >= 0 and redis.call('ZCARD', lease) >= limit then
    blocked = i
  end
  local next_send = tonumber(redis.call('GET', KEYS[k + 2]) or '0')
  local hold = tonumber(redis.call('GET', KEYS[k + 3]) or '0')
  local gate = math.max(next_send, hold) - now
  if gate > wait then wait = gate end
end
if blocked > 0 then return {-blocked, wait} end
if wait > 0 then return {0, wait} end
for i = 1, scopes do
  local k = released + 3 * (i - 1)
  redis.call('ZADD', KEYS[k + 1], now + ttl, ARGV[1])
  redis.call('PEXPIRE', KEYS[k + 1], math.ceil(ttl / 1000))
  local spacing = tonumber(ARGV[base + 2 * i])
  if spacing > 0 then
    redis.call('SET', KEYS[k + 2], now + spacing, 'PX',
               math.ceil(spacing / 1000) + 1000)
  end
end
return {1, 0}
"""
)

#: KEYS: lease keys. ARGV: token, lease TTL, then one token per key: lease
#: without looking at limits (a request already in flight).
ADOPT_SCRIPT = (
    _NOW_PREAMBLE
    + """
local ttl = tonumber(ARGV[2])
for i = 1, #KEYS do
  redis.call('ZADD', KEYS[i], now + ttl, ARGV[2 + i])
  redis.call('PEXPIRE', KEYS[i], math.ceil(ttl / 1000))
end
return #KEYS
"""
)

#: KEYS: lease keys. ARGV: the token to remove from each.
RELEASE_SCRIPT = """
for i = 1, #KEYS do redis.call('ZREM', KEYS[i], ARGV[i]) end
return #KEYS
"""

#: KEYS: hold key. ARGV: microseconds from now. A hold only ever grows.
HOLD_SCRIPT = (
    _NOW_PREAMBLE
    + """
local hold = now + tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if hold > current then
  redis.call('SET', KEYS[1], hold, 'PX', math.ceil(tonumber(ARGV[1]) / 1000) + 1000)
end
return 0
"""
)

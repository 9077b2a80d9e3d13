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

#: How many latency samples a scope's list keeps (the newest), and how long
#: it lives unread: a leader drains it every LEADER_INTERVAL.
SAMPLES_CAP = 2000
SAMPLES_TTL_MS = 10000

# Appends the S samples of KEYS[first..] (pairs: samples list, lease key)
# and ARGV[args..] ("kind latency"), each stamped with the server's time and
# the scope's leases (its requests in flight across processes) now.
_PUSH_SAMPLES = f"""
local function push_samples(first, args, count)
  for i = 1, count do
    local samples = KEYS[first + 2 * i - 2]
    local lease = KEYS[first + 2 * i - 1]
    local kind, latency = string.match(ARGV[args + i - 1], '^(%a) (.*)$')
    redis.call('RPUSH', samples, kind .. ' ' .. string.format('%.0f', now) ..
               ' ' .. latency .. ' ' .. redis.call('ZCARD', lease))
    redis.call('LTRIM', samples, -{SAMPLES_CAP}, -1)
    redis.call('PEXPIRE', samples, {SAMPLES_TTL_MS})
  end
end
"""

#: KEYS: the lease keys of R releases, the S sample pairs (samples list,
#: lease key), then the lease, next-send, hold, samples and limit key of
#: each scope. ARGV: token, lease TTL, R, S, the R released tokens, the S
#: samples ("kind latency"), then the limit (-1: none), the spacing and the
#: adaptive ceiling (0: not adaptive) of each scope. Returns ``{status,
#: wait, limits...}``: status 1 = leased (every scope), 0 = not leased, -i
#: = not leased and scope i is at its limit; wait = microseconds until
#: every time gate opens; then the shared adaptive limit of each scope (-1:
#: none published). Samples and releases go first, batched into the next
#: check (see SharedState.release); a send to an adaptive scope adds an
#: ``s`` sample with its scope's leases.
ACQUIRE_SCRIPT = (
    _NOW_PREAMBLE
    + _PUSH_SAMPLES
    + """
local ttl = tonumber(ARGV[2])
local released = tonumber(ARGV[3])
local sampled = tonumber(ARGV[4])
push_samples(released + 1, 5 + released, sampled)
for i = 1, released do redis.call('ZREM', KEYS[i], ARGV[4 + i]) end
local first = released + 2 * sampled
local base = 4 + released + sampled
local scopes = (#KEYS - first) / 5
local blocked = 0
local wait = 0
local limits = {}
for i = 1, scopes do
  local k = first + 5 * (i - 1)
  local lease = KEYS[k + 1]
  redis.call('ZREMRANGEBYSCORE', lease, '-inf', now)
  local limit = tonumber(ARGV[base + 3 * i - 2])
  local ceiling = tonumber(ARGV[base + 3 * i])
  limits[i] = -1
  if ceiling > 0 then
    local shared = redis.call('GET', KEYS[k + 5])
    if shared then
      limit = math.min(tonumber(shared), ceiling)
      limits[i] = limit
    end
  end
  if blocked == 0 and limit >= 0 and redis.call('ZCARD', lease) >= limit then
    blocked = i
  end
  local next_send = tonumber(redis.call('GET', KEYS[k + 2]) or '0')
  local hold = tonumber(redis.call('GET', KEYS[k + 3]) or '0')
  local gate = math.max(next_send, hold) - now
  if gate > wait then wait = gate end
end
if blocked > 0 then return {-blocked, wait, unpack(limits)} end
if wait > 0 then return {0, wait, unpack(limits)} end
for i = 1, scopes do
  local k = first + 5 * (i - 1)
  redis.call('ZADD', KEYS[k + 1], now + ttl, ARGV[1])
  redis.call('PEXPIRE', KEYS[k + 1], math.ceil(ttl / 1000))
  local spacing = tonumber(ARGV[base + 3 * i - 1])
  if spacing > 0 then
    redis.call('SET', KEYS[k + 2], now + spacing, 'PX',
               math.ceil(spacing / 1000) + 1000)
  end
  if tonumber(ARGV[base + 3 * i]) > 0 then
    local samples = KEYS[k + 4]
    redis.call('RPUSH', samples, 's ' .. string.format('%.0f', now) .. ' 0 ' ..
               redis.call('ZCARD', KEYS[k + 1]))
    redis.call('LTRIM', samples, -SAMPLES_CAP, -1)
    redis.call('PEXPIRE', samples, SAMPLES_TTL_MS)
  end
end
return {1, 0, unpack(limits)}
""".replace("SAMPLES_CAP", str(SAMPLES_CAP)).replace(
        "SAMPLES_TTL_MS", str(SAMPLES_TTL_MS)
    )
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

#: KEYS: R lease keys, then S sample pairs (samples list, lease key). ARGV:
#: R, S, the token to remove from each lease key, then the S samples.
RELEASE_SCRIPT = (
    _NOW_PREAMBLE
    + _PUSH_SAMPLES
    + """
local released = tonumber(ARGV[1])
local sampled = tonumber(ARGV[2])
push_samples(released + 1, 3 + released, sampled)
for i = 1, released do redis.call('ZREM', KEYS[i], ARGV[2 + i]) end
return released
"""
)

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

#: KEYS: the leader, samples and limit key of each adaptive scope. ARGV: this
#: process's id, the leader TTL and the limit TTL (ms), then the limit to
#: publish for each scope (-1: none). A process takes the lead of a scope
#: nobody leads (SET NX), keeps it while it renews it, publishes its limit
#: and drains the scope's samples. Returns ``{now, entries...}``: per scope
#: ``{0}`` (led by another process) or ``{1, samples...}``.
LEADER_SCRIPT = (
    _NOW_PREAMBLE
    + """
local me = ARGV[1]
local leader_ttl = tonumber(ARGV[2])
local limit_ttl = tonumber(ARGV[3])
local out = {string.format('%.0f', now)}
for i = 1, #KEYS / 3 do
  local leader, samples, limit = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local holder = redis.call('GET', leader)
  if not holder then
    redis.call('SET', leader, me, 'PX', leader_ttl)
    holder = me
  end
  if holder == me then
    redis.call('PEXPIRE', leader, leader_ttl)
    local publish = tonumber(ARGV[3 + i])
    if publish >= 0 then redis.call('SET', limit, publish, 'PX', limit_ttl) end
    local entry = redis.call('LRANGE', samples, 0, -1)
    redis.call('DEL', samples)
    table.insert(entry, 1, 1)
    out[i + 1] = entry
  else
    out[i + 1] = {0}
  end
end
return out
"""
)

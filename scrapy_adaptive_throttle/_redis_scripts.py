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

#: How long a scope's sends (and refusals) are kept for the global count
#: of the pace learned from 429s: the period before a refused send (1 s)
#: and that send's own age.
SENDS_KEEP_US = 2_000_000

# Hands the N leases of KEYS[first..] (pairs: lease key, sends key) and
# ARGV[args..] (triples: old token, new token, how long ago the new send
# was made, µs) on: a lease freed in this process and taken at once by its
# next send of the same scopes (see SharedState.check) is renamed to the
# new send's token, its expiry renewed, and the send joins the scope's
# sends at the time it was made. The count of leases never changes.
_RENEW_LEASES = """
local function renew_leases(first, args, count, ttl)
  for i = 1, count do
    local lease = KEYS[first + 2 * i - 2]
    local sends = KEYS[first + 2 * i - 1]
    local new = ARGV[args + 3 * i - 2]
    redis.call('ZREM', lease, ARGV[args + 3 * i - 3])
    redis.call('ZADD', lease, now + ttl, new)
    redis.call('PEXPIRE', lease, math.ceil(ttl / 1000))
    redis.call('ZADD', sends, now - tonumber(ARGV[args + 3 * i - 1]), new)
    redis.call('ZREMRANGEBYSCORE', sends, '-inf', now - SENDS_KEEP_US)
    redis.call('PEXPIRE', sends, SENDS_KEEP_US / 1000)
  end
end
""".replace("SENDS_KEEP_US", str(SENDS_KEEP_US))

#: KEYS: the lease keys of R releases, the S sample pairs (samples list,
#: lease key), the N hand-over pairs (lease key, sends key; see
#: _RENEW_LEASES), then the lease, next-send, hold, samples, limit, sends,
#: pace, quota and turns key of each scope, then this process's marker. ARGV:
#: token, lease TTL, R, S, N, the R released tokens, the S samples ("kind
#: latency"), the N hand-overs (old token, new token, age in µs), then the
#: limit (-1: none), the spacing, the adaptive ceiling
#: (0: not adaptive), the learned pace's interval (µs, 0: none), the pace
#: state this process knows ("": none), the quota (-1: none), its window
#: (µs) and the request's amount of each scope, then how many leased
#: requests this process has in flight. Returns ``{status, wait, now,
#: limits..., paces...}``: status 2 = the marker was missing while this
#: process has leases in flight (Redis lost its state without a failed
#: call: lease them again, then check again), 1 = leased (every scope),
#: 0 = not leased, -i = not leased and scope i is at its limit; wait =
#: microseconds until every time gate opens (leased: until this process's
#: next turn, 0: none); the server's time; then the shared adaptive limit
#: of each scope (-1: none published); then the shared pace state of each
#: scope when it differs from the one this process knows ("" otherwise).
#: Samples
#: and releases go first, batched into the next check (see
#: SharedState.release), hand-overs before them; a send to an adaptive
#: scope kept waiting by its leases adds a ``w`` sample (see
#: AdaptiveScopes.lead), a send to an adaptive scope adds an ``s`` sample
#: with its scope's leases. An admitted send joins its scope's sends (the
#: global count a refusal learns from) and, with a pace, the next send is
#: one interval after the time this one was allowed (a schedule, as in
#: LearnedRate.record_send), so the pace holds across processes. A send
#: kept waiting by a scope's next-send time or hold, when the scope has a
#: spacing or a pace, gets this process's turn (a hash of turns by marker,
#: and the ``tail`` after the last one): the wait is until that turn, one
#: interval after the turn before it, so that the processes waiting for
#: one spaced scope ask again one at a time instead of all at once; a
#: leased send of such a scope while others hold turns takes this
#: process's next turn at once; a turn that comes while a paced scope is
#: still closed moves every turn on by the difference.
ACQUIRE_SCRIPT = (
    _NOW_PREAMBLE
    + _PUSH_SAMPLES
    + _RENEW_LEASES
    + """
local ttl = tonumber(ARGV[2])
local released = tonumber(ARGV[3])
local sampled = tonumber(ARGV[4])
local renewed = tonumber(ARGV[5])
-- The marker lives as long as a lease: missing while this process has
-- leases in flight, Redis lost them (restarted empty, flushed, failed
-- over) without this process seeing a failed call. Checked first, so
-- that nothing is written twice by the check asked again.
local marker = KEYS[#KEYS]
local lost = redis.call('EXISTS', marker) == 0
redis.call('SET', marker, 1, 'PX', math.ceil(ttl / 1000))
if lost and tonumber(ARGV[#ARGV]) > 0 then
  return {2, 0, string.format('%.0f', now)}
end
renew_leases(released + 2 * sampled + 1, 6 + released + sampled, renewed, ttl)
push_samples(released + 1, 6 + released, sampled)
for i = 1, released do redis.call('ZREM', KEYS[i], ARGV[5 + i]) end
local first = released + 2 * sampled + 2 * renewed
local base = 5 + released + sampled + 3 * renewed
local scopes = (#KEYS - first - 1) / 9
local process = KEYS[#KEYS]
local blocked = 0
local wait = 0
local limits = {}
local paces = {}
local nexts = {}
local windows = {}
for i = 1, scopes do
  local k = first + 9 * (i - 1)
  local lease = KEYS[k + 1]
  redis.call('ZREMRANGEBYSCORE', lease, '-inf', now)
  local limit = tonumber(ARGV[base + 8 * i - 7])
  local ceiling = tonumber(ARGV[base + 8 * i - 5])
  limits[i] = -1
  if ceiling > 0 then
    local shared = redis.call('GET', KEYS[k + 5])
    if shared then
      limit = math.min(tonumber(shared), ceiling)
      limits[i] = limit
    end
  end
  local pace = redis.call('GET', KEYS[k + 7])
  if pace and pace ~= ARGV[base + 8 * i - 3] then paces[i] = pace else paces[i] = '' end
  if blocked == 0 and limit >= 0 and redis.call('ZCARD', lease) >= limit then
    blocked = i
  end
  local next_send = tonumber(redis.call('GET', KEYS[k + 2]) or '0')
  nexts[i] = next_send
  local hold = tonumber(redis.call('GET', KEYS[k + 3]) or '0')
  local opens = math.max(next_send, hold)
  local gate = opens - now
  local interval = math.max(tonumber(ARGV[base + 8 * i - 6]),
                            tonumber(ARGV[base + 8 * i - 4]))
  if interval > 0 then
    -- Processes waiting for a spaced scope (its spacing or learned pace)
    -- take turns, one interval apart, instead of all asking again when it
    -- opens, where one of them gets the send and the others ask again.
    -- While other processes hold turns, a process without one takes the
    -- next (a send does not jump the queue); one asking again before its
    -- turn keeps it; one whose turn came while the scope was still closed
    -- (the spacing drifted) is next. A process alone waits for the gate
    -- only, so its own spacing's jitter and a cache hit's refund count as
    -- without turns.
    local turns = KEYS[k + 9]
    local state = redis.call('HMGET', turns, process, 'tail')
    local mine = tonumber(state[1] or '0')
    local tail = tonumber(state[2] or '0')
    local others = redis.call('HLEN', turns) - (state[1] and 1 or 0) -
      (state[2] and 1 or 0)
    if others <= 0 then
      -- Alone: the wait is the gate's (a turn only tells a process that
      -- comes later where to queue).
      if gate > 0 then
        redis.call('HSET', turns, process, string.format('%.0f', opens),
                   'tail', string.format('%.0f', opens + interval))
        redis.call('PEXPIRE', turns, math.ceil((opens + interval - now) / 1000) + 1000)
      end
    else
      local due = mine > 0 and mine <= now
      if gate > 0 or (not due and tail > now) then
        local pace = tonumber(ARGV[base + 8 * i - 4])
        if due and pace > 0 and pace >= tonumber(ARGV[base + 8 * i - 6]) then
          -- This process's turn came while the paced scope was still
          -- closed: the turns fell behind the pace's schedule (a send
          -- more than half an interval late restarted it, or a hold came).
          -- Every turn moves on by the drift, so the next ones come as the
          -- scope opens again, instead of each asking once too early for
          -- the rest of the crawl. (A spacing's schedule follows each
          -- send's own lateness: its turns are left as they are.)
          local drift = opens - mine
          local held = redis.call('HGETALL', turns)
          for j = 1, #held, 2 do
            if held[j] ~= process then
              redis.call('HSET', turns, held[j],
                         string.format('%.0f', tonumber(held[j + 1]) + drift))
            end
          end
          tail = tail + drift
        end
        if due then
          mine = opens
        elseif mine == 0 or mine < opens then
          mine = math.max(opens, tail)
        end
        if mine + interval > tail then tail = mine + interval end
        redis.call('HSET', turns, process, string.format('%.0f', mine),
                   'tail', string.format('%.0f', tail))
        redis.call('PEXPIRE', turns, math.ceil((tail - now) / 1000) + 1000)
        gate = mine - now
      end
    end
  end
  -- The quota: one fixed window for every process (QuotaWindow's rule).
  local quota = tonumber(ARGV[base + 8 * i - 2])
  local window = tonumber(ARGV[base + 8 * i - 1])
  if quota >= 0 and window > 0 then
    local amount = tonumber(ARGV[base + 8 * i])
    local spent = redis.call('HMGET', KEYS[k + 8], 'start', 'consumed')
    local start = tonumber(spent[1])
    local consumed = tonumber(spent[2] or '0')
    if start and now - start >= window then
      -- Whole windows only: boundaries stay where the first use put them.
      start = start + math.floor((now - start) / window) * window
      consumed = 0
    end
    windows[i] = {start, consumed}
    if start and consumed > 0 and consumed + amount > quota then
      gate = math.max(gate, start + window - now)
    end
  end
  if gate > wait then wait = gate end
end
local stamp = string.format('%.0f', now)
for i = 1, scopes do table.insert(limits, paces[i]) end
if blocked > 0 then
  -- A send of an adaptive scope kept waiting by the leases: a ``w`` sample
  -- tells a leader that leads it alone that another process wants in.
  if tonumber(ARGV[base + 8 * blocked - 5]) > 0 then
    local samples = KEYS[first + 9 * (blocked - 1) + 4]
    redis.call('RPUSH', samples, 'w ' .. stamp .. ' 0 ' ..
               redis.call('ZCARD', KEYS[first + 9 * (blocked - 1) + 1]))
    redis.call('LTRIM', samples, -SAMPLES_CAP, -1)
    redis.call('PEXPIRE', samples, SAMPLES_TTL_MS)
  end
  return {-blocked, wait, stamp, unpack(limits)}
end
if wait > 0 then return {0, wait, stamp, unpack(limits)} end
local turn = 0
for i = 1, scopes do
  local k = first + 9 * (i - 1)
  local turns = KEYS[k + 9]
  redis.call('HDEL', turns, process)
  redis.call('ZADD', KEYS[k + 1], now + ttl, ARGV[1])
  redis.call('PEXPIRE', KEYS[k + 1], math.ceil(ttl / 1000))
  local next_send = now + tonumber(ARGV[base + 8 * i - 6])
  local interval = tonumber(ARGV[base + 8 * i - 4])
  if interval > 0 then
    -- Allowed one interval after the previous send was allowed; a send
    -- more than half an interval late starts a new schedule (no burst).
    local allowed = nexts[i] + interval
    if allowed < now + interval / 2 then allowed = now + interval end
    if allowed > next_send then next_send = allowed end
  end
  if next_send > now then
    redis.call('SET', KEYS[k + 2], next_send, 'PX',
               math.ceil((next_send - now) / 1000) + 1000)
  end
  local spacing = math.max(tonumber(ARGV[base + 8 * i - 6]), interval)
  if spacing > 0 and redis.call('HLEN', turns) > 1 then
    -- Others hold turns: this process takes the next one now, for its
    -- next send (its next check waits for it instead of asking first).
    local tail = tonumber(redis.call('HGET', turns, 'tail') or '0')
    local mine = math.max(next_send, tail)
    redis.call('HSET', turns, process, string.format('%.0f', mine),
               'tail', string.format('%.0f', mine + spacing))
    redis.call('PEXPIRE', turns, math.ceil((mine + spacing - now) / 1000) + 1000)
    if mine - now > turn then turn = mine - now end
  end
  local spent = windows[i]
  if spent then
    local start = spent[1] or now
    local window = tonumber(ARGV[base + 8 * i - 1])
    redis.call('HSET', KEYS[k + 8], 'start', string.format('%.0f', start),
               'consumed', spent[2] + tonumber(ARGV[base + 8 * i]))
    redis.call('PEXPIRE', KEYS[k + 8],
               math.ceil((start + window - now) / 1000) + 1000)
  end
  local sends = KEYS[k + 6]
  redis.call('ZADD', sends, now, ARGV[1])
  redis.call('ZREMRANGEBYSCORE', sends, '-inf', now - SENDS_KEEP_US)
  redis.call('PEXPIRE', sends, SENDS_KEEP_US / 1000)
  if tonumber(ARGV[base + 8 * i - 5]) > 0 then
    local samples = KEYS[k + 4]
    redis.call('RPUSH', samples, 's ' .. stamp .. ' 0 ' ..
               redis.call('ZCARD', KEYS[k + 1]))
    redis.call('LTRIM', samples, -SAMPLES_CAP, -1)
    redis.call('PEXPIRE', samples, SAMPLES_TTL_MS)
  end
end
return {1, turn, stamp, unpack(limits)}
""".replace("SAMPLES_CAP", str(SAMPLES_CAP))
    .replace("SAMPLES_TTL_MS", str(SAMPLES_TTL_MS))
    .replace("SENDS_KEEP_US", str(SENDS_KEEP_US))
)

#: KEYS: the sends, refusals, episode and count-start keys of a scope.
#: ARGV: how long before now the refused request was sent (µs, -1:
#: unknown), the period the server counts over (µs), a token for the
#: refusal, the lease token of the refused send ("": unknown; its score in
#: the sends is its exact send time, else the age estimates it), how long
#: the count's start is kept (ms), 1 to learn from the refusal or 0 to only
#: count it (a retry of a request refused before: ``{0, now}``, never the
#: refusal of an episode's claim). A refusal for too many requests (429):
#: recorded, and the first of its episode (no other one for a period) is
#: claimed for the asking process, which learns the pace from every
#: process's sends. As in one process (whose count starts at the scope's
#: first refusal, LearnedRate being made then), only the sends since the
#: scope's first refusal count: the first teaches nothing, so that one 429
#: (at a crawl's start, or of one page) does not set a pace from a count
#: that says nothing of the server's window. Returns ``{0, now}`` (another
#: process learns from this episode) or ``{1, now, accepted}``: the sends
#: over the period before the refused one, since the count's start, minus
#: the refusals since, of every process (as LearnedRate.count_accepted
#: counts its own).
REFUSE_SCRIPT = (
    _NOW_PREAMBLE
    + """
local age = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local sent = now
if age >= 0 then sent = now - age end
local own = ARGV[4] ~= '' and redis.call('ZSCORE', KEYS[1], ARGV[4])
if own then
  sent = tonumber(own)
  age = now - sent
end
local start = tonumber(redis.call('GET', KEYS[4]) or now)
redis.call('SET', KEYS[4], string.format('%.0f', start), 'PX', tonumber(ARGV[5]))
local since = sent - period
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - SENDS_KEEP_US)
local refused = redis.call('ZCOUNT', KEYS[2], since, '+inf')
redis.call('ZADD', KEYS[2], now, ARGV[3])
redis.call('PEXPIRE', KEYS[2], SENDS_KEEP_US / 1000)
local stamp = string.format('%.0f', now)
if ARGV[6] == '0' then return {0, stamp} end
local claimed = redis.call('SET', KEYS[3], stamp, 'NX', 'PX',
                           math.max(1, math.floor(period / 1000)))
if not claimed then return {0, stamp} end
local before = '(' .. string.format('%.0f', sent)
local accepted = redis.call('ZCOUNT', KEYS[1], math.max(since, start), before)
accepted = accepted - refused
if age < 0 then accepted = accepted - 1 end
if accepted < 0 then accepted = 0 end
return {1, stamp, accepted}
""".replace("SENDS_KEEP_US", str(SENDS_KEEP_US))
)

#: KEYS: the pace key of a scope. ARGV: the pace state learned (see
#: SharedPaces.publish), its TTL (ms).
PACE_SCRIPT = """
redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
return 1
"""

#: KEYS: this process's marker, then lease keys. ARGV: unused, lease TTL,
#: then one token per lease key: lease without looking at limits (a
#: request already in flight), and mark this process's leases as known to
#: this Redis (see the check script).
ADOPT_SCRIPT = (
    _NOW_PREAMBLE
    + """
local ttl = tonumber(ARGV[2])
redis.call('SET', KEYS[1], 1, 'PX', math.ceil(ttl / 1000))
for i = 2, #KEYS do
  redis.call('ZADD', KEYS[i], now + ttl, ARGV[1 + i])
  redis.call('PEXPIRE', KEYS[i], math.ceil(ttl / 1000))
end
return #KEYS - 1
"""
)

#: KEYS: R lease keys, then S sample pairs (samples list, lease key), then
#: N hand-over pairs (lease key, sends key). ARGV: R, S, N, the lease TTL,
#: the token to remove from each lease key, the S samples, then the N
#: hand-overs (old token, new token, age in µs; see _RENEW_LEASES, applied
#: first).
RELEASE_SCRIPT = (
    _NOW_PREAMBLE
    + _PUSH_SAMPLES
    + _RENEW_LEASES
    + """
local released = tonumber(ARGV[1])
local sampled = tonumber(ARGV[2])
local renewed = tonumber(ARGV[3])
renew_leases(released + 2 * sampled + 1, 5 + released + sampled, renewed,
             tonumber(ARGV[4]))
push_samples(released + 1, 5 + released, sampled)
for i = 1, released do redis.call('ZREM', KEYS[i], ARGV[4 + i]) end
return released
"""
)

#: KEYS: the next-send, sends and quota key of each scope of a request
#: answered from a cache. ARGV: the token of its lease, the server's time of
#: its admission (µs), then per scope the spacing that admission set (µs;
#: 0: none to give back, as for a paced scope), the request's amount (0:
#: none) and the quota's window (µs; 0: no quota). The send leaves the
#: scope's sends (it never reached the host: a 429's pace must not count
#: it); its spacing is given back if it is still the scope's latest send and
#: the next-send time is the one it set (nothing moved the gate since, as
#: DelayGate.refund); its amount is given back to the quota window it was
#: spent from, if that window is still open. Returns, per scope, 1 if its
#: next-send time was given back, else 0.
REFUND_SCRIPT = (
    _NOW_PREAMBLE
    + """
local token = ARGV[1]
local stamp = tonumber(ARGV[2])
local opened = {}
for i = 1, #KEYS / 3 do
  opened[i] = 0
  local next_key, sends, quota = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local spacing = tonumber(ARGV[3 * i])
  local amount = tonumber(ARGV[3 * i + 1])
  local window = tonumber(ARGV[3 * i + 2])
  local latest = redis.call('ZREVRANGE', sends, 0, 0)
  redis.call('ZREM', sends, token)
  if spacing > 0 and latest[1] == token then
    local next_send = tonumber(redis.call('GET', next_key) or '0')
    if next_send == stamp + spacing and next_send > now then
      redis.call('DEL', next_key)
      opened[i] = 1
    end
  end
  if amount > 0 and window > 0 then
    local spent = redis.call('HMGET', quota, 'start', 'consumed')
    local start = tonumber(spent[1])
    if start and stamp >= start and stamp < start + window
        and now < start + window then
      local consumed = math.max(0, tonumber(spent[2] or '0') - amount)
      redis.call('HSET', quota, 'consumed', consumed)
    end
  end
end
return opened
"""
)

#: KEYS: the quota key of a scope. ARGV: the quota, its window (µs), then
#: what the server reported about a request's use of it: the difference
#: between its actual and estimated consumption ("": not reported) and the
#: units left in the server's window ("": not reported; wins over the
#: difference). QuotaWindow.reconcile's rule on the shared window: the
#: window rolls first (whole windows only), a report in a window nobody
#: used yet starts it (a reported exhaustion must expire), and the
#: consumption never goes below 0. Returns the consumption as set.
RECONCILE_SCRIPT = (
    _NOW_PREAMBLE
    + """
local quota = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local spent = redis.call('HMGET', KEYS[1], 'start', 'consumed')
local start = tonumber(spent[1])
local consumed = tonumber(spent[2] or '0')
if start and now - start >= window then
  start = start + math.floor((now - start) / window) * window
  if now - start >= window then start = start + window end
  consumed = 0
end
if not start then start = now end
if ARGV[4] ~= '' then
  consumed = math.max(0, quota - tonumber(ARGV[4]))
else
  consumed = math.max(0, consumed + tonumber(ARGV[3]))
end
redis.call('HSET', KEYS[1], 'start', string.format('%.0f', start),
           'consumed', consumed)
redis.call('PEXPIRE', KEYS[1], math.ceil((start + window - now) / 1000) + 1000)
return tostring(consumed)
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

#: KEYS: the leader, samples, limit and baseline key of each adaptive scope.
#: ARGV: this process's id, the leader TTL and the limit TTL (ms), then the
#: limit and the baseline latency (s) to publish for each scope (-1: none).
#: A process takes the lead of a scope nobody leads (SET NX), keeps it while
#: it renews it, publishes its limit and baseline and drains the scope's
#: samples. Returns ``{now, entries...}``: per scope ``{0}`` (led by another
#: process) or ``{1, limit, baseline, samples...}``, the limit and baseline
#: published before this call (``''``: none), which a new leader adopts.
LEADER_SCRIPT = (
    _NOW_PREAMBLE
    + """
local me = ARGV[1]
local leader_ttl = tonumber(ARGV[2])
local limit_ttl = tonumber(ARGV[3])
local out = {string.format('%.0f', now)}
for i = 1, #KEYS / 4 do
  local leader, samples = KEYS[4 * i - 3], KEYS[4 * i - 2]
  local limit, baseline = KEYS[4 * i - 1], KEYS[4 * i]
  local holder = redis.call('GET', leader)
  if not holder then
    redis.call('SET', leader, me, 'PX', leader_ttl)
    holder = me
  end
  if holder == me then
    redis.call('PEXPIRE', leader, leader_ttl)
    local published = redis.call('GET', limit) or ''
    local published_baseline = redis.call('GET', baseline) or ''
    local publish = tonumber(ARGV[2 + 2 * i])
    if publish >= 0 then
      redis.call('SET', limit, publish, 'PX', limit_ttl)
      local best = tonumber(ARGV[3 + 2 * i])
      if best > 0 then redis.call('SET', baseline, ARGV[3 + 2 * i], 'PX', limit_ttl) end
    end
    local entry = redis.call('LRANGE', samples, 0, -1)
    redis.call('DEL', samples)
    table.insert(entry, 1, published_baseline)
    table.insert(entry, 1, published)
    table.insert(entry, 1, 1)
    out[i + 1] = entry
  else
    out[i + 1] = {0}
  end
end
return out
"""
)

#: KEYS: the leader, limit and baseline key of each adaptive scope whose
#: limit its leader just changed. ARGV: this process's id, the limit TTL
#: (ms), then the limit and baseline (s, -1: none) of each scope. Publishes
#: them where this process still leads: a limit decided on drained samples
#: is enforced at once, not a drain later. Returns the server's time (µs).
PUBLISH_SCRIPT = (
    _NOW_PREAMBLE
    + """
local me = ARGV[1]
local limit_ttl = tonumber(ARGV[2])
for i = 1, #KEYS / 3 do
  if redis.call('GET', KEYS[3 * i - 2]) == me then
    redis.call('SET', KEYS[3 * i - 1], ARGV[1 + 2 * i], 'PX', limit_ttl)
    if tonumber(ARGV[2 + 2 * i]) > 0 then
      redis.call('SET', KEYS[3 * i], ARGV[2 + 2 * i], 'PX', limit_ttl)
    end
  end
end
return string.format('%.0f', now)
"""
)

#: KEYS: the leader key of each scope this process leads. ARGV: this
#: process's id. Gives the lead up (its crawl ends), so that another process
#: takes it at its next renewal instead of a lead TTL later.
RESIGN_SCRIPT = """
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('DEL', KEYS[i]) end
end
return 0
"""

-- One sync of one instance for some partitions of one shared budget (see doc.go).
--
-- KEYS[1]   the budget's hash of partitions: one field per partition (see below)
-- KEYS[2]   the sweep of KEYS[1]'s lapsed fields: its cursor and when it last ran (see below)
-- KEYS[3]   when ARGV[8] > 0, the budget's quarantine hash (see below); every key of a budget
--           has the budget's hash tag
-- ARGV[1]   instance id (its field is "i:<id>")
-- ARGV[2]   lease duration, ms (an instance not heard from for this long is dead)
-- ARGV[3]   budget rate, execution seconds per second (0: no bucket)
-- ARGV[4]   budget burst, execution seconds
-- ARGV[5]   budget max_concurrent (0: unlimited)
-- ARGV[6]   sync interval, ms (the odd slots rotate every ten; two without a sync is an outage)
-- ARGV[7]   not after, µs of Redis TIME: a call that Redis runs later (it sat in the socket
--           of a Redis that hung, and its sender gave up on it) changes nothing; 0: no limit
-- ARGV[8]   the budget's quarantine for:, µs; 0: it shares no quarantines (no quarantine key)
-- ARGV[9]   the most quarantines the quarantine hash may hold
-- ARGV[10]  the partitions' reports, 11 little-endian doubles each:
--           seq, used seconds, demand (execution seconds per second), slots wanted,
--           slots applied (the instance's current limit), in flight, leave (1 or 0),
--           instances expected (the most the instance saw in the partition lately),
--           age µs (how long before now its usage counts as run; see below),
--           local debt seconds (what the instance's bucket holds now),
--           recovering (1 or 0: the instance's previous sync failed)
-- then each partition's field in KEYS[1], in the order of the reports
-- then for each quarantine the instance began since its last sync 2 values:
--           fingerprint (16 lower-case hex digits), µs left
--
-- A partition is one field of the budget's hash, so that a call of many partitions reads
-- them with one HMGET and writes them with one HSET: a command called from the script costs
-- more than the partition's own work. Its value is binary, every number a little-endian
-- double: the partition's expiry (µs of Redis TIME), then {tat, gf, gt, last, lu, ln}, then
-- for each instance its id "i:<id>" (after its length, a little-endian 16-bit integer) and
-- its entry. tat is the budget's theoretical arrival time (µs of Redis TIME: global debt =
-- rate × max(0, tat − now)), gf and gt the last time the bucket stood idle before usage that
-- ran later (µs, from and to; see below), last when anyone last synced it, and, while
-- instances are believed lost, lu and ln (until when, and how many instances there were); 0
-- where there is none. An instance's entry is {seq, demand, want, held slots, granted rate,
-- expiry µs, left, max_concurrent, rate, burst, local debt, its time µs}; left = 1 marks an
-- instance that left the partition, kept for a lease duration; the next three are the
-- budget's limits on that instance, the last two what its bucket held as it reported (a
-- share of debt it took on at that sync is in its next report). Fixed-size numbers, not
-- msgpack: the script decodes and encodes every partition of a call, and the other
-- instances' entries are written back as the bytes they were read.

-- Memory stays bounded: a partition lives while an instance takes part in it or its debt has
-- not drained (at most an hour of it). A field past its expiry counts as absent, and the calls
-- sweep the hash (HSCAN from the cursor in KEYS[2]), deleting the lapsed fields, so that the
-- sweep goes round the hash about once every four intervals however many partitions the calls
-- carry: a call sweeps the fields due since the last sweep, a quarter of the hash's fields
-- (HLEN) per interval, paced by the time of the last sweep kept with the cursor, so that the
-- calls of every instance share one pace; at most max_sweep of them, so that a call stays
-- short whatever the hash holds, and at least a quarter as many as it carries partitions.
-- Each field swept costs Redis a read of its value, and most fields are live: a budget whose
-- partitions are all active sweeps no more than that quarter, and one that keeps a few active
-- among many lapsed (a nightly job touched every tenant) deletes max_sweep lapsed fields per
-- call until they are gone. The hash and the cursor expire with the furthest expiry written,
-- so a budget nobody syncs goes whole.
--
-- Lost instances. An instance whose lease lapsed in Redis may still be running on its
-- fallback share: Redis lost its entry in a restart, or the entry lapsed while nobody could
-- sync (Redis hung, or the network failed). The partition shows it: the hash is gone though
-- the caller saw others lately (expected > 1), or nobody synced it for two intervals (each
-- live instance syncs about once an interval); or the caller comes back from failed syncs
-- itself: the others may have failed too, and wait for their retries (spread over up to
-- one and a half intervals) while their leases lapse, the outage too short for the
-- partition to go unsynced for two intervals. Then, for one lease duration, the capacity of
-- the instances that were there and are not back is kept free for them (none when all are
-- there). An instance that lapses while others sync normally has crashed: its capacity
-- returns when its lease lapses.
--
-- When usage ran. The used seconds of a report count as run age µs ago: in the middle of
-- the interval the report covers, or, for a report held back by failed syncs (its instance
-- could not reach Redis, or Redis hung), in the middle of the first interval, as if it had
-- come on time. Where the global bucket was idle since then, the usage fills that idle
-- time, as it ran then, and only the rest is debt; where others' usage kept the bucket busy,
-- it is debt in full. Counted as run when it arrives, the usage that every instance ran
-- during an outage would land at once as debt, and the instances' shares of it would fill
-- their buckets for as long as it took to run it. Reports do not arrive in the order their
-- usage ran: after an outage some instances come back before others (their retries are
-- spread), and their reports of usage that ran since move tat past the time the others'
-- held-back usage ran. So the last idle stretch that usage which ran later skipped over
-- ("gf" to "gt") is kept, and usage that ran during it fills it before it counts on tat.
--
-- The debt a lease carries. The global bucket counts each instance's usage, which that
-- instance's own bucket holds too. Debt that no live instance's bucket holds (usage of an
-- instance that left or crashed, or of a burst that moved: a lease that shrank forgave its
-- debt down to its new burst) would be room twice, in the global bucket's stead; each lease
-- carries its share of that debt, and the instance's bucket holds its own debt and that
-- share from then on. Only that: a share of the whole global debt would fill a bucket with
-- the instance's own usage again (the global bucket counts it when the report comes, after
-- the local one did), and statements about as large as a lease's burst would wait for their
-- own cost twice, holding the budget below its rate.
--
-- Shared quarantines. The quarantine hash (pgtraffic:{budget}:q:<after>:<for>) has one field
-- per quarantined fingerprint, its value when the quarantine ends (µs of Redis TIME). The call
-- adds the caller's new quarantines (a later end wins; at most for: from now; none past the
-- bound), drops the fields that ended or that this script could not have written, and returns
-- every quarantine in force. The hash expires when its last quarantine ends.
--
-- Returns {now µs (a string), stale (1 or 0), then one string of each partition's results,
-- 13 little-endian doubles each: {rate, burst, slots, live instances, global debt, target
-- rate, target slots, retake, rate, burst and max_concurrent in force, differ, hold}, then,
-- with a quarantine key, {fingerprint, µs left, ...}}. retake is, for a starved instance, µs
-- until another instance's lease lapses, or 1 for an instance that gives slots back while
-- another holds less than its target: it confirms at once, as Redis counts its earlier,
-- larger limit as held until it reports the smaller one (0: neither); differ is 1 when
-- instances disagree on the limits, hold the debt the instance's bucket must hold from now
-- on (see above).

-- The library functions the loop below calls, as locals: a script reads a global through
-- Redis's protected global table, which costs more than most of the arithmetic it feeds.
local min, max, floor, huge = math.min, math.max, math.floor, math.huge
local struct_pack, struct_unpack = struct.pack, struct.unpack
local sub, sort, concat = string.sub, table.sort, table.concat
local type, ipairs = type, ipairs
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local id = 'i:' .. ARGV[1]
local ttl = tonumber(ARGV[2]) * 1000
local rate = tonumber(ARGV[3])
local burst = tonumber(ARGV[4])
local maxc = tonumber(ARGV[5])
local period = max(tonumber(ARGV[6]) * 1000, 1)
local not_after = tonumber(ARGV[7])
local qfor = tonumber(ARGV[8])
local qmax = tonumber(ARGV[9])
local blob = ARGV[10]
local head = 10
local nparts = floor(#blob / 88)
if #blob ~= nparts * 88 or #ARGV < head + nparts then
  return redis.error_reply('sync: ' .. #blob .. ' bytes of reports for ' .. (#ARGV - head) .. ' values')
end
local hkey, ckey = KEYS[1], KEYS[2]
-- The budget's want channel (pgtraffic:{budget}:want, see below).
local want_channel = sub(hkey, 1, -3) .. 'want'

local function num(x) return string.format('%.17g', x) end

-- Everything read back from Redis is checked: another writer (or a corrupted restore) may
-- have left any value. A value that is not a finite number in its range is ignored, and the
-- writes below repair it. What struct.unpack reads is a number always (a NaN or an infinity
-- at worst), and each is checked with plain comparisons where it is read, which a NaN fails
-- (x >= lo is false): a partition holds some twenty such numbers, and a call of a Lua
-- function costs more than its comparisons. within checks a value that may be anything (what
-- tonumber made of a string: nil when not a number); finite is within over every finite
-- number.
local function within(x, lo, hi)
  return type(x) == 'number' and x >= lo and x <= hi and x > -huge and x < huge
end
local function finite(x) return within(x, -huge, huge) end
-- The most global debt kept, µs of the budget's rate (the horizon of the expiry below).
local max_debt = 3600 * 1000000
-- The most instances a partition may count as lost.
local max_lost = 100000
-- The furthest back a report's usage counts as run, µs.
local max_age = max_debt
-- The most fields one call sweeps: a sweep of that many costs Redis less than a call of
-- 256 partitions, however many lapsed fields the hash holds.
local max_sweep = 1024

-- A partition's value (see the top): its expiry and the partition's six values, then each
-- instance's entry, its id (after the id's length) and its twelve values. The header and the
-- caller's own entry are written in one struct.pack (value_format).
local head_format, head_len = '<ddddddd', 56
local entry_format, entry_len = '<Hc0dddddddddddd', 98 -- entry_len: the bytes besides the id
local value_format = '<dddddddHc0dddddddddddd'

-- The longest lease another instance may hold, µs: its sync interval may be longer than the
-- caller's (a rolling change of sync_interval, which the rules bound at a minute: a lease of
-- 2.5 minutes, leaseDuration(rules.MaxSyncInterval), which a test holds this to). Its entry, and the loss it records, are valid until then: read against the
-- caller's own lease, they would be dropped, and the capacity that instance holds handed
-- out again.
local max_ttl = max(ttl, 150 * 1000000)

-- valid reports whether an instance's entry {seq, demand, want, held slots, granted rate,
-- expiry µs, left, ...} is one this script could have written (a negative or non-finite
-- number, an expiry beyond the longest lease from now are not); entry returns a copy of a
-- valid one for the arithmetic. The entry as read is what the partition keeps of another
-- instance. What it holds counts as at most the whole budget: an instance on other limits (a
-- rolling change of the rules) may hold more than this one's.
local function valid(seq, demand, want, slots, granted, expires, left)
  return seq >= 0 and seq < huge and demand >= 0 and demand < huge and want >= 0 and want < huge and
    slots >= 0 and slots < huge and granted >= 0 and granted < huge and expires >= 0 and expires <= now + max_ttl and
    (left == 0 or left == 1)
end
local function entry(...)
  local e = {...}
  e[4], e[5] = min(e[4], maxc), min(e[5], rate)
  if not (e[8] >= 0 and e[8] < huge and e[9] >= 0 and e[9] < huge and e[10] >= 0 and e[10] < huge) then
    e[8], e[9], e[10] = nil, nil, nil -- no limits known
  end
  if not (e[11] >= 0 and e[11] < huge and e[12] >= 0 and e[12] <= now) then
    e[11], e[12] = 0, now -- holds nothing known
  end
  return e
end

if not_after > 0 and now > not_after then
  return {num(now), 1}
end

-- The furthest a partition's expiry may lie ahead: the most debt kept, and two leases.
local max_expiry = max_debt + 2 * ttl

-- expiry is when a field's partition lapses, µs, or nil when it is not a value this script
-- could have written.
local function expiry(v)
  if type(v) ~= 'string' or #v < 9 then return nil end
  local x = struct_unpack('<d', v)
  if not (x >= 0 and x <= now + max_expiry) then return nil end
  return x
end

-- A key of another type than this script writes (another writer) is replaced.
local kind = redis.call('TYPE', hkey)['ok']
if kind ~= 'hash' and kind ~= 'none' then redis.call('DEL', hkey) end

-- Sweep: delete the lapsed fields among the next ones from the cursor (see the top). KEYS[2]
-- holds "<cursor> <µs of the last sweep>". A cursor Redis could not have returned starts the
-- sweep over: one of 20 digits may be past 2^64 - 1, which HSCAN refuses, failing every sync
-- of the budget for as long as the key stays (a hash's cursor is below its table's size, far
-- below 10^19). A time to come, or none (the key of an earlier version held the cursor alone),
-- is now; one older than a round (four intervals) counts as a round ago.
local cursor, swept_at = '0', now
local state = redis.pcall('GET', ckey)
if type(state) == 'string' then
  local c, at = string.match(state, '^(%d+) (%d+)$')
  if c == nil then c = string.match(state, '^(%d+)$') end
  if c ~= nil and #c <= 19 then cursor = c end
  at = tonumber(at)
  if at ~= nil and at <= now then swept_at = max(at, now - 4 * period) end
end
-- The fields due since the last sweep: a quarter of the hash per interval. A fraction of a
-- field is left for a later call, which the time of the last sweep carries; the fields past
-- max_sweep are not (the next calls sweep at most as many each).
local due = floor(redis.call('HLEN', hkey) * (now - swept_at) / (4 * period))
if due >= 1 then swept_at = now end
local scan = redis.call('HSCAN', hkey, cursor, 'COUNT', max(math.ceil(nparts / 4), 32, min(due, max_sweep)))
local swept = {}
for j = 1, #scan[2], 2 do
  local x = expiry(scan[2][j + 1])
  if x == nil or x <= now then swept[#swept + 1] = scan[2][j] end
end
if #swept > 0 then redis.call('HDEL', hkey, unpack(swept)) end
cursor = scan[1]

-- Read every partition of the call at once.
local fields = {}
for i = 1, nparts do fields[i] = ARGV[head + i] end
local values = {}
if nparts > 0 then values = redis.call('HMGET', hkey, unpack(fields)) end
local writes = {}
local furthest = now

-- fill shares cap among demands max-min fairly (water-filling): in increasing order of
-- demand each gets its demand or an even split of what is left, whichever is smaller.
-- It puts the shares in out[1..n] and returns out and what no demand took.
local function fill(cap, demands, n, out)
  if n == 1 then
    -- Alone (most partitions of a budget per tenant): no order to sort.
    local x = min(demands[1], cap)
    out[1] = x
    return out, max(cap - x, 0)
  end
  local order = {}
  for i = 1, n do order[i] = i end
  sort(order, function(a, b) return demands[a] < demands[b] end)
  local left = cap
  for k, i in ipairs(order) do
    local x = min(demands[i], left / (n - k + 1))
    out[i] = x
    left = left - x
  end
  return out, max(left, 0)
end

-- rank_of is an instance's draw for the odd slots in this ten-interval epoch, the same for
-- every partition of the call.
local epoch = tostring(floor(now / (10 * period)))
local ranks = {}
local function rank_of(f)
  local r = ranks[f]
  if r == nil then
    r = redis.sha1hex(f .. '@' .. epoch)
    ranks[f] = r
  end
  return r
end

-- Each partition's result is 13 little-endian doubles, all of them in one string: formatting
-- numbers as text in Lua, and a reply of thirteen values per partition, cost more than the
-- partition's own work.
local result_format = '<ddddddddddddd'

-- ranked is the order of ids[1..n] by their draws (rank_of).
local function ranked(ids, n)
  local rank, order = {}, {}
  for k = 1, n do
    rank[k] = rank_of(ids[k])
    order[k] = k
  end
  sort(order, function(a, b) return rank[a] < rank[b] end)
  return order
end

-- Scratch tables that every partition of the call reuses, emptied after each: in Lua, a
-- table made per partition costs more than most of the partition's arithmetic. ids,
-- others and keep hold the other instances (see below), mine the caller's entry as
-- written back, me_entry the caller's demand among the others' entries, and d, w, share and
-- target the arithmetic's per-instance values.
local ids, others, keep = {}, {}, {}
local mine, me_entry = {}, {0, 0, 0, 0, 0, 0}
local d, w, share, target = {}, {}, {}, {}
local out, results = {num(now), 0}, {}
for i = 1, nparts do
  local seq, used, demand, want, applied, inflight, leave_n, expected, age, own, recovering_n =
    struct_unpack('<ddddddddddd', blob, (i - 1) * 88 + 1)
  local leave, recovering = leave_n == 1, recovering_n == 1
  if not (age >= 0 and age <= max_age) then age = 0 end
  if not (own >= 0 and own < huge) then own = 0 end -- the instance's local debt

  -- Read the partition, dropping instances whose lease has lapsed. A field past its
  -- expiry, or not one this script could have written, is a partition gone.
  local v = values[i]
  local x = expiry(v)
  local found = x ~= nil and x > now and #v >= head_len
  local tat, last, lost_until, lost_n = nil, nil, 0, 0
  local gap_from, gap_to = 0, 0
  local mine_seq = 0 -- the sequence number of the caller's last report counted
  local mine_bytes = nil -- the caller's entry as read, when live
  local gone, lapsed = 0, 0
  -- ids and others: the live instances other than the caller, and their entries (copies);
  -- keep: the other instances' entries as read (their bytes), written back unchanged. An
  -- entry cut short ends the partition's entries.
  if found then
    local _, s_tat, s_gf, s_gt, s_last, s_lu, s_ln = struct_unpack(head_format, v)
    if s_tat > -huge and s_tat < huge then tat = min(s_tat, now + max_debt) end
    if s_gf >= 0 and s_gf <= now then gap_from = s_gf end
    if s_gt >= 0 and s_gt <= now then gap_to = s_gt end
    if s_last >= 0 and s_last <= now then last = s_last end
    if s_lu >= 0 and s_lu <= now + max_ttl then lost_until = s_lu end
    if s_ln >= 0 and s_ln <= max_lost then lost_n = floor(s_ln) end
    local pos, size = head_len + 1, #v
    while pos + entry_len - 1 <= size do
      local stop = pos + entry_len + struct_unpack('<H', v, pos)
      if stop - 1 > size then break end
      local f, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12 = struct_unpack(entry_format, v, pos)
      if sub(f, 1, 2) ~= 'i:' or not valid(e1, e2, e3, e4, e5, e6, e7) then
      elseif e6 <= now then
        if e7 ~= 1 and f ~= id then lapsed = lapsed + 1 end
      elseif f == id then
        mine_seq, mine_bytes = e1, sub(v, pos, stop - 1)
      elseif e7 == 1 then
        gone = gone + 1
        keep[#keep + 1] = sub(v, pos, stop - 1)
      elseif others[f] == nil then
        ids[#ids + 1] = f
        others[f] = entry(e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12)
        keep[#keep + 1] = sub(v, pos, stop - 1)
      end
      pos = stop
    end
  end
  -- A partition without a tat (new, expired, or lost in a restart) has stood idle for as
  -- long as a report's usage may count back: usage that ran while Redis could not count it
  -- fills that idle time. Set to now, it would count as run now, and after an outage at
  -- least as long as the hash's expiry (a Redis stopped for 5 s) all the usage the
  -- instances ran on their fallback shares would be debt, holding the budget below its
  -- rate until it drained.
  if tat == nil then tat = now - max_age end

  -- A goodbye older than the caller's entry (a coordinator that replaced the one that sent it,
  -- under the same id, has reported since: its numbers are above every one its predecessor
  -- sent) ran late, having sat in a socket: the entry is the successor's, which holds its
  -- leases, and stays as it is. Its usage counts as any report's.
  local stale_leave = leave and mine_bytes ~= nil and seq < mine_seq

  -- Usage counts once per sequence number, whatever the retries. An instance's numbers only
  -- grow, so a stored one that differs (even a larger one, which no retry sends) is new.
  if seq ~= mine_seq then
    if used > 0 and rate > 0 then
      local at = now - age -- when it counts as run (see the top)
      local w = used / rate * 1000000 -- the bucket's time it takes, µs
      -- First into the idle stretch that usage which ran later skipped, where it ran then.
      local from = max(gap_from, at)
      if gap_to > from and gap_to <= tat then
        local fill = min(w, gap_to - from)
        gap_to, w = gap_to - fill, w - fill
      end
      if w > 0 then
        if at > tat then gap_from, gap_to = tat, at end -- idle until at
        tat = max(tat, at) + w
      end
    end
    mine_seq = seq
  end
  -- tat is kept as it is when it lies in the past (the bucket idle since), so that a report
  -- whose usage ran then can still fill that idle time.
  local debt = 0
  if rate > 0 then debt = rate * max(tat - now, 0) / 1000000 end

  -- The limits in force: while the instances disagree on the budget's limits (a rolling
  -- change of the rules), each enforces the smallest any of them holds, so that together
  -- they keep the smaller limit and each keeps its even share of it.
  local l_rate, l_burst, l_maxc, differ = rate, burst, maxc, 0
  for k = 1, #ids do
    local e = others[ids[k]]
    if e[8] ~= nil then
      if e[8] ~= maxc or e[9] ~= rate or e[10] ~= burst then differ = 1 end
      if maxc > 0 and e[8] > 0 then l_maxc = min(l_maxc, e[8]) end
      if rate > 0 and e[9] > 0 then
        l_rate, l_burst = min(l_rate, e[9]), min(l_burst, e[10])
      end
    end
  end

  local live = #ids
  local g_rate, g_burst, g_slots, t_rate, t_slots, hold = 0, 0, 0, 0, 0, 0
  local retake, yield = 0, 0
  if stale_leave then
    keep[#keep + 1] = mine_bytes
  elseif leave then
    mine[1], mine[2], mine[3], mine[4], mine[5], mine[6], mine[7] = mine_seq, 0, 0, 0, 0, now + ttl, 1
    mine[8], mine[9], mine[10], mine[11], mine[12] = maxc, rate, burst, 0, now
  else
    live = live + 1
    -- Every caller orders the instances alike (by id), so that the odd slots go round the
    -- same instances whoever computes them.
    ids[#ids + 1] = id
    sort(ids)
    local n = #ids
    local me = 0
    for k = 1, n do
      if ids[k] == id then me = k end
    end
    me_entry[2], me_entry[3] = demand, want
    others[id] = me_entry
    -- Lost instances run on their fallback share, the budget over the instances they knew:
    -- leave them that much until they are back (see the top).
    if (not found and expected > 1) or (last ~= nil and now - last > 2 * period) or recovering then
      lost_until = now + ttl
      lost_n = max(lost_n, expected, n + gone + lapsed)
    end
    if now >= lost_until then lost_n = 0 end
    local missing = max(lost_n - n - gone, 0)
    local known = max(lost_n, 1)

    if rate > 0 then
      -- Fair targets by demand; capacity nobody asked for is spread evenly, so that a rise
      -- in demand is served before the next sync. The grant never makes the instances'
      -- grants sum above the rate: others give back at their own next sync.
      for k = 1, n do d[k] = others[ids[k]][2] end
      local cap = l_rate - missing * l_rate / known
      local _, left = fill(cap, d, n, share)
      t_rate = share[me] + left / n
      local held = 0
      for k = 1, n do
        if k ~= me then held = held + others[ids[k]][5] end
      end
      g_rate = max(0, min(t_rate, cap - held))
      g_burst = l_burst * g_rate / l_rate

      -- The debt no live instance's bucket holds (see the top): each bucket holds its debt
      -- as reported, drained since at its lease's rate, and at most its lease's burst (a
      -- shrinking lease forgives the rest).
      local owned = min(own, g_burst)
      for k = 1, n do
        local e = others[ids[k]]
        if k ~= me then
          local b = l_burst * e[5] / l_rate
          owned = owned + min(max(0, e[11] - e[5] * (now - e[12]) / 1000000), b)
        end
      end
      local unowned = max(0, debt - owned)
      if unowned > 0 then hold = min(own + unowned * g_rate / l_rate, g_burst) end
    end

    local held_slots = 0
    if maxc > 0 then
      -- Whole slots: first max-min fair by slots wanted, then what no instance wants spread
      -- evenly as headroom, so that a rise in demand finds slots at once instead of at the
      -- next sync (see doc.go, "Slots with headroom"). Odd slots, of demand and then of
      -- headroom, go round the instances, ten sync intervals each: with fewer slots than
      -- instances each gets its turn, and a handover (which idles the slot until the old
      -- holder's next report) stays rare.
      for k = 1, n do w[k] = others[ids[k]][3] end
      local cap = l_maxc - missing * floor(l_maxc / known)
      fill(cap, w, n, share)
      local spare = cap
      for k = 1, n do
        target[k] = floor(share[k] + 1e-9)
        spare = spare - target[k]
      end
      -- Each instance draws a rank from its id and the ten-interval epoch (rendezvous
      -- hashing): every caller ranks alike, and an instance that comes or goes moves only its
      -- own odd slot, never the others'. Drawn only when there are odd slots to hand out.
      local order = nil
      if spare > 0 then
        for k = 1, n do
          if w[k] > target[k] then
            order = order or ranked(ids, n)
            for _, j in ipairs(order) do
              if spare <= 0 then break end
              if w[j] > target[j] then
                target[j] = target[j] + 1
                spare = spare - 1
              end
            end
            break
          end
        end
      end
      if spare > 0 then
        local each = floor(spare / n)
        for k = 1, n do target[k] = target[k] + each end
        spare = spare - each * n
        if spare > 0 then
          order = order or ranked(ids, n)
          for _, k in ipairs(order) do
            if spare <= 0 then break end
            target[k] = target[k] + 1
            spare = spare - 1
          end
        end
      end
      t_slots = target[me]
      -- Another instance holds what it was granted, or more while its statements from an
      -- earlier, larger grant are still in flight.
      local held = 0
      for k = 1, n do
        if k ~= me then held = held + others[ids[k]][4] end
      end
      g_slots = max(0, min(t_slots, cap - held))
      held_slots = max(g_slots, applied, inflight)
      -- An instance that gives slots back while another holds less than its target confirms
      -- at once that it applied its smaller grant: until it reports, Redis counts its
      -- earlier, larger one as held, and the other waits for it.
      if applied > g_slots then
        for k = 1, n do
          if k ~= me and others[ids[k]][4] < target[k] then
            yield = 1
            break
          end
        end
      end
      -- An instance that wants more than its grant, or than the limit it applied (it was
      -- refused since its last sync: it reports its demand a step at a time, doc.go), and is
      -- kept below its target by what others hold beyond theirs, says so on the budget's
      -- want channel (the message: the partition's field): the holders sync early, their
      -- estimates falling fast, and hand those slots over rather than at their next regular
      -- sync. Once every other instance holds at most its target (the hand-over done, or a
      -- saturated partition), no message goes out.
      if (want > g_slots or want > applied) and g_slots < t_slots then
        for k = 1, n do
          if k ~= me and others[ids[k]][4] > target[k] then
            redis.pcall('PUBLISH', want_channel, fields[i]) -- a Redis user denied the channel loses nothing else
            break
          end
        end
      end
    end

    -- A starved instance (it wants more than it was granted) learns when the first lease of
    -- another instance lapses and syncs then. A live holder renews every interval, which
    -- keeps its lapse past this instance's next regular sync (that sync comes first and
    -- asks again), so only a crashed holder's lapse brings a sync: its capacity is taken up
    -- at once rather than at the next regular sync.
    if (maxc > 0 and want > g_slots) or (rate > 0 and demand > g_rate * 1.01) then
      for k = 1, n do
        local e = others[ids[k]]
        if k ~= me and (e[4] > 0 or e[5] > 0) then
          local left = e[6] - now
          if retake == 0 or left < retake then retake = left end
        end
      end
    end

    if yield == 1 then retake = 1 end
    mine[1], mine[2], mine[3], mine[4], mine[5], mine[6], mine[7] = mine_seq, demand, want, held_slots, g_rate, now + ttl, 0
    mine[8], mine[9], mine[10], mine[11], mine[12] = maxc, rate, burst, own, now
  end

  -- The partition lives while an instance takes part in it or its debt has not drained.
  local horizon = min(max(tat - now, 0), max_debt)
  local lapse = now + max(2 * ttl, horizon + ttl)
  furthest = max(furthest, lapse)
  if gap_to <= gap_from then gap_from, gap_to = 0, 0 end
  if lost_n == 0 then lost_until = 0 end
  local value
  if stale_leave then
    value = struct_pack(head_format, lapse, tat, gap_from, gap_to, now, lost_until, lost_n)
  else
    value = struct_pack(value_format, lapse, tat, gap_from, gap_to, now, lost_until, lost_n, #id, id,
      mine[1], mine[2], mine[3], mine[4], mine[5], mine[6], mine[7], mine[8], mine[9], mine[10], mine[11], mine[12])
  end
  local nkeep = #keep
  if nkeep > 0 then value = value .. concat(keep) end
  writes[2 * i - 1], writes[2 * i] = fields[i], value

  -- Empty the scratch tables for the next partition.
  for k = 1, #ids do
    others[ids[k]] = nil
    ids[k] = nil
  end
  for j = 1, nkeep do keep[j] = nil end

  results[i] = struct_pack(result_format, g_rate, g_burst, g_slots, live, debt, t_rate, t_slots, retake,
    l_rate, l_burst, l_maxc, differ, hold)
end
out[3] = concat(results)
if nparts > 0 then redis.call('HSET', hkey, unpack(writes)) end
-- The hash and the sweep's cursor last as long as the furthest expiry written.
local keep_ms = math.ceil((furthest - now) / 1000)
local pttl = redis.call('PTTL', hkey)
if nparts > 0 and pttl < keep_ms then
  redis.call('PEXPIRE', hkey, keep_ms)
  pttl = keep_ms
end
if pttl > 0 then
  redis.call('SET', ckey, cursor .. ' ' .. string.format('%.0f', swept_at), 'PX', pttl)
else
  redis.call('DEL', ckey)
end

if qfor > 0 then
  local key = KEYS[3]
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'hash' and kind ~= 'none' then redis.call('DEL', key) end
  local function fingerprint(f) return type(f) == 'string' and #f == 16 and not string.find(f, '[^0-9a-f]') end
  -- Read the quarantines in force, dropping the ended ones and what is not a quarantine; one
  -- ending past for: from now (a failover to a Redis whose clock is behind) ends then.
  local ends, n = {}, 0
  local flat = redis.call('HGETALL', key)
  for j = 1, #flat, 2 do
    local f, x = flat[j], tonumber(flat[j + 1])
    if not fingerprint(f) or not finite(x) or x <= now or n >= qmax then
      redis.call('HDEL', key, f)
    else
      if x > now + qfor then
        x = now + qfor
        redis.call('HSET', key, f, num(x))
      end
      ends[f], n = x, n + 1
    end
  end
  for j = head + nparts + 1, #ARGV - 1, 2 do
    local f, left = ARGV[j], tonumber(ARGV[j + 1])
    if fingerprint(f) and within(left, 1, huge) then
      local x, known = now + min(left, qfor), ends[f] ~= nil
      if (known and x > ends[f]) or (not known and n < qmax) then
        if not known then n = n + 1 end
        ends[f] = x
        redis.call('HSET', key, f, num(x))
      end
    end
  end
  local list, last = {}, now
  for f, x in pairs(ends) do
    list[#list + 1] = f
    list[#list + 1] = x - now
    last = max(last, x)
  end
  if n > 0 then redis.call('PEXPIRE', key, math.ceil((last - now) / 1000) + 1) end
  out[4] = list
end
return out

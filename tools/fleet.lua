-- fleet.lua - renews one host's lease on one compartment of a fleet budget, atomically in Redis.
--
-- KEYS[1]  the compartment's hash, "bulkshim:fleet:<fleet>:<compartment>"
-- ARGV     host, fleet_limit, floor, ceiling (max_connections), held (in use
--          now), want (demand), applied (the limit in force on the host as it
--          called), lease_ms, forget_ms, seq (grows with every call of a host)
-- Returns  { share, lease_ms, live hosts, known hosts, note }, note being ""
--          or words the agent logs ("quiet", "floors").
--
-- The hash holds "=limit" and "=born" and one field "h:<host>" per host:
-- "share applied held want floor ceiling expires seen seq limit", times in
-- Redis's own milliseconds (TIME), so that no host's clock matters here.
--
-- Safety: what a host may have in use until its next call is at most
-- max(share, applied, held): it can admit up to the larger of the limit in
-- force and the share it is being given, and a lowered share closes nothing.
-- A host whose lease has run out is on its floor. The caller is given no
-- more than the fleet limit minus all that, so the sum never passes it.

local key = KEYS[1]
local host = ARGV[1]
local limit = tonumber(ARGV[2])
local floor = tonumber(ARGV[3])
local ceiling = tonumber(ARGV[4])
local held = tonumber(ARGV[5])
local want = tonumber(ARGV[6])
local applied = tonumber(ARGV[7])
local lease = tonumber(ARGV[8])
local forget = tonumber(ARGV[9])
local seq = tonumber(ARGV[10])
local maxhosts = tonumber(ARGV[11]) or 0

if not (limit and floor and ceiling and held and want and applied and lease and forget and seq) then
	return redis.error_reply('BULKSHIM malformed arguments')
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local born = tonumber(redis.call('HGET', key, '=born') or '')
if not born then
	-- A new fleet, or Redis lost its data: leases it gave before may
	-- still run on hosts it does not know yet, so for a while it gives
	-- out no more than floors (see 'quiet' below).
	born = now
	redis.call('HSET', key, '=born', born)
end

local hosts = {}
local order = {}
local flat = redis.call('HGETALL', key)
for i = 1, #flat, 2 do
	local f = flat[i]
	if string.sub(f, 1, 2) == 'h:' then
		local v = {}
		for w in string.gmatch(flat[i + 1], '%S+') do
			v[#v + 1] = tonumber(w)
		end
		local e = { share = v[1], applied = v[2], held = v[3], want = v[4], floor = v[5],
			ceiling = v[6], expires = v[7], seen = v[8], seq = v[9], limit = v[10] }
		if not e.limit then
			redis.call('HDEL', key, f)	-- garbage: forget it
		elseif e.seen + forget < now then
			redis.call('HDEL', key, f)	-- silent for long: forgotten
		else
			local name = string.sub(f, 3)
			hosts[name] = e
			order[#order + 1] = name
		end
	end
end

-- One budget, one limit: while a host with a live lease has another
-- fleet_limit, this one is refused (a changed limit is taken once the
-- leases of the old one have run out).
for _, name in ipairs(order) do
	local e = hosts[name]
	if name ~= host and e.expires > now and e.limit ~= limit then
		return redis.error_reply('BULKSHIM fleet_limit ' .. limit .. ' here but ' .. e.limit ..
			' on host ' .. name .. ' for ' .. key ..
			': every host of a fleet must set the same fleet_limit')
	end
end
redis.call('HSET', key, '=limit', limit)

local me = hosts[host]
if me and seq <= me.seq then
	-- A call that waited in a frozen server behind a newer one.
	return redis.error_reply('BULKSHIM stale call (seq ' .. seq .. ' after ' .. me.seq .. ')')
end
if not me then
	me = { share = floor }
	hosts[host] = me
	order[#order + 1] = host
end
me.applied = applied
me.held = held
me.want = math.max(floor, math.min(want, ceiling))
me.floor = floor
me.ceiling = ceiling
me.expires = now + lease
me.seen = now
me.seq = seq

-- Fair targets: every known host keeps its floor; what is left goes to the
-- hosts with a live lease, max-min fair on what they want above the floor.
local pool = limit
local live, nknown = 0, 0
local ask = {}
for _, name in ipairs(order) do
	local e = hosts[name]
	nknown = nknown + 1
	pool = pool - e.floor
	if e.expires > now then
		live = live + 1
		local d = math.max(0, math.min(e.want, e.ceiling) - e.floor)
		if d > 0 then
			ask[#ask + 1] = { name = name, d = d }
		end
	end
end
-- Hosts not heard from run on their floors too; with `hosts` set, their
-- floors (taken to be this host's) are held back as well.
local unknown = math.max(0, maxhosts - nknown) * floor
pool = pool - unknown
local note = ''
local extra = {}
if pool < 0 then
	note = 'floors'
	pool = 0
end
table.sort(ask, function(a, b) return a.d < b.d end)
local left = #ask
for _, a in ipairs(ask) do
	local fair = math.floor(pool / left)
	local give = math.min(a.d, fair)
	extra[a.name] = give
	pool = pool - give
	left = left - 1
end
-- What integer division left over goes to the first that still want more.
for _, a in ipairs(ask) do
	if pool <= 0 then
		break
	end
	local more = math.min(pool, a.d - extra[a.name])
	extra[a.name] = extra[a.name] + more
	pool = pool - more
end
local target = floor + (extra[host] or 0)
-- A lease a host holds ends (by its own clock) a third of a lease before
-- Redis's, counted from before its call was sent: whatever the lost state
-- granted has run out two thirds of a lease after this state was born.
if now < born + lease - math.floor(lease / 3) then
	note = 'quiet'
	target = floor
end

-- The share: the target, within what the others may be holding.
local room = limit - unknown
for _, name in ipairs(order) do
	if name ~= host then
		local e = hosts[name]
		if e.expires > now then
			room = room - math.max(e.share, e.applied, e.held)
		else
			room = room - e.floor
		end
	end
end
local share = math.max(0, math.min(target, ceiling, room))
me.share = share

redis.call('HSET', key, 'h:' .. host, table.concat({ me.share, me.applied, me.held, me.want,
	me.floor, me.ceiling, me.expires, me.seen, me.seq, limit }, ' '))
redis.call('PEXPIRE', key, forget)
return { share, lease, live, nknown, note }

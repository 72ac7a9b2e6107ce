-- fleet.lua - renews one host's lease on one compartment of a fleet budget, atomically in Redis.
--
-- KEYS[1]  the compartment's hash, "bulkshim:fleet:<fleet>:<compartment>"
-- ARGV     host (the identity), fleet_limit, floor, ceiling (max_connections),
--          held (in use now), want (demand), applied (the limit in force on
--          the host as it called), lease_ms, forget_ms, seq (grows with every
--          call of a host), hosts (0: only those heard from), token (the
--          segment the agent serves, the same for every agent of it), agent
--          (who the agent is, for the line of a refusal), "leave" when the
--          agent stops (its host is on its floor: what it holds is recorded
--          and its lease ends)
-- Returns  { share, lease_ms, live hosts, known hosts, note, limit in force,
--          host whose limit that is, soon }, note being "" or words the
--          agent logs ("quiet", "floors"), soon 1 when the share is short of
--          the caller's target only until other live hosts give back what
--          their next calls lower (the agent then calls again sooner).
--
-- The hash holds "=limit" and "=born" and one field "h:<host>#<token>" per
-- host: "share applied held want floor ceiling expires seen seq limit forget
-- churn", a tab and the agent's description; times in Redis's own
-- milliseconds (TIME), so that no host's clock matters here. churn is the
-- host's share changes per minute, weighted to the last minute or so.
--
-- Safety: what a host may have in use until its next call is at most
-- max(share, applied, held): it can admit up to the larger of the limit in
-- force and the share it is being given, and a lowered share closes nothing.
-- A host whose lease has run out is on its floor, but keeps what it opened
-- before: it may hold max(share, applied, held, floor) until it reports
-- again, or until it has been silent for its forget_ms and is forgotten.
-- The caller is given no more than the limit in force (the lowest of the
-- live hosts' fleet_limit) minus all that, so the sum never passes it.

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
local token = ARGV[12] or ''
local agent = string.gsub(ARGV[13] or '', '[%c]', '?')
local leave = ARGV[14] == 'leave'

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
		local nums, desc = string.match(flat[i + 1], '^([^\t]*)\t?(.*)$')
		local v = {}
		for w in string.gmatch(nums or '', '%S+') do
			v[#v + 1] = tonumber(w)
		end
		local name = string.sub(f, 3)
		local cut = string.find(name, '#', 1, true)
		-- An entry of an agent older than tokens ("h:<host>") is
		-- counted as that agent counted it: a floor once its lease ran
		-- out, forgotten after ten leases; so a fleet being upgraded
		-- does not hold back the old entries of its own hosts for long.
		local e = { share = v[1], applied = v[2], held = v[3], want = v[4], floor = v[5],
			ceiling = v[6], expires = v[7], seen = v[8], seq = v[9], limit = v[10],
			forget = v[11] or (cut and forget or lease * 10), churn = v[12] or 0, agent = desc or '',
			ident = cut and string.sub(name, 1, cut - 1) or name, old = not cut }
		if not (e.limit and e.share and e.applied and e.held and e.floor and e.expires and
		    e.seen and e.seq) then
			redis.call('HDEL', key, f)	-- garbage: forget it
		elseif e.seen + e.forget < now then
			redis.call('HDEL', key, f)	-- silent for long: forgotten
		else
			hosts[name] = e
			order[#order + 1] = name
		end
	end
end

-- What host e may hold until it calls again: a live lease may be used to
-- its share; one that ran out leaves the host on its floor with whatever
-- it opened before, which no expiry closes.
local function holds(e)
	if e.old and e.expires <= now then
		return e.floor
	end
	local m = math.max(e.share, e.applied, e.held)
	if e.expires <= now then
		m = math.max(m, e.floor)
	end
	return m
end

local mine = host .. '#' .. token
local me = hosts[mine]
if me and seq <= me.seq then
	-- A call that waited in a frozen server behind a newer one.
	return redis.error_reply('BULKSHIM stale call (seq ' .. seq .. ' after ' .. me.seq .. ')')
end
if not me then
	me = { share = 0, ident = host, churn = 0, expires = 0, seen = now, fresh = true }
	hosts[mine] = me
	order[#order + 1] = mine
end
-- What the caller was last given, while that still holds: the share its
-- lease runs on, which a small change of the targets leaves alone.
local had = (not me.fresh and me.expires > now) and me.share or nil
local last_seen = me.seen
me.applied = applied
me.held = held
me.want = math.max(floor, math.min(want, ceiling))
me.floor = floor
me.ceiling = ceiling
me.expires = now + lease
me.seen = now
me.seq = seq
me.limit = limit
me.forget = forget
me.agent = agent

local function save(share)
	me.share = share
	redis.call('HSET', key, 'h:' .. mine, table.concat({ me.share, me.applied, me.held, me.want,
		me.floor, me.ceiling, me.expires, me.seen, me.seq, me.limit, me.forget,
		string.format('%.2f', me.churn) }, ' ') .. '\t' .. me.agent)
	local keep = forget
	for _, name in ipairs(order) do
		keep = math.max(keep, hosts[name].forget)
	end
	redis.call('PEXPIRE', key, keep)
end

-- An agent that stops: its host is on its floor and keeps what it holds,
-- which is all Redis counts for it from now on.
if leave then
	me.expires = 0
	save(0)
	return { 0, lease, 0, 0, 'left', limit, host, 0 }
end

-- One identity, one agent: while another agent (another segment, or
-- another machine) holds this host's name with a live lease, the caller
-- is refused. It is recorded all the same, as a host without a lease,
-- so that what it holds on its floor is counted.
for _, name in ipairs(order) do
	local e = hosts[name]
	if name ~= mine and e.ident == host and e.expires > now then
		me.expires = 0
		save(0)
		return redis.error_reply('BULKSHIM host name "' .. host .. '" of ' .. key ..
			' is held by another live agent (' .. e.agent .. '), not this one (' ..
			agent .. '): give each agent its own fleet host')
	end
end

-- One budget: the lowest fleet_limit of the hosts with a live lease is in
-- force, so hosts configured differently (or a limit being changed host
-- by host) never make the fleet hold more than any of them allows.
local lim, lowest = limit, host
for _, name in ipairs(order) do
	local e = hosts[name]
	if e.expires > now and e.limit < lim then
		lim, lowest = e.limit, e.ident
	end
end
redis.call('HSET', key, '=limit', lim)

-- Fair targets: every known host keeps its floor, and one without a
-- live lease all it may hold; what is left goes to the hosts with a live
-- lease, max-min fair on what they want above the floor (their demand over
-- the last lease, as their agents measure it).
local pool = lim
local live, nknown = 0, 0
local ask = {}
local extra = {}
local lives = {}
for _, name in ipairs(order) do
	local e = hosts[name]
	nknown = nknown + 1
	if e.expires > now then
		pool = pool - e.floor
		live = live + 1
		lives[#lives + 1] = name
		extra[name] = 0
		local d = math.max(0, math.min(e.want, e.ceiling) - e.floor)
		if d > 0 then
			ask[#ask + 1] = { name = name, d = d }
		end
	else
		pool = pool - holds(e)
	end
end
-- Hosts not heard from run on their floors too; with `hosts` set, their
-- floors (taken to be this host's) are held back as well.
local unknown = math.max(0, maxhosts - nknown) * floor
pool = pool - unknown
local note = ''
if pool < 0 then
	note = 'floors'
	pool = 0
end
-- Ties in the order of names, so that every host's call computes the same
-- targets from the same entries.
table.sort(ask, function(a, b)
	if a.d ~= b.d then
		return a.d < b.d
	end
	return a.name < b.name
end)
local left = #ask
for _, a in ipairs(ask) do
	local fair = math.floor(pool / left)
	local give = math.min(a.d, fair)
	extra[a.name] = give
	pool = pool - give
	left = left - 1
end
-- What integer division left over goes to the first that still want more.
local short = false
for _, a in ipairs(ask) do
	if pool > 0 then
		local more = math.min(pool, a.d - extra[a.name])
		extra[a.name] = extra[a.name] + more
		pool = pool - more
	end
	if extra[a.name] < a.d then
		short = true	-- a host wants more than it is given
	end
end
-- The spare, what no host wants: handed out evenly to the hosts with a live
-- lease (within their ceilings), so that the shares add up to the whole
-- budget and a host whose demand rises finds headroom already there.
table.sort(lives)
local room_in = {}
local nroom = 0
for _, name in ipairs(lives) do
	local e = hosts[name]
	room_in[name] = math.max(0, e.ceiling - e.floor - extra[name])
	if room_in[name] > 0 then
		nroom = nroom + 1
	end
end
while pool > 0 and nroom > 0 do
	local each = math.max(1, math.floor(pool / nroom))
	nroom = 0
	for _, name in ipairs(lives) do
		local give = math.min(each, room_in[name], pool)
		extra[name] = extra[name] + give
		room_in[name] = room_in[name] - give
		pool = pool - give
		if room_in[name] > 0 then
			nroom = nroom + 1
		end
	end
end
local target = floor + (extra[mine] or 0)
-- Another live host that was granted less than its target and wants more
-- waits for room that shares kept through the band below would hold: it is
-- as short as one the targets give too little.
for _, name in ipairs(lives) do
	local e = hosts[name]
	if name ~= mine and e.share < math.min(e.floor + extra[name], e.ceiling) and
	    e.want > e.share then
		short = true
	end
end
-- Hysteresis: a share that moves by a little keeps what it had, so that
-- shares settle instead of following every wobble of the demand. A share
-- goes down at once when another host wants more than it is given (or
-- than it was granted), and up at once when this host wants more than it
-- has.
local band = math.max(1, math.floor(lim / 10))
if had then
	if target < had and not short and had - target <= band then
		target = had
	elseif target > had and me.want <= had and target - had <= band then
		target = had
	end
end
-- A lease a host holds ends (by its own clock) a third of a lease before
-- Redis's, counted from before its call was sent: whatever the lost state
-- granted has run out two thirds of a lease after this state was born.
if now < born + lease - math.floor(lease / 3) then
	note = 'quiet'
	target = floor
end

-- The share: the target, within what the others may be holding.
local room = lim - unknown
for _, name in ipairs(order) do
	if name ~= mine then
		room = room - holds(hosts[name])
	end
end
local share = math.max(0, math.min(target, ceiling, room))
-- Churn: share changes per minute, each change weighing less as a minute
-- passes (an exponential average over about a minute).
me.churn = (me.churn or 0) * math.exp(-math.max(0, now - last_seen) / 60000)
if had and share ~= had then
	me.churn = me.churn + 1
end
save(share)
-- Short of what it wants and of its target because live hosts still have
-- shares, limits in force or connections above theirs, which their next
-- calls lower (their agents call as soon as they close some): the caller
-- comes back sooner for the rest.
local soon = 0
if share < math.min(target, ceiling) and me.want > share then
	for _, name in ipairs(lives) do
		local e = hosts[name]
		if name ~= mine and holds(e) > e.floor + extra[name] then
			soon = 1
		end
	end
end
return { share, lease, live, nknown, note, lim, lowest, soon }

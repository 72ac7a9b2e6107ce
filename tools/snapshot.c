/* snapshot.c - a segment read once into a plain struct cli_snap, which every view only prints. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/*
 * The views (status, watch, metrics, serve, suggest) read nothing of the
 * segment themselves: they format what one pass of cli_snap_read copied,
 * so every table of a report shows the same reading of a compartment. The
 * features' own words are read by their files (cli_adaptive.c,
 * cli_pool.c, fleet_view.c), and the kernel engine's counts are merged in
 * by cmd_kernel.c, all called from here.
 */

/* A text of the segment (a path, a reason), read with its field's bound and
 * scrubbed: seg_open checked that it was terminated, but the segment is
 * shared and may hold anything, a terminal's escapes included. */
static void
copy_text(char *out, size_t len, const char *field, size_t size)
{
	snprintf(out, len, "%.*s", (int)strnlen(field, size), field);
	log_scrub(out, strlen(out));
}

/* ---- values that cannot be true ----
 *
 * Whoever may write a segment may write anything into it, and a reader
 * that prints what it found as if it were true misleads the operator (a
 * class with 2,340,651,807 permits in use). Each value is held to what the
 * library can write there: counts of permits, requests or waiters to the
 * socket table (each counted socket holds at most one of each, and each
 * waiter has its socket's slot), settings to what a config or `bulkshim
 * set` can give, counts of events since creation to COUNTER_MAX, and times
 * to this host's clock. A value beyond is flagged in its object's damaged
 * mask and zeroed (a limit becomes none), so that nothing derived from it
 * (a sum, a bar, HOT) is either. */

/* More events than any host counts in a segment's life (a million a second
 * for 285 years), and the largest integer a JSON reader's double holds
 * exactly. */
#define COUNTER_MAX	((1ULL << 53) - 1)
/* How far ahead of this host's clock a recorded time may be: a clock set
 * back by up to a day leaves it there. */
#define CLOCK_AHEAD_MS	(24ULL * 3600 * 1000)

static void
flag(uint64_t *mask, enum cli_field f)
{
	*mask |= 1ULL << f;
}

/* *v above max: flagged, and 0. */
static void
bound64(uint64_t *v, uint64_t max, uint64_t *mask, enum cli_field f)
{
	if (*v > max) {
		*v = 0;
		flag(mask, f);
	}
}

static void
bound32(uint32_t *v, uint64_t max, uint64_t *mask, enum cli_field f)
{
	uint64_t w = *v;

	bound64(&w, max, mask, f);
	*v = (uint32_t)w;
}

/* A limit as seg_apply_limits and `set` write it: 1..BS_MAX_LIMIT, or
 * UINT32_MAX for none (what a damaged one becomes). */
static void
check_limit(uint32_t *v, uint64_t *mask, enum cli_field f)
{
	if (*v == 0 || (*v > BS_MAX_LIMIT && *v != UINT32_MAX)) {
		*v = UINT32_MAX;
		flag(mask, f);
	}
}

/* A CLOCK_REALTIME time in ms, 0 for never. */
static void
check_time(uint64_t *v, uint64_t now_ms, uint64_t *mask, enum cli_field f)
{
	bound64(v, now_ms + CLOCK_AHEAD_MS, mask, f);
}

/* Counts of events, by reason: all of them flagged as one when one is
 * beyond COUNTER_MAX. */
static void
check_reasons(uint64_t *n, uint64_t *mask, enum cli_field f)
{
	for (int r = 0; r < REASON_MAX; r++) {
		if (n[r] > COUNTER_MAX) {
			memset(n, 0, REASON_MAX * sizeof(*n));
			flag(mask, f);
			return;
		}
	}
}

/* The name in field, as log_name makes it, into out: flagged when no
 * config could have given it. */
static void
read_name(char *out, size_t len, const char *field, size_t size, uint64_t *mask,
    enum cli_field f)
{
	if (!log_name(out, len, field, size))
		flag(mask, f);
}

static bool
near_limit(uint64_t used, uint32_t limit)
{
	return limit != UINT32_MAX && used * 100 >= (uint64_t)limit * CLI_HOT_PERCENT;
}

/* A histogram, its total the sum of the buckets read; an empty one,
 * flagged, when a bucket or the total is beyond COUNTER_MAX. */
static void
read_hist(const struct seg_hist *h, struct cli_hist *out, uint64_t *mask, enum cli_field f)
{
	bool bad = false;

	out->total = 0;
	for (int i = 0; i < BS_HIST_BUCKETS; i++) {
		out->bucket[i] = atomic_load(&h->bucket[i]);
		bad = bad || out->bucket[i] > COUNTER_MAX;
		out->total += out->bucket[i];
	}
	/* The count is bumped after the bucket: the buckets' total is the
	 * count that matches them. */
	out->sum_us = atomic_load(&h->sum_us);
	out->count = atomic_load(&h->count);
	if (bad || out->total > COUNTER_MAX) {
		memset(out, 0, sizeof(*out));
		flag(mask, f);
	}
}

/* The highest admissions in one second among the last BS_RATE_SECONDS
 * seconds (now, in CLOCK_MONOTONIC seconds cut to 32 bits). */
static uint64_t
recent_rate(const struct seg_comp *sc, uint64_t now)
{
	uint64_t best = 0;

	for (int k = 0; k < BS_RATE_SECONDS; k++) {
		uint64_t e = atomic_load(&sc->rate[k]), sec = e >> 32;

		if (sec <= now && now - sec < BS_RATE_SECONDS && (e & 0xffffffff) > best)
			best = e & 0xffffffff;
	}
	return best;
}

/* The classes with a limit; nslots is the segment's socket table. */
static void
read_classes(const struct seg_header *h, struct seg_comp *sc, uint32_t nslots,
    struct cli_comp *c)
{
	c->shares = atomic_load(&sc->cls_shares) != 0;
	for (uint32_t k = 0; k < h->nclass && k < BS_MAX_CLASSES; k++) {
		struct cli_class *cc = &c->cls[c->nclass];
		uint32_t lim = atomic_load(&sc->cls[k].limit);

		if (lim == 0)
			continue;
		cc->damaged = 0;
		read_name(cc->name, sizeof(cc->name), h->class_name[k], sizeof(h->class_name[k]),
		    &cc->damaged, CF_NAME);
		cc->limit = lim;
		bound32(&cc->limit, BS_MAX_LIMIT, &cc->damaged, CF_LIMIT);
		cc->in_use = atomic_load(&sc->cls[k].in_use);
		bound32(&cc->in_use, nslots, &cc->damaged, CF_IN_USE);
		cc->peak = atomic_load(&sc->cls[k].peak);
		bound32(&cc->peak, nslots, &cc->damaged, CF_PEAK);
		cc->admitted = atomic_load(&sc->cls[k].admitted);
		bound64(&cc->admitted, COUNTER_MAX, &cc->damaged, CF_ADMITTED);
		cc->rejected = atomic_load(&sc->cls[k].rejected);
		bound64(&cc->rejected, COUNTER_MAX, &cc->damaged, CF_REJECTED);
		cc->index = k;
		cc->shares = c->shares;
		cc->guaranteed = cc->shares ? atomic_load(&sc->cls_guaranteed[k]) : 0;
		bound32(&cc->guaranteed, BS_MAX_LIMIT, &cc->damaged, CF_GUARANTEED);
		cc->borrowed = cc->shares && cc->in_use > cc->guaranteed ? cc->in_use - cc->guaranteed : 0;
		if (cc->shares && (CLI_DAMAGED(cc->damaged, CF_IN_USE) ||
		    CLI_DAMAGED(cc->damaged, CF_GUARANTEED)))
			flag(&cc->damaged, CF_BORROWED);
		c->nclass++;
	}
}

/* Compartment c's own values, read by read_comp: held to what the library
 * can write (nslots is the segment's socket table). */
static void
check_comp(struct cli_comp *c, uint32_t nslots, uint64_t now_ms)
{
	uint64_t *m = &c->damaged;

	check_limit(&c->limit, m, CF_LIMIT);
	check_limit(&c->inflight_limit, m, CF_INFLIGHT_LIMIT);
	bound32(&c->in_use, nslots, m, CF_IN_USE);
	bound32(&c->over, nslots, m, CF_OVER);
	/* The peak is raised to in_use + over, two reads. */
	bound32(&c->peak, 2ULL * nslots, m, CF_PEAK);
	bound32(&c->waiting, nslots, m, CF_WAITING);
	bound32(&c->inflight, nslots, m, CF_INFLIGHT);
	bound32(&c->inflight_over, nslots, m, CF_INFLIGHT);
	bound32(&c->inflight_peak, nslots, m, CF_INFLIGHT_PEAK);
	bound32(&c->max_wait_ms, BS_MAX_WAIT_MS, m, CF_MAX_WAIT_MS);
	bound32(&c->max_waiting, BS_MAX_LIMIT, m, CF_MAX_WAITING);
	bound32(&c->connect_timeout_ms, BS_MAX_TIMEOUT_MS, m, CF_CONNECT_TIMEOUT_MS);
	bound32(&c->io_timeout_ms, BS_MAX_TIMEOUT_MS, m, CF_IO_TIMEOUT_MS);
	if (cfg_errno_name(c->reject_errno) == NULL) {
		c->reject_errno = ECONNREFUSED;
		flag(m, CF_ERRNO);
	}
	bound64(&c->admitted, COUNTER_MAX, m, CF_ADMITTED);
	bound64(&c->rejected, COUNTER_MAX, m, CF_REJECTED);
	check_time(&c->last_rejection_ms, now_ms, m, CF_LAST_REJECTION_MS);
	bound64(&c->reclaimed, COUNTER_MAX, m, CF_RECLAIMED);
	bound64(&c->reconciled, COUNTER_MAX, m, CF_RECONCILED);
	bound64(&c->inflight_admitted, COUNTER_MAX, m, CF_INFLIGHT_ADMITTED);
	bound64(&c->connect_timeouts, COUNTER_MAX, m, CF_CONNECT_TIMEOUTS);
	bound64(&c->io_timeouts, COUNTER_MAX, m, CF_IO_TIMEOUTS);
	/* The admissions of one second are a 32-bit count. */
	bound64(&c->peak_rate, UINT32_MAX, m, CF_PEAK_RATE);
	check_reasons(c->rejected_by, m, CF_REJECTED_BY);
	check_reasons(c->would_reject, m, CF_WOULD_REJECT);
}

/* The adaptive limit of c as adaptive.c and a config leave it; a damaged
 * one is shown as none. */
static void
check_adaptive(struct cli_comp *c, uint32_t nslots, uint64_t now_ms)
{
	const struct cli_adaptive *a = &c->ad;
	uint64_t t = a->last_change_ms, w = a->windows, n = a->changes;
	uint64_t bad = 0;

	if (a->mode == AD_NONE)
		return;
	check_time(&t, now_ms, &bad, CF_ADAPTIVE);
	bound64(&w, COUNTER_MAX, &bad, CF_ADAPTIVE);
	bound64(&n, COUNTER_MAX, &bad, CF_ADAPTIVE);
	if (bad != 0 || (a->mode != AD_ON && a->mode != AD_OFF) ||
	    (a->kind != P_CONN && a->kind != P_INFLIGHT) || a->min < 1 || a->min > a->max ||
	    a->max > BS_MAX_LIMIT || a->limit > BS_MAX_LIMIT || a->window_ms < 10 ||
	    a->window_ms > 60000 || a->tolerance_pct < 105 || a->tolerance_pct > 1000 ||
	    a->last_reason >= AD_R_MAX || a->algorithm >= AD_ALG_MAX || a->last_from > BS_MAX_LIMIT ||
	    a->last_to > BS_MAX_LIMIT || a->sample_conc16 > 16ULL * nslots ||
	    a->knee > AD_KNEE_MAX || a->knee > a->max || a->edge == 1) {
		memset(&c->ad, 0, sizeof(c->ad));
		flag(&c->damaged, CF_ADAPTIVE);
	}
}

/* A fleet budget as a config and the agent leave it; a damaged one is
 * shown as none. The lease is the agent's lease_ms from now at most, far
 * less than CLOCK_AHEAD_MS. */
static void
check_fleet(struct cli_comp *c)
{
	if (c->fleet_limit == 0)
		return;
	if (c->fleet_limit > BS_MAX_LIMIT || c->fleet_floor > c->fleet_limit ||
	    c->fleet_share > c->fleet_limit || c->fleet_hosts > BS_MAX_LIMIT ||
	    c->fleet_demand > BS_MAX_LIMIT || c->fleet_churn_c > 100u * 60 * 1000 ||
	    c->fleet_lease_left_ms > CLOCK_AHEAD_MS) {
		c->fleet_limit = 0;
		c->live_limit = UINT32_MAX;
		flag(&c->damaged, CF_FLEET_LIMIT);
		flag(&c->damaged, CF_LIVE_LIMIT);
	}
}

/* The pool and fleet figures of compartment c, read by their files. */
static void
check_comp_shares(struct cli_comp *c, uint32_t nslots)
{
	uint64_t *m = &c->damaged;

	bound32(&c->class_lent, nslots, m, CF_CLASS_LENT);
	if (c->pool >= 0) {
		bound32(&c->guaranteed, BS_MAX_LIMIT, m, CF_GUARANTEED);
		bound32(&c->borrowed, nslots, m, CF_BORROWED);
		if (CLI_DAMAGED(*m, CF_IN_USE) || CLI_DAMAGED(*m, CF_GUARANTEED)) {
			c->borrowed = 0;
			flag(m, CF_BORROWED);
		}
	}
	/* The fleet's share or floor may lower the limit, never raise it. */
	if (CLI_DAMAGED(*m, CF_LIMIT) || (c->live_limit > BS_MAX_LIMIT &&
	    c->live_limit != UINT32_MAX)) {
		c->live_limit = UINT32_MAX;
		flag(m, CF_LIVE_LIMIT);
	}
}

/* The lower of *lim and v, with *by the level of the lower (a tie keeps
 * the level already there). */
static void
lower(uint32_t *lim, enum limit_by *by, uint64_t v, enum limit_by vby)
{
	if (v < *lim) {
		*lim = (uint32_t)v;
		*by = vby;
	}
}

/* The index in c->cls of c's busiest class when that class has a limit:
 * it holds some of c's held permits, and at least as many as those
 * outside the classes with a limit hold together; -1 for none. */
static int
busiest_class(const struct cli_comp *c, uint32_t held)
{
	uint64_t limited = 0;
	uint32_t most = 0;
	int best = -1;

	for (size_t k = 0; k < c->nclass; k++) {
		const struct cli_class *cc = &c->cls[k];

		if (cc->damaged & (1ULL << CF_LIMIT | 1ULL << CF_IN_USE))
			return -1;
		limited += cc->in_use;
		if (cc->in_use > most) {
			most = cc->in_use;
			best = (int)k;
		}
	}
	if (best < 0 || (held > limited && most < held - limited))
		return -1;
	return best;
}

/* c's live limits, after limit_why's: a pool's room and its busiest
 * class's lower the connections' one to what c holds (held, its permits) and can still
 * take; every limit a damaged value feeds is damaged. */
static void
live_limits(const struct seg *s, const struct seg_comp *sc, struct cli_comp *c, uint32_t held)
{
	uint64_t *m = &c->damaged;
	uint32_t room;
	int cls = -1;

	if (c->live_by == LIMIT_BY_ADAPTIVE && CLI_DAMAGED(*m, CF_ADAPTIVE))
		flag(m, CF_LIVE_LIMIT);
	if (CLI_DAMAGED(*m, CF_INFLIGHT_LIMIT) || (c->inflight_live_by == LIMIT_BY_ADAPTIVE &&
	    CLI_DAMAGED(*m, CF_ADAPTIVE)) || (c->inflight_limit_now > BS_MAX_LIMIT &&
	    c->inflight_limit_now != UINT32_MAX))
		flag(m, CF_INFLIGHT_LIVE_LIMIT);
	if (CLI_DAMAGED(*m, CF_INFLIGHT_LIVE_LIMIT)) {
		c->inflight_limit_now = UINT32_MAX;
		c->inflight_live_by = LIMIT_BY_NONE;
	}
	if (c->pool >= 0 && (room = cli_pool_room(s, sc)) != UINT32_MAX) {
		c->pool_full = room == 0;
		lower(&c->live_limit, &c->live_by, (uint64_t)held + room, LIMIT_BY_POOL);
	}
	/* The busiest class, if it has a limit: its room is the next
	 * connect's; a class that holds nothing, or less than the classes
	 * without a limit hold together, binds nothing. */
	if ((cls = busiest_class(c, held)) >= 0) {
		const struct cli_class *cc = &c->cls[cls];
		uint32_t shared = atomic_load(&sc->cls_shared);

		room = cc->limit > cc->in_use ? cc->limit - cc->in_use : 0;
		/* Beyond its guarantee a class takes of the compartment's
		 * unguaranteed part too (share.c). */
		if (cc->shares && cc->in_use >= cc->guaranteed) {
			uint32_t left = shared > c->class_lent ? shared - c->class_lent : 0;

			room = left < room ? left : room;
		}
		c->class_full = room == 0;
		if ((uint64_t)held + room < c->live_limit) {
			c->live_limit = held + room;
			c->live_by = LIMIT_BY_CLASS;
		}
	}
	if (CLI_DAMAGED(*m, CF_LIVE_LIMIT)) {
		c->live_limit = UINT32_MAX;
		c->live_by = LIMIT_BY_NONE;
	}
	if (c->live_by == LIMIT_BY_CLASS && cls >= 0)
		snprintf(c->live_by_text, sizeof(c->live_by_text), "class %s", c->cls[cls].name);
	else
		snprintf(c->live_by_text, sizeof(c->live_by_text), "%s", limit_by_name(c->live_by));
}

/* Compartment i's own words, and its features' (the kernel engine's
 * counts come after, for every compartment at once). */
static void
read_comp(const struct seg *s, uint32_t i, uint64_t now_s, uint64_t now_ms, struct cli_comp *c)
{
	struct seg_comp *sc = seg_comp(s, i);

	memset(c, 0, sizeof(*c));
	c->index = i;
	read_name(c->name, sizeof(c->name), sc->name, sizeof(sc->name), &c->damaged, CF_NAME);
	c->limit = atomic_load(&sc->limit);
	c->over = atomic_load(&sc->over);
	c->in_use = atomic_load(&sc->in_use);
	c->peak = atomic_load(&sc->peak);
	c->waiting = atomic_load(&sc->waiting);
	c->inflight_limit = atomic_load(&sc->inflight_limit);
	c->inflight_over = atomic_load(&sc->inflight_over);
	c->inflight = atomic_load(&sc->inflight);
	c->inflight_peak = atomic_load(&sc->inflight_peak);
	c->max_wait_ms = atomic_load(&sc->max_wait_ms);
	c->max_waiting = atomic_load(&sc->max_waiting);
	c->connect_timeout_ms = atomic_load(&sc->connect_timeout_ms);
	c->io_timeout_ms = atomic_load(&sc->io_timeout_ms);
	c->reject_errno = atomic_load(&sc->reject_errno);
	c->enforce = atomic_load(&sc->enforce) != 0;
	c->admitted = atomic_load(&sc->admitted);
	c->rejected = atomic_load(&sc->rejected);
	c->last_rejection_ms = atomic_load(&sc->last_rejection_ms);
	c->reclaimed = atomic_load(&sc->reclaimed);
	c->reconciled = atomic_load(&sc->reconciled);
	c->inflight_admitted = atomic_load(&sc->inflight_admitted);
	c->connect_timeouts = atomic_load(&sc->connect_timeouts);
	c->io_timeouts = atomic_load(&sc->io_timeouts);
	c->peak_rate = atomic_load(&sc->peak_rate);
	c->recent_rate = recent_rate(sc, now_s);
	read_hist(&sc->h_connect, &c->h_connect, &c->damaged, CF_H_CONNECT);
	read_hist(&sc->h_reply, &c->h_reply, &c->damaged, CF_H_REPLY);
	read_hist(&sc->h_wait, &c->h_wait, &c->damaged, CF_H_WAIT);
	cli_read_adaptive(sc, &c->ad);
	check_adaptive(c, s->nslots, now_ms);
	for (int r = 0; r < REASON_MAX; r++) {
		c->rejected_by[r] = atomic_load(stat_reason_count(sc, (enum bs_reason)r, false));
		c->would_reject[r] = atomic_load(stat_reason_count(sc, (enum bs_reason)r, true));
	}
	check_comp(c, s->nslots, now_ms);
	/* Observe mode lets connections past the limit without a permit:
	 * in_use counts every connection, permits and the rest. */
	c->in_use += c->over;
	c->inflight += c->inflight_over;
	read_classes(seg_header(s), sc, s->nslots, c);
	/* What admission enforces now, by the library's own code. */
	c->live_limit = limit_why(sc, P_CONN, &c->live_by);
	c->inflight_limit_now = limit_why(sc, P_INFLIGHT, &c->inflight_live_by);
	cli_read_fleet(sc, c);
	check_fleet(c);
	cli_read_drill(sc, &c->drill);
	cli_read_comp_pool(s, c);
	if (c->pool >= 0)
		read_name(c->pool_name, sizeof(c->pool_name), c->pool_name, sizeof(c->pool_name),
		    &c->damaged, CF_NAME);
	check_comp_shares(c, s->nslots);
	live_limits(s, sc, c, c->in_use - c->over);
}

/* Pool p, read by cli_pool.c, held to what the library writes: its size as
 * a config gives it, reserve and shared part within it, what it lends and
 * its peak to the socket table. What is derived from its compartments is
 * damaged with theirs. */
static void
read_pool(const struct seg *s, struct cli_snap *snap, uint32_t p)
{
	struct cli_pool *v = &snap->pool[p];
	uint64_t *m = &v->damaged;

	cli_read_pool(s, p, v);
	read_name(v->name, sizeof(v->name), v->name, sizeof(v->name), m, CF_NAME);
	if (v->size == 0)
		flag(m, CF_SIZE);
	bound32(&v->size, BS_MAX_LIMIT, m, CF_SIZE);
	bound32(&v->reserved, v->size, m, CF_RESERVED);
	bound32(&v->shared, v->size, m, CF_SHARED);
	bound32(&v->lent, s->nslots, m, CF_LENT);
	bound32(&v->peak, s->nslots, m, CF_PEAK);
	bound64(&v->rejected, COUNTER_MAX, m, CF_REJECTED);
	bound32(&v->in_use, s->nslots, m, CF_IN_USE);
	bound32(&v->borrowed, s->nslots, m, CF_BORROWED);
	for (uint32_t i = 0; i < snap->ncomp; i++) {
		const struct cli_comp *c = &snap->comp[i];

		if (c->pool != (int)p)
			continue;
		if (CLI_DAMAGED(c->damaged, CF_IN_USE))
			flag(m, CF_IN_USE);
		if (CLI_DAMAGED(c->damaged, CF_BORROWED))
			flag(m, CF_BORROWED);
		if (CLI_DAMAGED(c->damaged, CF_GUARANTEED))
			flag(m, CF_GUARANTEED);
	}
	if (*m & (1ULL << CF_SIZE | 1ULL << CF_RESERVED | 1ULL << CF_IN_USE))
		flag(m, CF_FREE);
	if (CLI_DAMAGED(*m, CF_IN_USE))
		v->in_use = 0;
	if (CLI_DAMAGED(*m, CF_BORROWED))
		v->borrowed = 0;
	if (CLI_DAMAGED(*m, CF_GUARANTEED))
		v->guaranteed = 0;
	if (CLI_DAMAGED(*m, CF_FREE))
		v->free = 0;
}

static uint32_t
count_bits(uint64_t mask)
{
	return (uint32_t)__builtin_popcountll(mask);
}

int
cli_snap_read(const struct seg *s, struct cli_snap *snap)
{
	const struct seg_header *h = seg_header(s);
	uint64_t now_s = (now_mono_ms() / 1000) & 0xffffffff, now_ms = now_real_ms();

	memset(snap, 0, sizeof(*snap));
	snap->comp = calloc(s->ncomp ? s->ncomp : 1, sizeof(*snap->comp));
	if (snap->comp == NULL)
		return -ENOMEM;
	read_name(snap->name, sizeof(snap->name), h->name, sizeof(h->name), &snap->damaged,
	    CF_SEGMENT);
	copy_text(snap->config_path, sizeof(snap->config_path), h->config_path,
	    sizeof(h->config_path));
	snap->generation = atomic_load(&h->generation);
	snap->processes = cli_live_processes(s);
	snap->attaches = atomic_load(&h->attaches);
	bound64(&snap->attaches, COUNTER_MAX, &snap->damaged, CF_ATTACHED);
	snap->unprotected = atomic_load(&h->unprotected);
	bound64(&snap->unprotected, COUNTER_MAX, &snap->damaged, CF_UNPROTECTED);
	snap->unprotected_ms = atomic_load(&h->unprotected_ms);
	check_time(&snap->unprotected_ms, now_ms, &snap->damaged, CF_UNPROTECTED_LAST_MS);
	copy_text(snap->unprotected_why, sizeof(snap->unprotected_why), h->unprotected_why,
	    sizeof(h->unprotected_why));
	snap->ncomp = s->ncomp;
	for (uint32_t i = 0; i < s->ncomp; i++)
		read_comp(s, i, now_s, now_ms, &snap->comp[i]);
	cli_kernel_merge(s, snap->comp, snap->ncomp);
	/* After the merge: the kernel engine's connections count too. */
	snap->ndamaged = count_bits(snap->damaged);
	for (uint32_t i = 0; i < snap->ncomp; i++) {
		struct cli_comp *c = &snap->comp[i];

		c->hot = near_limit(c->in_use, c->live_limit) ||
		    near_limit(c->inflight, c->inflight_limit_now) || c->pool_full ||
		    c->class_full;
		c->ndamaged = count_bits(c->damaged);
		for (size_t k = 0; k < c->nclass; k++)
			c->ndamaged += count_bits(c->cls[k].damaged);
		snap->ndamaged += c->ndamaged;
	}
	snap->npools = h->npools < BS_MAX_POOLS ? h->npools : BS_MAX_POOLS;
	for (uint32_t p = 0; p < snap->npools; p++) {
		read_pool(s, snap, p);
		snap->ndamaged += count_bits(snap->pool[p].damaged);
	}
	/* Shrunk while read (cli_guard.c): what was read after is zeros. */
	if (guard_lost(s)) {
		flag(&snap->damaged, CF_TRUNCATED);
		snap->ndamaged++;
	}
	return 0;
}

void
cli_snap_free(struct cli_snap *snap)
{
	free(snap->comp);
	snap->comp = NULL;
	snap->ncomp = 0;
}

uint32_t
cli_live_processes(const struct seg *s)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < s->nprocs; i++) {
		struct seg_proc *p = seg_proc(s, i);

		if (atomic_load(&p->state) == PROC_LIVE &&
		    sys_pid_alive(atomic_load(&p->pid), atomic_load(&p->start)))
			n++;
	}
	return n;
}

uint32_t
cli_in_use_now(const struct seg *s, uint32_t i)
{
	const struct seg_comp *sc = seg_comp(s, i);

	return atomic_load(&sc->in_use) + atomic_load(&sc->over);
}

uint32_t
cli_inflight_now(const struct seg *s, uint32_t i)
{
	const struct seg_comp *sc = seg_comp(s, i);

	return atomic_load(&sc->inflight) + atomic_load(&sc->inflight_over);
}


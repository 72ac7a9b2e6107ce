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

/* A string of the segment, read with its field's bound: seg_open checked
 * that it was terminated, but the segment is shared and may hold anything. */
static void
copy_text(char *out, size_t len, const char *field, size_t size)
{
	snprintf(out, len, "%.*s", (int)strnlen(field, size), field);
}

static bool
near_limit(uint64_t used, uint32_t limit)
{
	return limit != UINT32_MAX && used * 100 >= (uint64_t)limit * CLI_HOT_PERCENT;
}

/* A histogram, its total the sum of the buckets read. */
static void
read_hist(const struct seg_hist *h, struct cli_hist *out)
{
	out->total = 0;
	for (int i = 0; i < BS_HIST_BUCKETS; i++) {
		out->bucket[i] = atomic_load(&h->bucket[i]);
		out->total += out->bucket[i];
	}
	/* The count is bumped after the bucket: the buckets' total is the
	 * count that matches them. */
	out->sum_us = atomic_load(&h->sum_us);
	out->count = atomic_load(&h->count);
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

static void
read_classes(const struct seg_header *h, struct seg_comp *sc, struct cli_comp *c)
{
	c->shares = atomic_load(&sc->cls_shares) != 0;
	for (uint32_t k = 0; k < h->nclass && k < BS_MAX_CLASSES; k++) {
		struct cli_class *cc = &c->cls[c->nclass];
		uint32_t lim = atomic_load(&sc->cls[k].limit);

		if (lim == 0)
			continue;
		memcpy(cc->name, h->class_name[k], sizeof(cc->name));
		cc->name[sizeof(cc->name) - 1] = '\0';
		cc->limit = lim;
		cc->in_use = atomic_load(&sc->cls[k].in_use);
		cc->peak = atomic_load(&sc->cls[k].peak);
		cc->admitted = atomic_load(&sc->cls[k].admitted);
		cc->rejected = atomic_load(&sc->cls[k].rejected);
		cc->index = k;
		cc->shares = c->shares;
		cc->guaranteed = cc->shares ? atomic_load(&sc->cls_guaranteed[k]) : 0;
		cc->borrowed = cc->shares && cc->in_use > cc->guaranteed ? cc->in_use - cc->guaranteed : 0;
		c->nclass++;
	}
}

/* Compartment i's own words, and its features' (the kernel engine's
 * counts come after, for every compartment at once). */
static void
read_comp(const struct seg *s, uint32_t i, uint64_t now_s, struct cli_comp *c)
{
	struct seg_comp *sc = seg_comp(s, i);

	memset(c, 0, sizeof(*c));
	c->index = i;
	memcpy(c->name, sc->name, sizeof(c->name));
	c->name[sizeof(c->name) - 1] = '\0';
	c->limit = atomic_load(&sc->limit);
	c->over = atomic_load(&sc->over);
	/* Observe mode lets connections past the limit without a permit:
	 * in_use counts every connection, permits and the rest. */
	c->in_use = atomic_load(&sc->in_use) + c->over;
	c->peak = atomic_load(&sc->peak);
	c->waiting = atomic_load(&sc->waiting);
	c->inflight_limit = atomic_load(&sc->inflight_limit);
	c->inflight_over = atomic_load(&sc->inflight_over);
	c->inflight = atomic_load(&sc->inflight) + c->inflight_over;
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
	read_hist(&sc->h_connect, &c->h_connect);
	read_hist(&sc->h_reply, &c->h_reply);
	read_hist(&sc->h_wait, &c->h_wait);
	cli_read_adaptive(sc, &c->ad);
	for (int r = 0; r < REASON_MAX; r++) {
		c->rejected_by[r] = atomic_load(stat_reason_count(sc, (enum bs_reason)r, false));
		c->would_reject[r] = atomic_load(stat_reason_count(sc, (enum bs_reason)r, true));
	}
	read_classes(seg_header(s), sc, c);
	cli_read_fleet(sc, c);
	/* What admission enforces now: an adaptive limit may be lower. */
	if (c->ad.mode == AD_ON && c->ad.kind == P_CONN && c->ad.limit < c->live_limit)
		c->live_limit = c->ad.limit;
	c->inflight_limit_now = c->inflight_limit;
	if (c->ad.mode == AD_ON && c->ad.kind == P_INFLIGHT && c->ad.limit < c->inflight_limit)
		c->inflight_limit_now = c->ad.limit;
	cli_read_comp_pool(s, c);
}

int
cli_snap_read(const struct seg *s, struct cli_snap *snap)
{
	const struct seg_header *h = seg_header(s);
	uint64_t now_s = (now_mono_ms() / 1000) & 0xffffffff;

	memset(snap, 0, sizeof(*snap));
	snap->comp = calloc(s->ncomp ? s->ncomp : 1, sizeof(*snap->comp));
	if (snap->comp == NULL)
		return -ENOMEM;
	copy_text(snap->name, sizeof(snap->name), h->name, sizeof(h->name));
	copy_text(snap->config_path, sizeof(snap->config_path), h->config_path,
	    sizeof(h->config_path));
	snap->generation = atomic_load(&h->generation);
	snap->processes = cli_live_processes(s);
	snap->attaches = atomic_load(&h->attaches);
	snap->unprotected = atomic_load(&h->unprotected);
	snap->unprotected_ms = atomic_load(&h->unprotected_ms);
	copy_text(snap->unprotected_why, sizeof(snap->unprotected_why), h->unprotected_why,
	    sizeof(h->unprotected_why));
	snap->ncomp = s->ncomp;
	for (uint32_t i = 0; i < s->ncomp; i++)
		read_comp(s, i, now_s, &snap->comp[i]);
	cli_kernel_merge(s, snap->comp, snap->ncomp);
	/* After the merge: the kernel engine's connections count too. */
	for (uint32_t i = 0; i < snap->ncomp; i++) {
		struct cli_comp *c = &snap->comp[i];

		c->hot = near_limit(c->in_use, c->live_limit) ||
		    near_limit(c->inflight, c->inflight_limit_now);
	}
	snap->npools = h->npools < BS_MAX_POOLS ? h->npools : BS_MAX_POOLS;
	for (uint32_t p = 0; p < snap->npools; p++)
		cli_read_pool(s, p, &snap->pool[p]);
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
cli_inflight_now(const struct seg *s, uint32_t i)
{
	const struct seg_comp *sc = seg_comp(s, i);

	return atomic_load(&sc->inflight) + atomic_load(&sc->inflight_over);
}

uint64_t
cli_hist_quantile_us(const struct cli_hist *h, unsigned permille)
{
	uint64_t rank, seen = 0;

	if (h->total == 0)
		return 0;
	/* The smallest rank with at least permille/1000 of the values at or
	 * below it: ceil(total * permille / 1000), in integers. */
	rank = (h->total * permille + 999) / 1000;
	if (rank == 0)
		rank = 1;
	for (int i = 0; i < BS_HIST_BUCKETS; i++) {
		seen += h->bucket[i];
		if (seen >= rank)
			return 1ULL << i;
	}
	return 1ULL << (BS_HIST_BUCKETS - 1);
}

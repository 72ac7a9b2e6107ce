/* stats.c - the statistics of a compartment: histograms, refusals by reason, connect times, resets. */
#include <stdint.h>

#include "admit/admit.h"
#include "log.h"

/*
 * Nothing here is a permit: every count is a plain atomic add, read by the
 * CLI. A process killed between two of them leaves a statistic one off,
 * never a limit.
 */

void
stat_hist_add_n(struct seg_hist *h, uint64_t us, uint64_t n)
{
	unsigned b = us == 0 ? 0 : 64 - (unsigned)__builtin_clzll(us);

	if (b >= BS_HIST_BUCKETS)
		b = BS_HIST_BUCKETS - 1;
	atomic_fetch_add(&h->bucket[b], n);
	atomic_fetch_add(&h->sum_us, us * n);
	atomic_fetch_add(&h->count, n);
}

void
stat_hist_add(struct seg_hist *h, uint64_t us)
{
	stat_hist_add_n(h, us, 1);
}

const char *
stat_reason_name(enum bs_reason why)
{
	static const char *names[REASON_MAX] = {
		"full", "inflight_full", "wait_timeout", "too_many_waiting", "class_full", "no_slot",
		"pool_full", "class_shared_full", "process_table_full",
	};

	return (unsigned)why < REASON_MAX ? names[why] : "unknown";
}

_Atomic uint64_t *
stat_reason_count(struct seg_comp *c, enum bs_reason why, bool would)
{
	if ((unsigned)why >= REASON_MAX)
		return NULL;
	if (why < REASON_V2)
		return would ? &c->would_reject[why] : &c->rejected_by[why];
	if (why < REASON_V3)
		return would ? &c->would_reject_more[why - REASON_V2] :
		    &c->rejected_by_more[why - REASON_V2];
	return would ? &c->would_reject_v4[why - REASON_V3] : &c->rejected_by_v4[why - REASON_V3];
}

void
stat_refused(struct seg *s, struct seg_comp *c, enum bs_reason why)
{
	struct seg_pool *pool;

	if (c == NULL || (unsigned)why >= REASON_MAX)
		return;
	atomic_fetch_add(stat_reason_count(c, why, false), 1);
	if (why == REASON_POOL_FULL && (pool = seg_pool_of(s, c)) != NULL)
		atomic_fetch_add(&pool->rejected, 1);
	atomic_fetch_add(&c->rejected, 1);
	atomic_store(&c->last_rejection_ms, now_real_ms());
}

void
stat_connect_time(struct seg *s, uint32_t slot, struct seg_comp *c)
{
	uint64_t t, now, us;

	/* Once: the exchange decides who times it. */
	if ((t = atomic_exchange(&s->slots[slot].connect_us, 0)) == 0)
		return;
	now = now_mono_us();
	us = now > (t & ~SENT_WEIGHTED) ? now - (t & ~SENT_WEIGHTED) : 0;
	stat_hist_add_n(&c->h_connect, us, (t & SENT_WEIGHTED) ? REQ_SAMPLE : 1);
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
BS_LTO_INLINE void
stat_connect_done_in(struct seg *s, uint32_t slot, struct seg_comp *c)
{
	if (atomic_load_explicit(&s->slots[slot].connect_us, memory_order_relaxed) != 0)
		stat_connect_time(s, slot, c);
}
#pragma GCC diagnostic pop

static void
zero_hist(struct seg_hist *h)
{
	for (int b = 0; b < BS_HIST_BUCKETS; b++)
		atomic_store(&h->bucket[b], 0);
	atomic_store(&h->count, 0);
	atomic_store(&h->sum_us, 0);
}

void
stat_reset(struct seg_comp *c)
{
	if (c == NULL)
		return;
	atomic_store(&c->admitted, 0);
	atomic_store(&c->rejected, 0);
	atomic_store(&c->reclaimed, 0);
	atomic_store(&c->last_rejection_ms, 0);
	atomic_store(&c->inflight_admitted, 0);
	atomic_store(&c->connect_timeouts, 0);
	atomic_store(&c->io_timeouts, 0);
	atomic_store(&c->peak_rate, 0);
	/* Peaks restart from what is held now, never below it. */
	atomic_store(&c->peak, atomic_load(&c->in_use) + atomic_load(&c->over));
	atomic_store(&c->inflight_peak, atomic_load(&c->inflight));
	for (int r = 0; r < REASON_MAX; r++) {
		atomic_store(stat_reason_count(c, (enum bs_reason)r, false), 0);
		atomic_store(stat_reason_count(c, (enum bs_reason)r, true), 0);
	}
	for (int k = 0; k < BS_RATE_SECONDS; k++)
		atomic_store(&c->rate[k], 0);
	zero_hist(&c->h_connect);
	zero_hist(&c->h_reply);
	zero_hist(&c->h_wait);
	for (int k = 0; k < BS_MAX_CLASSES; k++) {
		atomic_store(&c->cls[k].admitted, 0);
		atomic_store(&c->cls[k].rejected, 0);
		atomic_store(&c->cls[k].peak, atomic_load(&c->cls[k].in_use));
	}
	ad_reset_stats(c);
}


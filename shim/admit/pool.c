/* pool.c - pools: capacity shared by compartments, each with a guarantee, idle capacity lent up to each ceiling. */
#include <errno.h>
#include <limits.h>
#include <string.h>

#include "admit/pool.h"
#include "log.h"
#include "sys.h"

/*
 * A compartment in a pool holds, for each connection, its own permit
 * (P_CONN, below its ceiling `limit`, as without a pool) and, when that
 * permit is beyond its guarantee, one lent by the pool's shared part
 * (P_LENT; size - reserved - the sum of guarantees). share.c holds the
 * mechanism, the same one a compartment's classes use, and why at every
 * instant the pool's in use stays within size - reserved while a
 * compartment below its guarantee is never refused for the pool. This
 * file keeps the pools themselves: their words, live changes, waiters.
 */

/* Raises pool's peak to n, the use statistic just read. A count that went
 * below 0 after a kill (it wraps) raises no peak. */
static inline void
pool_raise_peak(struct seg_pool *pool, uint32_t n)
{
	uint32_t pk = atomic_load_explicit(&pool->peak, memory_order_relaxed);

	while (n > pk && n <= BS_MAX_SOCKETS &&
	    !atomic_compare_exchange_weak(&pool->peak, &pk, n))
		;
}
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
BS_LTO_INLINE int
pool_take(struct seg *s, struct seg_comp *c, struct seg_pool *pool, uint32_t slot, uint32_t gen,
    uint32_t took, uint32_t v, uint32_t *seen, _Atomic uint32_t **full)
{
	uint32_t lent;
	int r;

	if (v <= atomic_load_explicit(&c->guaranteed, memory_order_relaxed)) {
		/* Lent beyond the shared part (it shrank live, or a
		 * guarantee grew): nothing more until it drains, guaranteed
		 * or not, so that the pool never has more than size -
		 * reserved in use. Lending never passes the shared part, so
		 * once this reads below it, it stays so. (A borrower's take
		 * below refuses by the same comparison.) */
		lent = atomic_load(&pool->lent);
		if (lent > atomic_load(&pool->shared)) {
			*seen = lent;
			*full = &pool->lent;
			return TAKE_FULL;
		}
		/* Within the guarantee: the slot is marked so, unless it was
		 * released meanwhile. */
		r = tally_mark_change(&s->slots[slot], gen, 0, MARK_RELEASED, 0,
		    MARK_GUARANTEED(SHARE_POOL)) ? TAKE_OK : TAKE_BUSY;
	} else {
		r = tally_take_lent(s, slot, gen, pool, took, seen);
		if (r == TAKE_OK)	/* where a hand-over looks first (share.c's pass_on) */
			atomic_store_explicit(&c->lent_hint, slot, memory_order_relaxed);
		else if (r == TAKE_FULL)
			*full = &pool->lent;
	}
	if (r == TAKE_OK)
		pool_note_use(pool);
	return r;
}

BS_LTO_INLINE void
pool_note_use(struct seg_pool *pool)
{
	pool_raise_peak(pool, atomic_fetch_add_explicit(&pool->in_use_stat, 1,
	    memory_order_relaxed) + 1);
}

BS_LTO_INLINE void
pool_note_release(struct seg_pool *pool)
{
	atomic_fetch_sub_explicit(&pool->in_use_stat, 1, memory_order_relaxed);
}
#pragma GCC diagnostic pop


uint32_t
pool_in_use(const struct seg *s, uint32_t p, uint32_t *lent_derived)
{
	uint32_t sum = 0, lent = 0;

	for (uint32_t i = 0; i < s->ncomp; i++) {
		struct seg_comp *c = &s->comp[i];
		uint32_t n, g;

		if (atomic_load(&c->pool) != p + 1)
			continue;
		n = atomic_load(&c->in_use);
		g = atomic_load(&c->guaranteed);
		sum += n;
		lent += n > g ? n - g : 0;
	}
	if (lent_derived != NULL)
		*lent_derived = lent;
	return sum;
}

void
pool_update_shared(struct seg *s, uint32_t p)
{
	struct seg_pool *pool;
	uint64_t guar = 0, room;

	if (p >= s->h->npools || p >= BS_MAX_POOLS)
		return;
	pool = &s->h->pools[p];
	for (uint32_t i = 0; i < s->ncomp; i++) {
		if (atomic_load(&s->comp[i].pool) == p + 1)
			guar += atomic_load(&s->comp[i].guaranteed);
	}
	room = atomic_load(&pool->size) - (uint64_t)atomic_load(&pool->reserved);
	if (atomic_load(&pool->reserved) > atomic_load(&pool->size))
		room = 0;
	/* Guarantees set live above the room leave nothing to lend. */
	atomic_store(&pool->shared, (uint32_t)(room > guar ? room - guar : 0));
	if (atomic_load(&pool->sleepers) > 0)
		sys_futex_wake(&pool->lent, INT_MAX);
}

/* The pool word of config compartment cc: its pool's number from 1, 0 for
 * none (also for an index past cfg's pools, as a zeroed test config has). */
static uint32_t
pool_word(const struct bs_config *cfg, const struct cfg_compartment *cc)
{
	return cc->pool == BS_NO_POOL || cc->pool < 0 || (size_t)cc->pool >= cfg->npools ? 0 :
	    (uint32_t)cc->pool + 1;
}

void
pool_apply(struct seg *s, const struct bs_config *cfg, const int *cmap, bool membership)
{
	if (membership) {
		s->h->npools = (uint32_t)cfg->npools;
		for (size_t p = 0; p < cfg->npools; p++)
			bs_format(s->h->pools[p].name, sizeof(s->h->pools[p].name), "%s",
			    cfg->pools[p].name);
	}
	for (size_t p = 0; p < cfg->npools && p < s->h->npools; p++) {
		atomic_store(&s->h->pools[p].size, cfg->pools[p].size);
		atomic_store(&s->h->pools[p].reserved, cfg->pools[p].reserved);
	}
	for (size_t i = 0; i < cfg->ncomp; i++) {
		const struct cfg_compartment *cc = &cfg->comp[i];
		uint32_t old, now = pool_word(cfg, cc) == 0 ? 0 : cc->guaranteed;
		struct seg_comp *c;

		if (cmap[i] < 0 || (uint32_t)cmap[i] >= s->ncomp)
			continue;
		c = &s->comp[cmap[i]];
		if (membership)
			atomic_store(&c->pool, pool_word(cfg, cc));
		old = atomic_exchange(&c->guaranteed, now);
		/* The shared part shrinks before lent permits move onto a
		 * raised guarantee. */
		if (pool_word(cfg, cc) != 0)
			pool_update_shared(s, (uint32_t)cc->pool);
		share_guarantee_changed(s, c, 0, SHARE_POOL, old, now);
	}
	for (size_t p = 0; p < cfg->npools && p < s->h->npools; p++)
		pool_update_shared(s, (uint32_t)p);
}

const char *
pool_mismatch(const struct seg *s, const struct bs_config *cfg, const int *cmap)
{
	if (s->h->npools != cfg->npools)
		return "a different number of pools";
	for (size_t p = 0; p < cfg->npools; p++) {
		if (strncmp(s->h->pools[p].name, cfg->pools[p].name, BS_NAME_MAX) != 0)
			return "other pools";
	}
	for (size_t i = 0; i < cfg->ncomp; i++) {
		uint32_t want = pool_word(cfg, &cfg->comp[i]);

		if (cmap[i] >= 0 && (uint32_t)cmap[i] < s->ncomp &&
		    atomic_load(&s->comp[cmap[i]].pool) != want)
			return "compartments in other pools";
	}
	return NULL;
}

void
pool_resync_use(struct seg *s)
{
	/* Only an empty pool is set: a take or a give under way elsewhere
	 * would make a count taken now one high for good. Stored after the
	 * sum read 0, it is at worst one low (a take landed in between). */
	for (uint32_t p = 0; p < s->h->npools && p < BS_MAX_POOLS; p++) {
		if (pool_in_use(s, p, NULL) == 0)
			atomic_store(&s->h->pools[p].in_use_stat, 0);
	}
}

void
pool_reset_counters(struct seg *s, uint32_t p)
{
	struct seg_pool *pool;
	uint32_t n;

	if (p >= s->h->npools || p >= BS_MAX_POOLS)
		return;
	pool = &s->h->pools[p];
	atomic_store(&pool->rejected, 0);
	/* A statistic past BS_MAX_SOCKETS went below 0 after a kill, and
	 * raises no peak (pool_raise_peak): its peak restarts from 0. */
	n = atomic_load(&pool->in_use_stat);
	atomic_store(&pool->peak, n <= BS_MAX_SOCKETS ? n : 0);
	/* A take between the load and the store compared its count with the
	 * old, higher peak and left it alone, so the store may have put the
	 * peak below what is in use: raise it again as a take does. */
	pool_raise_peak(pool, atomic_load(&pool->in_use_stat));
}

void
pool_sleepers(struct seg *s, const struct seg_comp *c, int delta)
{
	struct seg_pool *pool = seg_pool_of(s, c);

	if (pool == NULL)
		return;
	if (delta > 0)
		atomic_fetch_add(&pool->sleepers, 1);
	else
		seg_dec_floor(&pool->sleepers);
}

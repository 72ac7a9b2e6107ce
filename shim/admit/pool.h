/* pool.h - private to admit/: a pool's permit in admission, its use statistic, its waiters. */
#ifndef BULKSHIM_POOL_H
#define BULKSHIM_POOL_H

#include "admit/share.h"

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
/* A member of pool took a connection permit: the use statistic goes up
 * and the peak with it. Inline: every take in a pool asks it. */
static inline void
pool_note_use(struct seg_pool *pool)
{
	pool_raise_peak(pool, atomic_fetch_add_explicit(&pool->in_use_stat, 1,
	    memory_order_relaxed) + 1);
}
/* A slot of a member of pool is being released: the use statistic goes
 * down (before the slot's permits do). */
static inline void
pool_note_release(struct seg_pool *pool)
{
	atomic_fetch_sub_explicit(&pool->in_use_stat, 1, memory_order_relaxed);
}
/* Sets the use statistic of every pool whose members hold nothing to 0
 * (after a reclaim: what a killed thread left one low is right again). */
void pool_resync_use(struct seg *s);
/* A waiter of c goes to sleep on the pool (delta 1) or wakes (-1). */
void pool_sleepers(struct seg *s, const struct seg_comp *c, int delta);

/*
 * After slot's permit of compartment c, in pool, whose take made in_use v:
 * within the guarantee if v is, else a permit lent by the pool
 * (share_take). TAKE_OK, TAKE_FULL with *full the word to wait on,
 * or TAKE_BUSY.
 */
static inline __attribute__((always_inline)) int
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
		r = share_mark(s, slot, gen, SHARE_POOL);
	} else {
		/* Right after the compartment's take (tag `took`), which
		 * found the slot of its generation, not released, after its
		 * compare-and-swap: the check after this one covers what came
		 * since, and the slot holds no lent permit (this step alone
		 * takes one, once an admission). Untagged and below the
		 * shared part (one comparison, as in tally_take_clear), the
		 * tally takes that compare-and-swap alone, with the same tag:
		 * the slot has made no earlier change of this tally to tell
		 * it from. */
		uint64_t w = atomic_load((_Atomic uint64_t *)(uintptr_t)&pool->lent);

		r = TAKE_MISS;
		if (__builtin_expect(w < atomic_load(&pool->shared), 1))
			r = take_swap(s, slot, gen, took, &pool->lent, w, NULL);
		if (r == TAKE_MISS)
			r = tally_take_lent(s, slot, gen, pool, seen);
		if (r == TAKE_OK)	/* where a hand-over looks first (share.c's pass_on) */
			atomic_store_explicit(&c->lent_hint, slot, memory_order_relaxed);
		else if (r == TAKE_FULL)
			*full = &pool->lent;
	}
	if (r == TAKE_OK)
		pool_note_use(pool);
	return r;
}

/* A pool permit went back to lent, the pool's tally of them: wakes the
 * pool's waiters, if any. Inline: every borrowed permit's release asks it,
 * and the tally it gave to is the pool, without a lookup. */

#endif

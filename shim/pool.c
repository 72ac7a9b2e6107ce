/* pool.c - pools: capacity shared by compartments, each with a guarantee, idle capacity lent up to each ceiling. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

/*
 * A compartment in a pool holds, for each connection, its own permit
 * (P_CONN, below its ceiling `limit`, as without a pool) and one of the
 * pool's: P_GUAR while it holds fewer than its guarantee, else P_LENT, one
 * of the pool's shared part (size - reserved - the sum of guarantees). Both
 * are tallies (tally.c), so kills, forks and execs leave them exact like
 * every other count, and nothing here is a lock. Hence, at every instant:
 *
 *   pool in use = sum of guar_in_use + lent <= sum of guarantees + shared
 *               = size - reserved;
 *   a compartment below its guarantee finds room in its guar_in_use, which
 *   nobody else counts in: it is never refused for the pool.
 *
 * A permit lent to a connection stays with it; when a connection holding a
 * guaranteed permit goes while others of its compartment hold lent ones,
 * one of those moves onto the guarantee and its lent permit goes back to
 * the shared part at once (pool_rebalance), so that `lent` is what the
 * compartments hold above their guarantees, never more.
 */

static void
futex_wake_all(_Atomic uint32_t *word)
{
	syscall(SYS_futex, (uint32_t *)(uintptr_t)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

struct seg_pool *
seg_pool_of(const struct seg *s, const struct seg_comp *c)
{
	uint32_t p = atomic_load_explicit(&c->pool, memory_order_relaxed);

	if (p == 0 || p > s->h->npools || p > BS_MAX_POOLS)
		return NULL;
	return &s->h->pools[p - 1];
}

_Atomic uint32_t *
pool_tally_of(const struct seg *s, struct seg_comp *c, int p, _Atomic uint32_t **limit)
{
	struct seg_pool *pool = seg_pool_of(s, c);

	if (pool == NULL)
		return NULL;
	if (p == P_GUAR) {
		if (limit != NULL)
			*limit = &c->guaranteed;
		return &c->guar_in_use;
	}
	if (p == P_LENT) {
		if (limit != NULL)
			*limit = &pool->shared;
		return &pool->lent;
	}
	return NULL;
}

_Atomic uint64_t *
seg_reason_count(struct seg_comp *c, enum bs_reason why, bool would)
{
	if ((unsigned)why >= REASON_MAX)
		return NULL;
	if (why < REASON_V2)
		return would ? &c->would_reject[why] : &c->rejected_by[why];
	return would ? &c->would_reject_more[why - REASON_V2] : &c->rejected_by_more[why - REASON_V2];
}

uint32_t
pool_in_use(const struct seg *s, uint32_t p, uint32_t *lent_derived)
{
	uint32_t sum = 0, lent = 0;

	for (uint32_t i = 0; i < s->h->ncomp; i++) {
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
	for (uint32_t i = 0; i < s->h->ncomp; i++) {
		if (atomic_load(&s->comp[i].pool) == p + 1)
			guar += atomic_load(&s->comp[i].guaranteed);
	}
	room = atomic_load(&pool->size) - (uint64_t)atomic_load(&pool->reserved);
	if (atomic_load(&pool->reserved) > atomic_load(&pool->size))
		room = 0;
	/* Guarantees set live above the room leave nothing to lend. */
	atomic_store(&pool->shared, (uint32_t)(room > guar ? room - guar : 0));
	if (atomic_load(&pool->sleepers) > 0)
		futex_wake_all(&pool->lent);
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
	for (size_t i = 0; i < cfg->ncomp; i++) {
		const struct cfg_compartment *cc = &cfg->comp[i];
		struct seg_comp *c;

		if (cmap[i] < 0 || (uint32_t)cmap[i] >= s->h->ncomp)
			continue;
		c = &s->comp[cmap[i]];
		if (membership)
			atomic_store(&c->pool, cc->pool == BS_NO_POOL ? 0 : (uint32_t)cc->pool + 1);
		atomic_store(&c->guaranteed, cc->pool == BS_NO_POOL ? 0 : cc->guaranteed);
	}
	for (size_t p = 0; p < cfg->npools && p < s->h->npools; p++) {
		atomic_store(&s->h->pools[p].size, cfg->pools[p].size);
		atomic_store(&s->h->pools[p].reserved, cfg->pools[p].reserved);
		pool_update_shared(s, (uint32_t)p);
	}
	for (uint32_t i = 0; i < s->h->ncomp; i++)
		pool_rebalance(s, i);
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
		uint32_t want = cfg->comp[i].pool == BS_NO_POOL ? 0 : (uint32_t)cfg->comp[i].pool + 1;

		if (cmap[i] >= 0 && (uint32_t)cmap[i] < s->h->ncomp &&
		    atomic_load(&s->comp[cmap[i]].pool) != want)
			return "compartments in other pools";
	}
	return NULL;
}

int
pool_take(struct seg *s, uint32_t slot, uint32_t gen, uint32_t *seen, _Atomic uint32_t **full)
{
	struct seg_comp *c = seg_slot_comp(s, &s->slots[slot]);
	struct seg_pool *pool;
	int r;

	if (c == NULL || (pool = seg_pool_of(s, c)) == NULL)
		return TALLY_TAKEN;
	/* Lent beyond the shared part (it shrank live, or a guarantee grew):
	 * nothing more until it drains, guaranteed or not, so that the pool
	 * never has more than size - reserved in use. Lending never passes
	 * the shared part, so once this reads below it, it stays so. */
	if (atomic_load(&pool->lent) > atomic_load(&pool->shared)) {
		*seen = atomic_load(&pool->lent);
		*full = &pool->lent;
		return TALLY_FULL;
	}
	r = tally_take(s, slot, gen, P_GUAR, 0, seen);
	if (r != TALLY_FULL)
		return r;
	r = tally_take(s, slot, gen, P_LENT, 0, seen);
	if (r == TALLY_FULL)
		*full = &pool->lent;
	else if (r == TALLY_TAKEN)
		atomic_store_explicit(&c->lent_hint, slot, memory_order_relaxed);
	return r;
}

void
pool_note_peak(struct seg *s, const struct seg_comp *c)
{
	struct seg_pool *pool = seg_pool_of(s, c);
	uint32_t n, pk;

	if (pool == NULL)
		return;
	n = pool_in_use(s, atomic_load(&c->pool) - 1, NULL);
	pk = atomic_load(&pool->peak);
	while (n > pk && !atomic_compare_exchange_weak(&pool->peak, &pk, n))
		;
}

void
pool_wake(const struct seg *s, const struct seg_slot *sl)
{
	struct seg_comp *c = seg_slot_comp(s, sl);
	struct seg_pool *pool = c != NULL ? seg_pool_of(s, c) : NULL;

	if (pool != NULL && atomic_load(&pool->sleepers) > 0)
		futex_wake_all(&pool->lent);
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

/*
 * Moves slot's lent permit onto its compartment's guarantee: takes P_GUAR,
 * then gives P_LENT. The take is announced before the slot's state is
 * read, and a release moves the state before it reads the mark, so either
 * this sees the release and withdraws, or the release sees the take under
 * way and waits for it (settle in permit.c), then gives back both. True if
 * the slot's lent permit went back.
 */
static bool
move_to_guarantee(struct seg *s, uint32_t slot, uint32_t gen)
{
	struct seg_slot *sl = &s->slots[slot];
	struct seg_comp *c = seg_slot_comp(s, sl);
	uint32_t seen;

	if (c == NULL)
		return false;
	atomic_store(&sl->op_pid, s->my_pid);
	if (!slot_mark_change(sl, gen, MARK_HELD(P_LENT), MARK_HELD(P_GUAR) | MARK_TAKING(P_GUAR) |
	    MARK_GIVING(P_GUAR) | MARK_GIVING(P_LENT), MARK_WITHDRAWN(P_GUAR), MARK_TAKING(P_GUAR)))
		return false;
	if (SLOT_KIND(atomic_load(&sl->state)) != SLOT_USED ||
	    !tally_add(s, &c->guar_in_use, &c->guaranteed, P_GUAR, slot, gen, &seen)) {
		slot_mark_change(sl, gen, MARK_TAKING(P_GUAR), 0, MARK_TAKING(P_GUAR), 0);
		return false;
	}
	if (tally_taken(s, slot, gen, P_GUAR, &c->guar_in_use) != TALLY_TAKEN)
		return false;
	return tally_give(s, slot, gen, P_LENT);
}

void
pool_rebalance(struct seg *s, uint32_t comp)
{
	struct seg_comp *c;
	uint32_t n = s->h->nslots, start;

	if (comp >= s->h->ncomp)
		return;
	c = &s->comp[comp];
	if (seg_pool_of(s, c) == NULL)
		return;
	/* From the slot that borrowed last: slots are handed out in turn,
	 * so the compartment's other borrowers are usually close by. */
	start = atomic_load_explicit(&c->lent_hint, memory_order_relaxed) % n;
	for (uint32_t k = 0; k < n; k++) {
		uint32_t i = (start + n - k) % n;
		struct seg_slot *sl = &s->slots[i];
		uint64_t m;

		/* Nothing to move: no room in the guarantee, or nothing lent. */
		if (atomic_load(&c->guar_in_use) >= atomic_load(&c->guaranteed) ||
		    atomic_load(&c->in_use) <= atomic_load(&c->guar_in_use))
			return;
		m = atomic_load_explicit(&sl->mark, memory_order_relaxed);
		if ((m & (MARK_HELD(P_LENT) | MARK_HELD(P_GUAR))) != MARK_HELD(P_LENT) ||
		    atomic_load_explicit(&sl->comp, memory_order_relaxed) != comp)
			continue;
		move_to_guarantee(s, i, MARK_GEN(m));
	}
}

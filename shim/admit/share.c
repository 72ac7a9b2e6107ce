/* share.c - guaranteed shares: a guarantee nobody else may take, idle capacity lent up to a ceiling, for pools and for classes. */
#include <stdint.h>

#include "admit/share.h"

/*
 * One mechanism serves two levels (enum share_level):
 *
 *   level        member        own permit (ceiling)      shared part (tally)
 *   SHARE_POOL   compartment   P_CONN   (max_connections) pool's lent, limit size - reserved - sum of guarantees
 *   SHARE_CLASS  class         P_CLASS  (class limit)     compartment's cls_lent, limit max_connections - sum of guarantees
 *
 * A member takes its own permit first, by the compare-and-swap of its own
 * tally. If that made its count v <= its guarantee, the permit is within
 * the guarantee: the slot's mark says so (MARK_GUARANTEED) and nothing
 * else is taken, so the guaranteed path costs one mark change. Otherwise it
 * also takes one permit of the shared part (P_LENT, P_CLENT), a tally of
 * its own, and is refused when that is full.
 *
 * Why no count of guaranteed permits is needed. Call N the member's slots
 * within its guarantee (marked, or about to be: their take made v <= g)
 * and L those holding a shared permit. Both are counted in the member's own
 * tally, so |N| + |L| <= count. A slot joins N only when its take made
 * count = v <= g, hence then |N| <= v - |L| <= g. A slot leaves N when it
 * is released; and a lent slot moves from L to N only as the hand-over of
 * a slot leaving N (share_released), before its own permit goes, or of a
 * guarantee raised live (share_guarantee_changed). Before: a hand-over
 * after the departure could find a borrower that came after a new take had already
 * filled the freed place, and put it on the guarantee too (seen as 11 open
 * in a pool of 10 by test_pool's witness); done while the leaving slot is
 * still counted, no take can fill its place first. Hence at every
 * instant, for a pool:
 *
 *   in use = sum of |N| + lent <= sum of guarantees + shared = size - reserved,
 *
 * and a member below its guarantee (count < g) takes its own permit with
 * v <= g: it is never refused for the shared part.
 *
 * Kills: the mark flag is set after the own permit's take and cleared
 * before the hand-over, and a hand-over gives the shared permit before it
 * marks the receiver. Killed anywhere, a slot is at worst within its
 * guarantee without the flag, and its release then hands nothing over: the
 * guarantee is used less until a borrower closes, never more. The tallies
 * themselves are exact under kills (tally.c).
 */

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"

BS_LTO_INLINE void
share_released(struct seg *s, uint32_t slot, uint64_t m, struct seg_comp *c,
    struct seg_pool *pool)
{
	if (c == NULL)
		return;
	/* Nobody borrows: nothing to hand over. The flag may stay, the slot
	 * is being freed (its next generation starts with a clean mark) and
	 * this release is the only one; share_hand_over hands over only
	 * while the slot still holds its own permit. */
	if ((m & MARK_GUARANTEED(SHARE_POOL)) && pool != NULL &&
	    atomic_load_explicit(&pool->lent, memory_order_relaxed) != 0)
		share_hand_over(s, c, slot, MARK_GEN(m), SHARE_POOL);
	if ((m & MARK_GUARANTEED(SHARE_CLASS)) &&
	    atomic_load_explicit(&c->cls_lent, memory_order_relaxed) != 0)
		share_hand_over(s, c, slot, MARK_GEN(m), SHARE_CLASS);
}
#pragma GCC diagnostic pop

static const int own_kind[SHARE_LEVELS] = { P_CONN, P_CLASS };
static const int lent_kind[SHARE_LEVELS] = { P_LENT, P_CLENT };

/* After the level's own permit of slot (P_CONN, P_CLASS), whose take
 * made its count v: within the guarantee (v <= *guaranteed) the slot is
 * marked so (the guaranteed path of a connect costs that one
 * compare-and-swap), else it takes a permit of the level's shared part.
 * TAKE_OK, TAKE_FULL (*seen the shared count) or TAKE_BUSY. */
static enum take
share_take(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen, enum share_level l,
    uint32_t v, _Atomic uint32_t *guaranteed, uint32_t *seen)
{
	enum take r;

	if (v <= atomic_load_explicit(guaranteed, memory_order_relaxed))
		return tally_mark_change(&s->slots[slot], gen, 0, MARK_RELEASED, 0,
		    MARK_GUARANTEED(l)) ? TAKE_OK : TAKE_BUSY;
	r = tally_take(s, c, slot, gen, lent_kind[l], 0, seen);
	/* Where a hand-over looks first (see pass_on). */
	if (r == TAKE_OK)
		atomic_store_explicit(&c->lent_hint, slot, memory_order_relaxed);
	return r;
}

enum take
share_take_class(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen, uint32_t cls,
    uint32_t v)
{
	uint32_t seen;
	enum take r = TAKE_FULL;

	/* While c lends more than its unguaranteed part (a guarantee raised
	 * live) nothing is admitted until it drains, as for a pool. */
	if (atomic_load(&c->cls_lent) <= atomic_load(&c->cls_shared))
		r = share_take(s, c, slot, gen, SHARE_CLASS, v, &c->cls_guaranteed[cls], &seen);
	if (r != TAKE_OK)
		tally_give(s, c, slot, gen, P_CLASS);
	return r;
}

/* The tally of level l's shared part for compartment c, or NULL. */
static _Atomic uint32_t *
shared_tally(const struct seg *s, struct seg_comp *c, enum share_level l)
{
	struct seg_pool *pool;

	if (l == SHARE_CLASS)
		return &c->cls_lent;
	pool = seg_pool_at(s, c);
	return pool != NULL ? &pool->lent : NULL;
}

/* Slot i's lent permit goes back and the slot is within its guarantee. */
static bool
move(struct seg *s, struct seg_comp *c, uint32_t i, uint32_t gen, enum share_level l)
{
	/* Given first, marked after: killed in between, the slot is within
	 * the guarantee unmarked, which hands nothing over later. */
	if (!tally_give(s, c, i, gen, lent_kind[l]))
		return false;
	if (tally_held(s, c, i, gen, own_kind[l]))
		tally_mark_change(&s->slots[i], gen, 0, MARK_RELEASED, 0, MARK_GUARANTEED(l));
	return true;
}

/*
 * Moves one permit lent at level l to compartment c (and class cls, for
 * SHARE_CLASS) onto its guarantee. The search starts at the slot that
 * borrowed last: slots are handed out in turn, so the member's other
 * borrowers are usually close by. True if one moved.
 */
static bool
pass_on(struct seg *s, struct seg_comp *c, uint32_t cls, enum share_level l)
{
	uint32_t n = s->nslots, start, comp = (uint32_t)(c - s->comp);
	_Atomic uint32_t *lent;

	if ((lent = shared_tally(s, c, l)) == NULL)
		return false;
	start = atomic_load_explicit(&c->lent_hint, memory_order_relaxed) % n;
	for (uint32_t k = 0; k < n; k++) {
		uint32_t i = (start + n - k) % n;
		struct seg_slot *sl = &s->slots[i];
		uint64_t m;

		/* Nobody borrows: nothing to move. */
		if (atomic_load_explicit(lent, memory_order_relaxed) == 0)
			return false;
		if (atomic_load_explicit(&sl->comp, memory_order_relaxed) != comp)
			continue;
		if (l == SHARE_CLASS && atomic_load_explicit(&sl->cls, memory_order_relaxed) != cls)
			continue;
		m = atomic_load(&sl->mark);
		if (!tally_held_at(s, i, MARK_GEN(m), lent_kind[l], lent))
			continue;
		if (move(s, c, i, MARK_GEN(m), l))
			return true;
	}
	return false;
}

/*
 * True if the member (compartment c, class cls of it for SHARE_CLASS)
 * may have a borrower: its own count, which still counts the slot leaving
 * its guarantee, is above the guarantee. Else pass_on would scan every
 * slot for nothing, on each release of a guaranteed permit while another
 * member borrows. A borrower left behind with the count at or below the
 * guarantee (a hand-over skipped by a race, or after a kill) stays lent
 * until it closes: the guarantee is used less, never more.
 */
static bool
may_borrow(const struct seg_comp *c, uint32_t cls, enum share_level l)
{
	if (l == SHARE_POOL)
		return atomic_load_explicit(&c->in_use, memory_order_relaxed) >
		    atomic_load_explicit(&c->guaranteed, memory_order_relaxed);
	return cls < BS_MAX_CLASSES &&
	    atomic_load_explicit(&c->cls[cls].in_use, memory_order_relaxed) >
	    atomic_load_explicit(&c->cls_guaranteed[cls], memory_order_relaxed);
}

/*
 * If the member may have a borrower, clears slot's flag of level l; if it
 * was set (and the slot holds its own permit), one permit lent to the same
 * compartment (and class) moves onto that guarantee, and the shared part
 * has it back at once. Async-signal-safe.
 */
void
share_hand_over(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen,
    enum share_level l)
{
	struct seg_slot *sl = &s->slots[slot];
	uint32_t cls = atomic_load(&sl->cls);

	/* Nothing to hand over: the flag may stay, as it only counts on a
	 * slot that still holds its own permit. */
	if (!may_borrow(c, cls, l))
		return;
	/* Only while the slot still holds its own permit: a release
	 * finished by a reclaimer after the owner died past its gives must
	 * not hand over a place a new take may have filled meanwhile. */
	if (tally_held(s, c, slot, gen, own_kind[l]) &&
	    tally_mark_change(sl, gen, MARK_GUARANTEED(l), 0, MARK_GUARANTEED(l), 0))
		pass_on(s, c, cls, l);
}

void
share_give(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen, enum share_level l)
{
	/* A slot within its guarantee holds no lent permit, and one that
	 * borrowed has no guarantee to pass on: of the first two steps one
	 * acts at most, in either order. */
	share_hand_over(s, c, slot, gen, l);
	tally_give(s, c, slot, gen, lent_kind[l]);
	tally_give(s, c, slot, gen, own_kind[l]);
}

/*
 * Slot i, within its guarantee, is no longer: its flag goes, then it takes
 * a permit of the shared part, past its limit if need be (the shared part
 * then admits nothing until it drains). Cleared first: killed in between,
 * the slot is within its guarantee unmarked, and hands nothing over.
 */
static bool
unmove(struct seg *s, struct seg_comp *c, uint32_t i, uint32_t gen, enum share_level l)
{
	struct seg_slot *sl = &s->slots[i];

	if (tally_of(s, c, sl, lent_kind[l], NULL) == NULL ||
	    !tally_held(s, c, i, gen, own_kind[l]) ||
	    !tally_mark_change(sl, gen, MARK_GUARANTEED(l), 0, MARK_GUARANTEED(l), 0))
		return false;
	return tally_take_past(s, c, i, gen, lent_kind[l]) == TAKE_OK;
}

static void
unmove_some(struct seg *s, struct seg_comp *c, uint32_t cls, enum share_level l, uint32_t n)
{
	uint32_t comp = (uint32_t)(c - s->comp);

	for (uint32_t i = 0; i < s->nslots && n > 0; i++) {
		struct seg_slot *sl = &s->slots[i];
		uint64_t m = atomic_load(&sl->mark);

		if (!(m & MARK_GUARANTEED(l)) || atomic_load(&sl->comp) != comp ||
		    (l == SHARE_CLASS && atomic_load(&sl->cls) != cls))
			continue;
		if (unmove(s, c, i, MARK_GEN(m), l))
			n--;
	}
}

void
share_guarantee_changed(struct seg *s, struct seg_comp *c, uint32_t cls, enum share_level l,
    uint32_t old, uint32_t now)
{
	for (uint32_t n = now > old ? now - old : 0; n > 0 && pass_on(s, c, cls, l); n--)
		;
	if (now < old)
		unmove_some(s, c, cls, l, old - now);
}

bool
share_pool_full(const struct seg *s, const struct seg_comp *c)
{
	const struct seg_pool *pool;

	/* Below its guarantee it borrows nothing (two loads, outside a
	 * pool too: its guarantee is then 0 and the pool word 0). */
	if (atomic_load_explicit(&c->in_use, memory_order_relaxed) <
	    atomic_load_explicit(&c->guaranteed, memory_order_relaxed) ||
	    (pool = seg_pool_at(s, c)) == NULL)
		return false;
	return atomic_load(&pool->lent) >= atomic_load(&pool->shared);
}

bool
share_classes_full(const struct seg_comp *c)
{
	return atomic_load_explicit(&c->cls_shares, memory_order_relaxed) != 0 &&
	    atomic_load(&c->cls_lent) >= atomic_load(&c->cls_shared);
}

void
share_update_classes(struct seg_comp *c)
{
	uint64_t guar = 0, lim = atomic_load(&c->limit);

	for (int k = 0; k < BS_MAX_CLASSES; k++)
		guar += atomic_load(&c->cls_guaranteed[k]);
	/* Guarantees set live above the limit leave nothing to lend. */
	atomic_store(&c->cls_shared, (uint32_t)(lim > guar ? lim - guar : 0));
}

/* share.h - private to admit/: guaranteed shares' steps for admission and release. */
#ifndef BULKSHIM_SHARE_H
#define BULKSHIM_SHARE_H

#include "admit/tally.h"

/* After the level's own permit of slot (P_CONN, P_CLASS), whose take
 * made its count v: within the guarantee (v <= *guaranteed) the slot is
 * marked so, else it takes a permit of the level's shared part.
 * TAKE_OK, TAKE_FULL (*seen the shared count) or TAKE_BUSY. */
enum take share_take(struct seg *s, uint32_t slot, uint32_t gen, enum share_level l, uint32_t v,
    _Atomic uint32_t *guaranteed, uint32_t *seen);
/* Gives back slot's permits of level l (its shared permit, then its own),
 * passing a guarantee on as a release does; used when admission stops
 * half-way. */
void share_give(struct seg *s, uint32_t slot, uint32_t gen, enum share_level l);
/* True if compartment c is in a pool and would borrow (it holds its
 * guarantee) from a shared part that is all lent: a reconcile may find
 * permits of the pool whose sockets are gone. */
bool share_pool_full(const struct seg *s, const struct seg_comp *c);
/* True if c's classes split it and its unguaranteed part is all lent. */
bool share_classes_full(const struct seg_comp *c);
/* Slot's hand-over of level l, when something is lent (share_released). */
void share_hand_over(struct seg *s, uint32_t slot, uint32_t gen, enum share_level l);

/* ---- share.c, inline: the guaranteed path of admission ---- */

/*
 * Marks slot (of generation gen, holding its own permit of level l) as
 * within its guarantee: one compare-and-swap of its mark. TAKE_OK, or
 * TAKE_BUSY if the slot is no longer what the caller took it for. Inline:
 * this is all the guaranteed path of a connect costs (share.c).
 */
static inline int
share_mark(struct seg *s, uint32_t slot, uint32_t gen, enum share_level l)
{
	_Atomic uint64_t *mark = &s->slots[slot].mark;
	uint64_t m = atomic_load_explicit(mark, memory_order_relaxed);

	/* The caller has just taken the level's own permit: the slot holds
	 * it unless it was released meanwhile. */
	do {
		if (MARK_GEN(m) != gen || (m & MARK_RELEASED))
			return TAKE_BUSY;
	} while (!atomic_compare_exchange_weak(mark, &m, m | MARK_GUARANTEED(l)));
	return TAKE_OK;
}

/* Slot, whose mark is m (with a MARK_GUARANTEED flag), of compartment c
 * in pool (each NULL: none, as the release read them), is about to give
 * back its permits: see share_hand_over. Two loads when nobody borrows. */
static inline void
share_released(struct seg *s, uint32_t slot, uint64_t m, const struct seg_comp *c,
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
		share_hand_over(s, slot, MARK_GEN(m), SHARE_POOL);
	if ((m & MARK_GUARANTEED(SHARE_CLASS)) &&
	    atomic_load_explicit(&c->cls_lent, memory_order_relaxed) != 0)
		share_hand_over(s, slot, MARK_GEN(m), SHARE_CLASS);
}

#endif

/* tally.h - private to admit/: the tallies' API and the inline steps of a take and a give. */
#ifndef BULKSHIM_TALLY_H
#define BULKSHIM_TALLY_H

#include "admit/admit.h"

/* The count that permit kind p of slot sl is counted in, and in *limit (if
 * not NULL) its limit (NULL: none); NULL if the slot names no such count. */
_Atomic uint32_t *tally_of(const struct seg *s, const struct seg_slot *sl, int p,
    _Atomic uint32_t **limit);
/* Changes sl's mark while it is of generation gen, has every flag of need
 * and none of deny: clears clr, sets set. False if it cannot. (Not for
 * MARK_HELD: tally.c alone writes those.) */
bool tally_mark_change(struct seg_slot *sl, uint32_t gen, uint64_t need, uint64_t deny,
    uint64_t clr, uint64_t set);
/* One attempt to take permit kind p for slot (of generation gen): one
 * tagged compare-and-swap of its tally. TAKE_OK, TAKE_FULL (*seen: the
 * count at the limit) or TAKE_BUSY (the slot holds one, or a kind of
 * `deny`, a MARK_HELD mask, or it is released). */
int tally_take(struct seg *s, uint32_t slot, uint32_t gen, int p, uint64_t deny, uint32_t *seen);
/* tally_take past the limit (a guarantee lowered live, share.c). */
int tally_take_past(struct seg *s, uint32_t slot, uint32_t gen, int p);
/* tally_take and tally_give of P_INFLIGHT for a slot of compartment c,
 * which the caller read after the slot's mark m (so a slot reused meanwhile
 * fails on its generation). */
int tally_take_inflight(struct seg *s, uint32_t slot, uint64_t m, struct seg_comp *c,
    uint32_t *seen);
bool tally_give_inflight(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c);
/* tally_take of P_CONN for a slot of compartment c (the caller read the
 * slot's compartment: c is the one it names), and of P_LENT for a slot of
 * a compartment in pool: inlined into admission (BS_LTO_INLINE; GCC warns
 * that a body it cannot see in this file might not be inlinable, and LTO
 * inlines it). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
BS_LTO_INLINE int tally_take_conn(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c,
    uint32_t *seen, uint32_t *took);
BS_LTO_INLINE int tally_take_lent(struct seg *s, uint32_t slot, uint32_t gen,
    struct seg_pool *pool, uint32_t *seen);
#pragma GCC diagnostic pop
/* Takes back the take that tally value w of count stands for, if the
 * tally still reads w (tally_take_own's, landed after its slot's release). */
void tally_undo(_Atomic uint32_t *count, uint64_t w);
/* A waiter of c's in-flight count wakes (tally_give_inflight_own's). */
void tally_wake_inflight(struct seg_comp *c);

/* The tag bits that name slot (of generation gen): index and generation. */
static inline __attribute__((always_inline)) uint32_t
tag_who(uint32_t slot, uint32_t gen)
{
	return (slot + 1) | (gen & TAG_GEN_MASK) << TAG_GEN_SHIFT;
}

static inline __attribute__((always_inline)) bool
tag_names(const struct seg *s, uint32_t tag, uint32_t who)
{
	return (tag & s->tag_wmask) == who;
}

static inline __attribute__((always_inline)) bool
tag_give(uint32_t tag)
{
	return (tag & TAG_GIVE) != 0;
}

/* The stamp of an operation on a tally whose tag names the slot already
 * (own: the last stamp counted up) or another slot (from the slot's mark
 * sequence, in the upper half of the stamp). */
static inline __attribute__((always_inline)) uint32_t
stamp_own(const struct seg *s, uint32_t tag)
{
	return ((tag & s->tag_smask) + s->tag_one) & s->tag_smask;
}

/* The stamp of an operation on a tally whose tag names another slot, or
 * none: from the slot's mark sequence m, in the upper half of the stamp. */
static inline __attribute__((always_inline)) uint32_t
stamp_new(const struct seg *s, uint64_t m)
{
	return (MARK_SEQ_OF(m) << s->tag_sshift) & s->tag_smask;
}

/* The compare-and-swap of slot's take, tag `tag`, from tally value w
 * (whose tag and count the caller checked: the fast paths below), and the
 * check after it: TAKE_OK (*seen, unless NULL: the count before),
 * TAKE_BUSY (released meanwhile: undone), or TAKE_MISS (the tally moved:
 * nothing done). */
static inline __attribute__((always_inline)) int
take_swap(struct seg *s, uint32_t slot, uint32_t gen, uint32_t tag, _Atomic uint32_t *count,
    uint64_t w, uint32_t *seen)
{
	_Atomic uint64_t *t = (_Atomic uint64_t *)(uintptr_t)count;
	uint64_t nw = (uint64_t)tag << 32 | ((uint32_t)w + 1), m;

	if (!atomic_compare_exchange_strong(t, &w, nw))
		return TAKE_MISS;
	if (seen != NULL)
		*seen = (uint32_t)w;
	m = atomic_load(&s->slots[slot].mark);
	if (__builtin_expect(MARK_GEN(m) != gen || (m & MARK_RELEASED), 0)) {
		tally_undo(count, nw);
		return TAKE_BUSY;
	}
	return TAKE_OK;
}

/* A take's fast path for a tally whose tag is 0 (a release untagged it:
 * nobody to reflect), below lim: take_loop's own steps for that case, with
 * nothing else live. TAKE_OK (*took: the tag it wrote), TAKE_BUSY
 * (released meanwhile: undone), or TAKE_MISS (not that case, nothing
 * done). */
static inline __attribute__((always_inline)) int
tally_take_clear(struct seg *s, uint32_t slot, uint32_t gen, int p, _Atomic uint32_t *count,
    uint32_t lim, uint32_t *seen, uint32_t *took)
{
	uint64_t w = atomic_load((_Atomic uint64_t *)(uintptr_t)count), m;

	/* Untagged and below lim, in one comparison: a tag makes w >= 2^32. */
	if (__builtin_expect(w >= lim, 0))
		return TAKE_MISS;
	m = atomic_load(&s->slots[slot].mark);
	if (MARK_GEN(m) != gen || (m & (MARK_RELEASED | MARK_HELD(p))))
		return TAKE_MISS;
	*took = tag_who(slot, gen) | stamp_new(s, m);
	return take_swap(s, slot, gen, *took, count, w, seen);
}

/* A take's fast path (tally.c's take_loop starts with it): the tally's tag
 * is the slot's own give (nobody to reflect), its mark m0 says it is not
 * released, and the count is below lim. TAKE_OK, TAKE_BUSY (released
 * meanwhile: undone), or TAKE_MISS (not that case, nothing done). */
static inline __attribute__((always_inline)) int
tally_take_own(struct seg *s, uint32_t slot, uint64_t m0, _Atomic uint32_t *count, uint32_t lim,
    uint32_t *seen)
{
	uint32_t gen = MARK_GEN(m0), who = tag_who(slot, gen), tag;
	uint64_t w = atomic_load((_Atomic uint64_t *)(uintptr_t)count);

	tag = (uint32_t)(w >> 32);
	if (__builtin_expect(tag_names(s, tag, who) && tag_give(tag) && !(m0 & MARK_RELEASED) &&
	    (uint32_t)w < lim, 1))
		return take_swap(s, slot, gen, who | stamp_own(s, tag), count, w, seen);
	return TAKE_MISS;
}

/* The in-flight take's fast path, for a caller that found c's adaptive
 * limit off (permit_request_quick): the static limit is the limit. */
static inline __attribute__((always_inline)) int
tally_take_inflight_own(struct seg *s, uint32_t slot, uint64_t m0, struct seg_comp *c,
    uint32_t *seen)
{
	return tally_take_own(s, slot, m0, &c->inflight, atomic_load(&c->inflight_limit), seen);
}

/* A give's fast path (tally.c's give_loop starts with it): the tally's tag
 * is the slot's own take, so the slot holds the permit and nobody needs a
 * reflection. The tally's new value if it gave (never 0: the caller wakes
 * waiters), 0 if not that case (nothing done). */
static inline __attribute__((always_inline)) uint64_t
tally_give_own(struct seg *s, uint32_t slot, uint32_t gen, _Atomic uint32_t *count)
{
	_Atomic uint64_t *t = (_Atomic uint64_t *)(uintptr_t)count;
	uint32_t who = tag_who(slot, gen), tag, cur;
	uint64_t w = atomic_load(t), nw;

	tag = (uint32_t)(w >> 32);
	cur = (uint32_t)w;
	if (!__builtin_expect(cur != 0 && tag_names(s, tag, who) && !tag_give(tag), 1))
		return 0;
	nw = (uint64_t)(who | TAG_GIVE | stamp_own(s, tag)) << 32 | (cur - 1);
	return atomic_compare_exchange_strong(t, &w, nw) ? nw : 0;
}

static inline __attribute__((always_inline)) bool
tally_give_inflight_own(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c)
{
	if (!tally_give_own(s, slot, gen, &c->inflight))
		return false;
	if (atomic_load(&c->waiting) > 0)
		tally_wake_inflight(c);
	return true;
}

/* Gives back permit kind p of slot if it holds it; true if it did. */
bool tally_give(struct seg *s, uint32_t slot, uint32_t gen, int p);
/* The release of slot (claimed SLOT_RELEASING by the caller), of
 * compartment c in pool (the caller's reads of the slot's and c's; NULL:
 * none): gives back every permit it holds and marks it MARK_RELEASED.
 * Returns what it held (MARK_HELD flags). */
uint64_t tally_release(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c,
    struct seg_pool *pool);
/* The slot (of generation gen, holding nothing) moves to the next
 * generation: a take of the old one still counted is undone as if the
 * slot were released. For a pending slot whose admission was refused. */
void tally_renew(struct seg *s, uint32_t slot, uint32_t gen);
/* Sets the segment's tag fields (segment.c, after mapping it). */
void tally_format(struct seg *s);
/* Undoes every take of a released slot still counted (its taker died
 * before it could see the release): run when a process is found dead or
 * has exec'd. */
void tally_sweep(struct seg *s);

#endif

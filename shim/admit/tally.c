/* tally.c - permit counts that a thread killed at any instruction cannot leave wrong. */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "admit/tally.h"
#include "log.h"
#include "sys.h"

/*
 * A thread can die between changing a counter and writing down, in its
 * slot, that it did: SIGKILL, or another thread's exec, can strike at any
 * instruction. So every counter that stands for permits held by slots is a
 * tally: the 32-bit count and, in the word after it, a tag naming the last
 * slot operation that changed it (slot index + 1, whether it added or took
 * away, 4 bits of the slot's generation and a stamp). One 64-bit
 * compare-and-swap changes both: that one step is the whole of a take or a
 * give. The tag is the announcement.
 *
 * Whether slot S holds permit kind P (tally_held) is read from P's tally
 * first: while its tag names S, the tag says (a take: held). Otherwise S's
 * mark says (MARK_HELD(P)). The mark is kept right by whoever moves the
 * tally away from a tag naming another slot X: before its compare-and-swap
 * it "reflects" the tag into X's mark (MARK_HELD(P) set for a take,
 * cleared for a give), always writing and moving the mark's sequence on.
 * A slot changing a tally whose tag names itself writes no mark: the tag
 * overrides the mark until someone else moves it, and that someone
 * reflects it first. A thread killed right after its compare-and-swap has
 * done its whole operation; the next changer of the tally writes it down.
 *
 * A stale reflection (a thread that read X's mark and checked the tally,
 * then was preempted) can only succeed its compare-and-swap of the mark if
 * nothing wrote the mark since; any later move of the tally away from X
 * wrote it first, so the stale write fails. This needs the tally's value
 * never to come back to one it had while such a thread waits (ABA): the
 * stamp makes each of X's operations on a tally a different value. An
 * operation of X on its own tag counts the previous stamp up; one on a
 * foreign tag starts from X's mark sequence, which every reflection of X
 * (every foreign move away from X) has moved on since X's last operation.
 * What never comes back is the tag; the count of a joint tally (kjoint.c)
 * may: a kernel engine's program moves it alone, under the tag, and back.
 * So whether the tally is still at an operation is read from its tag
 * (reflect, undo), never from the whole value.
 *
 * A release (tally_release) gives back every kind the slot holds, then
 * marks it MARK_RELEASED with one compare-and-swap that fails if anything
 * was reflected into the mark meanwhile. A take checks the mark before
 * its compare-and-swap and again after it: a take that lands after the
 * release (another thread's close of the same socket) sees MARK_RELEASED
 * and undoes itself. Killed before it could look, it is undone by the
 * next changer of the tally, whose reflection finds X released (or of
 * another generation, or no longer counted in this tally), or by the sweep
 * that runs when its process is found dead or has exec'd (tally_sweep).
 * Every taker reflects before comparing the count with the limit, so
 * such a take never makes anyone else refused.
 *
 * Once its release is marked, the slot's gives have nothing left to
 * announce: the release sets the tag of each tally it gave to (connection
 * and pool) to 0 if the tally still holds the value its give wrote
 * (untag). The next taker then finds no one to reflect: an admission's
 * take of an untagged tally is its check of the mark, its compare-and-swap
 * and the check after it (tally_take_clear, tally.h), and a pool's take
 * that follows the compartment's (pool_take) reuses that take's check and
 * its tag: the slot has made no earlier change of the pool's tally in its
 * generation, so no stale reflection can mistake the new value for one.
 */

/* Wakes one waiter of a count (a connection or in-flight tally). */
static void
futex_wake(_Atomic uint32_t *word)
{
	sys_futex_wake(word, 1);
}

/* A pool permit went back to lent, the pool's tally of them: wakes the
 * pool's waiters, if any (they wait on lent for any compartment of the
 * pool, so all of them). Inline: every borrowed permit's release asks it,
 * and the tally it gave to is the pool, without a lookup. */
static inline void
pool_wake(_Atomic uint32_t *lent)
{
	struct seg_pool *pool = (struct seg_pool *)((uintptr_t)lent -
	    offsetof(struct seg_pool, lent));

	if (atomic_load_explicit(&pool->sleepers, memory_order_relaxed) > 0)
		sys_futex_wake(lent, INT_MAX);
}

static _Atomic uint64_t *
tally(_Atomic uint32_t *count)
{
	/* The count and its tag word are 8-byte aligned neighbours. */
	return (_Atomic uint64_t *)(uintptr_t)count;
}

/*
 * The steps below are inlined into tally_take and tally_give, which keep a
 * copy specialised for the kinds taken and given most (P_CONN at every
 * connect and close, P_INFLIGHT at every request of a compartment with
 * max_inflight): their masks are constants and count_in's switch is gone.
 */

/* The counter that permit kind p of slot sl is counted in, and its limit
 * (NULL: none). NULL if the slot names no such counter. */
static inline __attribute__((always_inline)) _Atomic uint32_t *
count_in(const struct seg *s, struct seg_comp *c, const struct seg_slot *sl, int p,
    _Atomic uint32_t **limit)
{
	struct seg_pool *pool;
	uint32_t k;

	if (limit != NULL)
		*limit = NULL;
	if (c == NULL)
		return NULL;
	switch (p) {
	case P_CONN:
		if (limit != NULL)
			*limit = &c->limit;
		return &c->in_use;
	case P_CLASS:
		k = atomic_load(&sl->cls);
		if (k >= BS_MAX_CLASSES)
			return NULL;
		if (limit != NULL)
			*limit = &c->cls[k].limit;
		return &c->cls[k].in_use;
	case P_OVER:
		return &c->over;
	case P_INFLIGHT:
		if (limit != NULL)
			*limit = &c->inflight_limit;
		return &c->inflight;
	case P_INFLIGHT_OVER:
		return &c->inflight_over;
	case P_CLENT:
		if (limit != NULL)
			*limit = &c->cls_shared;
		return &c->cls_lent;
	case P_KERN:
		/* The joint count in a kernel engine's map (kjoint.c), held to
		 * the compartment's limit. */
		if (limit != NULL)
			*limit = &c->limit;
		return kjoint_of(s, c);
	case P_LENT:
		/* The pool's lent count, its limit the shared part. */
		if ((pool = seg_pool_at(s, c)) == NULL)
			return NULL;
		if (limit != NULL)
			*limit = &pool->shared;
		return &pool->lent;
	}
	return NULL;
}

/* The same for slot sl of whichever compartment it names. */
static inline __attribute__((always_inline)) _Atomic uint32_t *
count_of(const struct seg *s, const struct seg_slot *sl, int p, _Atomic uint32_t **limit)
{
	return count_in(s, seg_slot_comp(s, sl), sl, p, limit);
}

_Atomic uint32_t *
tally_of(const struct seg *s, struct seg_comp *c, const struct seg_slot *sl, int p,
    _Atomic uint32_t **limit)
{
	return count_in(s, c, sl, p, limit);
}

/* Changes slot's mark while it is of generation gen, has every flag of
 * `need` and none of `deny`: clears `clr`, sets `set`. False if it cannot. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
BS_LTO_INLINE bool
tally_mark_change(struct seg_slot *sl, uint32_t gen, uint64_t need, uint64_t deny, uint64_t clr,
    uint64_t set)
{
	uint64_t m = atomic_load(&sl->mark);

	do {
		if (MARK_GEN(m) != gen || (m & need) != need || (m & deny) != 0)
			return false;
	} while (!atomic_compare_exchange_weak(&sl->mark, &m, (m & ~clr) | set));
	return true;
}
#pragma GCC diagnostic pop


static inline __attribute__((always_inline)) uint64_t
seq_next(uint64_t m)
{
	return (m & ~MARK_SEQ) | ((m + MARK_SEQ_ONE) & MARK_SEQ);
}

/* Tally value w names an operation of slot sl whose socket is gone: sl
 * released, of another generation, or no longer counted in tally t for
 * kind p (m: sl's mark, read before). */
static inline __attribute__((always_inline)) bool
gone(const struct seg *s, const struct seg_slot *sl, uint64_t m, uint32_t tag, int p,
    _Atomic uint64_t *t)
{
	return ((MARK_GEN(m) ^ tag >> TAG_GEN_SHIFT) & TAG_GEN_MASK) != 0 ||
	    (m & MARK_RELEASED) != 0 || tally(count_of(s, sl, p, NULL)) != t;
}

/* Takes back the take that tally value w stands for, if its tag is still
 * w's (else whoever moved it did). The tag alone says: a kernel engine's
 * program moves the count of a joint tally (kjoint.c) under it. */
static void
undo(_Atomic uint64_t *t, uint64_t w)
{
	uint32_t tag = (uint32_t)(w >> 32), cur;

	do {
		cur = (uint32_t)w;
		if (atomic_compare_exchange_weak(t, &w, cur > 0 ? cur - 1 : 0)) {
			futex_wake((_Atomic uint32_t *)(uintptr_t)t);
			return;
		}
	} while ((uint32_t)(w >> 32) == tag);
}

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
		undo(tally(count), nw);
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

/* A take's fast path (take_loop starts with it): the tally's tag
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

/* A give's fast path (give_loop starts with it): the tally's tag
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

/*
 * Writes the operation that tally value w names (of a slot other than the
 * caller's) into that slot's mark, or undoes it if it is a take of a slot
 * whose socket is gone. Anyone about to move the tally away from w calls
 * this first. Always writes (the sequence moves on) while the tally's tag
 * is w's: see the top of this file. The tag, not the whole value: the
 * program of a kernel engine moves a joint tally's count alone, and can
 * move it back before the caller's compare-and-swap, which would then
 * move the tally away from w with w's operation never written down (a
 * take: a permit never given back; a give: a release that gives twice).
 */
static inline __attribute__((always_inline)) void
reflect(const struct seg *s, _Atomic uint64_t *t, uint64_t w, int p)
{
	uint32_t tag = (uint32_t)(w >> 32), i = tag & s->tag_imask;
	uint64_t held = tag_give(tag) ? 0 : MARK_HELD(p), m;
	struct seg_slot *sl;

	if (i == 0 || i > s->nslots)
		return;
	sl = &s->slots[i - 1];
	m = atomic_load(&sl->mark);
	for (;;) {
		if (gone(s, sl, m, tag, p, t)) {
			if (held)
				undo(t, w);
			return;
		}
		if ((uint32_t)(atomic_load(t) >> 32) != tag)
			return;
		if (atomic_compare_exchange_weak(&sl->mark, &m,
		    seq_next((m & ~MARK_HELD(p)) | held)))
			return;
	}
}

/* Whether slot (generation gen) holds kind p counted in count. */
static inline __attribute__((always_inline)) bool
held_at(const struct seg *s, uint32_t slot, uint32_t gen, int p, _Atomic uint32_t *count)
{
	uint32_t tag;
	uint64_t w, m;

	if (count == NULL)
		return false;
	w = atomic_load(tally(count));
	tag = (uint32_t)(w >> 32);
	if (tag_names(s, tag, tag_who(slot, gen)))
		return !tag_give(tag);
	m = atomic_load(&s->slots[slot].mark);
	return MARK_GEN(m) == gen && !(m & MARK_RELEASED) && (m & MARK_HELD(p));
}

bool
tally_held(const struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen, int p)
{
	if (slot >= s->nslots)
		return false;
	return held_at(s, slot, gen, p, count_in(s, c, &s->slots[slot], p, NULL));
}

bool
tally_held_at(const struct seg *s, uint32_t slot, uint32_t gen, int p, _Atomic uint32_t *count)
{
	return held_at(s, slot, gen, p, count);
}

/*
 * take_loop: one attempt to take permit kind p for slot (of generation gen), counted in
 * count under *limit (NULL: none, or `past`: ignored; NULL count: nothing to
 * take). TAKE_OK, TAKE_FULL (*seen: the count that was at the limit), or
 * TAKE_BUSY: the slot already holds a permit of that kind, or is released.
 */
static inline __attribute__((always_inline)) int
take_loop(struct seg *s, uint32_t slot, uint32_t gen, const uint64_t *m0, int p,
    _Atomic uint32_t *count, _Atomic uint32_t *limit, uint32_t *seen, uint32_t *took)
{
	struct seg_slot *sl = &s->slots[slot];
	uint32_t who = tag_who(slot, gen), tag, stamp, cur;
	_Atomic uint64_t *t;
	uint64_t w, m, nw;

	*seen = 0;
	if (count == NULL)
		return TAKE_BUSY;
	t = tally(count);
	w = atomic_load(t);
	for (;;) {
		tag = (uint32_t)(w >> 32);
		if (tag_names(s, tag, who)) {
			/* Our own last operation: held if it was a take. The
			 * mark the caller read will do for the release (the
			 * check after the compare-and-swap is the one that
			 * counts). */
			if (!tag_give(tag))
				return TAKE_BUSY;
			m = m0 != NULL ? *m0 : atomic_load(&sl->mark);
			if (MARK_GEN(m) != gen || (m & MARK_RELEASED))
				return TAKE_BUSY;
			stamp = stamp_own(s, tag);
		} else {
			/* Our mark is right while the tag names someone
			 * else; theirs is written down before we move it. */
			m = atomic_load(&sl->mark);
			if (MARK_GEN(m) != gen || (m & (MARK_RELEASED | MARK_HELD(p))))
				return TAKE_BUSY;
			if (tag != 0)
				reflect(s, t, w, p);
			stamp = stamp_new(s, m);
		}
		cur = (uint32_t)w;
		*seen = cur;
		if (limit != NULL ? cur >= limit_now(limit, p) : cur == UINT32_MAX)
			return TAKE_FULL;
		nw = (uint64_t)(who | stamp) << 32 | (cur + 1);
		if (atomic_compare_exchange_weak(t, &w, nw))
			break;
	}
	/* Released meanwhile (a close of the same socket in another thread,
	 * or a stall long enough to be taken for dead): the release may have
	 * looked before we counted, so we undo it ourselves. */
	m = atomic_load(&sl->mark);
	if (__builtin_expect(MARK_GEN(m) != gen || (m & MARK_RELEASED), 0)) {
		undo(t, nw);
		return TAKE_BUSY;
	}
	if (took != NULL)
		*took = (uint32_t)(nw >> 32);
	return TAKE_OK;
}

static __attribute__((noinline)) int
take_slow_inflight(struct seg *s, uint32_t slot, uint32_t gen, const uint64_t *m0,
    _Atomic uint32_t *count, _Atomic uint32_t *limit, uint32_t *seen)
{
	return take_loop(s, slot, gen, m0, P_INFLIGHT, count, limit, seen, NULL);
}

static __attribute__((noinline)) int
take_slow(struct seg *s, uint32_t slot, uint32_t gen, const uint64_t *m0, int p,
    _Atomic uint32_t *count, _Atomic uint32_t *limit, uint32_t *seen)
{
	return take_loop(s, slot, gen, m0, p, count, limit, seen, NULL);
}

/* take_loop's fast path (tally_take_own in tally.h) under the limit of
 * kind p. */
static inline __attribute__((always_inline)) int
take_own(struct seg *s, uint32_t slot, uint32_t gen, uint64_t m0, int p,
    _Atomic uint32_t *count, _Atomic uint32_t *limit, uint32_t *seen)
{
	if (MARK_GEN(m0) != gen)
		return TAKE_MISS;
	return tally_take_own(s, slot, m0, count, limit_now(limit, p), seen);
}

/* take_own inline, the rest out of line. */
static inline __attribute__((always_inline)) int
take_at(struct seg *s, uint32_t slot, uint32_t gen, const uint64_t *m0, int p,
    _Atomic uint32_t *count, _Atomic uint32_t *limit, uint32_t *seen)
{
	int r;

	if (m0 != NULL && count != NULL && limit != NULL) {
		r = take_own(s, slot, gen, *m0, p, count, limit, seen);
		if (__builtin_expect(r != TAKE_MISS, 1))
			return r;
	}
	/* Without the caller's mark (connects: the tag is another slot's
	 * almost always), the whole of it inline. */
	if (m0 == NULL)
		return take_loop(s, slot, gen, m0, p, count, limit, seen, NULL);
	if (p == P_INFLIGHT)
		return take_slow_inflight(s, slot, gen, m0, count, limit, seen);
	return take_slow(s, slot, gen, m0, p, count, limit, seen);
}

static inline __attribute__((always_inline)) int
take(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen, int p, uint64_t deny,
    uint32_t *seen)
{
	_Atomic uint32_t *limit, *count = count_in(s, c, &s->slots[slot], p, &limit);

	for (uint64_t d = deny; d != 0; d &= d - 1) {
		if (tally_held(s, c, slot, gen, __builtin_ctzll(d)))
			return TAKE_BUSY;
	}
	return take_at(s, slot, gen, NULL, p, count, limit, seen);
}

/* Every connect's kind gets a copy of its own (constant masks); a limited
 * request has tally_take_inflight. */
int
tally_take(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen, int p, uint64_t deny,
    uint32_t *seen)
{
	if (p == P_CONN)
		return take(s, c, slot, gen, P_CONN, deny, seen);
	return take(s, c, slot, gen, p, deny, seen);
}

int
tally_take_past(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen, int p)
{
	uint32_t seen;

	return take_at(s, slot, gen, NULL, p, count_in(s, c, &s->slots[slot], p, NULL), NULL,
	    &seen);
}

int
tally_take_inflight(struct seg *s, uint32_t slot, uint64_t m, struct seg_comp *c,
    uint32_t *seen)
{
	return take_at(s, slot, MARK_GEN(m), &m, P_INFLIGHT, &c->inflight, &c->inflight_limit, seen);
}

/* Inlined into admission under LTO (tally.h). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
BS_LTO_INLINE int
tally_take_conn(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c, uint32_t *seen,
    uint32_t *took)
{
	int r = tally_take_clear(s, slot, gen, P_CONN, &c->in_use, limit_now(&c->limit, P_CONN),
	    seen, took);

	if (__builtin_expect(r != TAKE_MISS, 1))
		return r;
	return take_loop(s, slot, gen, NULL, P_CONN, &c->in_use, &c->limit, seen, took);
}

BS_LTO_INLINE int
tally_take_lent(struct seg *s, uint32_t slot, uint32_t gen, struct seg_pool *pool, uint32_t took,
    uint32_t *seen)
{
	if (took != 0) {
		/* Right after the compartment's take (tag `took`), which
		 * found the slot of its generation, not released, after its
		 * compare-and-swap: the check after this one covers what came
		 * since, and the slot holds no lent permit (this step alone
		 * takes one, once an admission). Untagged and below the
		 * shared part (one comparison, as in tally_take_clear), the
		 * tally takes that compare-and-swap alone, with the same tag:
		 * the slot has made no earlier change of this tally to tell
		 * it from. */
		uint64_t w = atomic_load(tally(&pool->lent));
		int r = TAKE_MISS;

		if (__builtin_expect(w < atomic_load(&pool->shared), 1))
			r = take_swap(s, slot, gen, took, &pool->lent, w, NULL);
		if (r != TAKE_MISS)
			return r;
	}
	return take_at(s, slot, gen, NULL, P_LENT, &pool->lent, &pool->shared, seen);
}

BS_LTO_INLINE int
tally_take_inflight_quick(struct seg *s, uint32_t slot, uint64_t m0, struct seg_comp *c,
    uint32_t *seen)
{
	return tally_take_own(s, slot, m0, &c->inflight, atomic_load(&c->inflight_limit), seen);
}

BS_LTO_INLINE bool
tally_give_inflight_quick(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c)
{
	if (!tally_give_own(s, slot, gen, &c->inflight))
		return false;
	if (atomic_load(&c->waiting) > 0)
		futex_wake(&c->inflight);
	return true;
}
#pragma GCC diagnostic pop

/* Gives back permit kind p of slot, counted in count of compartment c, if
 * the slot holds it: one tagged compare-and-swap, then a waiter of c wakes.
 * The tally's new value if it did (never 0), else 0. give_at is its fast
 * path inline (the slot's own take is the tag: nobody to reflect),
 * give_loop the whole of it. */
static inline __attribute__((always_inline)) uint64_t
give_loop(struct seg *s, uint32_t slot, uint32_t gen, int p, struct seg_comp *c,
    _Atomic uint32_t *count)
{
	struct seg_slot *sl = &s->slots[slot];
	uint32_t who = tag_who(slot, gen), tag, stamp, cur;
	_Atomic uint64_t *t;
	uint64_t w, m, nw;

	if (count == NULL)
		return 0;
	t = tally(count);
	w = atomic_load(t);
	for (;;) {
		/* A count of 0 has no holder (a release looks at every kind). */
		if ((uint32_t)w == 0)
			return 0;
		tag = (uint32_t)(w >> 32);
		if (tag_names(s, tag, who)) {
			if (tag_give(tag))
				return 0;
			stamp = stamp_own(s, tag);
		} else {
			m = atomic_load(&sl->mark);
			if (MARK_GEN(m) != gen || (m & MARK_RELEASED) || !(m & MARK_HELD(p)))
				return 0;
			if (tag != 0)
				reflect(s, t, w, p);
			stamp = stamp_new(s, m);
		}
		cur = (uint32_t)w;
		nw = (uint64_t)(who | TAG_GIVE | stamp) << 32 | (cur > 0 ? cur - 1 : 0);
		if (atomic_compare_exchange_weak(t, &w, nw))
			break;
	}
	if ((p == P_CONN || p == P_INFLIGHT) && c != NULL && atomic_load(&c->waiting) > 0)
		futex_wake(count);
	if (p == P_LENT)
		pool_wake(count);
	return nw;
}

static __attribute__((noinline)) uint64_t
give_slow_inflight(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c,
    _Atomic uint32_t *count)
{
	return give_loop(s, slot, gen, P_INFLIGHT, c, count);
}

static __attribute__((noinline)) uint64_t
give_slow_conn(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c,
    _Atomic uint32_t *count)
{
	return give_loop(s, slot, gen, P_CONN, c, count);
}

static __attribute__((noinline)) uint64_t
give_slow(struct seg *s, uint32_t slot, uint32_t gen, int p, struct seg_comp *c,
    _Atomic uint32_t *count)
{
	return give_loop(s, slot, gen, p, c, count);
}

/* give_loop's fast path: the tally's tag is the slot's own take (nobody to
 * reflect). The tally's new value if it gave; 0 if not that case (nothing
 * done). */
static inline __attribute__((always_inline)) uint64_t
give_own(struct seg *s, uint32_t slot, uint32_t gen, int p, struct seg_comp *c,
    _Atomic uint32_t *count)
{
	uint64_t nw = tally_give_own(s, slot, gen, count);

	if (nw == 0)
		return 0;
	if ((p == P_CONN || p == P_INFLIGHT) && c != NULL && atomic_load(&c->waiting) > 0)
		futex_wake(count);
	if (p == P_LENT)
		pool_wake(count);
	return nw;
}

/* give_own inline, the rest out of line. */
static inline __attribute__((always_inline)) uint64_t
give_at(struct seg *s, uint32_t slot, uint32_t gen, int p, struct seg_comp *c,
    _Atomic uint32_t *count)
{
	uint64_t nw;

	if (count != NULL && (nw = give_own(s, slot, gen, p, c, count)) != 0)
		return nw;
	if (p == P_INFLIGHT)
		return give_slow_inflight(s, slot, gen, c, count);
	if (p == P_CONN)
		return give_slow_conn(s, slot, gen, c, count);
	return give_slow(s, slot, gen, p, c, count);
}

static inline __attribute__((always_inline)) bool
give(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen, int p)
{
	return give_at(s, slot, gen, p, c, count_in(s, c, &s->slots[slot], p, NULL)) != 0;
}

bool
tally_give(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen, int p)
{
	if (p == P_CONN)
		return give(s, c, slot, gen, P_CONN);
	return give(s, c, slot, gen, p);
}

bool
tally_give_inflight(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c)
{
	return give_at(s, slot, gen, P_INFLIGHT, c, &c->inflight) != 0;
}

/* tally_release's give of a kind other than P_CONN. */
static __attribute__((noinline)) uint64_t
give_kind(struct seg *s, uint32_t slot, uint32_t gen, int p, struct seg_comp *c,
    _Atomic uint32_t *count)
{
	return give_loop(s, slot, gen, p, c, count) != 0 ? MARK_HELD(p) : 0;
}

/* The same, one load when nobody holds the kind. (A borrowed permit,
 * P_LENT, is given back by tally_release itself: give_at's fast path
 * inline, as the slot whose take its tally's tag names is most often the
 * one to give it.) */
static inline __attribute__((always_inline)) uint64_t
release_kind(struct seg *s, uint32_t slot, uint32_t gen, int p, struct seg_comp *c,
    _Atomic uint32_t *count)
{
	if (count == NULL || atomic_load_explicit(count, memory_order_relaxed) == 0)
		return 0;
	return give_kind(s, slot, gen, p, c, count);
}

/*
 * Clears the tag of tally count if the count still reads w, the give of a
 * slot now released: its mark says it holds nothing, so the tag announces
 * nothing, and the next taker need not reflect it. w cannot come back once
 * moved (that slot gives nothing more). A tag of 0 is never reflected, so a
 * taker that read the count with tag 0 before other operations and finds it
 * so again after them (ABA) has missed no announcement: what it read is
 * what the count is.
 */
static inline __attribute__((always_inline)) void
untag(_Atomic uint32_t *count, uint64_t w)
{
	atomic_compare_exchange_strong(tally(count), &w, (uint32_t)w);
}

/* tally_release's loop, from what a first pass already gave back (had,
 * and the connection and pool tallies' values after their gives, conn and
 * lw). */
static __attribute__((noinline)) uint64_t
release_all(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c, struct seg_pool *pool,
    uint64_t had, uint64_t conn, uint64_t lw)
{
	struct seg_slot *sl = &s->slots[slot];
	_Atomic uint32_t *cls = c != NULL ? count_in(s, c, sl, P_CLASS, NULL) : NULL;
	_Atomic uint32_t *lent = c != NULL && pool != NULL ? &pool->lent : NULL;
	uint64_t w;

	for (;;) {
		uint64_t m = atomic_load(&sl->mark);

		if (MARK_GEN(m) != gen || (m & MARK_RELEASED))
			return had;
		/* Last kind first: a pool's permit goes back before the
		 * compartment's, so that a compartment never counts fewer
		 * permits than its guarantee holds. A give finds for itself
		 * whether the slot holds the kind. */
		if (c != NULL) {
			if (lent != NULL && atomic_load_explicit(lent, memory_order_relaxed) != 0 &&
			    (w = give_at(s, slot, gen, P_LENT, c, lent)) != 0) {
				had |= MARK_HELD(P_LENT);
				lw = w;
			}
			if (atomic_load_explicit(&c->kernel, memory_order_relaxed) != 0)
				had |= release_kind(s, slot, gen, P_KERN, c, kjoint_of(s, c));
			had |= release_kind(s, slot, gen, P_CLENT, c, &c->cls_lent);
			had |= release_kind(s, slot, gen, P_INFLIGHT_OVER, c, &c->inflight_over);
			had |= release_kind(s, slot, gen, P_INFLIGHT, c, &c->inflight);
			had |= release_kind(s, slot, gen, P_OVER, c, &c->over);
			had |= release_kind(s, slot, gen, P_CLASS, c, cls);
			if ((w = give_at(s, slot, gen, P_CONN, c, &c->in_use)) != 0) {
				had |= MARK_HELD(P_CONN);
				conn = w;
			}
		}
		/* Nothing is held now, unless a take of the slot's own lands
		 * after its give here (it will see MARK_RELEASED and undo
		 * itself). The compare-and-swap fails if a reflection wrote
		 * the mark since we read it: then we look again. */
		if (atomic_compare_exchange_strong(&sl->mark, &m,
		    seq_next((m & ~MARK_HELD_ALL) | MARK_RELEASED)))
			break;
	}
	if (conn != 0)
		untag(&c->in_use, conn);
	if (lw != 0)
		untag(lent, lw);
	return had;
}

/*
 * The common release is one pass of release_all, inline: a slot that took
 * no class permit (so none of a class's share either), while nobody holds
 * a request in flight or a permit let past a limit in observe mode (their
 * counts read 0, so the slot holds none of them) and no kernel engine
 * shares the compartment's count, gives back its pool's
 * permit if it borrowed one, then its connection permit, and is marked
 * released. Anything else, or a mark that moved meanwhile (a reflection),
 * is release_all's, from what was given back here.
 */
uint64_t
tally_release(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c,
    struct seg_pool *pool)
{
	struct seg_slot *sl = &s->slots[slot];
	uint64_t m, w, lw = 0, had = 0;

	if (c == NULL || atomic_load_explicit(&sl->cls, memory_order_relaxed) < BS_MAX_CLASSES ||
	    (atomic_load_explicit(&c->inflight, memory_order_relaxed) |
	    atomic_load_explicit(&c->over, memory_order_relaxed) |
	    atomic_load_explicit(&c->inflight_over, memory_order_relaxed) |
	    atomic_load_explicit(&c->cls_lent, memory_order_relaxed) |
	    atomic_load_explicit(&c->kernel, memory_order_relaxed)) != 0)
		return release_all(s, slot, gen, c, pool, 0, 0, 0);
	m = atomic_load(&sl->mark);
	if (MARK_GEN(m) != gen || (m & MARK_RELEASED))
		return 0;
	if (pool != NULL && atomic_load_explicit(&pool->lent, memory_order_relaxed) != 0 &&
	    (lw = give_at(s, slot, gen, P_LENT, c, &pool->lent)) != 0)
		had = MARK_HELD(P_LENT);
	w = give_at(s, slot, gen, P_CONN, c, &c->in_use);
	if (w != 0)
		had |= MARK_HELD(P_CONN);
	if (!atomic_compare_exchange_strong(&sl->mark, &m,
	    seq_next((m & ~MARK_HELD_ALL) | MARK_RELEASED)))
		return release_all(s, slot, gen, c, pool, had, w, lw);
	if (w != 0)
		untag(&c->in_use, w);
	if (lw != 0)
		untag(&pool->lent, lw);
	return had;
}

void
tally_renew(struct seg *s, uint32_t slot, uint32_t gen)
{
	_Atomic uint64_t *mark = &s->slots[slot].mark;
	uint64_t m = atomic_load(mark);

	do {
		if (MARK_GEN(m) != gen)
			return;
	} while (!atomic_compare_exchange_weak(mark, &m, MARK_OF_GEN(gen + 1) |
	    (m & MARK_WAITING) | (seq_next(m) & MARK_SEQ)));
}

/* Undoes the take tally count (of kind p) names if its slot is gone. */
static void
sweep_one(const struct seg *s, _Atomic uint32_t *count, int p)
{
	_Atomic uint64_t *t = tally(count);
	uint64_t w = atomic_load(t);
	uint32_t tag = (uint32_t)(w >> 32), i = tag & s->tag_imask;

	if (i == 0 || i > s->nslots || tag_give(tag))
		return;
	if (gone(s, &s->slots[i - 1], atomic_load(&s->slots[i - 1].mark), tag, p, t))
		undo(t, w);
}

void
tally_sweep(struct seg *s)
{
	for (uint32_t i = 0; i < s->ncomp; i++) {
		struct seg_comp *c = &s->comp[i];

		sweep_one(s, &c->in_use, P_CONN);
		sweep_one(s, &c->over, P_OVER);
		sweep_one(s, &c->inflight, P_INFLIGHT);
		sweep_one(s, &c->inflight_over, P_INFLIGHT_OVER);
		sweep_one(s, &c->cls_lent, P_CLENT);
		if (atomic_load(&c->kernel) != 0 && kjoint_of(s, c) != NULL)
			sweep_one(s, kjoint_of(s, c), P_KERN);
		for (int k = 0; k < BS_MAX_CLASSES; k++)
			sweep_one(s, &c->cls[k].in_use, P_CLASS);
	}
	for (uint32_t i = 0; i < s->h->npools && i < BS_MAX_POOLS; i++)
		sweep_one(s, &s->h->pools[i].lent, P_LENT);
}

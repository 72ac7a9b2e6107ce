/* tally.c - permit counts that a thread killed at any instruction cannot leave wrong. */
#include <errno.h>
#include <linux/futex.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

/*
 * A thread can die between changing a counter and writing down, in its
 * slot, that it did: SIGKILL, or another thread's exec, can strike at any
 * instruction. So every counter that stands for permits held by slots is a
 * tally: the 32-bit count and, in the word after it, a tag naming the last
 * slot operation that changed it (slot index + 1, whether it added or took
 * away, and 10 bits of the slot's generation). One 64-bit compare-and-swap
 * changes both. An operation on slot S and permit kind P goes:
 *
 *   1. announce: set MARK_TAKING(P) (or MARK_GIVING(P)) in S's mark;
 *   2. change the tally, tagging it with S;
 *   3. turn the announcement into its result (MARK_HELD(P) set or cleared).
 *
 * Whoever changes a tally first finishes the operation its current tag
 * names, if that operation's announcement is still up ("helping"). So
 * when an announcement outlives any later change of its tally, step 2 never
 * happened. A thread that finds an operation whose process is dead helps
 * it once: if the announcement is still up, a TAKING is withdrawn (the count
 * never moved) and a GIVING is carried out on the dead thread's behalf.
 * Nothing is ever counted twice or lost, and nobody waits for the dead.
 */

#define TAG_GIVE	(1u << 21)
#define TAG_INDEX(t)	((t) & 0x1fffffu)
#define TAG_GEN(t)	((t) >> 22)
#define GEN_BITS(g)	((g) & 0x3ffu)

_Static_assert(offsetof(struct seg_comp, in_use) % 8 == 0, "tally alignment");
_Static_assert(offsetof(struct seg_comp, inflight) % 8 == 0, "tally alignment");
_Static_assert(offsetof(struct seg_comp, over) % 8 == 0, "tally alignment");
_Static_assert(offsetof(struct seg_comp, inflight_over) % 8 == 0, "tally alignment");
_Static_assert(offsetof(struct seg_class, in_use) % 8 == 0, "tally alignment");
_Static_assert(BS_MAX_SOCKETS < TAG_GIVE, "slot index fits a tag");
_Static_assert(P_KINDS <= 7, "mark flags fit");
_Static_assert(offsetof(struct seg_comp, cls_lent) % 8 == 0, "tally alignment");
_Static_assert(offsetof(struct seg_pool, lent) % 8 == 0, "tally alignment");
_Static_assert(offsetof(struct seg_header, pools) % 8 == 0, "tally alignment");

static void
futex_wake(_Atomic uint32_t *word)
{
	syscall(SYS_futex, (uint32_t *)(uintptr_t)word, FUTEX_WAKE, 1, NULL, NULL, 0);
}

static _Atomic uint64_t *
tally(_Atomic uint32_t *count)
{
	/* The count and its tag word are 8-byte aligned neighbours. */
	return (_Atomic uint64_t *)(uintptr_t)count;
}

static uint64_t
tagged(uint32_t slot, uint32_t gen, bool give, uint32_t count)
{
	uint32_t tag = GEN_BITS(gen) << 22 | (give ? TAG_GIVE : 0) | (slot + 1);

	return (uint64_t)tag << 32 | count;
}

/*
 * The steps below are inlined into tally_take and tally_give, which keep a
 * copy specialised for the kinds taken and given most (P_CONN at every
 * connect and close, P_INFLIGHT at every request of a compartment with
 * max_inflight): their masks are constants and count_of's switch is gone.
 */

/* The counter that permit kind p of slot sl is counted in, and its limit
 * (NULL: none). NULL if the slot names no such counter. */
static inline __attribute__((always_inline)) _Atomic uint32_t *
count_in(const struct seg *s, struct seg_comp *c, const struct seg_slot *sl, int p,
    _Atomic uint32_t **limit)
{
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
	case P_LENT:
		return pool_tally_of(s, c, p, limit);
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
tally_of(const struct seg *s, const struct seg_slot *sl, int p, _Atomic uint32_t **limit)
{
	return count_of(s, sl, p, limit);
}

/* Changes slot's mark while it is of generation gen, has every flag of
 * `need` and none of `deny`: clears `clr`, sets `set`. False if it cannot. */
static inline __attribute__((always_inline)) bool
mark_change(struct seg_slot *sl, uint32_t gen, uint64_t need, uint64_t deny, uint64_t clr,
    uint64_t set)
{
	uint64_t m = atomic_load(&sl->mark), n;

	do {
		if (MARK_GEN(m) != gen || (m & need) != need || (m & deny) != 0)
			return false;
		n = (m & ~clr) | set;
		/* An announcement moves the sequence on (see MARK_SEQ). */
		if (set & (MARK_PENDING & ~MARK_WAITING))
			n = (n & ~MARK_SEQ) | (((n & MARK_SEQ) + MARK_SEQ_ONE) & MARK_SEQ);
	} while (!atomic_compare_exchange_weak(&sl->mark, &m, n));
	return true;
}

bool
slot_mark_change(struct seg_slot *sl, uint32_t gen, uint64_t need, uint64_t deny, uint64_t clr,
    uint64_t set)
{
	return mark_change(sl, gen, need, deny, clr, set);
}

/*
 * Finishes the operation that tally value w names, if its announcement is
 * still up and the tally still reads w (so the change it made is the last
 * one: see the top of this file). Anyone about to change the tally from w
 * calls this first.
 */
static inline __attribute__((always_inline)) void
help(const struct seg *s, _Atomic uint64_t *t, uint64_t w, int p)
{
	uint32_t tag = (uint32_t)(w >> 32), i = TAG_INDEX(tag);
	bool give = (tag & TAG_GIVE) != 0;
	struct seg_slot *sl;
	uint64_t m, pend = give ? MARK_GIVING(p) : MARK_TAKING(p);

	if (i == 0 || i > s->h->nslots)
		return;
	sl = &s->slots[i - 1];
	m = atomic_load(&sl->mark);
	for (;;) {
		uint64_t n = give ? m & ~(pend | MARK_HELD(p)) : (m & ~pend) | MARK_HELD(p);

		if (GEN_BITS(MARK_GEN(m)) != TAG_GEN(tag) || !(m & pend))
			return;
		if (atomic_load(t) != w)
			return;
		if (atomic_compare_exchange_weak(&sl->mark, &m, n))
			return;
	}
}

/*
 * Whether tally value w names an operation of slot itself. Such an
 * operation needs no help from the slot's own next one: a take or give
 * announces itself only when the slot has no other operation of the kind
 * under way (the announcement denies TAKING and GIVING, and a take denies
 * HELD), so the operation w names has already taken its announcement down.
 * Helping it anyway could only find our own announcement, of the same
 * 10-bit generation, and finish it early. So a slot changing a count it
 * changed last (one socket at a time, the common case) skips the look.
 */
static inline __attribute__((always_inline)) bool
own_tag(uint64_t w, uint32_t slot)
{
	return TAG_INDEX((uint32_t)(w >> 32)) == slot + 1;
}

/* The limit a take of kind p is held to: *limit, or lower, the fleet share
 * (connections) and the adaptive limit of the compartment whose word it is
 * (adaptive.c). */
static inline __attribute__((always_inline)) uint32_t
limit_now(_Atomic uint32_t *limit, int p)
{
	uint32_t v = atomic_load(limit);

	if (p == P_INFLIGHT)
		return ad_limit((const struct seg_comp *)((uintptr_t)limit -
		    offsetof(struct seg_comp, inflight_limit)), p, v);
	if (p == P_CONN) {
		/* A fleet lease may lower the static limit (seg_conn_limit). */
		const struct seg_comp *c = (const struct seg_comp *)((uintptr_t)limit -
		    offsetof(struct seg_comp, limit));

		return ad_limit(c, p, seg_conn_limit(c));
	}
	return v;
}

/* Adds one to the tally if below *limit (or if limit is NULL), tagged with
 * slot; helps the last operation first. Returns true if added; *seen is the
 * count last read, for a futex wait. */
static inline __attribute__((always_inline)) bool
add(const struct seg *s, _Atomic uint32_t *count, _Atomic uint32_t *limit, int p,
    uint32_t slot, uint32_t gen, uint32_t *seen)
{
	_Atomic uint64_t *t = tally(count);
	uint64_t w = atomic_load(t);

	for (;;) {
		uint32_t cur = (uint32_t)w;

		if (!own_tag(w, slot))
			help(s, t, w, p);
		*seen = cur;
		if (limit != NULL ? cur >= limit_now(limit, p) : cur == UINT32_MAX)
			return false;
		if (atomic_compare_exchange_weak(t, &w, tagged(slot, gen, false, cur + 1)))
			return true;
	}
}

bool
tally_add(const struct seg *s, _Atomic uint32_t *count, _Atomic uint32_t *limit, int p,
    uint32_t slot, uint32_t gen, uint32_t *seen)
{
	return add(s, count, limit, p, slot, gen, seen);
}

/* Takes one from the tally (never below 0), tagged with slot; helps first. */
static inline __attribute__((always_inline)) void
sub(const struct seg *s, _Atomic uint32_t *count, int p, uint32_t slot, uint32_t gen)
{
	_Atomic uint64_t *t = tally(count);
	uint64_t w = atomic_load(t);

	for (;;) {
		uint32_t cur = (uint32_t)w;

		if (!own_tag(w, slot))
			help(s, t, w, p);
		if (atomic_compare_exchange_weak(t, &w, tagged(slot, gen, true, cur > 0 ? cur - 1 : 0)))
			return;
	}
}

void
tally_sub(const struct seg *s, _Atomic uint32_t *count, int p, uint32_t slot, uint32_t gen)
{
	sub(s, count, p, slot, gen);
}

/* Step 3 of a take whose count went up: the announcement becomes
 * MARK_HELD(p), unless a helper did it, or it was withdrawn meanwhile. */
static inline __attribute__((always_inline)) int
taken(struct seg *s, uint32_t slot, uint32_t gen, int p, _Atomic uint32_t *count)
{
	struct seg_slot *sl = &s->slots[slot];
	uint64_t m;

	m = atomic_load(&sl->mark);
	for (;;) {
		if (MARK_GEN(m) != gen)
			return TALLY_BUSY;	/* freed under us, after a long stall */
		if (m & MARK_WITHDRAWN(p)) {
			/* Taken for dead and withdrawn: give back what we added. */
			slot_mark_change(sl, gen, 0, 0, MARK_WITHDRAWN(p), 0);
			tally_sub(s, count, p, slot, gen);
			return TALLY_BUSY;
		}
		if (!(m & MARK_TAKING(p)))
			return TALLY_TAKEN;	/* a helper finished it for us */
		if (atomic_compare_exchange_weak(&sl->mark, &m,
		    (m & ~MARK_TAKING(p)) | MARK_HELD(p)))
			return TALLY_TAKEN;
	}
}

/*
 * One attempt to take permit kind p for slot (of generation gen), counted in
 * count under *limit (NULL: none; NULL count: nothing to take). TALLY_TAKEN,
 * TALLY_FULL (*seen: the count that was at the limit), or TALLY_BUSY: the
 * slot already has, or is getting, a permit of that kind (or of the kinds in
 * `deny`).
 */
static inline __attribute__((always_inline)) int
take_at(struct seg *s, uint32_t slot, uint32_t gen, int p, uint64_t deny,
    _Atomic uint32_t *count, _Atomic uint32_t *limit, uint32_t *seen)
{
	struct seg_slot *sl = &s->slots[slot];

	*seen = 0;
	if (count == NULL)
		return TALLY_BUSY;
	atomic_store(&sl->op_pid, s->my_pid);
	/* A leftover MARK_WITHDRAWN(p) is of a dead thread's attempt. */
	if (!mark_change(sl, gen, 0, deny | MARK_HELD(p) | MARK_TAKING(p) | MARK_GIVING(p),
	    MARK_WITHDRAWN(p), MARK_TAKING(p)))
		return TALLY_BUSY;
	if (!add(s, count, limit, p, slot, gen, seen)) {
		mark_change(sl, gen, MARK_TAKING(p), 0, MARK_TAKING(p), 0);
		return TALLY_FULL;
	}
	return taken(s, slot, gen, p, count);
}

static inline __attribute__((always_inline)) int
take(struct seg *s, uint32_t slot, uint32_t gen, int p, uint64_t deny, uint32_t *seen)
{
	_Atomic uint32_t *limit, *count = count_of(s, &s->slots[slot], p, &limit);

	return take_at(s, slot, gen, p, deny, count, limit, seen);
}

int
tally_taken(struct seg *s, uint32_t slot, uint32_t gen, int p, _Atomic uint32_t *count)
{
	return taken(s, slot, gen, p, count);
}

/* Every connect's kind gets a copy of its own (constant masks); a limited
 * request has tally_take_inflight. */
int
tally_take(struct seg *s, uint32_t slot, uint32_t gen, int p, uint64_t deny, uint32_t *seen)
{
	if (p == P_CONN)
		return take(s, slot, gen, P_CONN, deny, seen);
	return take(s, slot, gen, p, deny, seen);
}

int
tally_take_inflight(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c,
    uint32_t *seen)
{
	return take_at(s, slot, gen, P_INFLIGHT, 0, &c->inflight, &c->inflight_limit, seen);
}

/* Steps 2 and 3 of giving back permit kind p of slot, once announced
 * (MARK_GIVING): the count goes down, the mark says so, a waiter of
 * compartment c (the slot's) wakes. */
static inline __attribute__((always_inline)) void
give_out(struct seg *s, uint32_t slot, uint32_t gen, int p, struct seg_comp *c,
    _Atomic uint32_t *count)
{
	struct seg_slot *sl = &s->slots[slot];

	if (count != NULL)
		sub(s, count, p, slot, gen);
	mark_change(sl, gen, MARK_GIVING(p), 0, MARK_GIVING(p) | MARK_HELD(p), 0);
	if (count != NULL && (p == P_CONN || p == P_INFLIGHT) && c != NULL &&
	    atomic_load(&c->waiting) > 0)
		futex_wake(count);
	if (count != NULL && p == P_LENT)
		pool_wake(s, sl);
}

/* Gives back permit kind p of slot, counted in count of compartment c, if
 * the slot holds it. True if it did. */
static inline __attribute__((always_inline)) bool
give_at(struct seg *s, uint32_t slot, uint32_t gen, int p, struct seg_comp *c,
    _Atomic uint32_t *count)
{
	struct seg_slot *sl = &s->slots[slot];

	atomic_store(&sl->op_pid, s->my_pid);
	if (!mark_change(sl, gen, MARK_HELD(p), MARK_GIVING(p), 0, MARK_GIVING(p)))
		return false;
	give_out(s, slot, gen, p, c, count);
	return true;
}

static inline __attribute__((always_inline)) bool
give(struct seg *s, uint32_t slot, uint32_t gen, int p)
{
	struct seg_slot *sl = &s->slots[slot];
	struct seg_comp *c = seg_slot_comp(s, sl);

	return give_at(s, slot, gen, p, c, count_in(s, c, sl, p, NULL));
}

bool
tally_give(struct seg *s, uint32_t slot, uint32_t gen, int p)
{
	if (p == P_CONN)
		return give(s, slot, gen, P_CONN);
	return give(s, slot, gen, p);
}

bool
tally_give_inflight(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c)
{
	return give_at(s, slot, gen, P_INFLIGHT, c, &c->inflight);
}

/*
 * Finishes whatever operation on slot a dead thread left half done: see
 * the top of this file. Also right when the thread is alive after all: it
 * notices (MARK_WITHDRAWN) and undoes its own change.
 */
static void
resolve(struct seg *s, uint32_t slot)
{
	struct seg_slot *sl = &s->slots[slot];
	uint64_t m = atomic_load(&sl->mark);
	uint32_t gen = MARK_GEN(m);

	for (int p = 0; p < P_KINDS; p++) {
		_Atomic uint32_t *count;

		if (!(m & (MARK_TAKING(p) | MARK_GIVING(p))))
			continue;
		count = tally_of(s, sl, p, NULL);
		if (count != NULL)
			help(s, tally(count), atomic_load(tally(count)), p);
		if (m & MARK_TAKING(p))
			slot_mark_change(sl, gen, MARK_TAKING(p), 0, MARK_TAKING(p), MARK_WITHDRAWN(p));
		if ((m & MARK_GIVING(p)) && (atomic_load(&sl->mark) & MARK_GIVING(p)))
			give_out(s, slot, gen, p, seg_slot_comp(s, sl), count);
	}
	if ((m & MARK_WAITING) && slot_mark_change(sl, gen, MARK_WAITING, 0, MARK_WAITING, 0)) {
		struct seg_comp *c = seg_slot_comp(s, sl);

		if (c != NULL)
			seg_dec_floor(&c->waiting);
	}
}

void
seg_resolve(struct seg *s, uint32_t slot, pid_t dead)
{
	struct seg_slot *sl;

	if (slot >= s->h->nslots)
		return;
	sl = &s->slots[slot];
	if ((atomic_load(&sl->mark) & MARK_PENDING) != 0 &&
	    (dead == 0 || atomic_load(&sl->op_pid) == dead))
		resolve(s, slot);
}

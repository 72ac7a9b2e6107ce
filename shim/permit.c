/* permit.c - admission by compare-and-swap, futex waits, requests in flight, histograms. */
#include <errno.h>
#include <linux/futex.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

/*
 * Every limit is a pair of words in the shared segment, a counter and its
 * limit. A permit is taken by one compare-and-swap of the counter from cur
 * to cur + 1 while cur is below the limit, so the limit is never exceeded
 * whatever the number of threads and processes. A waiter sleeps on the
 * counter's own word with FUTEX_WAIT (not the private variant: the word is
 * shared between processes), and whoever lowers it wakes one waiter.
 *
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

#define RECLAIM_POLL_MS	100	/* a waiter looks for dead holders this often */
#define SETTLE_MS	1000	/* how long a release waits for a live operation */

#define TAG_GIVE	(1u << 21)
#define TAG_INDEX(t)	((t) & 0x1fffffu)
#define TAG_GEN(t)	((t) >> 22)
#define GEN_BITS(g)	((g) & 0x3ffu)
/* Set by whoever withdraws a live-looking TAKING it took for dead: the
 * taker, if alive after all, gives back what it added. */
#define MARK_WITHDRAWN(p)	(1ULL << (25 + (p)))

_Static_assert(offsetof(struct seg_comp, in_use) % 8 == 0, "tally alignment");
_Static_assert(offsetof(struct seg_comp, inflight) % 8 == 0, "tally alignment");
_Static_assert(offsetof(struct seg_comp, over) % 8 == 0, "tally alignment");
_Static_assert(offsetof(struct seg_comp, inflight_over) % 8 == 0, "tally alignment");
_Static_assert(offsetof(struct seg_class, in_use) % 8 == 0, "tally alignment");
_Static_assert(BS_MAX_SOCKETS < TAG_GIVE, "slot index fits a tag");
_Static_assert(P_KINDS <= 7, "mark flags fit");

enum { TAKEN, FULL, BUSY };

uint32_t
seg_dec_floor(_Atomic uint32_t *v)
{
	uint32_t cur = atomic_load(v);

	/* A damaged segment must not wrap a count around to 4 billion. */
	while (cur > 0 && !atomic_compare_exchange_weak(v, &cur, cur - 1))
		;
	return cur > 0 ? cur - 1 : 0;
}

static void
futex_wake(_Atomic uint32_t *word)
{
	syscall(SYS_futex, (uint32_t *)(uintptr_t)word, FUTEX_WAKE, 1, NULL, NULL, 0);
}

/* Sleeps while *word == val, at most `us` microseconds. */
static void
futex_wait(_Atomic uint32_t *word, uint32_t val, uint64_t us)
{
	struct timespec ts = { (time_t)(us / 1000000), (long)(us % 1000000) * 1000 };

	syscall(SYS_futex, (uint32_t *)(uintptr_t)word, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void
raise_peak(_Atomic uint32_t *peak, uint32_t v)
{
	uint32_t p = atomic_load(peak);

	while (v > p && !atomic_compare_exchange_weak(peak, &p, v))
		;
}

/* ---- tallies and marks ---- */

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

/* The compartment of a slot, or NULL (a pending slot, or garbage). */
static struct seg_comp *
comp_of_slot(const struct seg *s, const struct seg_slot *sl)
{
	uint32_t comp = atomic_load(&sl->comp);

	return comp < s->h->ncomp ? &s->comp[comp] : NULL;
}

/* The counter that permit kind p of slot sl is counted in, and its limit
 * (NULL: none). NULL if the slot names no such counter. */
static _Atomic uint32_t *
kind_count(const struct seg *s, const struct seg_slot *sl, int p, _Atomic uint32_t **limit)
{
	struct seg_comp *c = comp_of_slot(s, sl);
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
	}
	return NULL;
}

/* Changes slot's mark while it is of generation gen, has every flag of
 * `need` and none of `deny`: clears `clr`, sets `set`. False if it cannot. */
static bool
mark_change(struct seg_slot *sl, uint32_t gen, uint64_t need, uint64_t deny, uint64_t clr,
    uint64_t set)
{
	uint64_t m = atomic_load(&sl->mark);

	do {
		if (MARK_GEN(m) != gen || (m & need) != need || (m & deny) != 0)
			return false;
	} while (!atomic_compare_exchange_weak(&sl->mark, &m, (m & ~clr) | set));
	return true;
}

/*
 * Finishes the operation that tally value w names, if its announcement is
 * still up and the tally still reads w (so the change it made is the last
 * one: see the top of this file). Anyone about to change the tally from w
 * calls this first.
 */
static void
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

/* Adds one to the tally if below *limit (or if limit is NULL), tagged with
 * slot; helps the last operation first. Returns true if added; *seen is the
 * count last read, for a futex wait. */
static bool
tally_add(const struct seg *s, _Atomic uint32_t *count, _Atomic uint32_t *limit, int p,
    uint32_t slot, uint32_t gen, uint32_t *seen)
{
	_Atomic uint64_t *t = tally(count);
	uint64_t w = atomic_load(t);

	for (;;) {
		uint32_t cur = (uint32_t)w;

		help(s, t, w, p);
		*seen = cur;
		if (limit != NULL ? cur >= atomic_load(limit) : cur == UINT32_MAX)
			return false;
		if (atomic_compare_exchange_weak(t, &w, tagged(slot, gen, false, cur + 1)))
			return true;
	}
}

/* Takes one from the tally (never below 0), tagged with slot; helps first. */
static void
tally_sub(const struct seg *s, _Atomic uint32_t *count, int p, uint32_t slot, uint32_t gen)
{
	_Atomic uint64_t *t = tally(count);
	uint64_t w = atomic_load(t);

	for (;;) {
		uint32_t cur = (uint32_t)w;

		help(s, t, w, p);
		if (atomic_compare_exchange_weak(t, &w, tagged(slot, gen, true, cur > 0 ? cur - 1 : 0)))
			return;
	}
}

static void
wake_waiters(const struct seg *s, struct seg_slot *sl, _Atomic uint32_t *count)
{
	struct seg_comp *c = comp_of_slot(s, sl);

	if (c != NULL && atomic_load(&c->waiting) > 0)
		futex_wake(count);
}

/*
 * One attempt to take permit kind p for slot (of generation gen). TAKEN,
 * FULL (*seen: the count that was at the limit), or BUSY: the slot already
 * has, or is getting, a permit of that kind (or of the kinds in `deny`).
 */
static int
take_kind(struct seg *s, uint32_t slot, uint32_t gen, int p, uint64_t deny, uint32_t *seen)
{
	struct seg_slot *sl = &s->slots[slot];
	_Atomic uint32_t *limit, *count = kind_count(s, sl, p, &limit);
	uint64_t m;

	*seen = 0;
	if (count == NULL)
		return BUSY;
	atomic_store(&sl->op_pid, s->my_pid);
	/* A leftover MARK_WITHDRAWN(p) is of a dead thread's attempt. */
	if (!mark_change(sl, gen, 0, deny | MARK_HELD(p) | MARK_TAKING(p) | MARK_GIVING(p),
	    MARK_WITHDRAWN(p), MARK_TAKING(p)))
		return BUSY;
	if (!tally_add(s, count, limit, p, slot, gen, seen)) {
		mark_change(sl, gen, MARK_TAKING(p), 0, MARK_TAKING(p), 0);
		return FULL;
	}
	m = atomic_load(&sl->mark);
	for (;;) {
		if (MARK_GEN(m) != gen)
			return BUSY;	/* freed under us, after a long stall */
		if (m & MARK_WITHDRAWN(p)) {
			/* Taken for dead and withdrawn: give back what we added. */
			mark_change(sl, gen, 0, 0, MARK_WITHDRAWN(p), 0);
			tally_sub(s, count, p, slot, gen);
			return BUSY;
		}
		if (!(m & MARK_TAKING(p)))
			return TAKEN;	/* a helper finished it for us */
		if (atomic_compare_exchange_weak(&sl->mark, &m,
		    (m & ~MARK_TAKING(p)) | MARK_HELD(p)))
			return TAKEN;
	}
}

/* Gives back permit kind p of slot, if the slot holds it. True if it did. */
static bool
give_kind(struct seg *s, uint32_t slot, uint32_t gen, int p)
{
	struct seg_slot *sl = &s->slots[slot];
	_Atomic uint32_t *count = kind_count(s, sl, p, NULL);

	atomic_store(&sl->op_pid, s->my_pid);
	if (!mark_change(sl, gen, MARK_HELD(p), MARK_GIVING(p), 0, MARK_GIVING(p)))
		return false;
	if (count != NULL)
		tally_sub(s, count, p, slot, gen);
	mark_change(sl, gen, MARK_GIVING(p), 0, MARK_GIVING(p) | MARK_HELD(p), 0);
	if (count != NULL && (p == P_CONN || p == P_INFLIGHT))
		wake_waiters(s, sl, count);
	return true;
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
		count = kind_count(s, sl, p, NULL);
		if (count != NULL)
			help(s, tally(count), atomic_load(tally(count)), p);
		if (m & MARK_TAKING(p))
			mark_change(sl, gen, MARK_TAKING(p), 0, MARK_TAKING(p), MARK_WITHDRAWN(p));
		if ((m & MARK_GIVING(p)) && (atomic_load(&sl->mark) & MARK_GIVING(p))) {
			if (count != NULL)
				tally_sub(s, count, p, slot, gen);
			mark_change(sl, gen, MARK_GIVING(p), 0, MARK_GIVING(p) | MARK_HELD(p), 0);
			if (count != NULL && (p == P_CONN || p == P_INFLIGHT))
				wake_waiters(s, sl, count);
		}
	}
	if ((m & MARK_WAITING) && mark_change(sl, gen, MARK_WAITING, 0, MARK_WAITING, 0)) {
		struct seg_comp *c = comp_of_slot(s, sl);

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

/* ---- waiting ---- */

/*
 * Takes permit kind p for slot, waiting for one when full if the caller may
 * wait and the compartment allows it: reclaims dead holders once, then
 * sleeps on the tally's count word until the deadline. The slot is marked
 * MARK_WAITING while counted in `waiting`. TAKEN, BUSY, or FULL with *why.
 */
static int
take_wait(struct seg *s, uint32_t slot, uint32_t gen, int p, bool may_wait, enum bs_reason full,
    enum bs_reason *why)
{
	struct seg_slot *sl = &s->slots[slot];
	struct seg_comp *c = comp_of_slot(s, sl);
	_Atomic uint32_t *count = kind_count(s, sl, p, NULL);
	uint32_t wait_ms, w, seen;
	uint64_t t0, deadline, now;
	int r;

	if (c == NULL || count == NULL)
		return BUSY;
	if ((r = take_kind(s, slot, gen, p, 0, &seen)) != FULL)
		return r;
	if (seg_reclaim(s, true) > 0 && (r = take_kind(s, slot, gen, p, 0, &seen)) != FULL)
		return r;
	*why = full;
	wait_ms = atomic_load(&c->max_wait_ms);
	if (!may_wait || wait_ms == 0 || !atomic_load(&c->enforce))
		return FULL;
	if (!mark_change(sl, gen, 0, MARK_WAITING, 0, MARK_WAITING))
		return FULL;
	w = atomic_load(&c->waiting);
	do {
		if (w >= atomic_load(&c->max_waiting)) {
			mark_change(sl, gen, MARK_WAITING, 0, MARK_WAITING, 0);
			*why = REASON_TOO_MANY_WAITING;
			return FULL;
		}
	} while (!atomic_compare_exchange_weak(&c->waiting, &w, w + 1));
	t0 = now_mono_us();
	deadline = t0 + (uint64_t)wait_ms * 1000;
	*why = REASON_WAIT_TIMEOUT;
	for (;;) {
		r = take_kind(s, slot, gen, p, 0, &seen);
		if (r != FULL)
			break;
		now = now_mono_us();
		if (now >= deadline)
			break;
		/* Wake up now and then to take back what dead processes
		 * hold: they will never wake us themselves. */
		futex_wait(count, seen,
		    deadline - now < RECLAIM_POLL_MS * 1000 ? deadline - now : RECLAIM_POLL_MS * 1000);
		seg_reclaim(s, true);
	}
	/* The count goes down before the mark: dying in between makes a
	 * reclaimer take one off again, an error that vanishes at 0. */
	seg_dec_floor(&c->waiting);
	mark_change(sl, gen, MARK_WAITING, 0, MARK_WAITING, 0);
	seg_hist_add(&c->h_wait, now_mono_us() - t0);
	return r;
}

void
seg_hist_add(struct seg_hist *h, uint64_t us)
{
	unsigned b = us == 0 ? 0 : 64 - (unsigned)__builtin_clzll(us);

	if (b >= BS_HIST_BUCKETS)
		b = BS_HIST_BUCKETS - 1;
	atomic_fetch_add(&h->bucket[b], 1);
	atomic_fetch_add(&h->sum_us, us);
	atomic_fetch_add(&h->count, 1);
}

/* Counts one admission in the per-second ring and the peak rate. */
static void
note_rate(struct seg_comp *c)
{
	uint64_t sec = now_mono_ms() / 1000, e, next;
	_Atomic uint64_t *slot = &c->rate[sec % BS_RATE_SECONDS];
	uint64_t peak;

	e = atomic_load(slot);
	do {
		next = (e >> 32) == (sec & 0xffffffff) ? e + 1 : ((sec & 0xffffffff) << 32) | 1;
	} while (!atomic_compare_exchange_weak(slot, &e, next));
	peak = atomic_load(&c->peak_rate);
	while ((next & 0xffffffff) > peak &&
	    !atomic_compare_exchange_weak(&c->peak_rate, &peak, next & 0xffffffff))
		;
}

const char *
seg_reason_name(enum bs_reason why)
{
	static const char *names[REASON_MAX] = {
		"full", "inflight_full", "wait_timeout", "too_many_waiting", "class_full", "no_slot",
	};

	return (unsigned)why < REASON_MAX ? names[why] : "unknown";
}

void
seg_count_rejection(struct seg *s, uint32_t comp, enum bs_reason why)
{
	struct seg_comp *c = seg_comp(s, comp);

	if (c == NULL || (unsigned)why >= REASON_MAX)
		return;
	atomic_fetch_add(&c->rejected_by[why], 1);
	atomic_fetch_add(&c->rejected, 1);
	atomic_store(&c->last_rejection_ms, now_real_ms());
}

/* ---- slots ---- */

/* Claims a free slot for the socket with inode ino, held by this process
 * (bit set in its row, one holder), of a new generation, with no permit
 * yet: a pending slot. Returns the slot or -ENOSPC. */
static int
alloc_slot(struct seg *s, int rec, uint64_t ino)
{
	uint32_t n = s->h->nslots;
	uint32_t start = atomic_fetch_add(&s->hint, 1) % n;

	for (uint32_t k = 0; k < n; k++) {
		uint32_t i = (start + k) % n, expected = SLOT_FREE;
		struct seg_slot *sl = &s->slots[i];
		uint64_t m;

		if (atomic_load_explicit(&sl->state, memory_order_relaxed) != SLOT_FREE)
			continue;
		/* SLOT_INIT keeps readers away until the fields are in. */
		if (!atomic_compare_exchange_strong(&sl->state, &expected, SLOT_INIT))
			continue;
		atomic_store(&sl->op_pid, s->my_pid);
		m = atomic_load(&sl->mark);
		atomic_store(&sl->mark, (uint64_t)(MARK_GEN(m) + 1) << 32);
		atomic_store(&sl->comp, SLOT_NO_COMP);
		atomic_store(&sl->cls, SLOT_NO_CLASS);
		atomic_store(&sl->connect_us, 0);
		atomic_store(&sl->inode, ino);
		seg_hold_first(s, rec, i);
		atomic_store_explicit(&sl->state, SLOT_USED, memory_order_release);
		atomic_store(&s->hint, i + 1);
		return (int)i;
	}
	return -ENOSPC;
}

int
seg_pending_slot(struct seg *s, uint64_t ino)
{
	int rec = seg_my_record(s), slot;

	if (rec < 0)
		return rec;
	slot = alloc_slot(s, rec, ino);
	if (slot >= 0)
		atomic_store(&s->lcount[slot], 1);
	return slot;
}

bool
seg_slot_admitted(const struct seg *s, uint32_t slot)
{
	return slot < s->h->nslots &&
	    (atomic_load(&s->slots[slot].mark) & (MARK_HELD(P_CONN) | MARK_HELD(P_OVER))) != 0;
}

bool
seg_slot_pending(const struct seg *s, uint32_t slot)
{
	return slot < s->h->nslots && atomic_load(&s->slots[slot].comp) == SLOT_NO_COMP &&
	    atomic_load(&s->slots[slot].state) == SLOT_USED;
}

/*
 * Takes the permits of compartment comp (and class cls) for the pending
 * slot, which this process holds. Returns 0, or -EBUSY with *why, or
 * -EALREADY when another holder (a forked process sharing the socket) is
 * already admitting it.
 */
static int
admit_slot(struct seg *s, uint32_t slot, uint32_t comp, uint32_t cls, bool may_wait,
    enum bs_reason *why)
{
	struct seg_slot *sl = &s->slots[slot];
	struct seg_comp *c = &s->comp[comp];
	struct seg_class *k = NULL;
	enum bs_reason reason = REASON_MAX;
	uint32_t gen = MARK_GEN(atomic_load(&sl->mark)), none = SLOT_NO_COMP, seen;
	int r;

	if (!atomic_compare_exchange_strong(&sl->comp, &none, comp))
		return -EALREADY;
	/* A capped class needs its class permit as well as the
	 * compartment's; the class permit is taken first and given back if
	 * the compartment refuses, so it never counts a refused call. */
	if (cls < BS_MAX_CLASSES && atomic_load(&c->cls[cls].limit) != 0) {
		k = &c->cls[cls];
		atomic_store(&sl->cls, cls);
		if (take_kind(s, slot, gen, P_CLASS, 0, &seen) != TAKEN) {
			reason = REASON_CLASS_FULL;
			atomic_fetch_add(&k->rejected, 1);
			k = NULL;
		}
	}
	if (reason == REASON_MAX) {
		r = take_wait(s, slot, gen, P_CONN, may_wait, REASON_FULL, &reason);
		if (r == TAKEN)
			reason = REASON_MAX;
		else if (r == BUSY)
			reason = REASON_NO_SLOT;
	}
	if (reason != REASON_MAX) {
		if (k != NULL) {
			give_kind(s, slot, gen, P_CLASS);
			k = NULL;
		}
		if (atomic_load(&c->enforce) || reason == REASON_NO_SLOT) {
			seg_count_rejection(s, comp, reason);
			atomic_store(&sl->cls, SLOT_NO_CLASS);
			atomic_store(&sl->comp, SLOT_NO_COMP);
			*why = reason;
			return -EBUSY;
		}
		/* Observe mode: let it through, say what enforcing would
		 * have done, and keep it apart from the permits proper. */
		atomic_fetch_add(&c->would_reject[reason], 1);
		take_kind(s, slot, gen, P_OVER, 0, &seen);
	}
	raise_peak(&c->peak, atomic_load(&c->in_use) + atomic_load(&c->over));
	if (k != NULL) {
		raise_peak(&k->peak, atomic_load(&k->in_use));
		atomic_fetch_add(&k->admitted, 1);
	}
	atomic_store(&sl->connect_us, now_mono_us());
	atomic_fetch_add(&c->admitted, 1);
	note_rate(c);
	return 0;
}

int
seg_acquire(struct seg *s, uint32_t comp, uint32_t cls, uint64_t ino, bool may_wait,
    enum bs_reason *why)
{
	int rec, slot, r;

	if (comp >= s->h->ncomp)
		return -EINVAL;
	rec = seg_my_record(s);
	/* The slot is taken, and this process recorded as its holder,
	 * before any permit: whoever finds us dead half-way finds it. */
	seg_gate_enter(s);
	slot = rec < 0 ? -ENOSPC : alloc_slot(s, rec, ino);
	seg_gate_leave(s);
	if (slot < 0) {
		*why = REASON_NO_SLOT;
		seg_count_rejection(s, comp, REASON_NO_SLOT);
		return -EBUSY;
	}
	r = admit_slot(s, (uint32_t)slot, comp, cls, may_wait, why);
	if (r < 0) {
		seg_drop_hold(s, rec, (uint32_t)slot, false);
		return -EBUSY;
	}
	atomic_store(&s->lcount[slot], 1);
	return slot;
}

int
seg_acquire_pending(struct seg *s, uint32_t slot, uint32_t comp, uint32_t cls, bool may_wait,
    enum bs_reason *why)
{
	if (comp >= s->h->ncomp || slot >= s->h->nslots)
		return -EINVAL;
	return admit_slot(s, slot, comp, cls, may_wait, why);
}

/*
 * Before a slot is given back: an operation still under way on it is
 * waited for a little (it is a few instructions long unless its thread
 * stalls), then finished as if its thread were dead.
 */
static void
settle(struct seg *s, uint32_t slot)
{
	struct seg_slot *sl = &s->slots[slot];
	struct timespec nap = { 0, 1000000 };
	uint64_t deadline = 0;

	while (atomic_load(&sl->mark) & MARK_PENDING) {
		pid_t op = atomic_load(&sl->op_pid);

		if (op != s->my_pid && !seg_pid_alive(op, 0))
			break;
		if (deadline == 0)
			deadline = now_mono_ms() + SETTLE_MS;
		else if (now_mono_ms() >= deadline)
			break;
		nanosleep(&nap, NULL);
	}
	resolve(s, slot);
}

void
seg_release_slot(struct seg *s, uint32_t slot, bool reclaimed)
{
	struct seg_slot *sl = &s->slots[slot];
	uint32_t used = SLOT_USED, gen;
	uint64_t m;

	if (!atomic_compare_exchange_strong(&sl->state, &used, SLOT_RELEASING))
		return;
	atomic_store(&sl->op_pid, s->my_pid);
	if (atomic_load(&sl->mark) & MARK_PENDING)
		settle(s, slot);
	m = atomic_load(&sl->mark);
	gen = MARK_GEN(m);
	for (int p = 0; p < P_KINDS; p++) {
		if (m & MARK_HELD(p))
			give_kind(s, slot, gen, p);
	}
	if (reclaimed && (m & (MARK_HELD(P_CONN) | MARK_HELD(P_OVER)))) {
		struct seg_comp *c = comp_of_slot(s, sl);

		if (c != NULL)
			atomic_fetch_add(&c->reclaimed, 1);
	}
	atomic_store(&sl->inode, 0);
	atomic_store_explicit(&sl->state, SLOT_FREE, memory_order_release);
}

void
seg_release_orphan(struct seg *s, uint32_t slot)
{
	struct seg_slot *sl;
	uint32_t init = SLOT_INIT;

	if (slot >= s->h->nslots)
		return;
	sl = &s->slots[slot];
	if (atomic_load(&sl->holders) != 0)
		return;
	/* Dead in alloc_slot, or between dropping the last hold and
	 * releasing, or half-way through the release itself. */
	if (atomic_compare_exchange_strong(&sl->state, &init, SLOT_FREE))
		return;
	if (init == SLOT_RELEASING) {
		uint32_t rel = SLOT_RELEASING;

		if (!atomic_compare_exchange_strong(&sl->state, &rel, SLOT_USED))
			return;
	}
	seg_release_slot(s, slot, true);
}

void
seg_hold(struct seg *s, uint32_t slot)
{
	if (slot >= s->h->nslots || atomic_load(&s->rec) < 0)
		return;
	atomic_fetch_add(&s->lcount[slot], 1);
}

void
seg_drop(struct seg *s, uint32_t slot)
{
	int rec = atomic_load(&s->rec);

	if (slot >= s->h->nslots || rec < 0)
		return;
	if (seg_dec_floor(&s->lcount[slot]) != 0)
		return;
	seg_drop_hold(s, rec, slot, false);
}

void
seg_connect_done(struct seg *s, uint32_t slot)
{
	struct seg_slot *sl;
	struct seg_comp *c;
	uint64_t t, now;

	if (slot >= s->h->nslots)
		return;
	sl = &s->slots[slot];
	if (atomic_load_explicit(&sl->connect_us, memory_order_relaxed) == 0)
		return;
	t = atomic_exchange(&sl->connect_us, 0);
	c = comp_of_slot(s, sl);
	if (t == 0 || c == NULL)
		return;
	now = now_mono_us();
	seg_hist_add(&c->h_connect, now > t ? now - t : 0);
}

/* ---- requests in flight ---- */

#define INFLIGHT_ANY	(MARK_HELD(P_INFLIGHT) | MARK_HELD(P_INFLIGHT_OVER) | \
			 MARK_TAKING(P_INFLIGHT) | MARK_TAKING(P_INFLIGHT_OVER))

int
seg_inflight_begin(struct seg *s, uint32_t slot, bool may_wait, enum bs_reason *why)
{
	struct seg_slot *sl;
	struct seg_comp *c;
	enum bs_reason reason = REASON_MAX;
	uint64_t m;
	uint32_t gen, seen;
	int r;

	if (slot >= s->h->nslots)
		return 0;
	sl = &s->slots[slot];
	/* The common case of a request already on its way: one load. */
	m = atomic_load_explicit(&sl->mark, memory_order_relaxed);
	if (m & INFLIGHT_ANY)
		return 0;
	c = comp_of_slot(s, sl);
	if (c == NULL || !(m & (MARK_HELD(P_CONN) | MARK_HELD(P_OVER))))
		return 0;
	gen = MARK_GEN(m);
	r = take_wait(s, slot, gen, P_INFLIGHT, may_wait, REASON_INFLIGHT_FULL, &reason);
	if (r == BUSY)
		return 0;	/* another thread's send on the same socket won */
	if (r == FULL) {
		if (atomic_load(&c->enforce)) {
			seg_count_rejection(s, atomic_load(&sl->comp), reason);
			*why = reason;
			return -EBUSY;
		}
		atomic_fetch_add(&c->would_reject[reason], 1);
		if (take_kind(s, slot, gen, P_INFLIGHT_OVER, INFLIGHT_ANY, &seen) != TAKEN)
			return 0;
	} else {
		raise_peak(&c->inflight_peak, atomic_load(&c->inflight));
	}
	atomic_store(&sl->sent_us, now_mono_us());
	atomic_fetch_add(&c->inflight_admitted, 1);
	return 1;
}

static void
inflight_finish(struct seg *s, uint32_t slot, bool record)
{
	struct seg_slot *sl;
	struct seg_comp *c;
	uint64_t m, t;
	uint32_t gen;

	if (slot >= s->h->nslots)
		return;
	sl = &s->slots[slot];
	m = atomic_load_explicit(&sl->mark, memory_order_relaxed);
	if (!(m & (MARK_HELD(P_INFLIGHT) | MARK_HELD(P_INFLIGHT_OVER))))
		return;
	gen = MARK_GEN(m);
	t = atomic_load(&sl->sent_us);
	if (!give_kind(s, slot, gen, P_INFLIGHT) && !give_kind(s, slot, gen, P_INFLIGHT_OVER))
		return;
	c = comp_of_slot(s, sl);
	if (record && c != NULL) {
		uint64_t now = now_mono_us();

		seg_hist_add(&c->h_reply, now > t ? now - t : 0);
	}
}

void
seg_inflight_end(struct seg *s, uint32_t slot)
{
	inflight_finish(s, slot, true);
}

void
seg_inflight_cancel(struct seg *s, uint32_t slot)
{
	inflight_finish(s, slot, false);
}

/* ---- statistics ---- */

static void
zero_hist(struct seg_hist *h)
{
	for (int b = 0; b < BS_HIST_BUCKETS; b++)
		atomic_store(&h->bucket[b], 0);
	atomic_store(&h->count, 0);
	atomic_store(&h->sum_us, 0);
}

void
seg_reset_counters(struct seg *s, uint32_t i)
{
	struct seg_comp *c = seg_comp(s, i);

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
		atomic_store(&c->rejected_by[r], 0);
		atomic_store(&c->would_reject[r], 0);
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
}

/* permit.c - admission by compare-and-swap, futex waits, requests in flight, histograms. */
#include <errno.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

/*
 * Every limit is a pair of 32-bit words in the shared segment, a counter and
 * its limit. A permit is taken by one compare-and-swap of the counter from
 * cur to cur + 1 while cur is below the limit, so the limit is never exceeded
 * whatever the number of threads and processes. A waiter sleeps on the
 * counter's own word with FUTEX_WAIT (not the private variant: the word is
 * shared between processes), and whoever decrements it wakes one waiter.
 */

#define RECLAIM_POLL_MS 100	/* a waiter looks for dead holders this often */

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

/* Gives back one unit of counter, waking a waiter if any waits. The waiter
 * raises `waiting` before it reads the counter and we read `waiting` after
 * lowering it, so one of the two always sees the other (both seq_cst). */
static void
give_back(struct seg_comp *c, _Atomic uint32_t *counter)
{
	seg_dec_floor(counter);
	if (atomic_load(&c->waiting) > 0)
		futex_wake(counter);
}

/* One compare-and-swap attempt loop: true if a unit below limit was taken. */
static bool
take_below(_Atomic uint32_t *counter, _Atomic uint32_t *limit)
{
	uint32_t cur = atomic_load(counter);

	while (cur < atomic_load(limit)) {
		if (atomic_compare_exchange_weak(counter, &cur, cur + 1))
			return true;
	}
	return false;
}

static void
raise_peak(_Atomic uint32_t *peak, uint32_t v)
{
	uint32_t p = atomic_load(peak);

	while (v > p && !atomic_compare_exchange_weak(peak, &p, v))
		;
}

/*
 * Takes one unit of counter below limit. Full: reclaims dead holders once,
 * then, if the caller may wait and the compartment allows it, waits on the
 * futex until the deadline. Returns 0, or -1 with *why set.
 */
static int
take(struct seg *s, struct seg_comp *c, _Atomic uint32_t *counter, _Atomic uint32_t *limit,
    bool may_wait, enum bs_reason full, enum bs_reason *why)
{
	uint32_t wait_ms = atomic_load(&c->max_wait_ms), w, cur;
	uint64_t t0, deadline, now;

	if (take_below(counter, limit))
		return 0;
	if (seg_reclaim(s, true) > 0 && take_below(counter, limit))
		return 0;
	*why = full;
	if (!may_wait || wait_ms == 0 || !atomic_load(&c->enforce))
		return -1;
	w = atomic_load(&c->waiting);
	do {
		if (w >= atomic_load(&c->max_waiting)) {
			*why = REASON_TOO_MANY_WAITING;
			return -1;
		}
	} while (!atomic_compare_exchange_weak(&c->waiting, &w, w + 1));
	t0 = now_mono_us();
	deadline = t0 + (uint64_t)wait_ms * 1000;
	*why = REASON_WAIT_TIMEOUT;
	for (;;) {
		cur = atomic_load(counter);
		if (cur < atomic_load(limit)) {
			if (atomic_compare_exchange_weak(counter, &cur, cur + 1)) {
				*why = REASON_MAX;
				break;
			}
			continue;
		}
		now = now_mono_us();
		if (now >= deadline)
			break;
		/* Wake up now and then to take back what dead processes
		 * hold: they will never wake us themselves. */
		futex_wait(counter, cur,
		    deadline - now < RECLAIM_POLL_MS * 1000 ? deadline - now : RECLAIM_POLL_MS * 1000);
		seg_reclaim(s, true);
	}
	seg_dec_floor(&c->waiting);
	seg_hist_add(&c->h_wait, now_mono_us() - t0);
	return *why == REASON_MAX ? 0 : -1;
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

static int
alloc_slot(struct seg *s, uint32_t comp, uint32_t cls, bool over, uint64_t ino)
{
	uint32_t n = s->h->nslots;
	uint32_t start = atomic_fetch_add(&s->hint, 1) % n;

	for (uint32_t k = 0; k < n; k++) {
		uint32_t i = (start + k) % n, expected = SLOT_FREE;
		struct seg_slot *sl = &s->slots[i];

		if (atomic_load_explicit(&sl->state, memory_order_relaxed) != SLOT_FREE)
			continue;
		/* SLOT_INIT (2) keeps readers away until the fields are in. */
		if (!atomic_compare_exchange_strong(&sl->state, &expected, 2))
			continue;
		atomic_store(&sl->comp, comp);
		atomic_store(&sl->cls, cls);
		atomic_store(&sl->over, over ? 1 : 0);
		atomic_store(&sl->inflight, IDLE);
		atomic_store(&sl->connect_us, now_mono_us());
		atomic_store(&sl->inode, ino);
		atomic_store(&sl->holders, 1);
		atomic_store_explicit(&sl->state, SLOT_USED, memory_order_release);
		atomic_store(&s->hint, i + 1);
		return (int)i;
	}
	return -ENOSPC;
}

/* Gives back the connection permit (and class permit) a slot stood for. */
static void
give_back_connection(struct seg *s, struct seg_comp *c, uint32_t cls, bool over)
{
	if (over) {
		seg_dec_floor(&c->over);
		return;
	}
	if (cls < BS_MAX_CLASSES)
		seg_dec_floor(&c->cls[cls].in_use);
	give_back(c, &c->in_use);
	(void)s;
}

int
seg_acquire(struct seg *s, uint32_t comp, uint32_t cls, uint64_t ino, bool may_wait,
    enum bs_reason *why)
{
	struct seg_comp *c;
	struct seg_class *k = NULL;
	enum bs_reason reason = REASON_MAX;
	bool over = false;
	int rec, slot;

	if (comp >= s->h->ncomp)
		return -EINVAL;
	c = &s->comp[comp];
	rec = seg_my_record(s);
	if (rec < 0) {
		*why = REASON_NO_SLOT;
		seg_count_rejection(s, comp, REASON_NO_SLOT);
		return -EBUSY;
	}
	/* A capped class needs its class permit as well as the
	 * compartment's; the class permit is taken first and given back if
	 * the compartment refuses, so it never counts a refused call. */
	if (cls < BS_MAX_CLASSES && atomic_load(&c->cls[cls].limit) != 0) {
		k = &c->cls[cls];
		if (!take_below(&k->in_use, &k->limit)) {
			reason = REASON_CLASS_FULL;
			atomic_fetch_add(&k->rejected, 1);
			k = NULL;
		}
	}
	if (reason == REASON_MAX &&
	    take(s, c, &c->in_use, &c->limit, may_wait, REASON_FULL, &reason) == 0)
		reason = REASON_MAX;
	if (reason != REASON_MAX) {
		if (k != NULL) {
			seg_dec_floor(&k->in_use);
			k = NULL;
		}
		if (atomic_load(&c->enforce)) {
			seg_count_rejection(s, comp, reason);
			*why = reason;
			return -EBUSY;
		}
		/* Observe mode: let it through, say what enforcing would
		 * have done, and keep it apart from the permits proper. */
		atomic_fetch_add(&c->would_reject[reason], 1);
		atomic_fetch_add(&c->over, 1);
		over = true;
	} else {
		raise_peak(&c->peak, atomic_load(&c->in_use) + atomic_load(&c->over));
	}
	if (k != NULL) {
		raise_peak(&k->peak, atomic_load(&k->in_use));
		atomic_fetch_add(&k->admitted, 1);
	}
	slot = alloc_slot(s, comp, k != NULL ? cls : SLOT_NO_CLASS, over, ino);
	if (slot < 0) {
		give_back_connection(s, c, k != NULL ? cls : SLOT_NO_CLASS, over);
		seg_count_rejection(s, comp, REASON_NO_SLOT);
		*why = REASON_NO_SLOT;
		return -EBUSY;
	}
	atomic_store(&s->lcount[slot], 1);
	seg_set_bit(s, rec, (uint32_t)slot);
	atomic_fetch_add(&c->admitted, 1);
	note_rate(c);
	return slot;
}

/* The last holder of slot is gone: every permit it stood for goes back. */
static void
release_slot(struct seg *s, uint32_t slot, bool reclaimed)
{
	struct seg_slot *sl = &s->slots[slot];
	uint32_t comp = atomic_load(&sl->comp);

	if (comp < s->h->ncomp) {
		struct seg_comp *c = &s->comp[comp];
		uint32_t fl = atomic_exchange(&sl->inflight, IDLE);

		if (fl == INFLIGHT)
			give_back(c, &c->inflight);
		else if (fl == INFLIGHT_OVER)
			seg_dec_floor(&c->inflight_over);
		give_back_connection(s, c, atomic_load(&sl->cls), atomic_load(&sl->over) != 0);
		if (reclaimed)
			atomic_fetch_add(&c->reclaimed, 1);
	}
	atomic_store(&sl->inode, 0);
	atomic_store_explicit(&sl->state, SLOT_FREE, memory_order_release);
}

void
seg_unhold(struct seg *s, uint32_t slot, bool reclaimed)
{
	_Atomic uint32_t *h;
	uint32_t cur;

	if (slot >= s->h->nslots)
		return;
	/* Only the holder that takes the count from 1 to 0 releases: a stray
	 * bit meeting a count already at 0 must not release twice. */
	h = &s->slots[slot].holders;
	cur = atomic_load(h);
	while (cur > 0 && !atomic_compare_exchange_weak(h, &cur, cur - 1))
		;
	if (cur == 1)
		release_slot(s, slot, reclaimed);
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
	if (seg_clear_bit(s, rec, slot))
		seg_unhold(s, slot, false);
}

void
seg_connect_done(struct seg *s, uint32_t slot)
{
	struct seg_slot *sl;
	uint64_t t, now;
	uint32_t comp;

	if (slot >= s->h->nslots)
		return;
	sl = &s->slots[slot];
	if (atomic_load_explicit(&sl->connect_us, memory_order_relaxed) == 0)
		return;
	t = atomic_exchange(&sl->connect_us, 0);
	comp = atomic_load(&sl->comp);
	if (t == 0 || comp >= s->h->ncomp)
		return;
	now = now_mono_us();
	seg_hist_add(&s->comp[comp].h_connect, now > t ? now - t : 0);
}

/* ---- requests in flight ---- */

int
seg_inflight_begin(struct seg *s, uint32_t slot, bool may_wait, enum bs_reason *why)
{
	struct seg_slot *sl;
	struct seg_comp *c;
	enum bs_reason reason = REASON_MAX;
	uint32_t comp, state = INFLIGHT, idle = IDLE;

	if (slot >= s->h->nslots)
		return 0;
	sl = &s->slots[slot];
	/* The common case of a request already on its way: one load. */
	if (atomic_load_explicit(&sl->inflight, memory_order_relaxed) != IDLE)
		return 0;
	comp = atomic_load(&sl->comp);
	if (comp >= s->h->ncomp)
		return 0;
	c = &s->comp[comp];
	if (take(s, c, &c->inflight, &c->inflight_limit, may_wait, REASON_INFLIGHT_FULL,
	    &reason) < 0) {
		if (atomic_load(&c->enforce)) {
			seg_count_rejection(s, comp, reason);
			*why = reason;
			return -EBUSY;
		}
		atomic_fetch_add(&c->would_reject[reason], 1);
		atomic_fetch_add(&c->inflight_over, 1);
		state = INFLIGHT_OVER;
	}
	atomic_store(&sl->sent_us, now_mono_us());
	if (!atomic_compare_exchange_strong(&sl->inflight, &idle, state)) {
		/* Another thread's send on the same socket won: one request. */
		if (state == INFLIGHT)
			give_back(c, &c->inflight);
		else
			seg_dec_floor(&c->inflight_over);
		return 0;
	}
	if (state == INFLIGHT)
		raise_peak(&c->inflight_peak, atomic_load(&c->inflight));
	atomic_fetch_add(&c->inflight_admitted, 1);
	return 1;
}

static void
inflight_finish(struct seg *s, uint32_t slot, bool record)
{
	struct seg_slot *sl;
	struct seg_comp *c;
	uint32_t comp, fl;

	if (slot >= s->h->nslots)
		return;
	sl = &s->slots[slot];
	if (atomic_load_explicit(&sl->inflight, memory_order_relaxed) == IDLE)
		return;
	fl = atomic_exchange(&sl->inflight, IDLE);
	comp = atomic_load(&sl->comp);
	if (fl == IDLE || comp >= s->h->ncomp)
		return;
	c = &s->comp[comp];
	if (record) {
		uint64_t t = atomic_load(&sl->sent_us), now = now_mono_us();

		seg_hist_add(&c->h_reply, now > t ? now - t : 0);
	}
	if (fl == INFLIGHT)
		give_back(c, &c->inflight);
	else
		seg_dec_floor(&c->inflight_over);
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

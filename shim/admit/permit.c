/* permit.c - admission by compare-and-swap, futex waits, slots, requests in flight, histograms. */
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
 */
#define RECLAIM_POLL_MS	100	/* a waiter looks for dead holders this often */





uint32_t
seg_dec_floor(_Atomic uint32_t *v)
{
	uint32_t cur = atomic_load(v);

	/* A damaged segment must not wrap a count around to 4 billion. */
	while (cur > 0 && !atomic_compare_exchange_weak(v, &cur, cur - 1))
		;
	return cur > 0 ? cur - 1 : 0;
}


__attribute__((noinline)) uint32_t
seg_fleet_limit(const struct seg_comp *c, uint32_t lim)
{
	uint32_t share;

	if (now_mono_ms() < atomic_load_explicit(&c->fleet_expiry_ms, memory_order_acquire))
		share = atomic_load_explicit(&c->fleet_share, memory_order_relaxed);
	else
		share = atomic_load_explicit(&c->fleet_floor, memory_order_relaxed);
	return share < lim ? share : lim;
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

/* ---- waiting ---- */

/*
 * One attempt at permit kind p for slot, of compartment c; for a
 * connection in a pool, the pool's permit after the compartment's
 * (pool.c), and the compartment's given back, here and only here, when the
 * pool has none. On TALLY_FULL, *word is the word to sleep on and *why the
 * reason.
 */
static inline __attribute__((always_inline)) int
take_step(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen, int p, uint32_t *seen,
    _Atomic uint32_t **word, enum bs_reason *why)
{
	uint32_t took = 0;
	int r = p == P_CONN ? tally_take_conn(s, slot, gen, c, seen, &took) :
	    tally_take(s, slot, gen, p, 0, seen);
	struct seg_pool *pool;

	if (r != TALLY_TAKEN || p != P_CONN || (pool = seg_pool_at(s, c)) == NULL)
		return r;
	/* The take made in_use *seen + 1: within the guarantee or not. */
	r = pool_take(s, c, pool, slot, gen, took, *seen + 1, seen, word);
	if (r == TALLY_TAKEN)
		return r;
	tally_give(s, slot, gen, P_CONN);
	if (r == TALLY_FULL)
		*why = REASON_POOL_FULL;
	return r;
}

/*
 * Takes permit kind p for slot, waiting for one when full if the caller may
 * wait (`wait`: WAIT_NEVER, WAIT_ALWAYS, or the descriptor whose blocking
 * mode is asked only now) and the compartment allows it: reclaims dead
 * holders once (and for a connection, if none was dead, reconciles its
 * compartment or pool), then sleeps on the tally's count word until the
 * deadline. The slot is marked MARK_WAITING while counted in `waiting`.
 * TALLY_TAKEN, TALLY_BUSY, or TALLY_FULL with *why.
 */
static int
take_wait(struct seg *s, uint32_t slot, uint32_t gen, int p, int wait, enum bs_reason full,
    enum bs_reason *why)
{
	struct seg_slot *sl = &s->slots[slot];
	struct seg_comp *c = seg_slot_comp(s, sl);
	_Atomic uint32_t *count = tally_of(s, sl, p, NULL), *word = count;
	enum bs_reason reason = full;
	uint32_t wait_ms, w, seen;
	uint64_t t0, deadline, now;
	int r;

	if (c == NULL || count == NULL)
		return TALLY_BUSY;
	if ((r = take_step(s, c, slot, gen, p, &seen, &word, &reason)) != TALLY_FULL)
		return r;
	/* What dead holders hold goes back first; then, for a connection,
	 * what sockets closed unseen hold (reconcile.c). */
	if (seg_reclaim(s, true) > 0 ||
	    (p == P_CONN && reconcile_refused(s, (uint32_t)(c - s->comp), reason) > 0)) {
		word = count;
		reason = full;
		if ((r = take_step(s, c, slot, gen, p, &seen, &word, &reason)) != TALLY_FULL)
			return r;
	}
	*why = reason;
	wait_ms = seg_max_wait_ms(c);
	if (wait == WAIT_NEVER || wait_ms == 0 || !atomic_load(&c->enforce) ||
	    (wait >= 0 && (s->blocking == NULL || !s->blocking(wait, 0))))
		return TALLY_FULL;
	/* op_pid names the waiter, for seg_resolve if it dies waiting. */
	if (atomic_load(&sl->mark) & MARK_WAITING)
		return TALLY_FULL;
	atomic_store(&sl->op_pid, s->my_pid);
	if (!slot_mark_change(sl, gen, 0, MARK_WAITING, 0, MARK_WAITING))
		return TALLY_FULL;
	w = atomic_load(&c->waiting);
	do {
		if (w >= atomic_load(&c->max_waiting)) {
			slot_mark_change(sl, gen, MARK_WAITING, 0, MARK_WAITING, 0);
			*why = REASON_TOO_MANY_WAITING;
			return TALLY_FULL;
		}
	} while (!atomic_compare_exchange_weak(&c->waiting, &w, w + 1));
	t0 = now_mono_us();
	deadline = t0 + (uint64_t)wait_ms * 1000;
	*why = REASON_WAIT_TIMEOUT;
	/* A pool's frees wake its sleepers (pool_wake). */
	pool_sleepers(s, c, 1);
	for (;;) {
		word = count;
		r = take_step(s, c, slot, gen, p, &seen, &word, &reason);
		if (r != TALLY_FULL)
			break;
		now = now_mono_us();
		if (now >= deadline)
			break;
		/* Wake up now and then to take back what dead processes
		 * hold: they will never wake us themselves. */
		futex_wait(word, seen,
		    deadline - now < RECLAIM_POLL_MS * 1000 ? deadline - now : RECLAIM_POLL_MS * 1000);
		seg_reclaim(s, true);
	}
	pool_sleepers(s, c, -1);
	/* The count goes down before the mark: dying in between makes a
	 * reclaimer take one off again, an error that vanishes at 0. */
	seg_dec_floor(&c->waiting);
	slot_mark_change(sl, gen, MARK_WAITING, 0, MARK_WAITING, 0);
	seg_hist_add(&c->h_wait, now_mono_us() - t0);
	return r;
}

void
seg_hist_add_n(struct seg_hist *h, uint64_t us, uint64_t n)
{
	unsigned b = us == 0 ? 0 : 64 - (unsigned)__builtin_clzll(us);

	if (b >= BS_HIST_BUCKETS)
		b = BS_HIST_BUCKETS - 1;
	atomic_fetch_add(&h->bucket[b], n);
	atomic_fetch_add(&h->sum_us, us * n);
	atomic_fetch_add(&h->count, n);
}

void
seg_hist_add(struct seg_hist *h, uint64_t us)
{
	seg_hist_add_n(h, us, 1);
}

/* Counts one admission at second sec (CLOCK_MONOTONIC) in the per-second
 * ring and the peak rate. Returns the admissions of that second, this one
 * in. */
static uint32_t
note_rate(struct seg_comp *c, uint64_t sec)
{
	uint64_t e, next;
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
	return (uint32_t)next;
}

const char *
seg_reason_name(enum bs_reason why)
{
	static const char *names[REASON_MAX] = {
		"full", "inflight_full", "wait_timeout", "too_many_waiting", "class_full", "no_slot",
		"pool_full", "class_shared_full",
	};

	return (unsigned)why < REASON_MAX ? names[why] : "unknown";
}

void
seg_count_rejection(struct seg *s, uint32_t comp, enum bs_reason why)
{
	struct seg_comp *c = seg_comp(s, comp);
	struct seg_pool *pool;

	if (c == NULL || (unsigned)why >= REASON_MAX)
		return;
	atomic_fetch_add(seg_reason_count(c, why, false), 1);
	if (why == REASON_POOL_FULL && (pool = seg_pool_of(s, c)) != NULL)
		atomic_fetch_add(&pool->rejected, 1);
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
	uint32_t n = s->nslots, i = atomic_load_explicit(&s->hint, memory_order_relaxed);

	/* The hint is where the last claim ended: a start, not a promise;
	 * threads racing from the same place are told apart by the CAS. */
	if (i >= n)
		i = 0;
	for (uint32_t k = 0; k < n; k++, i = i + 1 < n ? i + 1 : 0) {
		uint32_t expected = SLOT_FREE;
		struct seg_slot *sl = &s->slots[i];
		uint64_t m;

		if (atomic_load_explicit(&sl->state, memory_order_relaxed) != SLOT_FREE)
			continue;
		/* A slot this process still has descriptors recorded for was
		 * released by a reconcile elsewhere (reconcile.c): those stale
		 * entries must go before the slot can stand for a socket of
		 * ours again, or their drop would release the new one. */
		if (atomic_load_explicit(&s->lcount[i], memory_order_relaxed) != 0)
			continue;
		/* SLOT_INIT keeps readers away until the fields are in; it
		 * names us, so a reclaimer finishes the slot only if we die. */
		if (!atomic_compare_exchange_strong(&sl->state, &expected,
		    SLOT_BUSY(SLOT_INIT, s->my_pid)))
			continue;
		atomic_store(&sl->op_pid, s->my_pid);
		/* A new generation keeps the sequence (tally.c's stamps). */
		m = atomic_load(&sl->mark);
		atomic_store(&sl->mark, MARK_OF_GEN(MARK_GEN(m) + 1) | ((m + MARK_SEQ_ONE) & MARK_SEQ));
		atomic_store(&sl->comp, SLOT_NO_COMP);
		atomic_store(&sl->cls, SLOT_NO_CLASS);
		atomic_store(&sl->connect_us, 0);
		atomic_store(&sl->inode, ino);
		seg_hold_first(s, rec, i);
		atomic_store_explicit(&sl->state, SLOT_USED, memory_order_release);
		atomic_store_explicit(&s->hint, i + 1, memory_order_relaxed);
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
	uint32_t gen;

	if (slot >= s->nslots)
		return false;
	gen = MARK_GEN(atomic_load(&s->slots[slot].mark));
	return tally_held(s, slot, gen, P_CONN) || tally_held(s, slot, gen, P_OVER);
}

bool
seg_slot_pending(const struct seg *s, uint32_t slot)
{
	return slot < s->nslots && atomic_load(&s->slots[slot].comp) == SLOT_NO_COMP &&
	    atomic_load(&s->slots[slot].state) == SLOT_USED;
}

/*
 * The classes of c split it as a pool's compartments split the pool
 * (share.c): after the class permit, whose take made the class's count v,
 * one of c's unguaranteed part unless v is within the class's guarantee.
 * On failure the class permit is given back here. While c lends more
 * than its unguaranteed part (a guarantee raised live) nothing is admitted
 * until it drains, as for a pool.
 */
static int
class_share(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c, uint32_t cls,
    uint32_t v)
{
	uint32_t seen;
	int r = TALLY_FULL;

	if (atomic_load(&c->cls_lent) <= atomic_load(&c->cls_shared))
		r = share_take(s, slot, gen, SHARE_CLASS, v, &c->cls_guaranteed[cls], &seen);
	if (r != TALLY_TAKEN)
		tally_give(s, slot, gen, P_CLASS);
	return r;
}

/*
 * The permits of capped class cls of compartment comp: the class's own,
 * then, if the classes share comp, one of its unguaranteed part. When
 * either is missing, dead holders and sockets gone unseen may hold it
 * (reconcile_class_full), and both are tried once more. REASON_MAX when
 * taken, else the reason.
 */
static enum bs_reason
class_take(struct seg *s, uint32_t slot, uint32_t gen, uint32_t comp, uint32_t cls)
{
	struct seg_comp *c = &s->comp[comp];
	enum bs_reason why;
	uint32_t seen;

	for (bool again = false;; again = true) {
		why = REASON_CLASS_FULL;
		if (tally_take(s, slot, gen, P_CLASS, 0, &seen) == TALLY_TAKEN) {
			if (!atomic_load_explicit(&c->cls_shares, memory_order_relaxed) ||
			    class_share(s, slot, gen, c, cls, seen + 1) == TALLY_TAKEN)
				return REASON_MAX;
			why = REASON_CLASS_SHARED_FULL;
		}
		if (again || reconcile_class_full(s, comp) == 0)
			return why;
	}
}

/* admit_slot's class step, out of line: a capped class needs its class
 * permit as well as the compartment's. The class permit is taken first and
 * given back if the compartment refuses, so it never counts a refused call.
 * REASON_MAX with *k the class when taken, else the reason. */
static __attribute__((noinline)) enum bs_reason
admit_class(struct seg *s, uint32_t slot, uint32_t gen, uint32_t comp, uint32_t cls,
    struct seg_class **k)
{
	struct seg_class *kc = &s->comp[comp].cls[cls];
	enum bs_reason reason;

	atomic_store(&s->slots[slot].cls, cls);
	reason = class_take(s, slot, gen, comp, cls);
	if (reason != REASON_MAX)
		atomic_fetch_add(&kc->rejected, 1);
	else
		*k = kc;
	return reason;
}

/* admit_slot after a refusal for `reason`, out of line: the class permits
 * taken go back; enforcing, the slot is pending again and -EBUSY; in
 * observe mode the connect goes through (0), counted apart. */
static __attribute__((noinline)) int
admit_refused(struct seg *s, uint32_t slot, uint32_t gen, uint32_t comp, struct seg_class *k,
    enum bs_reason reason, enum bs_reason *why)
{
	struct seg_slot *sl = &s->slots[slot];
	struct seg_comp *c = &s->comp[comp];
	struct seg_pool *pool;
	uint32_t seen;

	if (k != NULL)
		share_give(s, slot, gen, SHARE_CLASS);
	if (atomic_load(&c->enforce) || reason == REASON_NO_SLOT) {
		seg_count_rejection(s, comp, reason);
		/* A request another thread began meanwhile on the socket
		 * (seg_request_begin) is of the old generation and undone
		 * with it. */
		tally_renew(s, slot, gen);
		atomic_store(&sl->cls, SLOT_NO_CLASS);
		atomic_store(&sl->comp, SLOT_NO_COMP);
		*why = reason;
		return -EBUSY;
	}
	/* Observe mode: let it through, say what enforcing would have done,
	 * and keep it apart from the permits proper. */
	atomic_fetch_add(seg_reason_count(c, reason, true), 1);
	tally_take(s, slot, gen, P_OVER, 0, &seen);
	/* Let past the pool as well: in its use and its peak. */
	if ((pool = seg_pool_at(s, c)) != NULL)
		pool_note_use(pool);
	return 0;
}

/*
 * Takes the permits of compartment comp (and class cls) for the pending
 * slot, which this process holds. Returns 0, or -EBUSY with *why, or
 * -EALREADY when another holder (a forked process sharing the socket) is
 * already admitting it.
 */
static int
admit_slot(struct seg *s, uint32_t slot, uint32_t comp, uint32_t cls, int wait,
    enum bs_reason *why)
{
	struct seg_slot *sl = &s->slots[slot];
	struct seg_comp *c = &s->comp[comp];
	struct seg_class *k = NULL;
	enum bs_reason reason = REASON_MAX;
	uint32_t gen = MARK_GEN(atomic_load(&sl->mark)), none = SLOT_NO_COMP, seen, n;
	uint64_t now;
	int r;

	if (!atomic_compare_exchange_strong(&sl->comp, &none, comp))
		return -EALREADY;
	if (__builtin_expect(cls < BS_MAX_CLASSES && atomic_load(&c->cls[cls].limit) != 0, 0))
		reason = admit_class(s, slot, gen, comp, cls, &k);
	if (reason == REASON_MAX) {
		_Atomic uint32_t *word;

		ad_tick(s, c, P_CONN);	/* a stalled backend, seen without replies */
		r = take_step(s, c, slot, gen, P_CONN, &seen, &word, &reason);
		if (__builtin_expect(r == TALLY_FULL, 0))
			r = take_wait(s, slot, gen, P_CONN, wait, REASON_FULL, &reason);
		if (__builtin_expect(r == TALLY_TAKEN, 1))
			reason = REASON_MAX;	/* take_wait named the reason it waited for */
		else if (r == TALLY_BUSY)
			reason = REASON_NO_SLOT;
	}
	if (__builtin_expect(reason != REASON_MAX, 0)) {
		if (admit_refused(s, slot, gen, comp, k, reason, why) < 0)
			return -EBUSY;
		k = NULL;
	}
	raise_peak(&c->peak, atomic_load(&c->in_use) + atomic_load(&c->over));
	/* A pool's peak is noted by pool_take (pool_note_use). */
	if (k != NULL) {
		raise_peak(&k->peak, atomic_load(&k->in_use));
		atomic_fetch_add(&k->admitted, 1);
	}
	/* The rate counts from the coarse clock's second. A busy compartment
	 * has its connects sampled (CONNECT_EXACT), as its replies are, and
	 * only a connect that is timed, or one of an adaptive compartment
	 * (whose lifetime and stalls the controller reads), reads the clock
	 * to the microsecond: once here and once at the end of the connect. */
	atomic_fetch_add(&c->admitted, 1);
	n = note_rate(c, now_mono_s());
	now = 0;
	if (__builtin_expect(n <= CONNECT_EXACT, 0)) {
		now = now_mono_us();
		atomic_store_explicit(&sl->connect_us, now, memory_order_relaxed);
	} else if (n % REQ_SAMPLE == 0) {
		now = now_mono_us();
		atomic_store_explicit(&sl->connect_us, now | SENT_WEIGHTED, memory_order_relaxed);
	}
	if (atomic_load_explicit(&c->ad.mode, memory_order_relaxed) == AD_ON && now == 0)
		now = now_mono_us();
	/* 0 for a connect admitted untimed (the adaptive limit off): no
	 * lifetime to sample if it is switched on before the close. */
	atomic_store(&sl->admit_us, now);
	return 0;
}

int
seg_acquire(struct seg *s, uint32_t comp, uint32_t cls, uint64_t ino, bool may_wait,
    enum bs_reason *why)
{
	int rec, slot, r;

	if (comp >= s->ncomp)
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
	r = admit_slot(s, (uint32_t)slot, comp, cls, may_wait ? WAIT_ALWAYS : WAIT_NEVER, why);
	if (r < 0) {
		seg_drop_hold(s, rec, (uint32_t)slot, false);
		return -EBUSY;
	}
	atomic_store(&s->lcount[slot], 1);
	return slot;
}

int
seg_acquire_pending(struct seg *s, uint32_t slot, uint32_t comp, uint32_t cls, int wait,
    enum bs_reason *why)
{
	if (comp >= s->ncomp || slot >= s->nslots)
		return -EINVAL;
	return admit_slot(s, slot, comp, cls, wait, why);
}

/* A connection of an adaptive compartment without max_inflight ended: its
 * lifetime is the request's latency. */
static void
adaptive_conn_done(struct seg_comp *c, struct seg_slot *sl)
{
	uint64_t t = atomic_load(&sl->admit_us), now;

	if (t == 0 || atomic_load_explicit(&c->ad.mode, memory_order_relaxed) != AD_ON)
		return;
	now = now_mono_us();
	ad_sample(c, P_CONN, now > t ? now - t : 0, now);
}

/* The release of a slot this process has claimed (state busy = RELEASING
 * with our pid): every permit it stood for goes back, then it is free. */
static void
release_claimed(struct seg *s, uint32_t slot, uint32_t busy, bool reclaimed)
{
	struct seg_slot *sl = &s->slots[slot];
	struct seg_comp *c = seg_slot_comp(s, sl);
	/* The compartment's pool, looked up once for all of the release. */
	struct seg_pool *pool = c != NULL ? seg_pool_at(s, c) : NULL;
	uint64_t m = atomic_load(&sl->mark), had;
	uint32_t gen = MARK_GEN(m);

	/* The pool's use statistic goes down first, before the hand-over
	 * below frees a place for a borrower and before the permit goes, as
	 * a take counts it after its permits: it never reads more than the
	 * pool has in use. Every admitted slot was counted (observe mode's
	 * too); one refused has no compartment. */
	if (pool != NULL)
		pool_note_release(pool);
	/* A permit within a guarantee goes: one lent to the same
	 * compartment (class) moves onto it, and the shared part has it
	 * back at once. Before this slot's own permit goes, so that a
	 * borrower arriving later finds the place free instead (share.c). */
	if (m & (MARK_GUARANTEED(SHARE_POOL) | MARK_GUARANTEED(SHARE_CLASS)))
		share_released(s, slot, m, c, pool);
	/* Every kind held goes back (last kind first), then the slot is
	 * marked released, so that a take landing after this undoes itself
	 * (tally.c). */
	had = tally_release(s, slot, gen, c, pool);
	if (had & (MARK_HELD(P_CONN) | MARK_HELD(P_OVER))) {
		if (c != NULL && reclaimed)
			atomic_fetch_add(&c->reclaimed, 1);
		else if (c != NULL)
			adaptive_conn_done(c, sl);
	}
	atomic_store(&sl->inode, 0);
	/* Only if the release is still ours: after a stall long enough to
	 * be taken for dead, someone else finished it and the slot may
	 * belong to a new socket now. */
	atomic_compare_exchange_strong(&sl->state, &busy, SLOT_FREE);
}

void
seg_release_slot(struct seg *s, uint32_t slot, bool reclaimed)
{
	uint32_t used = SLOT_USED, busy = SLOT_BUSY(SLOT_RELEASING, s->my_pid);

	if (atomic_compare_exchange_strong(&s->slots[slot].state, &used, busy))
		release_claimed(s, slot, busy, reclaimed);
}

void
seg_release_orphan(struct seg *s, uint32_t slot, pid_t dead)
{
	struct seg_slot *sl;
	uint32_t st, busy;

	if (slot >= s->nslots)
		return;
	sl = &s->slots[slot];
	st = atomic_load(&sl->state);
	busy = SLOT_BUSY(SLOT_RELEASING, s->my_pid);
	switch (SLOT_KIND(st)) {
	case SLOT_USED:
		/* Its last holder dropped it and died before releasing. */
		if (atomic_load(&sl->holders) == 0)
			seg_release_slot(s, slot, true);
		return;
	case SLOT_INIT:
		/* Dead while setting it up: no permit was taken yet. */
		if (dead > 0 && SLOT_BY(st) == dead)
			atomic_compare_exchange_strong(&sl->state, &st, SLOT_FREE);
		return;
	case SLOT_RELEASING:
		/* Dead half-way through the release: finish it. */
		if (dead > 0 && SLOT_BY(st) == dead &&
		    atomic_compare_exchange_strong(&sl->state, &st, busy))
			release_claimed(s, slot, busy, true);
		return;
	}
}

void
seg_hold(struct seg *s, uint32_t slot)
{
	if (slot >= s->nslots || atomic_load(&s->rec) < 0)
		return;
	atomic_fetch_add(&s->lcount[slot], 1);
}

void
seg_drop(struct seg *s, uint32_t slot)
{
	int rec = atomic_load(&s->rec);
	_Atomic uint32_t *lc;
	uint32_t n;

	if (slot >= s->nslots || rec < 0)
		return;
	/* The last local descriptor (the common case: 1 -> 0) drops the
	 * process's hold; the floor at 0 guards against a count gone wrong. */
	lc = &s->lcount[slot];
	n = atomic_load_explicit(lc, memory_order_relaxed);
	do {
		if (n == 0)
			break;
	} while (!atomic_compare_exchange_weak(lc, &n, n - 1));
	if (n > 1)
		return;
	seg_drop_hold(s, rec, slot, false);
}

void
seg_connect_time(struct seg *s, uint32_t slot, struct seg_comp *c)
{
	uint64_t t, now, us;

	/* Once: the exchange decides who times it. */
	if ((t = atomic_exchange(&s->slots[slot].connect_us, 0)) == 0)
		return;
	now = now_mono_us();
	us = now > (t & ~SENT_WEIGHTED) ? now - (t & ~SENT_WEIGHTED) : 0;
	seg_hist_add_n(&c->h_connect, us, (t & SENT_WEIGHTED) ? REQ_SAMPLE : 1);
}

void
seg_connect_done(struct seg *s, uint32_t slot)
{
	struct seg_comp *c;

	if (slot >= s->nslots || (c = seg_slot_comp(s, &s->slots[slot])) == NULL)
		return;
	seg_connect_done_in(s, slot, c);
}

/* ---- requests in flight ---- */

/* The slow end of seg_request_begin: the take found the compartment full
 * (r == TALLY_FULL) or the slot busy. Waits if it may; refuses with *why
 * (-EBUSY) when enforcing, else lets the request through apart from the
 * permits (P_INFLIGHT_OVER). 1 if the request is counted, 0 if not. */
static __attribute__((noinline)) int
request_full(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c, int r,
    bool may_wait, enum bs_reason *why)
{
	enum bs_reason reason = REASON_MAX;
	uint32_t seen;

	if (r == TALLY_FULL)
		r = take_wait(s, slot, gen, P_INFLIGHT, may_wait ? WAIT_ALWAYS : WAIT_NEVER,
		    REASON_INFLIGHT_FULL, &reason);
	if (r == TALLY_BUSY)
		return 0;	/* a request already on its way, or another thread's won */
	if (r == TALLY_FULL) {
		if (atomic_load(&c->enforce)) {
			seg_count_rejection(s, atomic_load(&s->slots[slot].comp), reason);
			*why = reason;
			return -EBUSY;
		}
		atomic_fetch_add(seg_reason_count(c, reason, true), 1);
		return tally_take(s, slot, gen, P_INFLIGHT_OVER, MARK_HELD(P_INFLIGHT), &seen) ==
		    TALLY_TAKEN;
	}
	raise_peak(&c->inflight_peak, atomic_load(&c->inflight));
	return 1;
}

/* A timed request begins now (flag: SENT_WEIGHTED if one of REQ_SAMPLE). */
static __attribute__((noinline)) void
request_timed(struct seg_slot *sl, uint64_t flag)
{
	atomic_store_explicit(&sl->sent_us, now_mono_us() | flag, memory_order_relaxed);
}

/* A request of c on slot sl is counted: the reply latency of one in
 * REQ_SAMPLE of the compartment is timed, and recorded with that weight;
 * every one while its adaptive limit (which needs them all) is on. */
static inline __attribute__((always_inline)) void
request_counted(struct seg_slot *sl, struct seg_comp *c, bool adaptive)
{
	uint64_t k = atomic_fetch_add_explicit(&c->inflight_admitted, 1, memory_order_relaxed);

	if (adaptive)
		request_timed(sl, 0);
	else if (__builtin_expect(k % REQ_SAMPLE == 0, 0))
		request_timed(sl, SENT_WEIGHTED);
	else if (atomic_load_explicit(&sl->sent_us, memory_order_relaxed) != 0)
		atomic_store_explicit(&sl->sent_us, 0, memory_order_relaxed);
}

int
seg_request_begin(struct seg *s, uint32_t slot, uint64_t m, struct seg_comp *c, bool may_wait,
    enum bs_reason *why)
{
	struct seg_slot *sl = &s->slots[slot];
	uint32_t gen = MARK_GEN(m), seen;
	bool adaptive;
	int r;

	if (c == NULL)
		return 0;
	/* One let through by observe mode is looked for only if there is
	 * one; a request already on its way makes the take below busy. */
	if (__builtin_expect(atomic_load_explicit(&c->inflight_over, memory_order_relaxed) != 0, 0) &&
	    tally_held_at(s, slot, gen, P_INFLIGHT_OVER, &c->inflight_over))
		return 0;
	adaptive = ad_on(c, P_INFLIGHT);
	if (adaptive)
		ad_tick(s, c, P_INFLIGHT);	/* a stalled backend, seen without replies */
	/* A socket whose admission is still under way may take one: if the
	 * admission is refused, the slot's generation moves on and the take
	 * is undone (admit_slot). */
	r = tally_take_inflight(s, slot, m, c, &seen);
	if (__builtin_expect(r != TALLY_TAKEN, 0) ||
	    __builtin_expect(seen + 1 > atomic_load_explicit(&c->inflight_peak,
	    memory_order_relaxed), 0)) {
		r = request_full(s, slot, gen, c, r, may_wait, why);
		if (r <= 0)
			return r;
	}
	request_counted(sl, c, adaptive);
	return 1;
}

/*
 * seg_request_begin's common case alone: no request let through by observe
 * mode, no adaptive limit, the take on the slot's own give with room and
 * no new peak. 1 if the request is counted, 0 if not (the slot was
 * released meanwhile), -1 if it is not that case (nothing done: the
 * caller goes seg_request_begin's whole way).
 */
int
seg_request_quick(struct seg *s, uint32_t slot, uint64_t m, struct seg_comp *c)
{
	uint32_t seen;
	int r;

	if (__builtin_expect(atomic_load_explicit(&c->inflight_over, memory_order_relaxed) != 0 ||
	    atomic_load_explicit(&c->ad.mode, memory_order_relaxed) == AD_ON, 0))
		return -1;
	r = tally_take_inflight_own(s, slot, m, c, &seen);
	if (__builtin_expect(r == TALLY_MISS, 0))
		return -1;
	if (__builtin_expect(r != TALLY_TAKEN, 0))
		return 0;
	if (__builtin_expect(seen + 1 > atomic_load_explicit(&c->inflight_peak,
	    memory_order_relaxed), 0))
		raise_peak(&c->inflight_peak, atomic_load(&c->inflight));
	request_counted(&s->slots[slot], c, false);
	return 1;
}

int
seg_inflight_begin(struct seg *s, uint32_t slot, bool may_wait, enum bs_reason *why)
{
	struct seg_slot *sl = seg_slot(s, slot);
	uint64_t m;

	if (sl == NULL)
		return 0;
	m = atomic_load_explicit(&sl->mark, memory_order_acquire);
	return seg_request_begin(s, slot, m, seg_slot_comp(s, sl), may_wait, why);
}

/* The end of a timed request (sent_us t, read before its give): its
 * reply latency, with its weight. */
static __attribute__((noinline)) void
reply_timed(struct seg_slot *sl, struct seg_comp *c, uint64_t t, bool record)
{
	uint64_t sent = t, now, us;

	/* Cleared unless a new request began meanwhile. */
	atomic_compare_exchange_strong(&sl->sent_us, &sent, 0);
	if (!record)
		return;
	now = now_mono_us();
	us = now > (t & ~SENT_WEIGHTED) ? now - (t & ~SENT_WEIGHTED) : 0;
	seg_hist_add_n(&c->h_reply, us, (t & SENT_WEIGHTED) ? REQ_SAMPLE : 1);
	ad_sample(c, P_INFLIGHT, us, now);
}

/* seg_request_end's whole way (t: sent_us, read before the give). */
static __attribute__((noinline)) void
request_end(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c, uint64_t t,
    bool record)
{
	if (!tally_give_inflight(s, slot, gen, c) &&
	    (__builtin_expect(atomic_load_explicit(&c->inflight_over, memory_order_relaxed) == 0, 1) ||
	    !tally_give(s, slot, gen, P_INFLIGHT_OVER)))
		return;
	if (__builtin_expect(t != 0, 0))
		reply_timed(&s->slots[slot], c, t, record);
}

/* The common case (an untimed request, the give on the slot's own take)
 * without a frame; the rest in request_end. */
void
seg_request_end(struct seg *s, uint32_t slot, uint64_t m, struct seg_comp *c, bool record)
{
	uint32_t gen = MARK_GEN(m);
	uint64_t t;

	if (c == NULL)
		return;
	/* Read before the give: a request that begins after it (another
	 * thread's) must not have its start taken for ours. */
	t = atomic_load_explicit(&s->slots[slot].sent_us, memory_order_relaxed);
	if (__builtin_expect(t == 0, 1) && tally_give_inflight_own(s, slot, gen, c))
		return;
	request_end(s, slot, gen, c, t, record);
}

static void
inflight_finish(struct seg *s, uint32_t slot, bool record)
{
	struct seg_slot *sl = seg_slot(s, slot);
	uint64_t m;

	if (sl == NULL)
		return;
	m = atomic_load_explicit(&sl->mark, memory_order_acquire);
	seg_request_end(s, slot, m, seg_slot_comp(s, sl), record);
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
		atomic_store(seg_reason_count(c, (enum bs_reason)r, false), 0);
		atomic_store(seg_reason_count(c, (enum bs_reason)r, true), 0);
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
	ad_reset_stats(c);
}

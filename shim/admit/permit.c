/* permit.c - admission: a connect's permits taken by compare-and-swap, waited for, refused; requests in flight. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "admit/pool.h"
#include "admit/slot.h"
#include "log.h"
#include "sys.h"

/*
 * Every limit is a pair of words in the shared segment, a counter and its
 * limit. A permit is taken by one compare-and-swap of the counter from cur
 * to cur + 1 while cur is below the limit, so the limit is never exceeded
 * whatever the number of threads and processes (tally.c). A waiter sleeps
 * on the counter's own word with FUTEX_WAIT (not the private variant: the
 * word is shared between processes), and whoever lowers it wakes one
 * waiter.
 *
 * A connect's permits, in order: the class's, if its class is capped (and
 * one of the compartment's unguaranteed part, if the classes share it);
 * the compartment's connection permit; and for a compartment in a pool,
 * the pool's (within the guarantee, or lent). Each level gives back what
 * it took when a later one refuses, so nothing counts a refused call.
 */
#define RECLAIM_POLL_MS	100	/* a waiter looks for dead holders this often */

static void
raise_peak(_Atomic uint32_t *peak, uint32_t v)
{
	uint32_t p = atomic_load(peak);

	while (v > p && !atomic_compare_exchange_weak(peak, &p, v))
		;
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

__attribute__((noinline)) void
permit_tick(struct seg *s, struct seg_comp *c, int p)
{
	uint64_t now, old, start, inflight, n, sum;

	if (!ad_on(c, p) || !ad_stall_due(c, (uint32_t)(c - s->comp), &now, &old, &start))
		return;
	slot_ages(s, c, p, now, old, &inflight, &n, &sum);
	ad_stall(c, start, now, n, sum, inflight);
}

/* permit_tick on an admission attempt: one load, inline, when c is not
 * adaptive. */
static inline void
tick(struct seg *s, struct seg_comp *c, int p)
{
	if (__builtin_expect(atomic_load_explicit(&c->ad.mode, memory_order_relaxed) != AD_ON, 1))
		return;
	permit_tick(s, c, p);
}

/* ---- waiting ---- */

/* The pool's permit after the compartment's (pool.h), whose take wrote tag
 * `took` and made in_use v: the permits taken before it (`had`, MARK_HELD
 * flags: the compartment's, the joint count's) go back when it is
 * refused. */
static inline __attribute__((always_inline)) enum take
pool_step(struct seg *s, struct seg_comp *c, struct seg_pool *pool, uint32_t slot, uint32_t gen,
    uint32_t took, uint32_t v, uint64_t had, uint32_t *seen, _Atomic uint32_t **word,
    enum bs_reason *why)
{
	enum take r = pool_take(s, c, pool, slot, gen, took, v, seen, word);

	if (r == TAKE_OK)
		return r;
	if (had & MARK_HELD(P_KERN))
		tally_give(s, c, slot, gen, P_KERN);
	tally_give(s, c, slot, gen, P_CONN);
	if (r == TAKE_FULL)
		*why = REASON_POOL_FULL;
	return r;
}

/*
 * take_step after the connection permit of a compartment that a kernel
 * engine counts too, out of line: the joint count's permit (kjoint.c),
 * then the pool's if c is in one; the permits taken go back when one is
 * refused. Admitted, socket fd (when admission has one, >= 0) is marked
 * the library's, for the engine's program: only now, so that a socket the
 * library refused is never passed uncounted.
 */
static __attribute__((noinline, cold)) enum take
kern_step(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen, uint32_t took,
    uint32_t *seen, _Atomic uint32_t **word, enum bs_reason *why, int fd)
{
	uint32_t v = *seen + 1;
	struct seg_pool *pool;
	enum take r = kjoint_take(s, c, slot, gen, seen);

	if (r != TAKE_OK) {
		tally_give(s, c, slot, gen, P_CONN);
		*word = &c->in_use;
		*why = REASON_FULL;
		return r;
	}
	if ((pool = seg_pool_at(s, c)) != NULL &&
	    (r = pool_step(s, c, pool, slot, gen, took, v, MARK_HELD(P_KERN), seen, word,
	    why)) != TAKE_OK)
		return r;
	if (fd >= 0)
		kjoint_mark(s, c, fd);
	return TAKE_OK;
}

/*
 * One attempt at permit kind p for slot, of compartment c; for a
 * connection counted with a kernel engine too, the joint count's permit
 * after the compartment's (kern_step); for a connection in a pool, the
 * pool's permit after those (pool_step); the compartment's given back,
 * here and only here, when a later one has none. On TAKE_FULL, *word is
 * the word to sleep on and *why the reason. wait is admission's (a
 * descriptor when >= 0).
 */
static inline __attribute__((always_inline)) enum take
take_step(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen, int p, uint32_t *seen,
    _Atomic uint32_t **word, enum bs_reason *why, int wait)
{
	uint32_t took = 0;
	enum take r = p == P_CONN ? tally_take_conn(s, slot, gen, c, seen, &took) :
	    tally_take(s, c, slot, gen, p, 0, seen);
	struct seg_pool *pool;

	if (r != TAKE_OK || p != P_CONN)
		return r;
	/* Read after the take (both sequentially consistent): an `attach`
	 * that sets the word after this load counts the permit in itself
	 * (kjoint_adopt). */
	if (__builtin_expect(atomic_load(&c->kernel) != 0, 0))
		return kern_step(s, c, slot, gen, took, seen, word, why, wait);
	if ((pool = seg_pool_at(s, c)) == NULL)
		return r;
	/* The take made in_use *seen + 1: within the guarantee or not. */
	return pool_step(s, c, pool, slot, gen, took, *seen + 1, 0, seen, word, why);
}

/*
 * Takes permit kind p of compartment c for slot, waiting for one when full
 * if the caller may wait (`wait`: WAIT_NEVER, WAIT_ALWAYS, or the
 * descriptor whose blocking mode is asked only now) and c allows it:
 * reclaims dead holders once (and for a connection, if none was dead,
 * reconciles its compartment or pool), then sleeps on the tally's count
 * word until the deadline. The slot is marked MARK_WAITING while counted in
 * `waiting`. TAKE_OK, TAKE_BUSY, or TAKE_FULL with *why.
 */
static enum take
take_wait(struct seg *s, struct seg_comp *c, uint32_t slot, uint32_t gen, int p, int wait,
    enum bs_reason full, enum bs_reason *why)
{
	struct seg_slot *sl = &s->slots[slot];
	_Atomic uint32_t *count, *word;
	enum bs_reason reason = full;
	uint32_t wait_ms, w, seen;
	uint64_t t0, deadline, now;
	enum take r;

	if (c == NULL)
		return TAKE_BUSY;
	/* p is P_CONN or P_INFLIGHT, both counted in c itself. */
	count = word = p == P_CONN ? &c->in_use : &c->inflight;
	if ((r = take_step(s, c, slot, gen, p, &seen, &word, &reason, wait)) != TAKE_FULL)
		return r;
	/* What dead holders hold goes back first; then, for a connection,
	 * what sockets closed unseen hold (reconcile.c). Observe mode refuses
	 * nothing and never waits, so it reconciles nothing: its calls past
	 * the limit would otherwise each read every holder's /proc/PID/fd,
	 * the first one in each new process at once (a prefork server
	 * starting a thousand workers). */
	if (proc_reclaim(s, true) > 0 ||
	    (p == P_CONN && atomic_load_explicit(&c->enforce, memory_order_relaxed) &&
	    reconcile_refused(s, c, reason) > 0)) {
		word = count;
		reason = full;
		if ((r = take_step(s, c, slot, gen, p, &seen, &word, &reason, wait)) != TAKE_FULL)
			return r;
	}
	*why = reason;
	wait_ms = seg_max_wait_ms(c);
	if (wait == WAIT_NEVER || wait_ms == 0 || !atomic_load(&c->enforce) ||
	    (wait >= 0 && (s->host == NULL || !s->host->blocking(wait, 0))))
		return TAKE_FULL;
	/* op_pid names the waiter, for slot_resolve if it dies waiting. */
	if (atomic_load(&sl->mark) & MARK_WAITING)
		return TAKE_FULL;
	atomic_store(&sl->op_pid, s->my_pid);
	if (!tally_mark_change(sl, gen, 0, MARK_WAITING, 0, MARK_WAITING))
		return TAKE_FULL;
	w = atomic_load(&c->waiting);
	do {
		if (w >= atomic_load(&c->max_waiting)) {
			tally_mark_change(sl, gen, MARK_WAITING, 0, MARK_WAITING, 0);
			*why = REASON_TOO_MANY_WAITING;
			return TAKE_FULL;
		}
	} while (!atomic_compare_exchange_weak(&c->waiting, &w, w + 1));
	t0 = now_mono_us();
	deadline = t0 + (uint64_t)wait_ms * 1000;
	*why = REASON_WAIT_TIMEOUT;
	/* A pool's frees wake its sleepers (tally.c's pool_wake). */
	pool_sleepers(s, c, 1);
	for (;;) {
		word = count;
		r = take_step(s, c, slot, gen, p, &seen, &word, &reason, wait);
		if (r != TAKE_FULL)
			break;
		now = now_mono_us();
		if (now >= deadline)
			break;
		/* Wake up now and then to take back what dead processes
		 * hold: they will never wake us themselves. */
		sys_futex_wait(word, seen,
		    deadline - now < RECLAIM_POLL_MS * 1000 ? deadline - now : RECLAIM_POLL_MS * 1000);
		proc_reclaim(s, true);
	}
	pool_sleepers(s, c, -1);
	/* The count goes down before the mark: dying in between makes a
	 * reclaimer take one off again, an error that vanishes at 0. */
	seg_dec_floor(&c->waiting);
	tally_mark_change(sl, gen, MARK_WAITING, 0, MARK_WAITING, 0);
	stat_hist_add(&c->h_wait, now_mono_us() - t0);
	return r;
}

/* ---- a connect's permits ---- */

/*
 * The permits of capped class cls of compartment c: the class's own,
 * then, if the classes share c, one of its unguaranteed part. When
 * either is missing, dead holders and sockets gone unseen may hold it
 * (reconcile_class_full), and both are tried once more. REASON_MAX when
 * taken, else the reason.
 */
static enum bs_reason
class_take(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c, uint32_t cls)
{
	enum bs_reason why;
	uint32_t seen;

	for (bool again = false;; again = true) {
		why = REASON_CLASS_FULL;
		if (tally_take(s, c, slot, gen, P_CLASS, 0, &seen) == TAKE_OK) {
			if (!atomic_load_explicit(&c->cls_shares, memory_order_relaxed) ||
			    share_take_class(s, c, slot, gen, cls, seen + 1) == TAKE_OK)
				return REASON_MAX;
			why = REASON_CLASS_SHARED_FULL;
		}
		if (again || reconcile_class_full(s, c) == 0)
			return why;
	}
}

/* take_permits' class step, out of line: a capped class needs its class
 * permit as well as the compartment's. The class permit is taken first and
 * given back if the compartment refuses, so it never counts a refused call.
 * REASON_MAX with *k the class when taken, else the reason. */
static __attribute__((noinline)) enum bs_reason
admit_class(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c, uint32_t cls,
    struct seg_class **k)
{
	struct seg_class *kc = &c->cls[cls];
	enum bs_reason reason;

	atomic_store(&s->slots[slot].cls, cls);
	reason = class_take(s, slot, gen, c, cls);
	if (reason != REASON_MAX)
		atomic_fetch_add(&kc->rejected, 1);
	else
		*k = kc;
	return reason;
}

/* take_permits after a refusal for `reason`, out of line: the class
 * permits taken go back; enforcing, the slot is pending again and
 * TAKE_FULL; in observe mode the connect goes through (TAKE_OK), counted
 * apart (and, where a kernel engine counts c too, socket fd >= 0 marked
 * the library's, which counted it). */
static __attribute__((noinline)) enum take
admit_refused(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c, struct seg_class *k,
    enum bs_reason reason, enum bs_reason *why, int fd)
{
	struct seg_slot *sl = &s->slots[slot];
	struct seg_pool *pool;
	uint32_t seen;

	if (k != NULL)
		share_give(s, c, slot, gen, SHARE_CLASS);
	if (atomic_load(&c->enforce) || reason == REASON_NO_SLOT) {
		stat_refused(s, c, reason);
		/* A request another thread began meanwhile on the socket
		 * (permit_request_begin) is of the old generation and undone
		 * with it. */
		tally_renew(s, slot, gen);
		atomic_store(&sl->cls, SLOT_NO_CLASS);
		atomic_store(&sl->comp, SLOT_NO_COMP);
		*why = reason;
		return TAKE_FULL;
	}
	/* Observe mode: let it through, say what enforcing would have done,
	 * and keep it apart from the permits proper. */
	atomic_fetch_add(stat_reason_count(c, reason, true), 1);
	tally_take(s, c, slot, gen, P_OVER, 0, &seen);
	/* Let past the pool as well: in its use and its peak. */
	if ((pool = seg_pool_at(s, c)) != NULL)
		pool_note_use(pool);
	if (atomic_load(&c->kernel) != 0) {
		kjoint_take_over(s, c, slot, gen);
		if (fd >= 0)
			kjoint_mark(s, c, fd);
	}
	return TAKE_OK;
}

/*
 * Takes the permits of compartment c (and class cls) for the pending
 * slot, which this process holds: permit_admit. TAKE_OK, TAKE_FULL with
 * *why, or TAKE_SHARED when another holder (a forked process sharing the
 * socket) is already admitting it.
 */
static enum take
take_permits(struct seg *s, uint32_t slot, struct seg_comp *c, uint32_t cls, int wait,
    enum bs_reason *why)
{
	struct seg_slot *sl = &s->slots[slot];
	struct seg_class *k = NULL;
	enum bs_reason reason = REASON_MAX;
	uint32_t gen = MARK_GEN(atomic_load(&sl->mark)), none = SLOT_NO_COMP, seen, n;
	uint64_t now;
	enum take r;

	if (!atomic_compare_exchange_strong(&sl->comp, &none, (uint32_t)(c - s->comp)))
		return TAKE_SHARED;
	if (__builtin_expect(cls < BS_MAX_CLASSES && atomic_load(&c->cls[cls].limit) != 0, 0))
		reason = admit_class(s, slot, gen, c, cls, &k);
	if (reason == REASON_MAX) {
		_Atomic uint32_t *word;

		tick(s, c, P_CONN);	/* a stalled backend, seen without replies */
		r = take_step(s, c, slot, gen, P_CONN, &seen, &word, &reason, wait);
		if (__builtin_expect(r == TAKE_FULL, 0))
			r = take_wait(s, c, slot, gen, P_CONN, wait, REASON_FULL, &reason);
		if (__builtin_expect(r == TAKE_OK, 1))
			reason = REASON_MAX;	/* take_wait named the reason it waited for */
		else if (r == TAKE_BUSY)
			reason = REASON_NO_SLOT;
	}
	if (__builtin_expect(reason != REASON_MAX, 0)) {
		if (admit_refused(s, slot, gen, c, k, reason, why, wait) != TAKE_OK)
			return TAKE_FULL;
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
	return TAKE_OK;
}

int
permit_acquire(struct seg *s, struct seg_comp *c, uint32_t cls, uint64_t ino, bool may_wait,
    enum bs_reason *why)
{
	int slot;

	if (c == NULL)
		return -EINVAL;
	/* The slot is taken, and this process recorded as its holder,
	 * before any permit: whoever finds us dead half-way finds it. */
	proc_gate_enter(s);
	slot = permit_claim(s, c, ino, false, why);
	proc_gate_leave(s);
	if (slot < 0) {
		stat_refused(s, c, *why);
		return -EBUSY;
	}
	if (take_permits(s, (uint32_t)slot, c, cls, may_wait ? WAIT_ALWAYS : WAIT_NEVER, why) !=
	    TAKE_OK) {
		slot_drop(s, (uint32_t)slot);
		return -EBUSY;
	}
	return slot;
}

/* permit_claim when the socket table has no free slot: dead holders'
 * slots, and those of sockets closed unseen, are taken back, and the claim
 * tried once more. A compartment at its limit would refuse the connect
 * anyway: that is then the reason given, not the table. */
static __attribute__((noinline)) int
claim_full(struct seg *s, struct seg_comp *c, int rec, uint64_t ino, enum bs_reason *why)
{
	int slot;

	reconcile_table_full(s);
	slot = slot_claim(s, rec, ino);
	if (slot >= 0)
		return slot;
	*why = REASON_NO_SLOT;
	if (c != NULL && atomic_load(&c->enforce) &&
	    atomic_load(&c->in_use) >= ad_limit(c, P_CONN, limit_conn(c)))
		*why = REASON_FULL;
	return slot;
}

int
permit_claim(struct seg *s, struct seg_comp *c, uint64_t ino, bool unseen, enum bs_reason *why)
{
	int rec = proc_record(s), slot;

	/* claim_record has taken back the records of the dead already. */
	if (__builtin_expect(rec < 0, 0)) {
		*why = REASON_PROCESS_TABLE_FULL;
		return rec;
	}
	slot = slot_claim(s, rec, ino);
	if (__builtin_expect(slot < 0, 0))
		slot = claim_full(s, c, rec, ino, why);
	/* Watched before any permit is taken: a release must never find it
	 * plain while another process may have the socket. */
	if (__builtin_expect(unseen, 0) && slot >= 0)
		slot_watch(s, (uint32_t)slot);
	return slot;
}

int
permit_share(struct seg *s, uint32_t slot, uint64_t ino, enum bs_reason *why)
{
	int rec = proc_record(s);
	struct seg_slot *sl = seg_slot(s, slot);

	if (rec < 0) {
		*why = REASON_PROCESS_TABLE_FULL;
		return rec;
	}
	if (sl == NULL || atomic_load(&sl->inode) != ino)
		return -ESTALE;
	/* A fork gave this process its hold of the pending slot; one that
	 * had no record then holds it now, so that the permit cannot go back
	 * while its connect is on its way. */
	if (slot_held_by(s, (uint32_t)rec, slot))
		return (int)slot;
	if (!slot_hold_add(s, (uint32_t)rec, slot))
		return -ESTALE;
	/* Given back and taken by another socket between the look and the
	 * hold: not this one's to admit. */
	if (atomic_load(&sl->inode) != ino) {
		slot_drop_hold(s, rec, slot, false);
		return -ESTALE;
	}
	return (int)slot;
}

enum take
permit_admit(struct seg *s, uint32_t slot, struct seg_comp *c, uint32_t cls, int wait,
    enum bs_reason *why)
{
	if (c == NULL || slot >= s->nslots) {
		*why = REASON_NO_SLOT;
		return TAKE_FULL;
	}
	return take_permits(s, slot, c, cls, wait, why);
}

/* ---- requests in flight ---- */

/* The slow end of permit_request_begin: the take found the compartment full
 * (r == TAKE_FULL) or the slot busy. Waits if it may; refuses with *why
 * (-EBUSY) when enforcing, else lets the request through apart from the
 * permits (P_INFLIGHT_OVER). 1 if the request is counted, 0 if not. */
static __attribute__((noinline)) int
request_full(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c, int r,
    bool may_wait, enum bs_reason *why)
{
	enum bs_reason reason = REASON_MAX;
	uint32_t seen;

	if (r == TAKE_FULL)
		r = take_wait(s, c, slot, gen, P_INFLIGHT, may_wait ? WAIT_ALWAYS : WAIT_NEVER,
		    REASON_INFLIGHT_FULL, &reason);
	if (r == TAKE_BUSY)
		return 0;	/* a request already on its way, or another thread's won */
	if (r == TAKE_FULL) {
		if (atomic_load(&c->enforce)) {
			stat_refused(s, c, reason);
			*why = reason;
			return -EBUSY;
		}
		atomic_fetch_add(stat_reason_count(c, reason, true), 1);
		return tally_take(s, c, slot, gen, P_INFLIGHT_OVER, MARK_HELD(P_INFLIGHT), &seen) ==
		    TAKE_OK;
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
permit_request_begin(struct seg *s, uint32_t slot, uint64_t m, struct seg_comp *c, bool may_wait,
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
		tick(s, c, P_INFLIGHT);	/* a stalled backend, seen without replies */
	/* A socket whose admission is still under way may take one: if the
	 * admission is refused, the slot's generation moves on and the take
	 * is undone (take_permits). */
	r = tally_take_inflight(s, slot, m, c, &seen);
	if (__builtin_expect(r != TAKE_OK, 0) ||
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
 * permit_request_begin's common case alone: no request let through by observe
 * mode, no adaptive limit, the take on the slot's own give with room and
 * no new peak. 1 if the request is counted, 0 if not (the slot was
 * released meanwhile), -1 if it is not that case (nothing done: the
 * caller goes permit_request_begin's whole way).
 */
int
permit_request_quick(struct seg *s, uint32_t slot, uint64_t m, struct seg_comp *c)
{
	uint32_t seen;
	int r;

	if (__builtin_expect(atomic_load_explicit(&c->inflight_over, memory_order_relaxed) != 0 ||
	    atomic_load_explicit(&c->ad.mode, memory_order_relaxed) == AD_ON, 0))
		return -1;
	r = tally_take_inflight_quick(s, slot, m, c, &seen);
	if (__builtin_expect(r == TAKE_MISS, 0))
		return -1;
	if (__builtin_expect(r != TAKE_OK, 0))
		return 0;
	if (__builtin_expect(seen + 1 > atomic_load_explicit(&c->inflight_peak,
	    memory_order_relaxed), 0))
		raise_peak(&c->inflight_peak, atomic_load(&c->inflight));
	request_counted(&s->slots[slot], c, false);
	return 1;
}

int
permit_inflight_begin(struct seg *s, uint32_t slot, bool may_wait, enum bs_reason *why)
{
	struct seg_slot *sl = seg_slot(s, slot);
	uint64_t m;

	if (sl == NULL)
		return 0;
	m = atomic_load_explicit(&sl->mark, memory_order_acquire);
	return permit_request_begin(s, slot, m, seg_slot_comp(s, sl), may_wait, why);
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
	stat_hist_add_n(&c->h_reply, us, (t & SENT_WEIGHTED) ? REQ_SAMPLE : 1);
	ad_sample(c, P_INFLIGHT, us, now);
}

/* permit_request_end's whole way (t: sent_us, read before the give). */
static __attribute__((noinline)) void
request_end(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c, uint64_t t,
    bool record)
{
	if (!tally_give_inflight(s, slot, gen, c) &&
	    (__builtin_expect(atomic_load_explicit(&c->inflight_over, memory_order_relaxed) == 0, 1) ||
	    !tally_give(s, c, slot, gen, P_INFLIGHT_OVER)))
		return;
	if (__builtin_expect(t != 0, 0))
		reply_timed(&s->slots[slot], c, t, record);
}

/* The common case (an untimed request, the give on the slot's own take)
 * without a frame; the rest in request_end. */
void
permit_request_end(struct seg *s, uint32_t slot, uint64_t m, struct seg_comp *c, bool record)
{
	uint32_t gen = MARK_GEN(m);
	uint64_t t;

	if (c == NULL)
		return;
	/* Read before the give: a request that begins after it (another
	 * thread's) must not have its start taken for ours. */
	t = atomic_load_explicit(&s->slots[slot].sent_us, memory_order_relaxed);
	if (__builtin_expect(t == 0, 1) && tally_give_inflight_quick(s, slot, gen, c))
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
	permit_request_end(s, slot, m, seg_slot_comp(s, sl), record);
}

void
permit_inflight_end(struct seg *s, uint32_t slot)
{
	inflight_finish(s, slot, true);
}

void
permit_inflight_cancel(struct seg *s, uint32_t slot)
{
	inflight_finish(s, slot, false);
}

/* Inlined into the receive wrappers under LTO (admit.h). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
BS_LTO_INLINE bool
permit_reply_quick(struct seg *s, uint32_t slot, uint32_t gen, struct seg_comp *c)
{
	return tally_give_inflight_quick(s, slot, gen, c);
}
#pragma GCC diagnostic pop

bool
permit_in_flight(const struct seg *s, uint32_t slot, struct seg_comp *c)
{
	uint32_t gen = MARK_GEN(atomic_load(&s->slots[slot].mark));

	return tally_held_at(s, slot, gen, P_INFLIGHT, &c->inflight) ||
	    tally_held_at(s, slot, gen, P_INFLIGHT_OVER, &c->inflight_over);
}

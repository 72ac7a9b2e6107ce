/* slot.c - a counted socket's whole life in the segment: claim, holds, drop and release. */
#include <errno.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>

#include "admit/pool.h"
#include "admit/share.h"
#include "admit/slot.h"
#include "admit/tally.h"
#include "log.h"
#include "sys.h"

/*
 * A permit is one unit of a compartment's in_use. The socket holding it has
 * a slot; each process that has a descriptor of the socket holds the slot
 * (a bit in its record's row, or the slot's holders word alone), and the
 * slot's `holders` counts those holds. The permit goes back when `holders`
 * drops to zero: when the last descriptor in the last process is closed,
 * or when the last holder is found dead (proc.c). Within a process, the
 * descriptors of a slot are counted in lcount: the process's hold goes
 * when its last one does.
 *
 * A slot's life: claimed free -> SLOT_INIT (by this pid) -> SLOT_USED,
 * pending (no compartment) with its first hold; admitted by permit.c (its
 * permits are tallies, tally.c); held and dropped by descriptors and
 * processes; released by the drop that takes its holders to 0: SLOT_USED
 * -> SLOT_RELEASING (by this pid), every permit given back, -> SLOT_FREE.
 * A process that dies half-way through any step leaves its pid in the
 * state word, and whoever finds it dead finishes the step
 * (slot_release_orphan).
 *
 * A slot whose socket processes the tables cannot name may hold as well is
 * SLOT_WATCHED instead of SLOT_USED (slot_watch): the drop that takes its
 * holders to 0 then gives nothing back but leaves it SLOT_KERNEL, and its
 * permits go back only when the kernel says that no file refers to the
 * socket any more (slot_release_kernel, from reconcile.c). A permit kept
 * too long is a delay; one given back while a copy of its socket is still
 * open would be an admission past the limit.
 */

/* ---- holds: bitmap bits and the holders count ---- */

/*
 * A hold is two writes: the bit in the holder's row and the slot's holders
 * count. A process killed between them would leave the two disagreeing for
 * good. So a change of holders takes the word for itself: one 64-bit
 * compare-and-swap changes the count, writes a tag naming the record and
 * whether it adds or drops a hold, and sets HTAG_LOCK; then the bit is
 * written and the lock cleared. Nobody changes the count while it is
 * locked (they wait the few instructions it lasts), so a changer that dies
 * in between leaves exactly one change half done, which the tag names, and
 * whoever finds it dead finishes it.
 *
 * Most sockets are only ever held by the process that connected them. So
 * the first hold is the holders word alone: count 1 and a tag naming the
 * record with HTAG_SOLE, no bit in its row (sole_word). Closing such a
 * socket is one compare-and-swap of that word to 0, with nothing after it:
 * there is no bit that could be cleared late, after the slot was released
 * and taken by a new socket (the reason the lock exists). Whoever lists a
 * record's holds reads its row and the holders words that name it so
 * (slot_held_bits, fork, exec, reclaim). A second holder (a fork's child, a
 * process that inherited the socket) first turns the sole hold into a bit by
 * a locked change of the usual kind, count unchanged (sole_to_bit); from then
 * on the slot goes the locked way. Either compare-and-swap of the sole word
 * wins, never both.
 */
#define REC_GEN(s, rec)	(atomic_load(&(s)->procs[rec].gen) & HTAG_GEN_MASK)
#define HOLD_WAIT_MS	1000	/* the longest a change waits for a stalled one */

/* When a wait for a live changer last ran out (hold_wait_locked). */
static _Atomic uint64_t hold_forced_ms;

_Static_assert(offsetof(struct seg_slot, holders) % 8 == 0, "holders alignment");
_Static_assert(BS_MAX_PROCESSES < HTAG_DROP, "record index fits a tag");

static _Atomic uint64_t *
holders_word(const struct seg_slot *sl)
{
	return (_Atomic uint64_t *)(uintptr_t)&sl->holders;
}

/* The locked holders word of a change by record rec to `count`. */
static uint64_t
holders_locked(const struct seg *s, uint32_t rec, bool drop, uint32_t count)
{
	uint32_t tag = HTAG_LOCK | HTAG(REC_GEN(s, rec), drop, rec);

	return (uint64_t)tag << 32 | count;
}

static bool
has_bit(const struct seg *s, uint32_t rec, uint32_t slot)
{
	return (atomic_load(&seg_row(s, rec)[slot / 64]) >> (slot % 64)) & 1;
}

uint64_t
slot_sole_word(const struct seg *s, uint32_t rec)
{
	return (uint64_t)(HTAG_SOLE | HTAG(REC_GEN(s, rec), false, rec)) << 32 | 1;
}

/* Record rec's sole word, from this process's cache (s->sole) when it is
 * rec's: a connect and a close of ours need not build it. The cache is set
 * whenever this process's record is published and cleared when it goes,
 * so it never names an earlier generation of the record. */
static inline uint64_t
sole_of(struct seg *s, uint32_t rec)
{
	uint64_t w = atomic_load_explicit(&s->sole, memory_order_relaxed);

	return HTAG_REC((uint32_t)(w >> 32)) == rec + 1 ? w : slot_sole_word(s, rec);
}

void
slot_set_record(struct seg *s, int rec)
{
	atomic_store(&s->sole, rec >= 0 ? slot_sole_word(s, (uint32_t)rec) : 0);
	atomic_store(&s->rec, rec);
}

/* The holders word once rec's sole hold is dropped. */
static inline uint64_t
sole_dropped(uint64_t sole)
{
	return (sole & ~((uint64_t)HTAG_SOLE << 32 | 1)) | (uint64_t)HTAG_DROP << 32;
}


uint64_t
slot_held_bits(const struct seg *s, uint32_t rec, uint32_t w)
{
	uint64_t bits, sole;

	if (rec >= s->nprocs || w >= s->bitmap_words)
		return 0;
	bits = atomic_load(&seg_row(s, rec)[w]);
	sole = slot_sole_word(s, rec);
	for (uint32_t k = 0; k < 64 && w * 64 + k < s->nslots; k++) {
		if (atomic_load(holders_word(&s->slots[w * 64 + k])) == sole)
			bits |= 1ULL << k;
	}
	return bits;
}

/* Writes the bit of the change that tag names into its record's row.
 * False if the record is no longer the one the tag names (freed, and
 * maybe taken again, while the change was under way). */
static bool
hold_bit(struct seg *s, uint32_t slot, uint32_t tag)
{
	uint32_t rec = HTAG_REC(tag);
	uint64_t m = 1ULL << (slot % 64);

	if (rec == 0 || rec > s->nprocs || HTAG_GEN(tag) != REC_GEN(s, rec - 1))
		return false;
	if (tag & HTAG_DROP)
		atomic_fetch_and(&seg_row(s, rec - 1)[slot / 64], ~m);
	else
		atomic_fetch_or(&seg_row(s, rec - 1)[slot / 64], m);
	return true;
}

/* The unlocked word that ends change w: the same count, or one less if
 * the change added a hold for a record that has gone meanwhile (its bit
 * was never written, so the hold must not count). */
static uint64_t
hold_end(uint64_t w, bool written)
{
	uint32_t tag = (uint32_t)(w >> 32), count = (uint32_t)w;

	if (!written && !(tag & HTAG_DROP) && count > 0)
		count--;
	return (uint64_t)(tag & ~HTAG_LOCK) << 32 | count;
}

/* The changer's own end of a change: its bit, then the unlock (which fails
 * harmlessly if someone took it for dead and finished it). */
static void
hold_done(struct seg *s, uint32_t slot, uint64_t w)
{
	bool written = hold_bit(s, slot, (uint32_t)(w >> 32));

	atomic_compare_exchange_strong(holders_word(&s->slots[slot]), &w, hold_end(w, written));
}

/* Finishes a change found locked as w whose changer is dead: only if the
 * word is still w, proved by winning the unlock, so a word that moved on
 * meanwhile is never acted on twice or late. */
static void
hold_finish(struct seg *s, uint32_t slot, uint64_t w)
{
	uint32_t tag = (uint32_t)(w >> 32), rec = HTAG_REC(tag);
	bool alive = rec != 0 && rec <= s->nprocs && HTAG_GEN(tag) == REC_GEN(s, rec - 1);

	if (atomic_compare_exchange_strong(holders_word(&s->slots[slot]), &w, hold_end(w, alive)))
		hold_bit(s, slot, tag);
}

/* The process making the change a locked tag names: the record's own, or
 * for a record being forked or reclaimed, the process doing that. */
static pid_t
changer_of(const struct seg *s, uint32_t tag)
{
	uint32_t rec = HTAG_REC(tag), st;

	if (rec == 0 || rec > s->nprocs || HTAG_GEN(tag) != REC_GEN(s, rec - 1))
		return 0;
	st = atomic_load(&s->procs[rec - 1].state);
	if (st == PROC_FORKING || st == PROC_RECLAIMING)
		return atomic_load(&s->procs[rec - 1].owner);
	return atomic_load(&s->procs[rec - 1].pid);
}

/* The holders word of slot once no change holds it: waits for a live
 * changer (a moment, at most HOLD_WAIT_MS), finishes a dead one's. */
static __attribute__((noinline)) uint64_t
hold_wait_locked(struct seg *s, uint32_t slot, uint64_t w)
{
	_Atomic uint64_t *t = holders_word(&s->slots[slot]);
	uint64_t deadline = 0;
	unsigned spins = 0;

	while ((w >> 32) & HTAG_LOCK) {
		if (++spins > 64) {
			pid_t who = changer_of(s, (uint32_t)(w >> 32));
			uint64_t now = now_mono_ms();

			/* A change locks one word per thread, so many words
			 * locked by live changers at once are damage (written
			 * by another process), not changes under way: after a
			 * wait that ran out, the next ones are finished at
			 * once, or a scan of every slot (fork) would wait a
			 * second per slot. Such a finish is what a wait that
			 * runs out does anyway: the changer's own unlock then
			 * fails harmlessly. Only damage, or a changer stopped
			 * for all of HOLD_WAIT_MS, makes a wait run out. */
			if (deadline == 0)
				deadline = now - atomic_load(&hold_forced_ms) < HOLD_WAIT_MS ? now :
				    now + HOLD_WAIT_MS;
			if (who <= 0 || (who != s->my_pid && !sys_pid_alive(who, 0))) {
				hold_finish(s, slot, w);
			} else if (now >= deadline) {
				atomic_store(&hold_forced_ms, now);
				hold_finish(s, slot, w);
			} else {
				sched_yield();
			}
		}
		w = atomic_load(t);
	}
	return w;
}

/* The common case, no change under way, is one load. */
static inline uint64_t
hold_wait(struct seg *s, uint32_t slot)
{
	uint64_t w = atomic_load(holders_word(&s->slots[slot]));

	return __builtin_expect((w >> 32) & HTAG_LOCK, 0) ? hold_wait_locked(s, slot, w) : w;
}

/* True if record rec holds slot, by bit or alone. A change naming rec
 * under way (its sole hold being turned into a bit) is waited for first. */
bool
slot_held_by(struct seg *s, uint32_t rec, uint32_t slot)
{
	uint64_t w = atomic_load(holders_word(&s->slots[slot]));

	if (((w >> 32) & HTAG_LOCK) && HTAG_REC((uint32_t)(w >> 32)) == rec + 1)
		w = hold_wait(s, slot);
	return w == slot_sole_word(s, rec) || has_bit(s, rec, slot);
}

/* The first hold of a slot being claimed: record rec, holders 1, held
 * through the holders word alone (HTAG_SOLE), no bit in rec's row. */
static void
hold_first(struct seg *s, int rec, uint32_t slot)
{
	_Atomic uint64_t *row = &seg_row(s, (uint32_t)rec)[slot / 64];
	uint64_t m = 1ULL << (slot % 64);

	/* The slot is still SLOT_INIT, ours alone: no lock needed. A bit of
	 * ours for it is of an older hold finished for us after a stall (the
	 * slot was free): it must not stand beside the sole hold. */
	if (__builtin_expect((atomic_load_explicit(row, memory_order_relaxed) & m) != 0, 0))
		atomic_fetch_and(row, ~m);
	atomic_store(holders_word(&s->slots[slot]), sole_of(s, (uint32_t)rec));
}

/* The sole hold that word w (HTAG_SOLE) names becomes a bit in its record's
 * row, by a locked change that adds it with the count unchanged: a changer
 * dying half-way is finished like any other, and if the record is gone the
 * count loses the hold (hold_end). Whoever loses the race for w (the
 * holder's own close, another second holder) reads the word again. */
static void
sole_to_bit(struct seg *s, uint32_t slot, uint64_t w)
{
	uint32_t tag = ((uint32_t)(w >> 32) & ~HTAG_SOLE) | HTAG_LOCK;
	uint64_t nw = (uint64_t)tag << 32 | (uint32_t)w;

	if (atomic_compare_exchange_strong(holders_word(&s->slots[slot]), &w, nw))
		hold_done(s, slot, nw);
}

/* Adds a hold of record rec on slot if somebody still holds the slot (a
 * slot at 0 is being released). True if it did. */
bool
slot_hold_add(struct seg *s, uint32_t rec, uint32_t slot)
{
	_Atomic uint64_t *t = holders_word(&s->slots[slot]);
	uint64_t w, nw;

	for (;;) {
		w = hold_wait(s, slot);
		if ((uint32_t)w == 0)
			return false;
		if ((w >> 32) & HTAG_SOLE) {
			sole_to_bit(s, slot, w);
			continue;
		}
		nw = holders_locked(s, rec, false, (uint32_t)w + 1);
		if (atomic_compare_exchange_weak(t, &w, nw))
			break;
	}
	hold_done(s, slot, nw);
	return true;
}

/* The locked drop of rec's bit hold of slot; the count it found, or 0 if
 * rec holds no bit. */
static __attribute__((noinline)) uint32_t
drop_bit(struct seg *s, uint32_t rec, uint32_t slot)
{
	_Atomic uint64_t *t = holders_word(&s->slots[slot]);
	uint64_t sole = slot_sole_word(s, rec), w, nw;
	uint32_t cur;

	for (;;) {
		w = hold_wait(s, slot);
		/* Held alone after all (the caller's compare-and-swap met
		 * a word changing under it): dropped the sole way. */
		if (w == sole) {
			if (atomic_compare_exchange_weak(t, &w, sole_dropped(sole)))
				return 1;
			continue;
		}
		/* No bit: not held, or a drop that died half-way was just
		 * finished by hold_wait. */
		if (!has_bit(s, rec, slot))
			return 0;
		cur = (uint32_t)w;
		nw = holders_locked(s, rec, true, cur > 0 ? cur - 1 : 0);
		if (atomic_compare_exchange_weak(t, &w, nw))
			break;
	}
	hold_done(s, slot, nw);
	/* A stray bit meeting a count already at 0 must not release twice:
	 * 0 is returned as "not the last". */
	return cur;
}

bool
slot_drop_hold(struct seg *s, int rec, uint32_t slot, bool reclaimed)
{
	_Atomic uint64_t *t;
	uint64_t sole, w;

	if (rec < 0 || (uint32_t)rec >= s->nprocs || slot >= s->nslots)
		return false;
	/* The common case, a socket held by this record alone since its
	 * first hold: one compare-and-swap and the slot is released. */
	t = holders_word(&s->slots[slot]);
	sole = sole_of(s, (uint32_t)rec);
	w = sole;
	if (!atomic_compare_exchange_strong(t, &w, sole_dropped(sole)) &&
	    drop_bit(s, (uint32_t)rec, slot) != 1)
		return false;
	/* Only the drop that takes the count from 1 to 0 releases. */
	slot_release(s, slot, reclaimed);
	return true;
}

/* Changes of record rec's holds left half done (its process died between
 * the count and the bit) are finished, so its row is right. */
/* Changes of record rec's holds left half done (its process died between
 * the count and the bit) are finished, so its row is right. */
void
slot_settle_holds(struct seg *s, uint32_t rec)
{
	for (uint32_t i = 0; i < s->nslots; i++) {
		uint64_t w = atomic_load(holders_word(&s->slots[i]));
		uint32_t tag = (uint32_t)(w >> 32);

		if ((tag & HTAG_LOCK) && HTAG_REC(tag) == rec + 1 && HTAG_GEN(tag) == REC_GEN(s, rec))
			hold_finish(s, i, w);
	}
}

/* Record rec's sole holds (no bit) are dropped. A change naming rec that is
 * under way (another process turning its sole hold into a bit) is waited
 * for first, so that its bit is in the row before the caller reads the row;
 * no new sole hold of rec can appear, as its process is gone or is the
 * caller. */
void
slot_drop_sole_holds(struct seg *s, uint32_t rec, pid_t dead, bool reclaimed)
{
	uint64_t sole = slot_sole_word(s, rec);

	for (uint32_t i = 0; i < s->nslots; i++) {
		uint64_t w = atomic_load(holders_word(&s->slots[i]));

		if (HTAG_REC((uint32_t)(w >> 32)) != rec + 1)
			continue;
		if ((w >> 32) & HTAG_LOCK)
			w = hold_wait(s, i);
		if (w != sole)
			continue;
		if (dead > 0)
			slot_resolve(s, i, dead);
		slot_drop_hold(s, (int)rec, i, reclaimed);
	}
}

/* Slots that process pid left unfinished: dropped by it and never
 * released, or set up or released half-way when it died. No row has
 * their bit, so every slot is looked at. */
void
slot_release_orphans(struct seg *s, pid_t pid)
{
	for (uint32_t i = 0; i < s->nslots; i++) {
		uint32_t st = atomic_load_explicit(&s->slots[i].state, memory_order_relaxed);

		if (st == SLOT_FREE || st == SLOT_KERNEL ||
		    (SLOT_BY(st) != pid && atomic_load(&s->slots[i].holders) != 0))
			continue;
		/* A drop still locked (its process died between the count and
		 * its bit) is finished first, so the bit never outlives the
		 * slot's release and meets a new socket in it. */
		if (SLOT_HELD(st))
			hold_wait(s, i);
		slot_release_orphan(s, i, pid);
	}
}

int
slot_find_inode(const struct seg *s, uint64_t ino)
{
	for (uint32_t i = 0; i < s->nslots; i++) {
		if (SLOT_HELD(atomic_load(&s->slots[i].state)) &&
		    atomic_load(&s->slots[i].inode) == ino)
			return (int)i;
	}
	return -1;
}

/* ---- claim, descriptors, release ---- */

/* slot_alloc in the slots lo .. nslots - 1 only, looking from slot i on.
 * Inlined, so that slot_alloc's lo of 0 costs nothing. */
static inline __attribute__((always_inline)) int
alloc_from(struct seg *s, int rec, uint64_t ino, uint32_t lo, uint32_t i)
{
	uint32_t n = s->nslots;

	if (i < lo || i >= n)
		i = lo;
	for (uint32_t k = lo; k < n; k++, i = i + 1 < n ? i + 1 : lo) {
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
		hold_first(s, rec, i);
		atomic_store_explicit(&sl->state, SLOT_USED, memory_order_release);
		atomic_store_explicit(&s->hint, i + 1, memory_order_relaxed);
		return (int)i;
	}
	return -ENOSPC;
}

int
slot_alloc(struct seg *s, int rec, uint64_t ino)
{
	/* The hint is where the last claim ended: a start, not a promise;
	 * threads racing from the same place are told apart by the CAS. */
	return alloc_from(s, rec, ino, 0, atomic_load_explicit(&s->hint, memory_order_relaxed));
}

int
slot_claim(struct seg *s, int rec, uint64_t ino)
{
	int slot;

	if (rec < 0)
		return rec;
	slot = slot_alloc(s, rec, ino);
	if (slot >= 0)
		atomic_store(&s->lcount[slot], 1);
	return slot;
}

/*
 * The slots admissions may need at once: each compartment's connection
 * limit, and as many waiters as it lets wait. A compartment nothing bounds
 * (no max_connections, or observe mode, which lets every connect through)
 * may need any number: then at least half the table. Pending entries of a
 * fork go only above these, so that they can never refuse an admission
 * the limits allow.
 */
static uint32_t
admission_room(const struct seg *s)
{
	uint64_t room = 0;
	bool unbounded = false;

	for (uint32_t i = 0; i < s->ncomp; i++) {
		struct seg_comp *c = &s->comp[i];
		uint32_t lim = atomic_load_explicit(&c->limit, memory_order_relaxed);

		if (lim > BS_MAX_LIMIT || !atomic_load_explicit(&c->enforce, memory_order_relaxed)) {
			unbounded = true;
			continue;
		}
		room += lim;
		if (seg_max_wait_ms(c) != 0)
			room += atomic_load_explicit(&c->max_waiting, memory_order_relaxed);
	}
	if (unbounded && room < s->nslots / 2)
		room = s->nslots / 2;
	return room < s->nslots ? (uint32_t)room : s->nslots;
}

int
slot_claim_shared(struct seg *s, int rec, uint64_t ino)
{
	/* Where this process's last pending entry went: forks come one at
	 * a time in a process (proc_gate_close), so a plain static will do. */
	static uint32_t next;
	int slot;

	if (rec < 0)
		return rec;
	slot = alloc_from(s, rec, ino, admission_room(s), next);
	if (slot < 0)
		return slot;
	next = (uint32_t)slot + 1;
	atomic_store(&s->lcount[slot], 1);
	return slot;
}

bool
slot_admitted(const struct seg *s, uint32_t slot)
{
	struct seg_comp *c;
	uint32_t gen;

	if (slot >= s->nslots)
		return false;
	gen = MARK_GEN(atomic_load(&s->slots[slot].mark));
	c = seg_slot_comp(s, &s->slots[slot]);
	return tally_held(s, c, slot, gen, P_CONN) || tally_held(s, c, slot, gen, P_OVER);
}

bool
slot_pending(const struct seg *s, uint32_t slot)
{
	return slot < s->nslots && atomic_load(&s->slots[slot].comp) == SLOT_NO_COMP &&
	    SLOT_HELD(atomic_load(&s->slots[slot].state));
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

/* A watched slot's last known holder dropped it: a copy may live on where
 * no record shows it, and the kernel says when it is gone (reconcile.c),
 * asked at this process's next connect that needs the permit. Out of line:
 * the common release never comes here. */
static __attribute__((noinline, cold)) void
leave_to_kernel(struct seg *s, uint32_t slot)
{
	uint32_t used = SLOT_WATCHED;

	if (atomic_compare_exchange_strong(&s->slots[slot].state, &used, SLOT_KERNEL))
		reconcile_soon();
}

void
slot_release(struct seg *s, uint32_t slot, bool reclaimed)
{
	uint32_t used = SLOT_USED, busy = SLOT_BUSY(SLOT_RELEASING, s->my_pid);

	if (atomic_compare_exchange_strong(&s->slots[slot].state, &used, busy)) {
		release_claimed(s, slot, busy, reclaimed);
		return;
	}
	if (used == SLOT_WATCHED)
		leave_to_kernel(s, slot);
}

bool
slot_watch(struct seg *s, uint32_t slot)
{
	uint32_t st = SLOT_USED;

	if (slot >= s->nslots)
		return false;
	/* A slot given back meanwhile (RELEASING, FREE) lost its last holder
	 * before the caller's fork: no copy of its socket reaches the child. */
	return atomic_compare_exchange_strong(&s->slots[slot].state, &st, SLOT_WATCHED) ||
	    st == SLOT_WATCHED;
}

bool
slot_release_kernel(struct seg *s, uint32_t slot, uint64_t ino)
{
	uint32_t st = SLOT_KERNEL, busy = SLOT_BUSY(SLOT_RELEASING, s->my_pid);
	bool held;

	if (slot >= s->nslots ||
	    !atomic_compare_exchange_strong(&s->slots[slot].state, &st, busy))
		return false;
	/* Ours now; nobody adds a hold to a slot at 0 holders. The caller
	 * asked the kernel about inode ino: a slot given back and taken by
	 * another socket since is that socket's, and goes back untouched. */
	if (atomic_load(&s->slots[slot].inode) != ino) {
		atomic_compare_exchange_strong(&s->slots[slot].state, &busy, SLOT_KERNEL);
		return false;
	}
	held = slot_admitted(s, slot);
	release_claimed(s, slot, busy, false);
	return held;
}

void
slot_release_orphan(struct seg *s, uint32_t slot, pid_t dead)
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
	case SLOT_WATCHED:
		/* Its last holder dropped it and died before releasing. */
		if (atomic_load(&sl->holders) == 0)
			slot_release(s, slot, true);
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
slot_hold(struct seg *s, uint32_t slot)
{
	if (slot >= s->nslots || atomic_load(&s->rec) < 0)
		return;
	atomic_fetch_add(&s->lcount[slot], 1);
}

void
slot_drop(struct seg *s, uint32_t slot)
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
	slot_drop_hold(s, rec, slot, false);
}

/*
 * What a dead thread can leave half done on slot is its wait: the slot
 * counted in `waiting` (MARK_WAITING, set by the process in op_pid). Its
 * takes and gives are whole at their compare-and-swap (see the top).
 */
void
slot_resolve(struct seg *s, uint32_t slot, pid_t dead)
{
	struct seg_slot *sl;
	uint64_t m;

	if (slot >= s->nslots)
		return;
	sl = &s->slots[slot];
	m = atomic_load(&sl->mark);
	if (!(m & MARK_WAITING) || (dead != 0 && atomic_load(&sl->op_pid) != dead))
		return;
	if (tally_mark_change(sl, MARK_GEN(m), MARK_WAITING, 0, MARK_WAITING, 0)) {
		struct seg_comp *c = seg_slot_comp(s, sl);

		if (c != NULL)
			seg_dec_floor(&c->waiting);
	}
}

void
slot_ages(const struct seg *s, struct seg_comp *c, int p, uint64_t now, uint64_t old,
    uint64_t *inflight, uint64_t *n, uint64_t *sum)
{
	_Atomic uint32_t *held = p == P_CONN ? &c->in_use : &c->inflight;
	_Atomic uint32_t *over = p == P_CONN ? &c->over : &c->inflight_over;
	int hp = p == P_CONN ? P_CONN : P_INFLIGHT, op = p == P_CONN ? P_OVER : P_INFLIGHT_OVER;
	uint32_t ci = (uint32_t)(c - s->comp), nslots = s->nslots;
	uint64_t t, m;

	*inflight = *n = *sum = 0;
	for (uint32_t i = 0; i < nslots; i++) {
		const struct seg_slot *sl = &s->slots[i];

		if (atomic_load_explicit(&sl->comp, memory_order_relaxed) != ci)
			continue;
		m = atomic_load_explicit(&sl->mark, memory_order_relaxed);
		if (!tally_held_at(s, i, MARK_GEN(m), hp, held) &&
		    !tally_held_at(s, i, MARK_GEN(m), op, over))
			continue;
		t = atomic_load_explicit(p == P_CONN ? &sl->admit_us : &sl->sent_us,
		    memory_order_relaxed) & ~SENT_WEIGHTED;
		if (t == 0 || t > now)
			continue;
		(*inflight)++;
		if (now - t > old) {
			(*n)++;
			*sum += now - t;
		}
	}
}

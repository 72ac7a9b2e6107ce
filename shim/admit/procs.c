/* procs.c - process records and their holds: reclaim of the dead, fork, exec and exit. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

/*
 * Each process that holds a counted socket has a record in the segment:
 * pid, start time, state, and a bitmap row with one bit per socket slot it
 * holds alongside other processes (a slot it holds alone is named by the
 * slot's holders word instead: see the sole holds below). A slot's permits
 * go back when its last holder drops it: closes its last descriptor of the
 * socket, or is found dead (/proc/PID/stat says Z or X, or shows another
 * start time). fork gives a record made for the child before fork() runs
 * every hold of the parent; exec finds the record of its PID and start
 * time again.
 */

#define RECLAIM_EVERY_MS 100
#define FORK_GRACE_MS	300	/* a fork's record is left alone this long, whatever else */
#define GATE_WAIT_MS	1000	/* the longest fork waits for the gate to empty */

/* Reads a small file with raw system calls; returns bytes read or -errno. */
static long
read_small(const char *path, char *buf, size_t len)
{
	long fd, n;

	fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	n = syscall(SYS_read, fd, buf, len - 1);
	if (n < 0)
		n = -errno;
	syscall(SYS_close, fd);
	if (n >= 0)
		buf[n] = '\0';
	return n;
}

/* Parses /proc/PID/stat: the state letter and field 22 (start time). The
 * command name may hold spaces and parentheses, so parsing starts after the
 * last ')'. Returns 0, -ENOENT if the process is gone, or another -errno. */
static int
proc_stat(pid_t pid, char *state, uint64_t *start, uint64_t *threads)
{
	char path[64], buf[1024];
	char *p;
	long n;
	int field = 2;

	bs_format(path, sizeof(path), "/proc/%d/stat", (int)pid);
	n = read_small(path, buf, sizeof(buf));
	if (n < 0)
		return (int)n;
	p = strrchr(buf, ')');
	if (p == NULL || p[1] != ' ')
		return -EINVAL;
	p += 2;
	*state = *p;
	*threads = 0;
	for (field = 3; field < 22 && *p; p++) {
		if (*p == ' ' && ++field == 20) {
			for (const char *q = p + 1; *q >= '0' && *q <= '9'; q++)
				*threads = *threads * 10 + (uint64_t)(*q - '0');
		}
	}
	*start = 0;
	while (*p >= '0' && *p <= '9')
		*start = *start * 10 + (uint64_t)(*p++ - '0');
	return 0;
}

uint64_t
seg_pid_start(pid_t pid)
{
	char state;
	uint64_t start, threads;

	return proc_stat(pid, &state, &start, &threads) == 0 ? start : 0;
}

bool
seg_pid_alive(pid_t pid, uint64_t start)
{
	char state;
	uint64_t st, threads;
	int r;

	if (pid <= 0)
		return false;
	r = proc_stat(pid, &state, &st, &threads);
	if (r == -ENOENT || r == -ESRCH)
		return false;
	if (r < 0) {
		/* No /proc (or hidepid): fall back to a signal probe, which
		 * cannot tell a zombie or a reused PID, so it errs on "alive". */
		return !(kill(pid, 0) < 0 && errno == ESRCH);
	}
	/* A zombie has closed all its descriptors: its permits are free. But
	 * a thread-group leader that called pthread_exit() shows as a zombie
	 * while its other threads live on, holding the descriptors; the
	 * thread count (field 20) tells the two apart. */
	if ((state == 'Z' || state == 'X' || state == 'x') && threads <= 1)
		return false;
	return start == 0 || st == start;
}

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
 * (seg_held_bits, fork, exec, reclaim). A second holder (a fork's child, a
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

/* The holders word of a slot that record rec holds alone, by its first hold. */
static inline uint64_t
sole_word(const struct seg *s, uint32_t rec)
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

	return HTAG_REC((uint32_t)(w >> 32)) == rec + 1 ? w : sole_word(s, rec);
}

/* Publishes rec (or -1) as this process's record, with its sole word. */
static void
set_rec(struct seg *s, int rec)
{
	atomic_store(&s->sole, rec >= 0 ? sole_word(s, (uint32_t)rec) : 0);
	atomic_store(&s->rec, rec);
}

/* The holders word once rec's sole hold is dropped. */
static inline uint64_t
sole_dropped(uint64_t sole)
{
	return (sole & ~((uint64_t)HTAG_SOLE << 32 | 1)) | (uint64_t)HTAG_DROP << 32;
}


uint64_t
seg_held_bits(const struct seg *s, uint32_t rec, uint32_t w)
{
	uint64_t bits, sole;

	if (rec >= s->nprocs || w >= s->bitmap_words)
		return 0;
	bits = atomic_load(&seg_row(s, rec)[w]);
	sole = sole_word(s, rec);
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
			if (who <= 0 || (who != s->my_pid && !seg_pid_alive(who, 0))) {
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
static bool
holds(struct seg *s, uint32_t rec, uint32_t slot)
{
	uint64_t w = atomic_load(holders_word(&s->slots[slot]));

	if (((w >> 32) & HTAG_LOCK) && HTAG_REC((uint32_t)(w >> 32)) == rec + 1)
		w = hold_wait(s, slot);
	return w == sole_word(s, rec) || has_bit(s, rec, slot);
}

void
seg_hold_first(struct seg *s, int rec, uint32_t slot)
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
static bool
hold_add(struct seg *s, uint32_t rec, uint32_t slot)
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
	uint64_t sole = sole_word(s, rec), w, nw;
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
seg_drop_hold(struct seg *s, int rec, uint32_t slot, bool reclaimed)
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
	seg_release_slot(s, slot, reclaimed);
	return true;
}

/* Changes of record rec's holds left half done (its process died between
 * the count and the bit) are finished, so its row is right. */
static void
settle_holds(struct seg *s, uint32_t rec)
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
static void
drop_sole_holds(struct seg *s, uint32_t rec, pid_t dead, bool reclaimed)
{
	uint64_t sole = sole_word(s, rec);

	for (uint32_t i = 0; i < s->nslots; i++) {
		uint64_t w = atomic_load(holders_word(&s->slots[i]));

		if (HTAG_REC((uint32_t)(w >> 32)) != rec + 1)
			continue;
		if ((w >> 32) & HTAG_LOCK)
			w = hold_wait(s, i);
		if (w != sole)
			continue;
		if (dead > 0)
			seg_resolve(s, i, dead);
		seg_drop_hold(s, (int)rec, i, reclaimed);
	}
}

/* Slots that process pid left unfinished: dropped by it and never
 * released, or set up or released half-way when it died. No row has
 * their bit, so every slot is looked at. */
static void
release_orphans(struct seg *s, pid_t pid)
{
	for (uint32_t i = 0; i < s->nslots; i++) {
		uint32_t st = atomic_load_explicit(&s->slots[i].state, memory_order_relaxed);

		if (st == SLOT_FREE || (SLOT_BY(st) != pid && atomic_load(&s->slots[i].holders) != 0))
			continue;
		/* A drop still locked (its process died between the count and
		 * its bit) is finished first, so the bit never outlives the
		 * slot's release and meets a new socket in it. */
		if (st == SLOT_USED)
			hold_wait(s, i);
		seg_release_orphan(s, i, pid);
	}
}

/* True if some record in use names pid. */
static bool
has_record(const struct seg *s, pid_t pid)
{
	for (uint32_t i = 0; i < s->nprocs; i++) {
		if (atomic_load(&s->procs[i].state) != PROC_FREE &&
		    atomic_load(&s->procs[i].pid) == pid)
			return true;
	}
	return false;
}

/*
 * Slots set up or released half-way by a dead process that had no record:
 * a process reclaims (and so releases others' slots) before it has a
 * record of its own, at attach or when the table is full, and a kill can
 * land there. Nobody's reclaim would ever finish those. A process with a
 * record is left to release_orphans, after its row's holds are dropped.
 */
static void
release_recordless(struct seg *s)
{
	for (uint32_t i = 0; i < s->nslots; i++) {
		uint32_t st = atomic_load_explicit(&s->slots[i].state, memory_order_relaxed);
		pid_t by = SLOT_BY(st);

		if ((SLOT_KIND(st) != SLOT_INIT && SLOT_KIND(st) != SLOT_RELEASING) || by <= 0 ||
		    by == s->my_pid || seg_pid_alive(by, 0) || has_record(s, by))
			continue;
		seg_release_orphan(s, i, by);
	}
}

/* ---- process records ---- */

/* Drops every hold of record rec and frees the record. The caller owns rec
 * exclusively; `dead` says its process is dead (then whatever it left half
 * done is finished first), `reclaimed` that its permits count as reclaimed
 * (it died without exiting normally). */
static void
empty_record(struct seg *s, uint32_t rec, bool dead_proc, bool reclaimed)
{
	_Atomic uint64_t *r = seg_row(s, rec);
	pid_t dead = dead_proc ? atomic_load(&s->procs[rec].pid) : 0;

	if (dead_proc)
		settle_holds(s, rec);
	/* The sole holds first: one turned into a bit meanwhile is in the
	 * row read below. */
	drop_sole_holds(s, rec, dead, reclaimed);
	for (uint32_t w = 0; w < s->bitmap_words; w++) {
		uint64_t bits = atomic_load(&r[w]);

		while (bits != 0) {
			uint32_t slot = w * 64 + (uint32_t)__builtin_ctzll(bits);

			bits &= bits - 1;
			/* What the dead process was doing to the slot when
			 * it died is finished first. */
			if (dead > 0)
				seg_resolve(s, slot, dead);
			seg_drop_hold(s, (int)rec, slot, reclaimed);
		}
	}
	if (dead_proc) {
		release_orphans(s, dead);
		/* A take it made on a socket released meanwhile (tally.c). */
		tally_sweep(s);
	}
	atomic_store(&s->procs[rec].pid, 0);
	atomic_store(&s->procs[rec].start, 0);
	atomic_store(&s->procs[rec].owner, 0);
	atomic_store_explicit(&s->procs[rec].state, PROC_FREE, memory_order_release);
}

/* Claims a free process record in state `state` for owner; -ENOSPC if none. */
static int
alloc_record(struct seg *s, uint32_t state, pid_t owner)
{
	for (int pass = 0; pass < 2; pass++) {
		for (uint32_t i = 0; i < s->nprocs; i++) {
			uint32_t expected = PROC_FREE;

			if (atomic_load(&s->procs[i].state) != PROC_FREE)
				continue;
			/* A freed record has owner 0, so between this CAS
			 * and the owner store a reclaimer sees FORKING with
			 * owner 0 and knows to leave it alone. */
			if (atomic_compare_exchange_strong(&s->procs[i].state, &expected,
			    PROC_FORKING)) {
				atomic_fetch_add(&s->procs[i].gen, 1);
				atomic_store(&s->procs[i].owner, owner);
				atomic_store(&s->procs[i].pid, 0);
				atomic_store(&s->procs[i].since_ms, now_mono_ms());
				atomic_store(&s->procs[i].fork_locked, 0);
				s->procs[i].uid = (uint32_t)geteuid();
				for (uint32_t w = 0; w < s->bitmap_words; w++)
					atomic_store(&seg_row(s, i)[w], 0);
				if (state != PROC_FORKING)
					atomic_store(&s->procs[i].state, state);
				return (int)i;
			}
		}
		if (pass == 0 && seg_reclaim(s, false) == 0)
			break;
	}
	return -ENOSPC;
}

/* This process's record, claimed on first need. Two threads may race to
 * claim one; the loser gives its record back, so nobody waits. */
static __attribute__((noinline)) int
claim_record(struct seg *s)
{
	int mine, expected = -1;
	pid_t pid;

	pid = s->my_pid;
	mine = alloc_record(s, PROC_FORKING, pid);
	if (mine < 0)
		return mine;
	atomic_store(&s->procs[mine].start, s->my_start);
	atomic_store(&s->procs[mine].pid, pid);
	atomic_store(&s->procs[mine].state, PROC_LIVE);
	if (!atomic_compare_exchange_strong(&s->rec, &expected, mine)) {
		empty_record(s, (uint32_t)mine, false, false);
		return expected;
	}
	atomic_store(&s->sole, sole_word(s, (uint32_t)mine));
	return mine;
}

int
seg_my_record(struct seg *s)
{
	int r = atomic_load(&s->rec);

	return __builtin_expect(r >= 0, 1) ? r : claim_record(s);
}

/*
 * While a fork is under way its child's record is FORKING with no pid yet.
 * If the parent dies then, a reclaimer must know whether a child exists
 * that will still claim the record. The parent takes an OFD read lock on
 * byte `rec` of the segment object before fork; the child inherits the
 * descriptor, so the lock lives until both have closed it: the parent right
 * after fork, the child once it has claimed the record (or at death). The
 * program's other threads may close the descriptor under us (closefrom, a
 * dup2 onto its number), so the record is also left alone FORK_GRACE_MS
 * whatever the lock says; the child publishes its pid in microseconds.
 * Returns the descriptor, or -1 (then only the parent speaks for it).
 */
static int
fork_lock(struct seg *s, uint32_t rec)
{
	char name[BS_NAME_MAX + 16];
	struct flock fl = { .l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = rec, .l_len = 1 };
	int fd;

	seg_shm_name(s->h->name, name, sizeof(name));
	fd = shm_open(name, O_RDONLY, 0);
	if (fd < 0)
		return -1;
	if (fcntl(fd, F_OFD_SETLK, &fl) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* True if some process still has the fork lock of record rec. */
static bool
fork_lock_held(const struct seg *s, uint32_t rec)
{
	char name[BS_NAME_MAX + 16];
	struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = rec, .l_len = 1 };
	int fd, r;

	seg_shm_name(s->h->name, name, sizeof(name));
	fd = shm_open(name, O_RDONLY, 0);
	if (fd < 0)
		return true;	/* cannot tell: leave it to the grace period */
	r = fcntl(fd, F_OFD_GETLK, &fl);
	close(fd);
	return r < 0 || fl.l_type != F_UNLCK;
}

/* A FORKING record whose parent died before it knew its child: true if a
 * child may still claim it (see fork_lock). */
static bool
forking_child(const struct seg *s, uint32_t rec, pid_t owner)
{
	if (now_mono_ms() - atomic_load(&s->procs[rec].since_ms) < FORK_GRACE_MS)
		return true;
	/* The lock is held from before fork() until the child claims the
	 * record, by the parent or the child: free, nobody ever will, even
	 * if the parent lives on (its forking thread was killed by exec). */
	if (atomic_load(&s->procs[rec].fork_locked))
		return fork_lock_held(s, rec);
	return owner == s->my_pid || seg_pid_alive(owner, 0);
}

int
seg_reclaim(struct seg *s, bool throttle)
{
	pid_t me = s->my_pid;
	int n = 0;

	if (throttle) {
		uint64_t now = now_mono_ms(), last = atomic_load(&s->h->last_reclaim_ms);

		if (now - last < RECLAIM_EVERY_MS && now >= last)
			return 0;
		if (!atomic_compare_exchange_strong(&s->h->last_reclaim_ms, &last, now))
			return 0;
	}
	for (uint32_t i = 0; i < s->nprocs; i++) {
		struct seg_proc *p = &s->procs[i];
		uint32_t st = atomic_load(&p->state), expected = st;
		pid_t pid = atomic_load(&p->pid), owner = atomic_load(&p->owner);
		uint64_t start = atomic_load(&p->start);

		switch (st) {
		case PROC_LIVE:
			if (pid == me || seg_pid_alive(pid, start))
				continue;
			break;
		case PROC_FORKING:
			/* Filled in by a parent around fork(): the child if
			 * its pid is known, else the fork lock (or, without
			 * one, the parent) speaks for it. */
			if (owner == 0 || (pid != 0 ? seg_pid_alive(pid, start) :
			    forking_child(s, i, owner)))
				continue;
			break;
		case PROC_EXITED:
			/* Exited normally: its holds go back once the kernel
			 * has closed its descriptors, never before. */
			if (seg_pid_alive(pid, start))
				continue;
			break;
		case PROC_RECLAIMING:
			if (owner == me || seg_pid_alive(owner, 0))
				continue;
			break;
		default:
			continue;
		}
		if (!atomic_compare_exchange_strong(&p->state, &expected, PROC_RECLAIMING))
			continue;
		/* Between the reads above and the CAS the record may have been
		 * freed and taken by a new process in the same state: then it
		 * is not the one found dead, and goes back untouched. */
		if (atomic_load(&p->pid) != pid || atomic_load(&p->start) != start) {
			atomic_store(&p->state, st);
			continue;
		}
		atomic_store(&p->owner, me);
		empty_record(s, i, true, st != PROC_EXITED);
		n++;
	}
	/* Unthrottled (the CLI, a start-up, a full table) or after a death. */
	if (!throttle || n > 0)
		release_recordless(s);
	/* A death may have left a pool's use statistic one off. */
	if (n > 0)
		pool_resync_use(s);
	return n;
}

int
seg_find_inode(const struct seg *s, uint64_t ino)
{
	for (uint32_t i = 0; i < s->nslots; i++) {
		if (atomic_load(&s->slots[i].state) == SLOT_USED &&
		    atomic_load(&s->slots[i].inode) == ino)
			return (int)i;
	}
	return -1;
}

/* ---- fork, exec and exit ---- */

/* The gate while a fork is under way: waits for it, bounded. */
static __attribute__((noinline)) void
gate_wait(struct seg *s)
{
	uint64_t deadline = 0;

	atomic_fetch_sub(&s->busy, 1);
	for (;;) {
		atomic_fetch_add(&s->busy, 1);
		if (atomic_load(&s->forking) == 0)
			return;
		atomic_fetch_sub(&s->busy, 1);
		/* A fork is taking its snapshot: a moment. Bounded, since a
		 * signal handler can call us while its own thread forks. */
		if (deadline == 0)
			deadline = now_mono_ms() + GATE_WAIT_MS;
		else if (now_mono_ms() >= deadline)
			break;
		sched_yield();
	}
	atomic_fetch_add(&s->busy, 1);
}

/* Small, so that the library's link-time optimisation inlines the common
 * case of no fork under way: one add and one load. */
void
seg_gate_enter(struct seg *s)
{
	atomic_fetch_add(&s->busy, 1);
	if (__builtin_expect(atomic_load(&s->forking) != 0, 0))
		gate_wait(s);
}

void
seg_gate_leave(struct seg *s)
{
	/* One subtraction; from 0 (a child whose gate the fork wrapper reset
	 * while a signal handler's thread was in it) it is put back, so the
	 * count never wraps around for good. */
	if (__builtin_expect(atomic_fetch_sub(&s->busy, 1) == 0, 0))
		atomic_fetch_add(&s->busy, 1);
}

void
seg_gate_close(struct seg *s)
{
	uint64_t deadline = now_mono_ms() + GATE_WAIT_MS;
	uint32_t none = 0;

	/* One fork at a time in a process: two would each share out the
	 * same unconnected socket and copy half-made records. Bounded, for
	 * a signal handler forking in the middle of its own thread's fork. */
	while (!atomic_compare_exchange_weak(&s->forking, &none, 1)) {
		if (now_mono_ms() >= deadline) {
			atomic_fetch_add(&s->forking, 1);
			break;
		}
		none = 0;
		sched_yield();
	}
	while (atomic_load(&s->busy) != 0 && now_mono_ms() < deadline)
		sched_yield();
	if (atomic_load(&s->busy) != 0)
		bs_log(LOG_WARN, "fork: another thread stayed %d ms in the middle of taking a "
		    "permit; the child's holds may miss it", GATE_WAIT_MS);
}

void
seg_fork_prepare(struct seg *s, struct seg_fork *f)
{
	int rec = atomic_load(&s->rec), child;

	f->rec = -1;
	f->lockfd = -1;
	if (rec < 0)
		return;
	child = alloc_record(s, PROC_FORKING, s->my_pid);
	if (child < 0) {
		bs_log(LOG_ERROR, "process table of segment %s is full: a child's "
		    "inherited sockets are not counted as held by it", s->h->name);
		return;
	}
	f->rec = child;
	f->gen = atomic_load(&s->procs[child].gen);
	f->lockfd = fork_lock(s, (uint32_t)child);
	if (f->lockfd >= 0)
		atomic_store(&s->procs[child].fork_locked, 1);
	/* The child holds every socket the parent holds now, by bit or
	 * alone (sole); the holds are taken before fork so the parent
	 * closing first cannot free them. The gate is closed, so no thread
	 * is between taking a slot and recording it; a slot released
	 * meanwhile (holders at 0) is not held again. Each slot is looked at
	 * once, so a sole hold turned into a bit by hold_add is not added
	 * twice; one being turned by another process is waited for. */
	for (uint32_t slot = 0; slot < s->nslots; slot++) {
		if (holds(s, (uint32_t)rec, slot))
			hold_add(s, (uint32_t)child, slot);
	}
}

/* Writes pid into record f->rec if it is still the record of generation
 * f->gen and names no pid yet (or this one). The child and the parent both
 * do, whichever runs first; a child that ran and died before its parent
 * returned from fork() may have had its record reclaimed and reused, and
 * must not have its pid written into another fork's record. */
static bool
publish_pid(struct seg *s, const struct seg_fork *f, pid_t pid)
{
	_Atomic uint64_t *w = (_Atomic uint64_t *)(uintptr_t)&s->procs[f->rec].pid;
	uint64_t none = (uint64_t)f->gen << 32, mine = none | (uint32_t)pid;

	return atomic_compare_exchange_strong(w, &none, mine) || none == mine;
}

/* Closes the fork lock's descriptor, if it still is ours: the program may
 * have closed it and reused the number meanwhile. */
static void
fork_unlock(const struct seg *s, int lockfd)
{
	int saved = errno;
	struct stat st;

	if (lockfd >= 0 && fstat(lockfd, &st) == 0 && S_ISREG(st.st_mode) &&
	    (uint64_t)st.st_ino == s->ino)
		close(lockfd);
	errno = saved;
}

bool
seg_fork_child(struct seg *s, const struct seg_fork *f)
{
	pid_t me = (pid_t)syscall(SYS_getpid);
	uint32_t expected = PROC_FORKING;
	bool claimed;

	/* The other threads did not come along: nobody is in the gate. */
	atomic_store(&s->busy, 0);
	atomic_store(&s->forking, 0);
	s->my_pid = me;
	s->my_start = seg_pid_start(me);
	if (f->rec < 0) {
		set_rec(s, -1);
		return true;
	}
	/* Once our pid is in the record nobody reclaims it while we live,
	 * so the start time and the state can follow. */
	claimed = publish_pid(s, f, me);
	if (claimed) {
		atomic_store(&s->procs[f->rec].start, s->my_start);
		claimed = atomic_compare_exchange_strong(&s->procs[f->rec].state, &expected,
		    PROC_LIVE);
	}
	fork_unlock(s, f->lockfd);
	if (claimed) {
		set_rec(s, f->rec);
		return true;
	}
	/* Reclaimed meanwhile: what this process inherited is adopted again
	 * by the caller. */
	set_rec(s, -1);
	for (uint32_t i = 0; i < s->nslots; i++)
		atomic_store(&s->lcount[i], 0);
	return false;
}

void
seg_fork_parent(struct seg *s, const struct seg_fork *f, pid_t pid)
{
	seg_dec_floor(&s->forking);
	fork_unlock(s, f->lockfd);
	if (f->rec < 0)
		return;
	if (pid < 0) {
		empty_record(s, (uint32_t)f->rec, false, false);
		return;
	}
	publish_pid(s, f, pid);
}

static bool
any_slot_used(const struct seg *s)
{
	for (uint32_t i = 0; i < s->nslots; i++) {
		if (atomic_load_explicit(&s->slots[i].state, memory_order_relaxed) != SLOT_FREE)
			return true;
	}
	return false;
}

void
seg_adopt(struct seg *s, void (*cb)(int fd, uint32_t slot))
{
	pid_t me = (pid_t)syscall(SYS_getpid);
	int rec = -1;
	DIR *d;
	struct dirent *e;

	/* The record of the image this process was before exec. */
	for (uint32_t i = 0; i < s->nprocs; i++) {
		struct seg_proc *p = &s->procs[i];

		if (atomic_load(&p->state) != PROC_LIVE || atomic_load(&p->pid) != me)
			continue;
		if (atomic_load(&p->start) == s->my_start && rec < 0) {
			rec = (int)i;
		} else {
			uint32_t expected = PROC_LIVE;

			/* A dead process whose PID we now have. */
			if (atomic_compare_exchange_strong(&p->state, &expected, PROC_RECLAIMING))
				empty_record(s, i, true, true);
		}
	}
	if (rec >= 0) {
		/* The threads of the old image are gone: what they left half
		 * done on any slot or hold is finished now. (A process new
		 * under a reused pid has nothing of its own to finish: its
		 * dead predecessor's record was emptied just above.) */
		for (uint32_t i = 0; i < s->nslots; i++) {
			if (atomic_load_explicit(&s->slots[i].state, memory_order_relaxed) !=
			    SLOT_FREE &&
			    atomic_load_explicit(&s->slots[i].op_pid, memory_order_relaxed) == me)
				seg_resolve(s, i, me);
		}
		release_orphans(s, me);
		tally_sweep(s);
		settle_holds(s, (uint32_t)rec);
		set_rec(s, rec);
	} else if (!any_slot_used(s))
		return;		/* nothing anyone holds can have been inherited */
	d = opendir("/proc/self/fd");
	if (d != NULL) {
		while ((e = readdir(d)) != NULL) {
			struct stat st;
			int fd = atoi(e->d_name), slot;

			if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd == dirfd(d))
				continue;
			if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
				continue;
			slot = seg_find_inode(s, (uint64_t)st.st_ino);
			if (slot < 0)
				continue;
			if (rec < 0 || !holds(s, (uint32_t)rec, (uint32_t)slot)) {
				/* Inherited from another process (posix_spawn,
				 * or a fork the shim did not see): hold it too,
				 * unless its permit was freed meanwhile. */
				struct seg_slot *sl = &s->slots[slot];

				if (rec < 0 && (rec = seg_my_record(s)) < 0)
					break;
				if (!hold_add(s, (uint32_t)rec, (uint32_t)slot))
					continue;
				if (atomic_load(&sl->inode) != (uint64_t)st.st_ino) {
					seg_drop_hold(s, rec, (uint32_t)slot, false);
					continue;
				}
			}
			atomic_fetch_add(&s->lcount[slot], 1);
			cb(fd, (uint32_t)slot);
		}
		closedir(d);
	}
	if (rec < 0)
		return;
	/* Sockets the old image held whose descriptors did not survive exec
	 * (close-on-exec) are no longer held by this process. */
	for (uint32_t slot = 0; slot < s->nslots; slot++) {
		if (atomic_load(&s->lcount[slot]) == 0 && holds(s, (uint32_t)rec, slot))
			seg_drop_hold(s, rec, slot, false);
	}
}

void
seg_detach_all(struct seg *s)
{
	int rec = atomic_exchange(&s->rec, -1);
	uint32_t expected = PROC_LIVE;

	atomic_store(&s->sole, 0);
	if (rec < 0)
		return;
	for (uint32_t i = 0; i < s->nslots; i++)
		atomic_store(&s->lcount[i], 0);
	if (atomic_compare_exchange_strong(&s->procs[rec].state, &expected, PROC_RECLAIMING))
		empty_record(s, (uint32_t)rec, false, false);
}

void
seg_exit(struct seg *s)
{
	int rec = atomic_load(&s->rec);
	uint32_t expected = PROC_LIVE;

	if (rec < 0)
		return;
	/* The record stays this process's until it is dead, even if it
	 * holds nothing now: the other threads run on until the process
	 * ends, and one may take a permit, or a destructor close a counted
	 * socket, through the usual path. A reclaim frees it afterwards. */
	if (atomic_compare_exchange_strong(&s->procs[rec].state, &expected, PROC_EXITED))
		atomic_store(&s->h->last_reclaim_ms, 0);
}

/* proc.c - process records: who holds what, reclaim of the dead, fork, exec and exit. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "admit/pool.h"
#include "admit/slot.h"
#include "admit/tally.h"
#include "log.h"
#include "sys.h"

/*
 * Each process that holds a counted socket has a record in the segment:
 * pid, start time, state, and a bitmap row with one bit per socket slot it
 * holds alongside other processes (a slot it holds alone is named by the
 * slot's holders word instead: slot.c's sole holds). A slot's permits go
 * back when its last holder drops it: closes its last descriptor of the
 * socket, or is found dead (/proc/PID/stat says Z or X, or shows another
 * start time). fork gives a record made for the child before fork() runs
 * every hold of the parent; exec finds the record of its PID and start
 * time again.
 */

#define RECLAIM_EVERY_MS 100
#define FORK_GRACE_MS	300	/* a fork's record is left alone this long, whatever else */
#define GATE_WAIT_MS	1000	/* the longest fork waits for the gate to empty */
#define CLAIM_WAIT_MS	20	/* the longest a thread waits for a sibling's claim */

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
		    by == s->my_pid || sys_pid_alive(by, 0) || has_record(s, by))
			continue;
		slot_release_orphan(s, i, by);
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
		slot_settle_holds(s, rec);
	/* The sole holds first: one turned into a bit meanwhile is in the
	 * row read below. */
	slot_drop_sole_holds(s, rec, dead, reclaimed);
	for (uint32_t w = 0; w < s->bitmap_words; w++) {
		uint64_t bits = atomic_load(&r[w]);

		while (bits != 0) {
			uint32_t slot = w * 64 + (uint32_t)__builtin_ctzll(bits);

			bits &= bits - 1;
			/* What the dead process was doing to the slot when
			 * it died is finished first. */
			if (dead > 0)
				slot_resolve(s, slot, dead);
			slot_drop_hold(s, (int)rec, slot, reclaimed);
		}
	}
	if (dead_proc) {
		slot_release_orphans(s, dead);
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
		if (pass == 0 && proc_reclaim(s, false) == 0)
			break;
	}
	return -ENOSPC;
}

/* This process's record, claimed on first need. Threads may race to claim
 * one; each takes a record, the first to publish keeps it and the others
 * give theirs back, so nobody waits. A thread that finds the table full
 * while another thread of this process is still claiming waits (bounded)
 * for that claim: the table may be full of its own siblings' records, and
 * the process is then no more out of records than before the race. A table
 * found full is not looked at again for RECLAIM_EVERY_MS, in this
 * segment: each look reads every holder's /proc entry, and a program may
 * retry a refused connect at once. */
static int
await_sibling_claim(struct seg *s)
{
	uint64_t deadline = now_mono_ms() + CLAIM_WAIT_MS;
	int r;

	while ((r = atomic_load(&s->rec)) < 0 && atomic_load(&s->claiming) != 0 &&
	    now_mono_ms() < deadline)
		sched_yield();
	return r;
}

static __attribute__((noinline)) int
claim_record(struct seg *s)
{
	int mine, expected = -1;
	uint64_t now = now_mono_ms();
	pid_t pid;

	if (now < atomic_load(&s->full_until_ms))
		return -ENOSPC;
	pid = s->my_pid;
	atomic_fetch_add(&s->claiming, 1);
	mine = alloc_record(s, PROC_FORKING, pid);
	if (mine < 0) {
		int sibling;

		atomic_fetch_sub(&s->claiming, 1);
		sibling = await_sibling_claim(s);
		if (sibling >= 0)
			return sibling;
		atomic_store(&s->full_until_ms, now + RECLAIM_EVERY_MS);
		return mine;
	}
	atomic_store(&s->procs[mine].start, s->my_start);
	atomic_store(&s->procs[mine].pid, pid);
	atomic_store(&s->procs[mine].state, PROC_LIVE);
	if (!atomic_compare_exchange_strong(&s->rec, &expected, mine)) {
		atomic_fetch_sub(&s->claiming, 1);
		empty_record(s, (uint32_t)mine, false, false);
		return expected;
	}
	atomic_store(&s->sole, slot_sole_word(s, (uint32_t)mine));
	atomic_fetch_sub(&s->claiming, 1);
	return mine;
}

int
proc_record(struct seg *s)
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
	if (sys_fcntl(fd, F_OFD_SETLK, &fl) < 0) {
		sys_close(fd);
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
	r = sys_fcntl(fd, F_OFD_GETLK, &fl);
	sys_close(fd);
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
	return owner == s->my_pid || sys_pid_alive(owner, 0);
}

int
proc_reclaim(struct seg *s, bool throttle)
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
			if (pid == me || sys_pid_alive(pid, start))
				continue;
			break;
		case PROC_FORKING:
			/* Filled in by a parent around fork(): the child if
			 * its pid is known, else the fork lock (or, without
			 * one, the parent) speaks for it. */
			if (owner == 0 || (pid != 0 ? sys_pid_alive(pid, start) :
			    forking_child(s, i, owner)))
				continue;
			break;
		case PROC_EXITED:
			/* Exited normally: its holds go back once the kernel
			 * has closed its descriptors, never before. */
			if (sys_pid_alive(pid, start))
				continue;
			break;
		case PROC_RECLAIMING:
			if (owner == me || sys_pid_alive(owner, 0))
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

/* ---- fork, exec and exit ---- */

/* The gate while a fork is under way: waits for it, bounded. */
static __attribute__((noinline)) void
gate_wait(struct seg *s)
{
	uint64_t deadline = 0;

	/* A process that shares our memory but is not us (a vfork or clone
	 * child, while our gate is closed around its making), or a copy made
	 * while it was (clone, _Fork): its descriptors are not the tables',
	 * and nobody would ever open the gate for it. */
	if (sys_getpid() != s->my_pid)
		return;
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
proc_gate_enter(struct seg *s)
{
	atomic_fetch_add(&s->busy, 1);
	if (__builtin_expect(atomic_load(&s->forking) != 0, 0))
		gate_wait(s);
}

void
proc_gate_leave(struct seg *s)
{
	/* One subtraction; from 0 (a child whose gate the fork wrapper reset
	 * while a signal handler's thread was in it) it is put back, so the
	 * count never wraps around for good. */
	if (__builtin_expect(atomic_fetch_sub(&s->busy, 1) == 0, 0))
		atomic_fetch_add(&s->busy, 1);
}

void
proc_gate_close(struct seg *s)
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

/* Every slot record rec holds becomes watched (slot_watch): a child the
 * tables cannot name may hold its socket, so its permits stay until the
 * kernel has no file of it left. */
static void
watch_all(struct seg *s, uint32_t rec)
{
	for (uint32_t slot = 0; slot < s->nslots; slot++) {
		if (slot_held_by(s, rec, slot))
			slot_watch(s, slot);
	}
}

/*
 * A fork whose child gets no record (the process table is full): nothing
 * in the tables will say that the child holds what it inherits, so the
 * parent closing its copies would give their permits back while the
 * child's copies are open. Every slot the parent holds is watched instead.
 * Said at most once a second per process.
 */
static void
fork_unrecorded(struct seg *s, uint32_t rec)
{
	static _Atomic uint64_t said_ms;
	uint64_t now = now_mono_ms(), last = atomic_load(&said_ms);
	char name[BS_NAME_MAX];

	watch_all(s, rec);

	if ((last != 0 && now - last < 1000) || !atomic_compare_exchange_strong(&said_ms, &last, now))
		return;
	log_name(name, sizeof(name), s->h->name, sizeof(name));
	bs_log(LOG_ERROR, "the process table of segment %s is full (max_processes = %u): the "
	    "child of this fork gets no record, so the sockets it inherits keep their permits "
	    "until the kernel has closed every copy, and its own connects are refused while the "
	    "table stays full; set max_processes = %u", name, s->nprocs,
	    seg_table_grown(s->nprocs, BS_MAX_PROCESSES));
}

void
proc_fork_prepare(struct seg *s, struct proc_fork *f)
{
	int rec = atomic_load(&s->rec), child;

	f->rec = -1;
	f->lockfd = -1;
	if (rec < 0)
		return;
	child = alloc_record(s, PROC_FORKING, s->my_pid);
	if (child < 0) {
		fork_unrecorded(s, (uint32_t)rec);
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
		if (slot_held_by(s, (uint32_t)rec, slot))
			slot_hold_add(s, (uint32_t)child, slot);
	}
}

/*
 * Every slot is watched, not only those whose descriptors the child could
 * inherit: this process cannot tell which those are. Close-on-exec in the
 * parent says nothing about the child (CPython's subprocess clears it on
 * the child's copies of pass_fds; a posix_spawn file action dup2s a
 * close-on-exec socket to a number that survives exec), a vfork or clone
 * child may run any code before it execs or instead of it, and a thread of
 * ours may close its copy while the child still has one. A slot watched
 * for nothing costs only time: when its last holder drops it, its permit
 * waits for the next reconcile, which the first connect to find its
 * compartment full runs. The gate stays closed until proc_spawn_done, so
 * no thread takes a slot between the watch and the child's copy of the
 * descriptors that the watch missed (an unconnected socket connected
 * meanwhile takes a watched slot: the caller clears its fresh marks).
 */
void
proc_spawn_prepare(struct seg *s)
{
	int rec;

	proc_gate_close(s);
	rec = atomic_load(&s->rec);
	if (rec >= 0)
		watch_all(s, (uint32_t)rec);
}

void
proc_spawn_done(struct seg *s)
{
	seg_dec_floor(&s->forking);
}

/* Writes pid into record f->rec if it is still the record of generation
 * f->gen and names no pid yet (or this one). The child and the parent both
 * do, whichever runs first; a child that ran and died before its parent
 * returned from fork() may have had its record reclaimed and reused, and
 * must not have its pid written into another fork's record. */
static bool
publish_pid(struct seg *s, const struct proc_fork *f, pid_t pid)
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
		sys_close(lockfd);
	errno = saved;
}

bool
proc_fork_child(struct seg *s, const struct proc_fork *f)
{
	pid_t me = sys_getpid();
	uint32_t expected = PROC_FORKING;
	bool claimed;

	/* The other threads did not come along: nobody is in the gate. */
	atomic_store(&s->busy, 0);
	atomic_store(&s->forking, 0);
	atomic_store(&s->claiming, 0);
	s->my_pid = me;
	s->my_start = sys_pid_start(me);
	if (f->rec < 0) {
		slot_set_record(s, -1);
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
		slot_set_record(s, f->rec);
		return true;
	}
	/* Reclaimed meanwhile: what this process inherited is adopted again
	 * by the caller. */
	slot_set_record(s, -1);
	for (uint32_t i = 0; i < s->nslots; i++)
		atomic_store(&s->lcount[i], 0);
	return false;
}

void
proc_fork_parent(struct seg *s, const struct proc_fork *f, pid_t pid)
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
proc_adopt(struct seg *s, void (*cb)(int fd, uint32_t slot))
{
	pid_t me = sys_getpid();
	int rec = -1;
	bool norec = false;
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
				slot_resolve(s, i, me);
		}
		slot_release_orphans(s, me);
		tally_sweep(s);
		slot_settle_holds(s, (uint32_t)rec);
		slot_set_record(s, rec);
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
			slot = slot_find_inode(s, (uint64_t)st.st_ino);
			if (slot < 0)
				continue;
			if (rec < 0 || !slot_held_by(s, (uint32_t)rec, (uint32_t)slot)) {
				/* Inherited from another process (posix_spawn,
				 * or a fork the shim did not see): hold it too,
				 * unless its permit was freed meanwhile. */
				struct seg_slot *sl = &s->slots[slot];

				if (rec < 0 && !norec && (rec = proc_record(s)) < 0)
					norec = true;
				/* No record to hold it by (the process table
				 * is full): its permit waits for the kernel
				 * to say no copy is left. */
				if (norec) {
					slot_watch(s, (uint32_t)slot);
					continue;
				}
				if (!slot_hold_add(s, (uint32_t)rec, (uint32_t)slot))
					continue;
				if (atomic_load(&sl->inode) != (uint64_t)st.st_ino) {
					slot_drop_hold(s, rec, (uint32_t)slot, false);
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
		if (atomic_load(&s->lcount[slot]) == 0 && slot_held_by(s, (uint32_t)rec, slot))
			slot_drop_hold(s, rec, slot, false);
	}
}

void
proc_detach_all(struct seg *s)
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
proc_exit(struct seg *s)
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

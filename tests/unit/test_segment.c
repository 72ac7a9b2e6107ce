/* test_segment.c - unit tests of the shared segment: admission, holds, fork, reclaim, validation. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../shim/admit/segment.c"
#include "seg_fixture.h"

static struct cfg_compartment comps[2];

/* A fresh configuration with its own segment name: "a" limit 3, "b" limit 1. */
static int
setup(void **state)
{
	(void)state;
	memset(&cfg, 0, sizeof(cfg));
	memset(comps, 0, sizeof(comps));
	snprintf(cfg.segment, sizeof(cfg.segment), "ut%d_%d", (int)getpid(), counter++);
	snprintf(cfg.path, sizeof(cfg.path), "unit.cfg");
	snprintf(comps[0].name, sizeof(comps[0].name), "a");
	comps[0].max_connections = 3;
	comps[0].reject_errno = ECONNREFUSED;
	snprintf(comps[1].name, sizeof(comps[1].name), "b");
	comps[1].max_connections = 1;
	comps[1].reject_errno = EAGAIN;
	comps[0].enforce = comps[1].enforce = true;
	snprintf(cfg.classes[0].name, sizeof(cfg.classes[0].name), "default");
	cfg.nclass = 1;
	cfg.comp = comps;
	cfg.ncomp = 2;
	cfg.mode = 0600;
	cfg.max_processes = 16;
	cfg.max_sockets = 64;
	return 0;
}

/* One connection permit, as the shim asks for it: default class, no wait. */
static int
acq(struct seg *s, uint32_t comp, uint64_t ino)
{
	enum bs_reason why = REASON_MAX;

	return permit_acquire(s, seg_comp(s, comp), 0, ino, false, &why);
}

static void
test_admits_up_to_the_limit_and_refuses_the_next(void **state)
{
	struct seg *s = attach();
	int slots[3];

	(void)state;
	for (int i = 0; i < 3; i++) {
		slots[i] = acq(s, 0, 1000 + (uint64_t)i);
		assert_true(slots[i] >= 0);
	}
	assert_int_equal(acq(s, 0, 2000), -EBUSY);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 3);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->rejected), 1);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->admitted), 3);
	assert_true(atomic_load(&seg_comp(s, 0)->last_rejection_ms) > 0);
	/* The other compartment is unaffected. */
	assert_true(acq(s, 1, 3000) >= 0);
	slot_drop(s, (uint32_t)slots[0]);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 2);
	assert_true(acq(s, 0, 4000) >= 0);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->peak), 3);
	proc_detach_all(s);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 0);
	assert_int_equal(atomic_load(&seg_comp(s, 1)->in_use), 0);
	seg_close(s);
}

static void
test_a_copy_keeps_the_permit_until_the_last_drop(void **state)
{
	struct seg *s = attach();
	int slot = acq(s, 0, 42);

	(void)state;
	assert_true(slot >= 0);
	slot_hold(s, (uint32_t)slot);
	slot_drop(s, (uint32_t)slot);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 1);
	assert_int_equal(slot_find_inode(s, 42), slot);
	slot_drop(s, (uint32_t)slot);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 0);
	assert_int_equal(slot_find_inode(s, 42), -1);
	/* A drop too many never wraps the count around. */
	slot_drop(s, (uint32_t)slot);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 0);
	seg_close(s);
}

static struct seg *race_seg;
static pthread_barrier_t race_barrier;
static _Atomic int race_won;

static void *
racer(void *arg)
{
	(void)arg;
	pthread_barrier_wait(&race_barrier);
	if (acq(race_seg, 0, (uint64_t)pthread_self()) >= 0)
		atomic_fetch_add(&race_won, 1);
	return NULL;
}

static void
test_thirty_two_threads_racing_for_three_permits_get_three(void **state)
{
	pthread_t t[32];

	(void)state;
	for (int round = 0; round < 20; round++) {
		race_seg = attach();
		atomic_store(&race_won, 0);
		pthread_barrier_init(&race_barrier, NULL, 32);
		for (int i = 0; i < 32; i++)
			pthread_create(&t[i], NULL, racer, NULL);
		for (int i = 0; i < 32; i++)
			pthread_join(t[i], NULL);
		pthread_barrier_destroy(&race_barrier);
		assert_int_equal(atomic_load(&race_won), 3);
		assert_int_equal(atomic_load(&seg_comp(race_seg, 0)->in_use), 3);
		assert_int_equal(atomic_load(&seg_comp(race_seg, 0)->peak), 3);
		assert_int_equal(atomic_load(&seg_comp(race_seg, 0)->rejected), 29 * (round + 1));
		proc_detach_all(race_seg);
		seg_close(race_seg);
	}
}

/* Runs fn in a child process that attaches on its own; the child reports
 * through a pipe that it holds its permits, then blocks until killed. */
static pid_t
holder_child(int permits)
{
	int p[2];
	pid_t pid;
	char c;

	assert_int_equal(pipe(p), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct seg *s = NULL;

		close(p[0]);
		if (seg_attach(&cfg, &s, err, sizeof(err)) != 0)
			_exit(2);
		for (int i = 0; i < permits; i++) {
			if (acq(s, 0, 500 + (uint64_t)i) < 0)
				_exit(3);
		}
		if (write(p[1], "x", 1) != 1)
			_exit(4);
		pause();
		_exit(0);
	}
	close(p[1]);
	assert_int_equal(read(p[0], &c, 1), 1);
	close(p[0]);
	return pid;
}

/* Takes every free process record of s for this live process, as the
 * claims of its sibling threads would, so that alloc_record finds none. */
static void
fill_records(struct seg *s)
{
	for (uint32_t i = 0; i < s->nprocs; i++) {
		if (atomic_load(&s->procs[i].state) != PROC_FREE)
			continue;
		atomic_store(&s->procs[i].owner, getpid());
		atomic_store(&s->procs[i].since_ms, now_mono_ms());
		atomic_store(&s->procs[i].state, PROC_FORKING);
	}
}

static void
test_a_full_table_in_one_segment_leaves_another_alone(void **state)
{
	struct seg *full = attach(), *other;

	(void)state;
	fill_records(full);
	assert_int_equal(proc_record(full), -ENOSPC);
	snprintf(cfg.segment, sizeof(cfg.segment), "ut%d_%d", (int)getpid(), counter++);
	other = attach();
	assert_true(proc_record(other) >= 0);
	seg_close(other);
	seg_close(full);
}

static struct seg *sibling_seg;

static void *
sibling_publishes(void *arg)
{
	(void)arg;
	usleep(5000);
	atomic_store(&sibling_seg->rec, 3);
	atomic_store(&sibling_seg->claiming, 0);
	return NULL;
}

static void
test_a_thread_finding_the_table_full_takes_its_siblings_record(void **state)
{
	pthread_t t;

	(void)state;
	sibling_seg = attach();
	fill_records(sibling_seg);
	/* Another thread of this process is half-way through its claim. */
	atomic_store(&sibling_seg->claiming, 1);
	pthread_create(&t, NULL, sibling_publishes, NULL);
	assert_int_equal(proc_record(sibling_seg), 3);
	pthread_join(t, NULL);
	atomic_store(&sibling_seg->rec, -1);
	seg_close(sibling_seg);
}

static void
test_permits_of_a_killed_process_are_reclaimed(void **state)
{
	struct seg *s = attach();
	pid_t pid = holder_child(2);

	(void)state;
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 2);
	assert_int_equal(proc_reclaim(s, false), 0);	/* alive: nothing to take */
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	assert_int_equal(proc_reclaim(s, false), 1);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 0);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->reclaimed), 2);
	seg_close(s);
}

static void
test_a_zombie_holder_counts_as_dead(void **state)
{
	struct seg *s = attach();
	pid_t pid = holder_child(3);

	(void)state;
	kill(pid, SIGKILL);
	/* Not waited for yet: a zombie until the end of this test. */
	for (int i = 0; i < 200 && sys_pid_alive(pid, 0); i++)
		usleep(5000);
	assert_false(sys_pid_alive(pid, 0));
	/* A full compartment reclaims by itself when asked for a permit. */
	atomic_store(&s->h->last_reclaim_ms, 0);
	assert_true(acq(s, 0, 77) >= 0);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 1);
	waitpid(pid, NULL, 0);
	proc_detach_all(s);
	seg_close(s);
}

static void
test_a_reused_pid_is_told_apart_by_start_time(void **state)
{
	pid_t me = getpid();
	uint64_t start = sys_pid_start(me);

	(void)state;
	assert_true(start > 0);
	assert_true(sys_pid_alive(me, start));
	assert_true(sys_pid_alive(me, 0));
	assert_false(sys_pid_alive(me, start + 1));
	assert_false(sys_pid_alive(0, 0));
	assert_false(sys_pid_alive(-5, 0));
}

static void
test_fork_shares_the_socket_until_both_processes_drop_it(void **state)
{
	struct seg *s = attach();
	int slot = acq(s, 1, 99), st, go[2];
	struct proc_fork f;
	pid_t pid;
	char c;

	(void)state;
	assert_true(slot >= 0);
	assert_int_equal(pipe(go), 0);
	proc_fork_prepare(s, &f);
	assert_true(f.rec >= 0);
	pid = fork();
	if (pid == 0) {
		proc_fork_child(s, &f);
		/* Wait until the parent dropped its copy, then drop ours. */
		if (read(go[0], &c, 1) != 1)
			_exit(2);
		if (atomic_load(&seg_comp(s, 1)->in_use) != 1)
			_exit(3);
		slot_drop(s, (uint32_t)slot);
		_exit(atomic_load(&seg_comp(s, 1)->in_use) == 0 ? 0 : 4);
	}
	proc_fork_parent(s, &f, pid);
	assert_int_equal(atomic_load(&s->slots[slot].holders), 2);
	slot_drop(s, (uint32_t)slot);
	assert_int_equal(atomic_load(&seg_comp(s, 1)->in_use), 1);
	assert_int_equal(write(go[1], "x", 1), 1);
	waitpid(pid, &st, 0);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_int_equal(atomic_load(&seg_comp(s, 1)->in_use), 0);
	seg_close(s);
}

static void
test_a_failed_fork_undoes_the_child_record(void **state)
{
	struct seg *s = attach();
	int slot = acq(s, 0, 5);
	struct proc_fork f;

	(void)state;
	proc_fork_prepare(s, &f);
	assert_true(f.rec >= 0);
	proc_fork_parent(s, &f, -1);
	assert_int_equal(atomic_load(&s->slots[slot].holders), 1);
	assert_int_equal(atomic_load(&s->procs[f.rec].state), PROC_FREE);
	slot_drop(s, (uint32_t)slot);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 0);
	seg_close(s);
}

/*
 * A forking parent that dies before its child claims the child's record:
 * in a helper process (which takes a record of its own), acquire a permit,
 * prepare a fork, then either die without forking (`with_child` false) or
 * fork a child that waits on `go` before claiming, and die. Returns the
 * helper's pid; the record index and slot come back through `out`.
 */
static pid_t
die_while_forking(struct seg *s, bool with_child, int go, int done, int out)
{
	pid_t pid = fork();

	if (pid == 0) {
		struct proc_fork f, none = { -1, 0, -1 };
		int slot, res[2];
		pid_t child;
		char c;

		proc_fork_child(s, &none);	/* a process of its own, no record yet */
		slot = acq(s, 0, 7);
		proc_fork_prepare(s, &f);
		res[0] = f.rec;
		res[1] = slot;
		if (write(out, res, sizeof(res)) != sizeof(res))
			_exit(2);
		if (!with_child)
			_exit(0);
		child = fork();
		if (child == 0) {
			if (read(go, &c, 1) != 1)
				_exit(2);
			c = proc_fork_child(s, &f) &&
			    atomic_load(&seg_comp(s, 0)->in_use) == 1 ? 'y' : 'n';
			slot_drop(s, (uint32_t)slot);
			if (atomic_load(&seg_comp(s, 0)->in_use) != 0)
				c = 'l';
			if (write(done, &c, 1) != 1)
				_exit(2);
			_exit(0);
		}
		_exit(child > 0 ? 0 : 3);
	}
	return pid;
}

static void
test_a_parent_dying_before_fork_leaves_nothing_held(void **state)
{
	struct seg *s = attach();
	int p[2], res[2], st;
	pid_t pid;

	(void)state;
	assert_int_equal(pipe(p), 0);
	pid = die_while_forking(s, false, -1, -1, p[1]);
	assert_int_equal(read(p[0], res, sizeof(res)), sizeof(res));
	waitpid(pid, &st, 0);
	assert_true(res[0] >= 0 && res[1] >= 0);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 1);
	/* Past the fork's moment of grace, no lock held: no child can
	 * claim the record, and it goes back. */
	atomic_store(&s->procs[res[0]].since_ms, 1);
	assert_true(proc_reclaim(s, false) >= 2);
	assert_int_equal(atomic_load(&s->procs[res[0]].state), PROC_FREE);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 0);
	seg_close(s);
}

static void
test_a_child_whose_parent_died_keeps_its_holds(void **state)
{
	struct seg *s = attach();
	int p[2], go[2], done[2], res[2], st;
	pid_t pid;
	char c = 0;

	(void)state;
	assert_int_equal(pipe(p), 0);
	assert_int_equal(pipe(go), 0);
	assert_int_equal(pipe(done), 0);
	pid = die_while_forking(s, true, go[0], done[1], p[1]);
	assert_int_equal(read(p[0], res, sizeof(res)), sizeof(res));
	waitpid(pid, &st, 0);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	/* The parent is dead, its child has not claimed its record yet: the
	 * parent's own record goes, the child's holds stay, the moment of
	 * grace past or not (the child holds the fork lock). */
	atomic_store(&s->procs[res[0]].since_ms, 1);
	proc_reclaim(s, false);
	assert_int_equal(atomic_load(&s->procs[res[0]].state), PROC_FORKING);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 1);
	assert_int_equal(write(go[1], "x", 1), 1);
	assert_int_equal(read(done[0], &c, 1), 1);
	assert_int_equal(c, 'y');
	seg_close(s);
}

static void
test_a_slot_being_set_up_by_a_live_process_is_left_alone(void **state)
{
	struct seg *s = attach();
	int p[2], slot = -1;
	pid_t pid;

	(void)state;
	assert_int_equal(pipe(p), 0);
	pid = fork();
	if (pid == 0) {
		/* A process that takes a slot, drops it (the slot's holders
		 * tag now names its record) and dies without a word. */
		struct proc_fork none = { -1, 0, -1 };

		proc_fork_child(s, &none);
		slot = acq(s, 0, 77);
		slot_drop(s, (uint32_t)slot);
		if (write(p[1], &slot, sizeof(slot)) != sizeof(slot))
			_exit(2);
		_exit(0);
	}
	assert_int_equal(read(p[0], &slot, sizeof(slot)), sizeof(slot));
	waitpid(pid, NULL, 0);
	assert_true(slot >= 0);
	/* This (live) process claims that slot for a new socket and is
	 * between the claim and its first hold, as alloc_slot leaves it;
	 * the dead process's record is reclaimed meanwhile. */
	atomic_store(&s->slots[slot].state, SLOT_BUSY(SLOT_INIT, getpid()));
	assert_true(proc_reclaim(s, false) >= 1);
	assert_int_equal(atomic_load(&s->slots[slot].state), SLOT_BUSY(SLOT_INIT, getpid()));
	/* A slot a dead process was setting up is freed. */
	atomic_store(&s->slots[slot].state, SLOT_BUSY(SLOT_INIT, pid));
	slot_release_orphan(s, (uint32_t)slot, pid);
	assert_int_equal(atomic_load(&s->slots[slot].state), SLOT_FREE);
	seg_close(s);
}

static void
test_a_hold_dropped_half_way_by_a_dead_process_is_finished_once(void **state)
{
	struct seg *s = attach();
	int slot = acq(s, 1, 55), st;
	struct proc_fork f;
	pid_t pid;

	(void)state;
	assert_true(slot >= 0);
	proc_fork_prepare(s, &f);
	assert_true(f.rec >= 0);
	pid = fork();
	if (pid == 0) {
		_Atomic uint64_t *w = (_Atomic uint64_t *)(uintptr_t)&s->slots[slot].holders;
		uint32_t tag = HTAG_LOCK | HTAG(f.gen, true, (uint32_t)f.rec);

		proc_fork_child(s, &f);
		/* Killed right after taking its hold off the count, before
		 * clearing its bit: the count says 1, its row still 2. */
		atomic_store(w, (uint64_t)tag << 32 | 1);
		_exit(0);
	}
	proc_fork_parent(s, &f, pid);
	waitpid(pid, &st, 0);
	assert_true(proc_reclaim(s, false) >= 1);
	/* The half-done drop was finished, not done again: the parent's hold
	 * (and its permit) is still there, and the word is unlocked. */
	assert_int_equal(atomic_load(&s->slots[slot].holders), 1);
	assert_int_equal(atomic_load(&s->slots[slot].holders_tag) & HTAG_LOCK, 0);
	assert_int_equal(atomic_load(&seg_comp(s, 1)->in_use), 1);
	slot_drop(s, (uint32_t)slot);
	assert_int_equal(atomic_load(&seg_comp(s, 1)->in_use), 0);
	seg_close(s);
}

static void
test_a_late_parent_never_writes_into_a_reused_record(void **state)
{
	struct seg *s = attach();
	struct proc_fork a, b;

	(void)state;
	assert_true(acq(s, 0, 8) >= 0);
	proc_fork_prepare(s, &a);
	assert_true(a.rec >= 0);
	/* The child ran, died and its record was reclaimed before its
	 * parent came back from fork(); another fork got the record. */
	proc_fork_parent(s, &a, -1);
	a.lockfd = -1;
	proc_fork_prepare(s, &b);
	assert_int_equal(b.rec, a.rec);
	assert_true(b.gen != a.gen);
	/* The first parent now publishes its (dead) child's pid: not into
	 * the second fork's record, which would then look dead. */
	proc_fork_parent(s, &a, 424242);
	assert_int_equal(atomic_load(&s->procs[b.rec].pid), 0);
	assert_int_equal(atomic_load(&s->procs[b.rec].state), PROC_FORKING);
	proc_fork_parent(s, &b, -1);
	seg_close(s);
}

static _Atomic int second_fork_in;

static void *
second_fork(void *arg)
{
	struct seg *s = arg;

	proc_gate_close(s);
	atomic_store(&second_fork_in, 1);
	return NULL;
}

static void
test_forks_of_one_process_take_turns(void **state)
{
	struct seg *s = attach();
	struct proc_fork none = { -1, 0, -1 };
	pthread_t t;

	(void)state;
	proc_gate_close(s);
	atomic_store(&second_fork_in, 0);
	assert_int_equal(pthread_create(&t, NULL, second_fork, s), 0);
	usleep(50000);
	assert_int_equal(atomic_load(&second_fork_in), 0);
	proc_fork_parent(s, &none, 1);	/* the first fork is done */
	pthread_join(t, NULL);
	assert_int_equal(atomic_load(&second_fork_in), 1);
	proc_fork_parent(s, &none, 1);
	assert_int_equal(atomic_load(&s->forking), 0);
	seg_close(s);
}

static void
test_a_hold_added_for_a_record_gone_meanwhile_does_not_count(void **state)
{
	struct seg *s = attach();
	int slot = acq(s, 1, 66);
	_Atomic uint64_t *w;
	uint32_t other, tag;

	(void)state;
	assert_true(slot >= 0);
	/* A fork's parent added a hold for its child's record (count 2)
	 * and stalled before writing the bit; meanwhile that record was
	 * reclaimed and claimed again (another generation). Before adding
	 * it, the parent's own first hold (the holders word alone) was
	 * turned into its bit, as hold_add does. */
	atomic_fetch_or(&seg_row(s, (uint32_t)atomic_load(&s->rec))[slot / 64],
	    1ULL << (slot % 64));
	other = (uint32_t)atomic_load(&s->rec) + 1;
	tag = HTAG_LOCK | HTAG(atomic_load(&s->procs[other].gen) + 1, false, other);
	w = (_Atomic uint64_t *)(uintptr_t)&s->slots[slot].holders;
	atomic_store(w, (uint64_t)tag << 32 | 2);
	/* The next change finishes it without counting that hold, so this
	 * process's drop is the last and the permit goes back. */
	slot_drop(s, (uint32_t)slot);
	assert_int_equal(atomic_load(&s->slots[slot].holders), 0);
	assert_int_equal(atomic_load(&seg_comp(s, 1)->in_use), 0);
	seg_close(s);
}

/* The holders word of a slot that record rec holds alone (procs.c). */
static uint64_t
sole_of(struct seg *s, uint32_t rec)
{
	uint32_t tag = HTAG_SOLE | HTAG(atomic_load(&s->procs[rec].gen), false, rec);

	return (uint64_t)tag << 32 | 1;
}

static _Atomic uint64_t *
word_of(struct seg *s, int slot)
{
	return (_Atomic uint64_t *)(uintptr_t)&s->slots[slot].holders;
}

static bool
bit_of(struct seg *s, uint32_t rec, int slot)
{
	return (atomic_load(&seg_row(s, rec)[slot / 64]) >> (slot % 64)) & 1;
}

static void
test_a_socket_held_alone_is_its_holders_word_and_one_drop_frees_it(void **state)
{
	struct seg *s = attach();
	int slot = acq(s, 0, 91);
	uint32_t rec;

	(void)state;
	assert_true(slot >= 0);
	rec = (uint32_t)atomic_load(&s->rec);
	/* Count 1, a tag naming our record as the sole holder, no bit. */
	assert_true(atomic_load(word_of(s, slot)) == sole_of(s, rec));
	assert_false(bit_of(s, rec, slot));
	/* Those who list our holds see it all the same. */
	assert_true(slot_held_bits(s, rec, (uint32_t)slot / 64) & (1ULL << (slot % 64)));
	assert_int_equal(seg_proc_held(s, rec), 1);
	slot_drop(s, (uint32_t)slot);
	assert_int_equal(atomic_load(&s->slots[slot].holders), 0);
	assert_int_equal(atomic_load(&s->slots[slot].holders_tag) & (HTAG_SOLE | HTAG_LOCK), 0);
	assert_int_equal(atomic_load(&s->slots[slot].state), SLOT_FREE);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 0);
	assert_false(bit_of(s, rec, slot));
	seg_close(s);
}

static void
test_a_second_holder_turns_the_sole_hold_into_a_bit(void **state)
{
	struct seg *s = attach();
	int slot = acq(s, 0, 92);
	struct proc_fork f;
	uint32_t rec;

	(void)state;
	assert_true(slot >= 0);
	rec = (uint32_t)atomic_load(&s->rec);
	proc_fork_prepare(s, &f);
	assert_true(f.rec >= 0);
	/* Both hold it by bit now, counted once each. */
	assert_int_equal(atomic_load(&s->slots[slot].holders), 2);
	assert_int_equal(atomic_load(&s->slots[slot].holders_tag) & (HTAG_SOLE | HTAG_LOCK), 0);
	assert_true(bit_of(s, rec, slot));
	assert_true(bit_of(s, (uint32_t)f.rec, slot));
	/* The fork failed: the child's hold goes, ours stays, by bit. */
	proc_fork_parent(s, &f, -1);
	assert_int_equal(atomic_load(&s->slots[slot].holders), 1);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 1);
	slot_drop(s, (uint32_t)slot);
	assert_int_equal(atomic_load(&s->slots[slot].holders), 0);
	assert_false(bit_of(s, rec, slot));
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 0);
	seg_close(s);
}

/* A child of this test process that takes one permit alone, reports its
 * slot and record, and waits to be killed. */
static pid_t
sole_child(int *slot, int *rec)
{
	int p[2], got[2];
	pid_t pid;

	assert_int_equal(pipe(p), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct seg *c = NULL;

		if (seg_attach(&cfg, &c, err, sizeof(err)) != 0)
			_exit(2);
		got[0] = acq(c, 0, 93);
		got[1] = proc_record(c);
		if (write(p[1], got, sizeof(got)) != sizeof(got))
			_exit(3);
		pause();
		_exit(0);
	}
	assert_int_equal(read(p[0], got, sizeof(got)), sizeof(got));
	close(p[0]);
	close(p[1]);
	*slot = got[0];
	*rec = got[1];
	assert_true(*slot >= 0 && *rec >= 0);
	return pid;
}

/* The sole holder child of sole_child is killed with slot's holders word
 * left as w (a state it was killed in); its reclaim must free the slot. */
static void
kill_leaving_and_reclaim(struct seg *s, pid_t pid, int slot, uint64_t w)
{
	atomic_store(word_of(s, slot), w);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 1);
	assert_int_equal(proc_reclaim(s, false), 1);
	assert_int_equal(atomic_load(&s->slots[slot].holders), 0);
	assert_int_equal(atomic_load(&s->slots[slot].state), SLOT_FREE);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 0);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->reclaimed), 1);
}

static void
test_a_sole_hold_left_half_turned_into_a_bit_is_finished_at_reclaim(void **state)
{
	struct seg *s = attach();
	int slot, rec;
	pid_t pid = sole_child(&slot, &rec);
	uint32_t tag;

	(void)state;
	assert_true(atomic_load(word_of(s, slot)) == sole_of(s, (uint32_t)rec));
	/* A second holder took the sole word (locked, count unchanged) and
	 * was killed before writing the holder's bit; then the holder is
	 * killed too. */
	tag = HTAG_LOCK | HTAG(atomic_load(&s->procs[rec].gen), false, (uint32_t)rec);
	/* The reclaim finishes the change (the bit), then drops the hold. */
	kill_leaving_and_reclaim(s, pid, slot, (uint64_t)tag << 32 | 1);
	seg_close(s);
}

static void
test_a_sole_hold_dropped_by_a_process_killed_before_the_release_is_released(void **state)
{
	struct seg *s = attach();
	int slot, rec;
	pid_t pid = sole_child(&slot, &rec);
	uint32_t tag;

	(void)state;
	/* Killed right after its close's one compare-and-swap (count 0, the
	 * tag naming it as the dropper), before releasing the slot. */
	tag = HTAG(atomic_load(&s->procs[rec].gen), true, (uint32_t)rec);
	kill_leaving_and_reclaim(s, pid, slot, (uint64_t)tag << 32);
	seg_close(s);
}

static void
test_a_second_holder_of_a_live_sole_holder_leaves_it_a_bit_that_reclaim_drops(void **state)
{
	struct seg *s = attach();
	int slot, rec;
	pid_t pid = sole_child(&slot, &rec);
	struct proc_fork f;
	int mine = proc_record(s);

	(void)state;
	assert_true(mine >= 0);
	/* Another process (this one) adds a hold for a record of its own
	 * while the child, alive, holds the socket alone: what a fork of the
	 * child does, run here by speaking for the child's record. */
	atomic_store(&s->rec, rec);
	proc_fork_prepare(s, &f);
	atomic_store(&s->rec, mine);
	assert_true(f.rec >= 0);
	assert_int_equal(atomic_load(&s->slots[slot].holders), 2);
	assert_true(bit_of(s, (uint32_t)rec, slot));
	assert_true(bit_of(s, (uint32_t)f.rec, slot));
	proc_fork_parent(s, &f, -1);
	assert_int_equal(atomic_load(&s->slots[slot].holders), 1);
	/* The holder dies: its hold, a bit now, goes back at reclaim. */
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	assert_int_equal(proc_reclaim(s, false), 1);
	assert_int_equal(atomic_load(&s->slots[slot].holders), 0);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 0);
	proc_detach_all(s);
	seg_close(s);
}

static void
test_a_leftover_segment_takes_the_new_limits(void **state)
{
	struct seg *s = attach();

	(void)state;
	seg_close(s);
	comps[0].max_connections = 7;
	s = attach();
	assert_int_equal(atomic_load(&seg_comp(s, 0)->limit), 7);
	seg_close(s);
}

static void
test_a_live_segment_keeps_its_limits(void **state)
{
	struct seg *s = attach(), *s2;

	(void)state;
	assert_true(acq(s, 0, 1) >= 0);	/* this process is now a holder */
	comps[0].max_connections = 9;
	s2 = attach();
	assert_int_equal(atomic_load(&seg_comp(s2, 0)->limit), 3);
	seg_close(s2);
	proc_detach_all(s);
	seg_close(s);
}

static void
test_the_config_mode_is_applied(void **state)
{
	char path[128];
	struct stat st;
	struct seg *s;

	(void)state;
	cfg.mode = 0640;
	s = attach();
	snprintf(path, sizeof(path), "/dev/shm/bulkshim.%s", cfg.segment);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0640);
	seg_close(s);
}

/* Writes `len` bytes of a segment image to the segment's name. */
static void
plant(const void *img, size_t len)
{
	char name[BS_NAME_MAX + 16];
	int fd;

	snprintf(name, sizeof(name), "/bulkshim.%s", cfg.segment);
	fd = shm_open(name, O_RDWR | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, img, len), (ssize_t)len);
	close(fd);
}

static void
expect_untrusted(const char *what)
{
	struct seg *s = NULL;

	assert_true(seg_attach(&cfg, &s, err, sizeof(err)) < 0);
	assert_null(s);
	assert_non_null(strstr(err, what));
	assert_true(seg_open(cfg.segment, false, &s, err, sizeof(err)) < 0);
}

/* A copy of a freshly made segment (malloc'd; *len its size). */
static char *
snapshot(size_t *len)
{
	struct seg *s = attach();
	char *img = malloc(s->size);

	assert_non_null(img);
	*len = s->size;
	memcpy(img, s->base, s->size);
	seg_close(s);
	return img;
}

static void
test_a_damaged_segment_is_never_trusted(void **state)
{
	size_t len;
	char *img = snapshot(&len);

	(void)state;

	((struct seg_header *)img)->magic ^= 1;
	plant(img, len);
	expect_untrusted("bad magic");
	((struct seg_header *)img)->magic ^= 1;

	((struct seg_header *)img)->version = 99;
	plant(img, len);
	expect_untrusted("version");
	((struct seg_header *)img)->version = SEG_VERSION;

	plant(img, len / 2);
	expect_untrusted("truncated");

	plant(img, 10);
	expect_untrusted("truncated");

	((struct seg_header *)img)->nslots = 0xffffffff;
	plant(img, len);
	expect_untrusted("out of range");
	((struct seg_header *)img)->nslots = 64;

	((struct seg_header *)img)->off_slots += 8;
	plant(img, len);
	expect_untrusted("inconsistent");
	free(img);
}

/* A creator killed between sizing the segment and writing its magic (the
 * last thing it writes) leaves it sized but unfinished; the next process
 * sets it up instead of refusing it, and its limits hold. */
static void
test_a_segment_left_unfinished_by_its_creator_is_set_up_anew(void **state)
{
	size_t len;
	char *img = snapshot(&len);
	struct seg *s;

	(void)state;
	for (int round = 0; round < 2; round++) {
		if (round == 0)
			memset(img, 0, len);	/* died right after ftruncate */
		else
			((struct seg_header *)img)->magic = 0;	/* died before the magic */
		plant(img, len);
		s = attach();
		assert_int_equal(s->h->magic, SEG_MAGIC);
		for (uint64_t i = 1; i <= 3; i++)
			assert_true(acq(s, 0, i) >= 0);
		assert_int_equal(acq(s, 0, 4), -EBUSY);
		proc_detach_all(s);
		memcpy(img, s->base, len);	/* a whole image for the next round */
		seg_close(s);
	}
	free(img);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_admits_up_to_the_limit_and_refuses_the_next, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_copy_keeps_the_permit_until_the_last_drop, setup, teardown),
		cmocka_unit_test_setup_teardown(test_thirty_two_threads_racing_for_three_permits_get_three, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_full_table_in_one_segment_leaves_another_alone, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_thread_finding_the_table_full_takes_its_siblings_record, setup, teardown),
		cmocka_unit_test_setup_teardown(test_permits_of_a_killed_process_are_reclaimed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_zombie_holder_counts_as_dead, setup, teardown),
		cmocka_unit_test(test_a_reused_pid_is_told_apart_by_start_time),
		cmocka_unit_test_setup_teardown(test_fork_shares_the_socket_until_both_processes_drop_it, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_failed_fork_undoes_the_child_record, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_parent_dying_before_fork_leaves_nothing_held, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_a_child_whose_parent_died_keeps_its_holds, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_a_slot_being_set_up_by_a_live_process_is_left_alone,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_a_hold_dropped_half_way_by_a_dead_process_is_finished_once, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_late_parent_never_writes_into_a_reused_record,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(test_forks_of_one_process_take_turns, setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_a_hold_added_for_a_record_gone_meanwhile_does_not_count, setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_a_socket_held_alone_is_its_holders_word_and_one_drop_frees_it, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_second_holder_turns_the_sole_hold_into_a_bit,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_a_sole_hold_left_half_turned_into_a_bit_is_finished_at_reclaim, setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_a_sole_hold_dropped_by_a_process_killed_before_the_release_is_released, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(
		    test_a_second_holder_of_a_live_sole_holder_leaves_it_a_bit_that_reclaim_drops, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_a_leftover_segment_takes_the_new_limits, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_live_segment_keeps_its_limits, setup, teardown),
		cmocka_unit_test_setup_teardown(test_the_config_mode_is_applied, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_damaged_segment_is_never_trusted, setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_a_segment_left_unfinished_by_its_creator_is_set_up_anew, setup, teardown),
	};

	return cmocka_run_group_tests_name("segment", tests, NULL, NULL);
}

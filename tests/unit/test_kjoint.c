/* test_kjoint.c - unit tests of the count a compartment shares with a kernel engine: the library's tally with the program moving its count. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../shim/admit/permit.c"
#include "../../shim/admit/tally.c"
#include "seg_fixture.h"
#include "../../kernel/kern.h"

/*
 * No BPF here: the engine's map is a shared anonymous mapping, which this
 * process (and its forked children) has "mapped" as the map of id FAKE_ID,
 * and the engine's program is a thread doing what bulkshim.bpf.c does to
 * the entry: compare-and-swap of the count half alone below the limit, a
 * release that never goes below 0, its own count beside it.
 */

#define LIMIT		3
#define FAKE_ID		77

static struct cfg_compartment comps[1];
static struct kern_comp *entry;	/* the fake map's one entry */

static int
setup(void **state)
{
	(void)state;
	memset(comps, 0, sizeof(comps));
	snprintf(comps[0].name, sizeof(comps[0].name), "c");
	comps[0].max_connections = LIMIT;
	comps[0].enforce = true;
	comps[0].reject_errno = ECONNREFUSED;
	fixture_config("kj", comps, 1);
	entry = mmap(NULL, sizeof(*entry), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
	    -1, 0);
	assert_true(entry != MAP_FAILED);
	memset(entry, 0, sizeof(*entry));
	snprintf(entry->name, sizeof(entry->name), "c");
	entry->limit = LIMIT;
	return 0;
}

static int
teardown_kj(void **state)
{
	munmap(entry, sizeof(*entry));
	return teardown(state);
}

/* The segment, its compartment counted with the fake engine. */
static struct seg *
attach_joint(void)
{
	struct seg *s = attach();

	atomic_store(&s->kern.joint[0], (uintptr_t)&entry->joint);
	atomic_store(&s->kern.id, FAKE_ID);
	atomic_store(&s->comp[0].kernel, FAKE_ID);
	return s;
}

/* ---- the program's side, as bulkshim.bpf.c does it ---- */

static bool
prog_take(void)
{
	uint32_t cur;

	__atomic_fetch_add(&entry->in_use, 1, __ATOMIC_SEQ_CST);
	cur = __atomic_load_n(&entry->joint, __ATOMIC_SEQ_CST);
	while (cur < entry->limit) {
		if (__atomic_compare_exchange_n(&entry->joint, &cur, cur + 1, false,
		    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
			return true;
	}
	__atomic_fetch_sub(&entry->in_use, 1, __ATOMIC_SEQ_CST);
	return false;
}

static void
prog_give(void)
{
	uint32_t cur = __atomic_load_n(&entry->joint, __ATOMIC_SEQ_CST);

	while (cur > 0 && !__atomic_compare_exchange_n(&entry->joint, &cur, cur - 1, false,
	    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
		;
	__atomic_fetch_sub(&entry->in_use, 1, __ATOMIC_SEQ_CST);
}

/* What both sides hold, each counted after its take and before its give:
 * never more than what is really held. */
/* held: what both sides hold, counted after a take and before a give, so
 * never above what they really hold. One word: two read one after the
 * other could count a permit given back by one side and taken by the
 * other in between twice. */
static _Atomic int held, over, stop;

static void
count_take(void)
{
	if (atomic_fetch_add(&held, 1) + 1 > LIMIT)
		atomic_store(&over, 1);
}

static void *
program(void *arg)
{
	unsigned seed = (unsigned)(uintptr_t)arg;
	int mine = 0;

	while (!atomic_load(&stop)) {
		if (mine > 0 && rand_r(&seed) % 2) {
			atomic_fetch_sub(&held, 1);
			prog_give();
			mine--;
		} else if (prog_take()) {
			mine++;
			count_take();
		}
	}
	while (mine-- > 0) {
		atomic_fetch_sub(&held, 1);
		prog_give();
	}
	return NULL;
}

static void *
library(void *arg)
{
	struct seg *s = arg;
	enum bs_reason why;

	for (uint64_t i = 0; i < 20000 && !atomic_load(&over); i++) {
		int a = permit_acquire(s, seg_comp(s, 0), 0, 1000 + i, false, &why);

		if (a < 0)
			continue;
		count_take();
		atomic_fetch_sub(&held, 1);
		slot_drop(s, (uint32_t)a);
	}
	return NULL;
}

/* The library's threads and the program's take from one count at once:
 * the two together never hold more than the limit, and nothing is left. */
static void
test_the_library_and_the_program_never_pass_the_limit_together(void **state)
{
	struct seg *s = attach_joint();
	pthread_t p[2], l[2];

	(void)state;
	atomic_store(&stop, 0);
	atomic_store(&over, 0);
	atomic_store(&held, 0);
	for (int i = 0; i < 2; i++) {
		assert_int_equal(pthread_create(&p[i], NULL, program, (void *)(uintptr_t)(i + 1)), 0);
		assert_int_equal(pthread_create(&l[i], NULL, library, s), 0);
	}
	for (int i = 0; i < 2; i++)
		pthread_join(l[i], NULL);
	atomic_store(&stop, 1);
	for (int i = 0; i < 2; i++)
		pthread_join(p[i], NULL);
	assert_int_equal(atomic_load(&over), 0);
	assert_int_equal(entry->joint, 0);
	assert_int_equal(entry->in_use, 0);
	assert_int_equal(atomic_load(&s->comp[0].in_use), 0);
	/* The program never wrote the tag: whatever is there is the
	 * library's own last operation. */
	proc_detach_all(s);
	seg_close(s);
}

/* A full joint count refuses the library's connect, whose own permit goes
 * back; the program's release makes room for it again. */
static void
test_a_full_joint_count_refuses_and_gives_the_compartments_permit_back(void **state)
{
	struct seg *s = attach_joint();
	enum bs_reason why = REASON_MAX;
	int a;

	(void)state;
	for (int i = 0; i < LIMIT - 1; i++)
		assert_true(prog_take());
	a = permit_acquire(s, seg_comp(s, 0), 0, 1, false, &why);
	assert_true(a >= 0);
	assert_int_equal(entry->joint, LIMIT);
	assert_false(prog_take());
	assert_int_equal(permit_acquire(s, seg_comp(s, 0), 0, 2, false, &why), -EBUSY);
	assert_int_equal(why, REASON_FULL);
	assert_int_equal(atomic_load(&s->comp[0].in_use), 1);
	assert_int_equal(entry->peak, LIMIT);
	prog_give();
	assert_true(permit_acquire(s, seg_comp(s, 0), 0, 2, false, &why) >= 0);
	assert_int_equal(entry->joint, LIMIT);
	proc_detach_all(s);
	assert_int_equal(entry->joint, LIMIT - 2);
	prog_give();
	assert_int_equal(entry->joint, 0);
	seg_close(s);
}

/* The joint tally of the library's take for slot a, the program's
 * permits counted beside it; the tag names the take. */
static uint64_t
take_for_the_library(struct seg *s, int *a)
{
	enum bs_reason why;

	*a = permit_acquire(s, seg_comp(s, 0), 0, 1, false, &why);
	assert_true(*a >= 0);
	/* The tag speaks for the take: the slot's mark does not say it yet. */
	assert_false(atomic_load(&s->slots[*a].mark) & MARK_HELD(P_KERN));
	return atomic_load((_Atomic uint64_t *)(uintptr_t)&entry->joint);
}

/* A library thread about to move the joint tally away from another slot's
 * take writes that take into the slot's mark first (reflect), also when
 * the count it finds is not the one it read: the program moves the count
 * alone, under the tag, and may move it back before the thread's
 * compare-and-swap, which then succeeds. Unwritten, the slot's release
 * would find nothing held and the joint count would keep its permit. */
static void
test_a_take_is_written_down_while_the_program_moves_the_count(void **state)
{
	struct seg *s = attach_joint();
	int a;
	uint64_t w = take_for_the_library(s, &a);

	(void)state;
	assert_true(prog_take());
	reflect(s, (_Atomic uint64_t *)(uintptr_t)&entry->joint, w, P_KERN);
	assert_true(atomic_load(&s->slots[a].mark) & MARK_HELD(P_KERN));
	prog_give();
	slot_drop(s, (uint32_t)a);
	assert_int_equal(entry->joint, 0);
	assert_int_equal(atomic_load(&s->comp[0].in_use), 0);
	seg_close(s);
}

/* An undo of a take whose tag is still there takes it back, whatever the
 * program did to the count meanwhile (the program's permit stays). */
static void
test_an_undo_takes_back_under_the_programs_count(void **state)
{
	struct seg *s = attach_joint();
	int a;
	uint64_t w = take_for_the_library(s, &a);

	(void)state;
	assert_true(prog_take());
	assert_int_equal(entry->joint, 2);
	undo((_Atomic uint64_t *)(uintptr_t)&entry->joint, w);
	assert_int_equal(entry->joint, 1);
	prog_give();
	assert_int_equal(entry->joint, 0);
	slot_drop(s, (uint32_t)a);
	assert_int_equal(entry->joint, 0);
	seg_close(s);
}

/* The killed child's work: connection permits taken and given, forever. */
static void
take_and_give(struct seg *s)
{
	enum bs_reason why;

	for (uint64_t i = 0;; i++) {
		int a = permit_acquire(s, seg_comp(s, 0), 0, 100 + i, false, &why);

		if (a >= 0)
			slot_drop(s, (uint32_t)a);
	}
}

/*
 * A process taking and giving joint permits is SIGKILLed at random
 * instants while the program moves the count beside it; after each kill
 * and reclaim (the sweep after a death included), the joint count is
 * exactly what the program holds, and the compartment's own 0.
 */
static void
test_kills_while_the_program_moves_the_count_leave_it_exact(void **state)
{
	struct seg *s = attach_joint();
	unsigned seed = (unsigned)getpid();

	(void)state;
	for (int round = 0; round < 200; round++) {
		pthread_t p;
		pid_t pid;

		atomic_store(&stop, 0);
		pid = start_child(s, take_and_give);
		assert_int_equal(pthread_create(&p, NULL, program, (void *)(uintptr_t)round), 0);
		usleep((useconds_t)(rand_r(&seed) % 3000));
		kill_and_reclaim(s, pid);
		/* What a kill left to the next changer goes at the sweep. */
		tally_sweep(s);
		atomic_store(&stop, 1);
		pthread_join(p, NULL);
		if (entry->joint != 0 || entry->in_use != 0 ||
		    atomic_load(&s->comp[0].in_use) != 0)
			fail_msg("after kill %d: joint %u, the program's %u, in_use %u", round,
			    entry->joint, entry->in_use, atomic_load(&s->comp[0].in_use));
	}
	seg_close(s);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(
		    test_the_library_and_the_program_never_pass_the_limit_together, setup,
		    teardown_kj),
		cmocka_unit_test_setup_teardown(
		    test_a_full_joint_count_refuses_and_gives_the_compartments_permit_back, setup,
		    teardown_kj),
		cmocka_unit_test_setup_teardown(
		    test_kills_while_the_program_moves_the_count_leave_it_exact, setup,
		    teardown_kj),
		cmocka_unit_test_setup_teardown(
		    test_a_take_is_written_down_while_the_program_moves_the_count, setup,
		    teardown_kj),
		cmocka_unit_test_setup_teardown(
		    test_an_undo_takes_back_under_the_programs_count, setup, teardown_kj),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

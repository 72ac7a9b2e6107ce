/* test_permit.c - unit tests of in-flight permits, futex waits, classes, observe mode and histograms. */
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

#include "../../shim/permit.c"
#include "seg_fixture.h"

static struct cfg_compartment comps[1];

/* One compartment "c": 2 connections, 1 request in flight, class "batch"
 * (index 1) capped at 1. */
static int
setup(void **state)
{
	(void)state;
	memset(&cfg, 0, sizeof(cfg));
	memset(comps, 0, sizeof(comps));
	snprintf(cfg.segment, sizeof(cfg.segment), "up%d_%d", (int)getpid(), counter++);
	snprintf(cfg.path, sizeof(cfg.path), "unit.cfg");
	snprintf(comps[0].name, sizeof(comps[0].name), "c");
	comps[0].max_connections = 2;
	comps[0].max_inflight = 1;
	comps[0].enforce = true;
	comps[0].reject_errno = ECONNREFUSED;
	comps[0].class_limit[1] = 1;
	snprintf(cfg.classes[0].name, sizeof(cfg.classes[0].name), "default");
	snprintf(cfg.classes[1].name, sizeof(cfg.classes[1].name), "batch");
	cfg.nclass = 2;
	cfg.comp = comps;
	cfg.ncomp = 1;
	cfg.mode = 0600;
	cfg.max_processes = 16;
	cfg.max_sockets = 64;
	return 0;
}

static int
acq(struct seg *s, uint32_t cls, uint64_t ino, bool wait, enum bs_reason *why)
{
	return seg_acquire(s, 0, cls, ino, wait, why);
}

static void
test_one_request_in_flight_refuses_the_second_until_a_reply(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;
	int a = acq(s, 0, 1, false, &why), b = acq(s, 0, 2, false, &why);

	(void)state;
	assert_true(a >= 0 && b >= 0);
	assert_int_equal(seg_inflight_begin(s, (uint32_t)a, false, &why), 1);
	/* A second send on the same socket is the same request. */
	assert_int_equal(seg_inflight_begin(s, (uint32_t)a, false, &why), 0);
	assert_int_equal(seg_inflight_begin(s, (uint32_t)b, false, &why), -EBUSY);
	assert_int_equal(why, REASON_INFLIGHT_FULL);
	assert_int_equal(atomic_load(&s->comp[0].rejected_by[REASON_INFLIGHT_FULL]), 1);
	seg_inflight_end(s, (uint32_t)a);
	assert_int_equal(atomic_load(&s->comp[0].inflight), 0);
	assert_int_equal(atomic_load(&s->comp[0].h_reply.count), 1);
	assert_int_equal(seg_inflight_begin(s, (uint32_t)b, false, &why), 1);
	/* Closing a socket in flight gives its in-flight permit back too. */
	seg_drop(s, (uint32_t)b);
	assert_int_equal(atomic_load(&s->comp[0].inflight), 0);
	assert_int_equal(atomic_load(&s->comp[0].in_use), 1);
	seg_detach_all(s);
	seg_close(s);
}

static void
test_idle_connections_hold_no_inflight_permit(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;
	int a = acq(s, 0, 1, false, &why), b = acq(s, 0, 2, false, &why);

	(void)state;
	assert_true(a >= 0 && b >= 0);
	assert_int_equal(atomic_load(&s->comp[0].inflight), 0);
	assert_int_equal(seg_inflight_begin(s, (uint32_t)b, false, &why), 1);
	seg_inflight_cancel(s, (uint32_t)b);
	assert_int_equal(atomic_load(&s->comp[0].h_reply.count), 0);
	seg_detach_all(s);
	seg_close(s);
}

static void
test_a_class_never_holds_more_than_its_limit(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;

	(void)state;
	assert_true(acq(s, 1, 1, false, &why) >= 0);
	assert_int_equal(acq(s, 1, 2, false, &why), -EBUSY);
	assert_int_equal(why, REASON_CLASS_FULL);
	/* The default class still gets the compartment's other permit. */
	assert_true(acq(s, 0, 3, false, &why) >= 0);
	assert_int_equal(atomic_load(&s->comp[0].cls[1].in_use), 1);
	assert_int_equal(atomic_load(&s->comp[0].cls[1].rejected), 1);
	assert_int_equal(atomic_load(&s->comp[0].in_use), 2);
	seg_detach_all(s);
	assert_int_equal(atomic_load(&s->comp[0].cls[1].in_use), 0);
	seg_close(s);
}

static void
test_a_refused_compartment_gives_the_class_permit_back(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;

	(void)state;
	assert_true(acq(s, 0, 1, false, &why) >= 0);
	assert_true(acq(s, 0, 2, false, &why) >= 0);
	assert_int_equal(acq(s, 1, 3, false, &why), -EBUSY);
	assert_int_equal(why, REASON_FULL);
	assert_int_equal(atomic_load(&s->comp[0].cls[1].in_use), 0);
	seg_detach_all(s);
	seg_close(s);
}

static void
test_observe_mode_refuses_nothing_and_counts_what_it_would(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;
	int slots[5];

	(void)state;
	atomic_store(&s->comp[0].enforce, 0);
	for (int i = 0; i < 5; i++) {
		slots[i] = acq(s, 0, (uint64_t)i + 1, false, &why);
		assert_true(slots[i] >= 0);
	}
	assert_int_equal(atomic_load(&s->comp[0].would_reject[REASON_FULL]), 3);
	assert_int_equal(atomic_load(&s->comp[0].rejected), 0);
	assert_int_equal(atomic_load(&s->comp[0].in_use), 2);
	assert_int_equal(atomic_load(&s->comp[0].over), 3);
	/* Releasing one admitted past the limit does not free a real permit. */
	seg_drop(s, (uint32_t)slots[4]);
	assert_int_equal(atomic_load(&s->comp[0].over), 2);
	assert_int_equal(atomic_load(&s->comp[0].in_use), 2);
	assert_int_equal(seg_inflight_begin(s, (uint32_t)slots[0], false, &why), 1);
	assert_int_equal(seg_inflight_begin(s, (uint32_t)slots[1], false, &why), 1);
	assert_int_equal(atomic_load(&s->comp[0].would_reject[REASON_INFLIGHT_FULL]), 1);
	assert_int_equal(atomic_load(&s->comp[0].inflight_over), 1);
	seg_detach_all(s);
	assert_int_equal(atomic_load(&s->comp[0].over), 0);
	assert_int_equal(atomic_load(&s->comp[0].in_use), 0);
	assert_int_equal(atomic_load(&s->comp[0].inflight), 0);
	assert_int_equal(atomic_load(&s->comp[0].inflight_over), 0);
	seg_close(s);
}

static void
test_a_waiter_is_woken_by_a_release(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;
	pthread_t t;
	uint64_t t0, took;
	int a;

	(void)state;
	atomic_store(&s->comp[0].max_wait_ms, 5000);
	atomic_store(&s->comp[0].max_waiting, 2);
	a = acq(s, 0, 1, false, &why);
	assert_true(acq(s, 0, 2, false, &why) >= 0);
	wait_seg = s;
	pthread_create(&t, NULL, late_release, (void *)(uintptr_t)a);
	t0 = now_mono_us();
	assert_true(acq(s, 0, 3, true, &why) >= 0);
	took = now_mono_us() - t0;
	pthread_join(t, NULL);
	/* Woken by the release after ~50 ms, long before the 5 s limit. */
	assert_true(took >= 40000 && took < 1000000);
	assert_int_equal(atomic_load(&s->comp[0].h_wait.count), 1);
	assert_int_equal(atomic_load(&s->comp[0].waiting), 0);
	seg_detach_all(s);
	seg_close(s);
}

static void
test_a_wait_times_out_and_too_many_waiters_are_refused(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;
	uint64_t t0;

	(void)state;
	atomic_store(&s->comp[0].max_wait_ms, 100);
	atomic_store(&s->comp[0].max_waiting, 1);
	assert_true(acq(s, 0, 1, false, &why) >= 0);
	assert_true(acq(s, 0, 2, false, &why) >= 0);
	t0 = now_mono_us();
	assert_int_equal(acq(s, 0, 3, true, &why), -EBUSY);
	assert_int_equal(why, REASON_WAIT_TIMEOUT);
	assert_true(now_mono_us() - t0 >= 90000);
	/* With the one waiting place taken, the next caller is refused now. */
	atomic_store(&s->comp[0].waiting, 1);
	t0 = now_mono_us();
	assert_int_equal(acq(s, 0, 4, true, &why), -EBUSY);
	assert_int_equal(why, REASON_TOO_MANY_WAITING);
	assert_true(now_mono_us() - t0 < 50000);
	atomic_store(&s->comp[0].waiting, 0);
	/* A caller that may not wait (a non-blocking socket) is refused now. */
	assert_int_equal(acq(s, 0, 5, false, &why), -EBUSY);
	assert_int_equal(why, REASON_FULL);
	assert_int_equal(atomic_load(&s->comp[0].rejected_by[REASON_WAIT_TIMEOUT]), 1);
	assert_int_equal(atomic_load(&s->comp[0].rejected_by[REASON_TOO_MANY_WAITING]), 1);
	assert_int_equal(atomic_load(&s->comp[0].rejected_by[REASON_FULL]), 1);
	seg_detach_all(s);
	seg_close(s);
}

static void
test_a_waiter_in_another_process_is_woken(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;
	int a, st, p[2];
	pid_t pid;
	char c;

	(void)state;
	atomic_store(&s->comp[0].max_wait_ms, 5000);
	a = acq(s, 0, 1, false, &why);
	assert_true(acq(s, 0, 2, false, &why) >= 0);
	assert_int_equal(pipe(p), 0);
	pid = fork();
	if (pid == 0) {
		struct seg *s2 = NULL;
		uint64_t t0, took;

		if (seg_attach(&cfg, &s2, err, sizeof(err)) != 0)
			_exit(2);
		if (write(p[1], "w", 1) != 1)
			_exit(3);
		t0 = now_mono_us();
		if (seg_acquire(s2, 0, 0, 9, true, &why) < 0)
			_exit(4);
		took = now_mono_us() - t0;
		/* Released ~100 ms after we started; well before 5 s. */
		_exit(took < 1000000 ? 0 : 5);
	}
	assert_int_equal(read(p[0], &c, 1), 1);
	usleep(100000);
	seg_drop(s, (uint32_t)a);
	waitpid(pid, &st, 0);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	seg_detach_all(s);
	seg_close(s);
}

/* The pid of a process that has exited and been reaped. */
static pid_t
dead_pid(void)
{
	pid_t pid = fork();

	if (pid == 0)
		_exit(0);
	waitpid(pid, NULL, 0);
	return pid;
}

/* A pending slot in compartment 0, as alloc_slot leaves it, of generation *gen. */
static uint32_t
fresh_slot(struct seg *s, uint64_t ino, uint32_t *gen)
{
	int slot = alloc_slot(s, seg_my_record(s), ino);

	assert_true(slot >= 0);
	atomic_store(&s->slots[slot].comp, 0);
	atomic_store(&s->lcount[slot], 1);
	*gen = MARK_GEN(atomic_load(&s->slots[slot].mark));
	return (uint32_t)slot;
}

static void
test_a_take_cut_short_is_finished_or_withdrawn(void **state)
{
	struct seg *s = attach();
	struct seg_comp *c = &s->comp[0];
	pid_t dead = dead_pid();
	uint32_t b, d, gb, gd, seen;

	(void)state;
	/* Killed after its compare-and-swap, before writing it down: the
	 * permit is the slot's, and goes back with it. */
	b = fresh_slot(s, 11, &gb);
	assert_true(slot_mark_change(&s->slots[b], gb, 0, 0, 0, MARK_TAKING(P_CONN)));
	assert_true(tally_add(s, &c->in_use, &c->limit, P_CONN, b, gb, &seen));
	atomic_store(&s->slots[b].op_pid, dead);
	seg_resolve(s, b, dead);
	assert_true(atomic_load(&s->slots[b].mark) & MARK_HELD(P_CONN));
	assert_false(atomic_load(&s->slots[b].mark) & MARK_PENDING);
	assert_int_equal(atomic_load(&c->in_use), 1);
	seg_drop(s, b);
	assert_int_equal(atomic_load(&c->in_use), 0);

	/* Killed before its compare-and-swap: nothing was counted, the
	 * announcement is withdrawn, and the count stays right. */
	d = fresh_slot(s, 12, &gd);
	assert_true(slot_mark_change(&s->slots[d], gd, 0, 0, 0, MARK_TAKING(P_CONN)));
	atomic_store(&s->slots[d].op_pid, dead);
	seg_resolve(s, d, dead);
	assert_false(atomic_load(&s->slots[d].mark) & (MARK_HELD(P_CONN) | MARK_PENDING));
	seg_drop(s, d);
	assert_int_equal(atomic_load(&c->in_use), 0);

	/* Killed after the compare-and-swap, and another thread changed
	 * the tally since: that thread finished it first (helping). */
	b = fresh_slot(s, 13, &gb);
	assert_true(slot_mark_change(&s->slots[b], gb, 0, 0, 0, MARK_TAKING(P_CONN)));
	assert_true(tally_add(s, &c->in_use, &c->limit, P_CONN, b, gb, &seen));
	d = fresh_slot(s, 14, &gd);
	assert_int_equal(tally_take(s, d, gd, P_CONN, 0, &seen), TALLY_TAKEN);
	assert_true(atomic_load(&s->slots[b].mark) & MARK_HELD(P_CONN));
	assert_int_equal(atomic_load(&c->in_use), 2);
	/* The limit (2) holds with both: a third is refused. */
	assert_int_equal(acq(s, 0, 15, false, &(enum bs_reason){ REASON_MAX }), -EBUSY);
	seg_drop(s, b);
	seg_drop(s, d);
	assert_int_equal(atomic_load(&c->in_use), 0);
	seg_detach_all(s);
	seg_close(s);
}

static void
test_a_give_cut_short_is_carried_out_once(void **state)
{
	struct seg *s = attach();
	struct seg_comp *c = &s->comp[0];
	enum bs_reason why = REASON_MAX;
	pid_t dead = dead_pid();
	int a = acq(s, 0, 21, false, &why), b = acq(s, 0, 22, false, &why);
	uint32_t ga, gb;

	(void)state;
	assert_true(a >= 0 && b >= 0);
	assert_int_equal(atomic_load(&c->in_use), 2);
	ga = MARK_GEN(atomic_load(&s->slots[a].mark));
	gb = MARK_GEN(atomic_load(&s->slots[b].mark));
	/* Killed after announcing, before the count went down: the
	 * reclaimer takes it down. */
	assert_true(slot_mark_change(&s->slots[a], ga, MARK_HELD(P_CONN), 0, 0, MARK_GIVING(P_CONN)));
	atomic_store(&s->slots[a].op_pid, dead);
	seg_resolve(s, (uint32_t)a, dead);
	assert_int_equal(atomic_load(&c->in_use), 1);
	assert_false(atomic_load(&s->slots[a].mark) & (MARK_HELD(P_CONN) | MARK_PENDING));
	/* Killed after the count went down, before writing it down: the
	 * reclaimer only finishes the mark, it does not count it twice. */
	assert_true(slot_mark_change(&s->slots[b], gb, MARK_HELD(P_CONN), 0, 0, MARK_GIVING(P_CONN)));
	tally_sub(s, &c->in_use, P_CONN, (uint32_t)b, gb);
	atomic_store(&s->slots[b].op_pid, dead);
	seg_resolve(s, (uint32_t)b, dead);
	assert_int_equal(atomic_load(&c->in_use), 0);
	assert_false(atomic_load(&s->slots[b].mark) & (MARK_HELD(P_CONN) | MARK_PENDING));
	/* Dropping both slots now gives nothing back a second time. */
	seg_drop(s, (uint32_t)a);
	seg_drop(s, (uint32_t)b);
	assert_int_equal(atomic_load(&c->in_use), 0);
	seg_detach_all(s);
	seg_close(s);
}

/* Every count of compartment 0 is back to 0 and every slot free. */
static void
assert_all_back(struct seg *s, int round)
{
	struct seg_comp *c = &s->comp[0];

	if (atomic_load(&c->in_use) != 0 || atomic_load(&c->inflight) != 0 ||
	    atomic_load(&c->cls[1].in_use) != 0 || atomic_load(&c->waiting) != 0)
		fail_msg("after kill %d: in_use %u inflight %u class %u waiting %u", round,
		    atomic_load(&c->in_use), atomic_load(&c->inflight),
		    atomic_load(&c->cls[1].in_use), atomic_load(&c->waiting));
	for (uint32_t i = 0; i < s->h->nslots; i++) {
		if (atomic_load(&s->slots[i].state) != SLOT_FREE)
			fail_msg("after kill %d: slot %u still in state %u", round, i,
			    atomic_load(&s->slots[i].state));
	}
}

/* The killed child's work: connection, class and in-flight permits taken
 * and given back, forever. */
static void
take_and_give(struct seg *s)
{
	enum bs_reason why;

	for (uint64_t i = 0;; i++) {
		int a = seg_acquire(s, 0, (uint32_t)(i & 1), 100 + i, false, &why);

		if (a < 0)
			continue;
		if (seg_inflight_begin(s, (uint32_t)a, false, &why) == 1)
			seg_inflight_end(s, (uint32_t)a);
		seg_drop(s, (uint32_t)a);
	}
}

/*
 * A process that does nothing but take and give permits (connection, class,
 * request in flight) is SIGKILLed at random instants, 300 times; after each
 * kill, the reclaim must leave every count at 0. The loop spends nearly all
 * its time inside the tally operations, so the kills land inside them.
 */
static void
test_kills_at_random_instants_leak_nothing(void **state)
{
	struct seg *s = attach();
	unsigned seed = (unsigned)getpid();

	(void)state;
	for (int round = 0; round < 300; round++) {
		pid_t pid = start_child(s, take_and_give);

		usleep((useconds_t)(rand_r(&seed) % 3000));
		kill_and_reclaim(s, pid);
		assert_all_back(s, round);
	}
	seg_close(s);
}
static void
test_histogram_buckets_are_log2_microseconds(void **state)
{
	struct seg_hist h;

	(void)state;
	memset(&h, 0, sizeof(h));
	seg_hist_add(&h, 0);
	seg_hist_add(&h, 1);
	seg_hist_add(&h, 3);
	seg_hist_add(&h, 1000);
	seg_hist_add(&h, UINT64_MAX / 2);
	assert_int_equal(atomic_load(&h.bucket[0]), 1);
	assert_int_equal(atomic_load(&h.bucket[1]), 1);
	assert_int_equal(atomic_load(&h.bucket[2]), 1);
	assert_int_equal(atomic_load(&h.bucket[10]), 1);	/* 512..1023 us */
	assert_int_equal(atomic_load(&h.bucket[BS_HIST_BUCKETS - 1]), 1);
	assert_int_equal(atomic_load(&h.count), 5);
}

static void
test_admissions_are_counted_per_second(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;
	uint64_t sec, e;

	(void)state;
	assert_true(acq(s, 0, 1, false, &why) >= 0);
	assert_true(acq(s, 0, 2, false, &why) >= 0);
	sec = now_mono_ms() / 1000;
	e = atomic_load(&s->comp[0].rate[sec % BS_RATE_SECONDS]);
	/* Both within this second, unless the second turned in between. */
	if ((e >> 32) == (sec & 0xffffffff))
		assert_true((e & 0xffffffff) >= 1);
	assert_true(atomic_load(&s->comp[0].peak_rate) >= 1);
	seg_detach_all(s);
	seg_close(s);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_one_request_in_flight_refuses_the_second_until_a_reply, setup, teardown),
		cmocka_unit_test_setup_teardown(test_idle_connections_hold_no_inflight_permit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_class_never_holds_more_than_its_limit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_refused_compartment_gives_the_class_permit_back, setup, teardown),
		cmocka_unit_test_setup_teardown(test_observe_mode_refuses_nothing_and_counts_what_it_would, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_waiter_is_woken_by_a_release, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_wait_times_out_and_too_many_waiters_are_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_waiter_in_another_process_is_woken, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_take_cut_short_is_finished_or_withdrawn, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_a_give_cut_short_is_carried_out_once, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_kills_at_random_instants_leak_nothing, setup,
		    teardown),
		cmocka_unit_test(test_histogram_buckets_are_log2_microseconds),
		cmocka_unit_test_setup_teardown(test_admissions_are_counted_per_second, setup, teardown),
	};

	return cmocka_run_group_tests_name("permit", tests, NULL, NULL);
}

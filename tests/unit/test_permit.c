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

#include "../../shim/admit/permit.c"
#include "../../shim/admit/tally.c"
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
	return permit_acquire(s, seg_comp(s, 0), cls, ino, wait, why);
}

static void
test_one_request_in_flight_refuses_the_second_until_a_reply(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;
	int a = acq(s, 0, 1, false, &why), b = acq(s, 0, 2, false, &why);

	(void)state;
	assert_true(a >= 0 && b >= 0);
	assert_int_equal(permit_inflight_begin(s, (uint32_t)a, false, &why), 1);
	/* A second send on the same socket is the same request. */
	assert_int_equal(permit_inflight_begin(s, (uint32_t)a, false, &why), 0);
	assert_int_equal(permit_inflight_begin(s, (uint32_t)b, false, &why), -EBUSY);
	assert_int_equal(why, REASON_INFLIGHT_FULL);
	assert_int_equal(atomic_load(&s->comp[0].rejected_by[REASON_INFLIGHT_FULL]), 1);
	permit_inflight_end(s, (uint32_t)a);
	assert_int_equal(atomic_load(&s->comp[0].inflight), 0);
	/* The compartment's first request is one of those timed: it stands
	 * for REQ_SAMPLE replies. */
	assert_int_equal(atomic_load(&s->comp[0].h_reply.count), REQ_SAMPLE);
	assert_int_equal(permit_inflight_begin(s, (uint32_t)b, false, &why), 1);
	/* Closing a socket in flight gives its in-flight permit back too. */
	slot_drop(s, (uint32_t)b);
	assert_int_equal(atomic_load(&s->comp[0].inflight), 0);
	assert_int_equal(atomic_load(&s->comp[0].in_use), 1);
	proc_detach_all(s);
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
	assert_int_equal(permit_inflight_begin(s, (uint32_t)b, false, &why), 1);
	permit_inflight_cancel(s, (uint32_t)b);
	assert_int_equal(atomic_load(&s->comp[0].h_reply.count), 0);
	proc_detach_all(s);
	seg_close(s);
}

/* One request in REQ_SAMPLE of a compartment has its reply timed and
 * recorded with that weight: after n replies the histogram counts
 * REQ_SAMPLE * ceil(n / REQ_SAMPLE), its sum the sampled latencies so
 * weighted, and a request cancelled records nothing. */
static void
test_reply_latency_is_sampled_with_its_weight(void **state)
{
	struct seg *s = attach();
	struct seg_comp *c = &s->comp[0];
	enum bs_reason why = REASON_MAX;
	int a = acq(s, 0, 1, false, &why);
	uint64_t buckets = 0;

	(void)state;
	assert_true(a >= 0);
	for (uint32_t n = 1; n <= 2 * REQ_SAMPLE + 1; n++) {
		assert_int_equal(permit_inflight_begin(s, (uint32_t)a, false, &why), 1);
		if (n == 2)
			assert_int_equal(atomic_load(&s->slots[a].sent_us), 0);
		permit_inflight_end(s, (uint32_t)a);
		assert_int_equal(atomic_load(&c->h_reply.count),
		    REQ_SAMPLE * ((n + REQ_SAMPLE - 1) / REQ_SAMPLE));
	}
	for (int k = 0; k < BS_HIST_BUCKETS; k++)
		buckets += atomic_load(&c->h_reply.bucket[k]);
	assert_int_equal(buckets, 3 * REQ_SAMPLE);
	assert_int_equal(atomic_load(&c->h_reply.sum_us) % REQ_SAMPLE, 0);
	/* The next sampled one, cancelled: nothing recorded, nothing left. */
	for (uint32_t n = 0; n < REQ_SAMPLE; n++) {
		assert_int_equal(permit_inflight_begin(s, (uint32_t)a, false, &why), 1);
		permit_inflight_cancel(s, (uint32_t)a);
	}
	assert_int_equal(atomic_load(&c->h_reply.count), 3 * REQ_SAMPLE);
	assert_int_equal(atomic_load(&s->slots[a].sent_us), 0);
	assert_int_equal(atomic_load(&c->inflight_admitted), 3 * REQ_SAMPLE + 1);
	assert_int_equal(atomic_load(&c->inflight), 0);
	proc_detach_all(s);
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
	proc_detach_all(s);
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
	proc_detach_all(s);
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
	slot_drop(s, (uint32_t)slots[4]);
	assert_int_equal(atomic_load(&s->comp[0].over), 2);
	assert_int_equal(atomic_load(&s->comp[0].in_use), 2);
	assert_int_equal(permit_inflight_begin(s, (uint32_t)slots[0], false, &why), 1);
	assert_int_equal(permit_inflight_begin(s, (uint32_t)slots[1], false, &why), 1);
	assert_int_equal(atomic_load(&s->comp[0].would_reject[REASON_INFLIGHT_FULL]), 1);
	assert_int_equal(atomic_load(&s->comp[0].inflight_over), 1);
	proc_detach_all(s);
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
	proc_detach_all(s);
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
	proc_detach_all(s);
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
		if (permit_acquire(s2, seg_comp(s2, 0), 0, 9, true, &why) < 0)
			_exit(4);
		took = now_mono_us() - t0;
		/* Released ~100 ms after we started; well before 5 s. */
		_exit(took < 1000000 ? 0 : 5);
	}
	assert_int_equal(read(p[0], &c, 1), 1);
	usleep(100000);
	slot_drop(s, (uint32_t)a);
	waitpid(pid, &st, 0);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	proc_detach_all(s);
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
	int slot = slot_alloc(s, proc_record(s), ino);

	assert_true(slot >= 0);
	atomic_store(&s->slots[slot].comp, 0);
	atomic_store(&s->lcount[slot], 1);
	*gen = MARK_GEN(atomic_load(&s->slots[slot].mark));
	return (uint32_t)slot;
}

/* The tally word (count and tag) of count. */
static _Atomic uint64_t *
tally_word(_Atomic uint32_t *count)
{
	return (_Atomic uint64_t *)(uintptr_t)count;
}

/*
 * A take or give is whole at its one compare-and-swap of the tally: killed
 * right after it, the tag says what it did, the slot's mark is not written
 * (the tag overrides it), and the next changer of the tally writes it down.
 * Killed before it, nothing happened.
 */
static void
test_a_take_is_whole_at_its_compare_and_swap(void **state)
{
	struct seg *s = attach();
	struct seg_comp *c = &s->comp[0];
	pid_t dead = dead_pid();
	uint32_t b, d, gb, gd, seen;

	(void)state;
	/* Killed after its compare-and-swap, before anything else: the
	 * permit is the slot's (by the tag), and goes back with it. */
	b = fresh_slot(s, 11, &gb);
	assert_int_equal(tally_take(s, slot_comp_of(s, b), b, gb, P_CONN, 0, &seen), TAKE_OK);
	assert_false(atomic_load(&s->slots[b].mark) & MARK_HELD(P_CONN));
	assert_true(tally_held(s, slot_comp_of(s, b), b, gb, P_CONN));
	atomic_store(&s->slots[b].op_pid, dead);
	slot_resolve(s, b, dead);
	assert_int_equal(atomic_load(&c->in_use), 1);
	/* Another slot's take moves the tally away: b's mark says so now. */
	d = fresh_slot(s, 12, &gd);
	assert_int_equal(tally_take(s, slot_comp_of(s, d), d, gd, P_CONN, 0, &seen), TAKE_OK);
	assert_true(atomic_load(&s->slots[b].mark) & MARK_HELD(P_CONN));
	assert_true(tally_held(s, slot_comp_of(s, b), b, gb, P_CONN));
	assert_int_equal(atomic_load(&c->in_use), 2);
	/* The limit (2) holds with both: a third is refused. */
	assert_int_equal(acq(s, 0, 15, false, &(enum bs_reason){ REASON_MAX }), -EBUSY);
	/* b gives on d's tag: no mark write, the tag overrides the stale
	 * MARK_HELD; d's next change clears it. */
	assert_true(tally_give(s, slot_comp_of(s, b), b, gb, P_CONN));
	assert_true(atomic_load(&s->slots[b].mark) & MARK_HELD(P_CONN));
	assert_false(tally_held(s, slot_comp_of(s, b), b, gb, P_CONN));
	assert_false(tally_give(s, slot_comp_of(s, b), b, gb, P_CONN));
	assert_int_equal(atomic_load(&c->in_use), 1);
	assert_true(tally_give(s, slot_comp_of(s, d), d, gd, P_CONN));
	assert_false(atomic_load(&s->slots[b].mark) & MARK_HELD(P_CONN));
	assert_int_equal(atomic_load(&c->in_use), 0);
	/* Killed before its compare-and-swap: nothing was counted. */
	slot_drop(s, b);
	slot_drop(s, d);
	assert_int_equal(atomic_load(&c->in_use), 0);
	/* Held again and released: given back once, then marked released;
	 * a second release gives nothing. */
	b = fresh_slot(s, 13, &gb);
	assert_int_equal(tally_take(s, slot_comp_of(s, b), b, gb, P_CONN, 0, &seen), TAKE_OK);
	assert_int_equal(tally_release(s, b, gb, slot_comp_of(s, b), NULL),
	    MARK_HELD(P_CONN));
	assert_true(atomic_load(&s->slots[b].mark) & MARK_RELEASED);
	assert_int_equal(tally_release(s, b, gb, slot_comp_of(s, b), NULL), 0);
	assert_int_equal(tally_take(s, slot_comp_of(s, b), b, gb, P_CONN, 0, &seen), TAKE_BUSY);
	assert_int_equal(atomic_load(&c->in_use), 0);
	slot_drop(s, b);
	proc_detach_all(s);
	seg_close(s);
}

/*
 * A release clears the tag its own give left (tally.c's untag): the next
 * taker has nothing to reflect. The give happened, and the mark says the
 * slot holds nothing, so the tag announced nothing more.
 */
static void
test_a_release_leaves_no_tag_to_reflect(void **state)
{
	struct seg *s = attach();
	struct seg_comp *c = &s->comp[0];
	_Atomic uint64_t *t = tally_word(&c->in_use);
	uint32_t b, d, gb, gd, seen;

	(void)state;
	b = fresh_slot(s, 41, &gb);
	assert_int_equal(tally_take(s, slot_comp_of(s, b), b, gb, P_CONN, 0, &seen), TAKE_OK);
	assert_int_equal(atomic_load(t) >> 32 & s->tag_imask, b + 1);
	slot_drop(s, b);
	assert_int_equal(atomic_load(t), 0);
	/* Released on another slot's take: b's give reflects d's take into
	 * d's mark first, and b's tag goes after the release. */
	b = fresh_slot(s, 42, &gb);
	d = fresh_slot(s, 43, &gd);
	assert_int_equal(tally_take(s, slot_comp_of(s, b), b, gb, P_CONN, 0, &seen), TAKE_OK);
	assert_int_equal(tally_take(s, slot_comp_of(s, d), d, gd, P_CONN, 0, &seen), TAKE_OK);
	slot_drop(s, b);
	assert_int_equal(atomic_load(t), 1);
	assert_true(atomic_load(&s->slots[d].mark) & MARK_HELD(P_CONN));
	assert_true(tally_held(s, slot_comp_of(s, d), d, gd, P_CONN));
	/* The limit still counts d: one more, not two. */
	b = fresh_slot(s, 44, &gb);
	assert_int_equal(tally_take(s, slot_comp_of(s, b), b, gb, P_CONN, 0, &seen), TAKE_OK);
	assert_int_equal(acq(s, 0, 45, false, &(enum bs_reason){ REASON_MAX }), -EBUSY);
	slot_drop(s, b);
	slot_drop(s, d);
	assert_int_equal(atomic_load(t), 0);
	proc_detach_all(s);
	seg_close(s);
}

/*
 * A take that lands after its slot's release (its thread read the mark
 * before the release, as when another thread closes the same socket, and
 * was killed before its check after the compare-and-swap): counted once
 * too many, but never refusing anyone, and undone by the next changer of
 * the tally, whether the slot is released or already reused, or by the
 * sweep of a dead process's reclaim.
 */
static void
test_a_take_landing_after_the_release_is_undone(void **state)
{
	struct seg *s = attach();
	struct seg_comp *c = &s->comp[0];
	_Atomic uint64_t *t = tally_word(&c->in_use);
	uint32_t b, d, e, gb, gd, ge, seen;
	uint64_t late;

	(void)state;
	for (int how = 0; how < 3; how++) {
		b = fresh_slot(s, 31, &gb);
		/* The value b's take leaves in the tally, as its late
		 * compare-and-swap would write it. */
		assert_int_equal(tally_take(s, slot_comp_of(s, b), b, gb, P_CONN, 0, &seen), TAKE_OK);
		late = atomic_load(t);
		assert_true(tally_give(s, slot_comp_of(s, b), b, gb, P_CONN));
		slot_drop(s, b);		/* released and free */
		assert_int_equal(atomic_load(&c->in_use), 0);
		atomic_store(t, late);	/* the take lands now */
		assert_int_equal(atomic_load(&c->in_use), 1);
		if (how == 1) {
			/* Meanwhile the slot is of a new generation, as
			 * alloc_slot leaves it for another socket. */
			atomic_store(&s->slots[b].mark, MARK_OF_GEN(gb + 1));
		}
		if (how == 2) {
			tally_sweep(s);
			assert_int_equal(atomic_load(&c->in_use), 0);
		}
		/* Two others are admitted under the limit of 2: the orphan
		 * is undone before the first one's limit check. */
		d = fresh_slot(s, 33, &gd);
		assert_int_equal(tally_take(s, slot_comp_of(s, d), d, gd, P_CONN, 0, &seen), TAKE_OK);
		assert_int_equal(atomic_load(&c->in_use), 1);
		e = fresh_slot(s, 34, &ge);
		assert_int_equal(tally_take(s, slot_comp_of(s, e), e, ge, P_CONN, 0, &seen), TAKE_OK);
		assert_int_equal(atomic_load(&c->in_use), 2);
		slot_drop(s, d);
		slot_drop(s, e);
		assert_int_equal(atomic_load(&c->in_use), 0);
	}
	proc_detach_all(s);
	seg_close(s);
}

/*
 * An admission's take of an untagged tally (tally_take_clear: nobody to
 * reflect) writes what the whole take would: the count up by one and the
 * slot's tag. One whose checks passed before its slot's release and whose
 * compare-and-swap lands after it sees MARK_RELEASED and undoes itself; one
 * whose tally moved meanwhile does nothing, and the whole take that follows
 * reflects the other slot first.
 */
static void
test_an_untagged_take_landing_after_the_release_undoes_itself(void **state)
{
	struct seg *s = attach();
	struct seg_comp *c = &s->comp[0];
	_Atomic uint64_t *t = tally_word(&c->in_use);
	uint32_t b, d, gb, gd, seen = 9, took = 0, tag;
	uint64_t w;

	(void)state;
	b = fresh_slot(s, 51, &gb);
	assert_int_equal(atomic_load(t), 0);
	assert_int_equal(tally_take_conn(s, b, gb, c, &seen, &took), TAKE_OK);
	assert_int_equal(seen, 0);
	assert_int_equal(took & s->tag_wmask, tag_who(b, gb));
	assert_int_equal(atomic_load(t), (uint64_t)took << 32 | 1);
	assert_true(tally_held(s, slot_comp_of(s, b), b, gb, P_CONN));
	slot_drop(s, b);
	assert_int_equal(atomic_load(t), 0);
	/* Checked while the slot was live, released before the swap. */
	b = fresh_slot(s, 52, &gb);
	w = atomic_load(t);
	tag = tag_who(b, gb) | stamp_new(s, atomic_load(&s->slots[b].mark));
	slot_drop(s, b);
	assert_true(atomic_load(&s->slots[b].mark) & MARK_RELEASED ||
	    MARK_GEN(atomic_load(&s->slots[b].mark)) != gb);
	assert_int_equal(take_swap(s, b, gb, tag, &c->in_use, w, &seen), TAKE_BUSY);
	assert_int_equal(atomic_load(&c->in_use), 0);
	/* The tally moved since it was read (another slot took): no swap,
	 * and the whole take reflects d's take into d's mark first. */
	b = fresh_slot(s, 53, &gb);
	d = fresh_slot(s, 54, &gd);
	w = atomic_load(t);
	assert_int_equal(tally_take_conn(s, d, gd, c, &seen, &took), TAKE_OK);
	tag = tag_who(b, gb) | stamp_new(s, atomic_load(&s->slots[b].mark));
	assert_int_equal(take_swap(s, b, gb, tag, &c->in_use, w, &seen), TAKE_MISS);
	assert_int_equal(atomic_load(&c->in_use), 1);
	assert_false(atomic_load(&s->slots[d].mark) & MARK_HELD(P_CONN));
	assert_int_equal(tally_take_conn(s, b, gb, c, &seen, &took), TAKE_OK);
	assert_int_equal(seen, 1);
	assert_true(atomic_load(&s->slots[d].mark) & MARK_HELD(P_CONN));
	assert_true(tally_held(s, slot_comp_of(s, b), b, gb, P_CONN) && tally_held(s, slot_comp_of(s, d), d, gd, P_CONN));
	/* At the limit (2): the fast path refuses nothing itself. */
	assert_int_equal(acq(s, 0, 55, false, &(enum bs_reason){ REASON_MAX }), -EBUSY);
	slot_drop(s, b);
	slot_drop(s, d);
	assert_int_equal(atomic_load(&c->in_use), 0);
	proc_detach_all(s);
	seg_close(s);
}

/* Threads taking and giving one slot's in-flight permit (two threads of
 * one socket) beside another slot's: the counts never pass the limit
 * (1) and end exactly at what the slots hold. */
struct racer {
	struct seg *s;
	uint32_t slot, gen;
	_Atomic int *over;
};

static void *
race(void *arg)
{
	struct racer *r = arg;
	struct seg_comp *c = &r->s->comp[0];
	uint32_t seen;

	for (int i = 0; i < 20000; i++) {
		if (tally_take_inflight(r->s, r->slot, atomic_load(&r->s->slots[r->slot].mark), c,
		    &seen) == TAKE_OK &&
		    atomic_load(&c->inflight) > 1)
			atomic_fetch_add(r->over, 1);
		tally_give_inflight(r->s, r->slot, r->gen, c);
	}
	return NULL;
}

static void
test_two_threads_of_one_slot_race_exactly(void **state)
{
	struct seg *s = attach();
	struct seg_comp *c = &s->comp[0];
	enum bs_reason why = REASON_MAX;
	int a = acq(s, 0, 41, false, &why), b = acq(s, 0, 42, false, &why);
	_Atomic int over = 0;
	struct racer r[4];
	pthread_t th[4];
	uint32_t held;

	(void)state;
	assert_true(a >= 0 && b >= 0);
	for (int i = 0; i < 4; i++) {
		r[i].s = s;
		r[i].slot = (uint32_t)(i < 3 ? a : b);
		r[i].gen = MARK_GEN(atomic_load(&s->slots[r[i].slot].mark));
		r[i].over = &over;
		assert_int_equal(pthread_create(&th[i], NULL, race, &r[i]), 0);
	}
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	assert_int_equal(atomic_load(&over), 0);
	held = tally_held(s, slot_comp_of(s, (uint32_t)a), (uint32_t)a, r[0].gen, P_INFLIGHT) +
	    tally_held(s, slot_comp_of(s, (uint32_t)b), (uint32_t)b, r[3].gen, P_INFLIGHT);
	assert_int_equal(atomic_load(&c->inflight), held);
	slot_drop(s, (uint32_t)a);
	slot_drop(s, (uint32_t)b);
	assert_int_equal(atomic_load(&c->inflight), 0);
	assert_int_equal(atomic_load(&c->in_use), 0);
	proc_detach_all(s);
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
		int a = permit_acquire(s, seg_comp(s, 0), (uint32_t)(i & 1), 100 + i, false, &why);

		if (a < 0)
			continue;
		if (permit_inflight_begin(s, (uint32_t)a, false, &why) == 1)
			permit_inflight_end(s, (uint32_t)a);
		slot_drop(s, (uint32_t)a);
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
	stat_hist_add(&h, 0);
	stat_hist_add(&h, 1);
	stat_hist_add(&h, 3);
	stat_hist_add(&h, 1000);
	stat_hist_add(&h, UINT64_MAX / 2);
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
	proc_detach_all(s);
	seg_close(s);
}

/* setup, with the connection limit adaptive (no max_inflight: a
 * connection's lifetime is what the controller measures). */
static int
setup_adaptive_conns(void **state)
{
	setup(state);
	comps[0].max_connections = 64;
	comps[0].max_inflight = 0;
	comps[0].class_limit[1] = 0;
	comps[0].adaptive = true;
	comps[0].ad_min = 1;
	comps[0].ad_max = 64;
	comps[0].ad_initial = 64;
	comps[0].ad_window_ms = 100;
	comps[0].ad_tolerance_pct = 120;
	return 0;
}

/* Admits and closes n connections at once, and counts how many were
 * admitted with a microsecond admission time (admit_us), and how many of
 * those without a connect time to start from (connect_us). */
static void
admit_and_close(struct seg *s, int n, int *stamped, int *stamped_untimed)
{
	enum bs_reason why = REASON_MAX;

	*stamped = *stamped_untimed = 0;
	for (int i = 0; i < n; i++) {
		int a = acq(s, 0, 600 + (uint64_t)i, false, &why);
		uint64_t admit, connect;

		assert_true(a >= 0);
		admit = atomic_load(&s->slots[a].admit_us);
		connect = atomic_load(&s->slots[a].connect_us) & ~SENT_WEIGHTED;
		if (admit != 0) {
			(*stamped)++;
			if (connect == 0)
				(*stamped_untimed)++;
			else
				assert_int_equal(admit, connect);
		}
		slot_drop(s, (uint32_t)a);
	}
}

/*
 * Beyond CONNECT_EXACT admissions in a second, a connect that is not timed
 * reads no microsecond clock: its admission time stays 0 (the rate counts
 * from the coarse clock's second), while a timed one starts its connect
 * time from its admission time. With the connection limit adaptive, every
 * connect has its admission time, for the lifetime the controller reads.
 */
static void
test_an_untimed_connect_reads_the_clock_only_when_adaptive(void **state)
{
	struct seg *s = attach();
	int stamped, untimed;

	(void)state;
	atomic_store(&s->comp[0].ad.mode, AD_OFF);
	admit_and_close(s, 300, &stamped, &untimed);
	/* At most the first 64 of each second and one in 16 after them:
	 * fewer than 300, however the seconds fall. */
	assert_true(stamped < 300 - 100);
	assert_int_equal(untimed, 0);
	atomic_store(&s->comp[0].ad.mode, AD_ON);
	admit_and_close(s, 300, &stamped, &untimed);
	assert_int_equal(stamped, 300);
	assert_true(untimed > 0);
	proc_detach_all(s);
	seg_close(s);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_one_request_in_flight_refuses_the_second_until_a_reply, setup, teardown),
		cmocka_unit_test_setup_teardown(test_idle_connections_hold_no_inflight_permit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reply_latency_is_sampled_with_its_weight, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_a_class_never_holds_more_than_its_limit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_refused_compartment_gives_the_class_permit_back, setup, teardown),
		cmocka_unit_test_setup_teardown(test_observe_mode_refuses_nothing_and_counts_what_it_would, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_waiter_is_woken_by_a_release, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_wait_times_out_and_too_many_waiters_are_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_waiter_in_another_process_is_woken, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_take_is_whole_at_its_compare_and_swap, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_a_take_landing_after_the_release_is_undone, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_two_threads_of_one_slot_race_exactly, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_a_release_leaves_no_tag_to_reflect, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(
		    test_an_untagged_take_landing_after_the_release_undoes_itself, setup, teardown),
		cmocka_unit_test_setup_teardown(test_kills_at_random_instants_leak_nothing, setup,
		    teardown),
		cmocka_unit_test(test_histogram_buckets_are_log2_microseconds),
		cmocka_unit_test_setup_teardown(test_admissions_are_counted_per_second, setup, teardown),
		cmocka_unit_test_setup_teardown(test_an_untimed_connect_reads_the_clock_only_when_adaptive,
		    setup_adaptive_conns, teardown),
	};

	return cmocka_run_group_tests_name("permit", tests, NULL, NULL);
}

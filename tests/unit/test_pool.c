/* test_pool.c - unit tests of pools: guarantees, lending up to ceilings, pool_full, waits, kills. */
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

#include "../../shim/admit/pool.c"
#include "../../shim/admit/tally.c"
#include "seg_fixture.h"

/* Pool "pg" of size 12, reserved 2: room 10. "a": guarantee 3, ceiling 6;
 * "b": guarantee 2, ceiling 8; "c": no guarantee, ceiling 10. Shared: 5. */
static struct cfg_compartment comps[3];

static int
setup(void **state)
{
	static const char *names[3] = { "a", "b", "c" };
	static const uint32_t guar[3] = { 3, 2, 0 }, ceil[3] = { 6, 8, 10 };

	(void)state;
	memset(&cfg, 0, sizeof(cfg));
	memset(comps, 0, sizeof(comps));
	snprintf(cfg.segment, sizeof(cfg.segment), "upool%d_%d", (int)getpid(), counter++);
	snprintf(cfg.path, sizeof(cfg.path), "unit.cfg");
	for (int i = 0; i < 3; i++) {
		snprintf(comps[i].name, sizeof(comps[i].name), "%s", names[i]);
		comps[i].max_connections = ceil[i];
		comps[i].enforce = true;
		comps[i].reject_errno = ECONNREFUSED;
		comps[i].pool = 0;
		comps[i].guaranteed = guar[i];
	}
	cfg.npools = 1;
	snprintf(cfg.pools[0].name, sizeof(cfg.pools[0].name), "pg");
	cfg.pools[0].size = 12;
	cfg.pools[0].reserved = 2;
	snprintf(cfg.classes[0].name, sizeof(cfg.classes[0].name), "default");
	cfg.nclass = 1;
	cfg.comp = comps;
	cfg.ncomp = 3;
	cfg.mode = 0600;
	cfg.max_processes = 16;
	cfg.max_sockets = 128;
	return 0;
}

static uint64_t next_ino = 1000;

/* One connection permit of compartment comp, or -EBUSY with *why. */
static int
take_one(struct seg *s, uint32_t comp, bool wait, enum bs_reason *why)
{
	return permit_acquire(s, seg_comp(s, comp), 0, next_ino++, wait, why);
}

/* The permits compartment comp holds within its guarantee: its slots
 * marked so (share.c keeps no count of them). */
static uint32_t
guar_held(struct seg *s, uint32_t comp)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < s->h->nslots; i++) {
		uint64_t m = atomic_load(&s->slots[i].mark);

		if (atomic_load(&s->slots[i].comp) == comp && tally_held(s, slot_comp_of(s, i), i, MARK_GEN(m), P_CONN) &&
		    (m & MARK_GUARANTEED(SHARE_POOL)))
			n++;
	}
	return n;
}

static uint32_t
lent(struct seg *s)
{
	return atomic_load(&s->h->pools[0].lent);
}

static void
test_the_pool_lends_its_shared_part_and_no_more(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;

	(void)state;
	assert_int_equal(atomic_load(&s->h->pools[0].shared), 5);
	/* c has no guarantee: all it holds is lent, up to the shared 5. */
	for (int i = 0; i < 5; i++)
		assert_true(take_one(s, 2, false, &why) >= 0);
	assert_int_equal(lent(s), 5);
	assert_int_equal(take_one(s, 2, false, &why), -EBUSY);
	assert_int_equal(why, REASON_POOL_FULL);
	/* The refusal gave the compartment's permit back. */
	assert_int_equal(atomic_load(&s->comp[2].in_use), 5);
	assert_int_equal(atomic_load(stat_reason_count(&s->comp[2], REASON_POOL_FULL, false)), 1);
	assert_int_equal(atomic_load(&s->h->pools[0].rejected), 1);
	assert_string_equal(stat_reason_name(REASON_POOL_FULL), "pool_full");
	proc_detach_all(s);
	seg_close(s);
}

/* The pool's peak is the most permits its members had in use at once,
 * raised at every take (within a guarantee too), a compartment outside the
 * pool not counted. The use statistic it is raised from goes down with
 * every release, and a reclaim sets it to 0 when the pool is empty. */
static void
test_the_pool_peak_counts_its_members_only(void **state)
{
	struct seg *s;
	enum bs_reason why = REASON_MAX;
	int held[6];

	(void)state;
	comps[2].pool = BS_NO_POOL;
	comps[2].guaranteed = 0;
	s = attach();
	for (int i = 0; i < 4; i++)
		assert_true(take_one(s, 2, false, &why) >= 0);
	assert_int_equal(atomic_load(&s->h->pools[0].peak), 0);
	/* Within guarantees: nothing lent, the peak noted all the same. */
	for (int i = 0; i < 3; i++)
		assert_true((held[i] = take_one(s, 0, false, &why)) >= 0);
	assert_int_equal(lent(s), 0);
	assert_int_equal(atomic_load(&s->h->pools[0].peak), 3);
	for (int i = 3; i < 6; i++)
		assert_true((held[i] = take_one(s, 1, false, &why)) >= 0);
	assert_int_equal(lent(s), 1);
	assert_int_equal(atomic_load(&s->h->pools[0].peak), 6);
	/* Released: the statistic goes back to 0, the peak stays. */
	for (int i = 0; i < 6; i++)
		slot_drop(s, (uint32_t)held[i]);
	assert_int_equal(atomic_load(&s->h->pools[0].in_use_stat), 0);
	assert_true((held[0] = take_one(s, 0, false, &why)) >= 0);
	assert_int_equal(atomic_load(&s->h->pools[0].peak), 6);
	/* Below 0 (it wraps), as threads killed between a permit's give
	 * and the statistic leave it, it raises no peak... */
	atomic_store(&s->h->pools[0].in_use_stat, UINT32_MAX - 1);
	assert_true((held[1] = take_one(s, 1, false, &why)) >= 0);
	assert_int_equal(atomic_load(&s->h->pools[0].peak), 6);
	/* ... and a reclaim leaves it so while the pool holds permits, and
	 * sets it to 0 once it holds none. */
	pool_resync_use(s);
	assert_int_equal(atomic_load(&s->h->pools[0].in_use_stat), UINT32_MAX);
	slot_drop(s, (uint32_t)held[0]);
	slot_drop(s, (uint32_t)held[1]);
	pool_resync_use(s);
	assert_int_equal(atomic_load(&s->h->pools[0].in_use_stat), 0);
	proc_detach_all(s);
	seg_close(s);
}

/* `bulkshim reset`: the refusals go to 0 and the peak restarts from what
 * is in use now; a statistic below 0 restarts it from 0, and a pool past
 * the segment's is left alone. */
static void
test_a_reset_restarts_the_pool_peak_from_what_is_in_use(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;
	int held[5];

	(void)state;
	for (int i = 0; i < 5; i++)
		assert_true((held[i] = take_one(s, 2, false, &why)) >= 0);
	assert_int_equal(take_one(s, 2, false, &why), -EBUSY);
	assert_int_equal(why, REASON_POOL_FULL);
	for (int i = 0; i < 3; i++)
		slot_drop(s, (uint32_t)held[i]);
	assert_int_equal(atomic_load(&s->h->pools[0].peak), 5);
	pool_reset_counters(s, 0);
	assert_int_equal(atomic_load(&s->h->pools[0].peak), 2);
	assert_int_equal(atomic_load(&s->h->pools[0].rejected), 0);
	atomic_store(&s->h->pools[0].in_use_stat, UINT32_MAX);
	pool_reset_counters(s, 0);
	assert_int_equal(atomic_load(&s->h->pools[0].peak), 0);
	atomic_store(&s->h->pools[0].rejected, 7);
	pool_reset_counters(s, 1);
	pool_reset_counters(s, BS_MAX_POOLS);
	assert_int_equal(atomic_load(&s->h->pools[0].rejected), 7);
	slot_drop(s, (uint32_t)held[3]);
	slot_drop(s, (uint32_t)held[4]);
	proc_detach_all(s);
	seg_close(s);
}

static void
test_a_compartment_below_its_guarantee_is_never_refused_for_the_pool(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;

	(void)state;
	for (int i = 0; i < 5; i++)
		assert_true(take_one(s, 2, false, &why) >= 0);
	/* The shared part is all lent to c; a and b still get their 3 and 2. */
	for (int i = 0; i < 3; i++)
		assert_true(take_one(s, 0, false, &why) >= 0);
	for (int i = 0; i < 2; i++)
		assert_true(take_one(s, 1, false, &why) >= 0);
	/* Above its guarantee, a must borrow, and nothing is left. */
	assert_int_equal(take_one(s, 0, false, &why), -EBUSY);
	assert_int_equal(why, REASON_POOL_FULL);
	assert_int_equal(pool_in_use(s, 0, NULL), 10);
	proc_detach_all(s);
	seg_close(s);
}

static void
test_no_compartment_exceeds_its_ceiling(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;

	(void)state;
	for (int i = 0; i < 6; i++)
		assert_true(take_one(s, 0, false, &why) >= 0);
	assert_int_equal(take_one(s, 0, false, &why), -EBUSY);
	assert_int_equal(why, REASON_FULL);
	assert_int_equal(guar_held(s, 0), 3);
	assert_int_equal(lent(s), 3);
	proc_detach_all(s);
	seg_close(s);
}

/*
 * A borrowed permit on an untagged pool tally is taken by one
 * compare-and-swap with the compartment take's tag, held by the slot as
 * the whole take's would be, and its release gives both back and leaves
 * both tallies untagged at 0. On a tally another slot's take tagged, the
 * whole take reflects that take first.
 */
static void
test_a_borrowed_permit_is_taken_and_given_back_exactly(void **state)
{
	struct seg *s = attach();
	_Atomic uint64_t *pt = (_Atomic uint64_t *)(uintptr_t)&s->h->pools[0].lent;
	_Atomic uint64_t *ct = (_Atomic uint64_t *)(uintptr_t)&s->comp[2].in_use;
	enum bs_reason why = REASON_MAX;
	int a, b;
	uint32_t ga, gb;

	(void)state;
	/* c (index 2) has no guarantee: each of its permits is borrowed. */
	assert_true((a = take_one(s, 2, false, &why)) >= 0);
	ga = MARK_GEN(atomic_load(&s->slots[a].mark));
	assert_int_equal(lent(s), 1);
	assert_int_equal(atomic_load(pt) >> 32, atomic_load(ct) >> 32);
	assert_int_equal((atomic_load(pt) >> 32) & s->tag_wmask, tag_who((uint32_t)a, ga));
	assert_true(tally_held(s, slot_comp_of(s, (uint32_t)a), (uint32_t)a, ga, P_LENT));
	assert_true(tally_held(s, slot_comp_of(s, (uint32_t)a), (uint32_t)a, ga, P_CONN));
	/* b borrows on a's tag: a's take goes into a's mark first. */
	assert_true((b = take_one(s, 2, false, &why)) >= 0);
	gb = MARK_GEN(atomic_load(&s->slots[b].mark));
	assert_true(atomic_load(&s->slots[a].mark) & MARK_HELD(P_LENT));
	assert_int_equal(lent(s), 2);
	assert_true(tally_held(s, slot_comp_of(s, (uint32_t)a), (uint32_t)a, ga, P_LENT));
	assert_true(tally_held(s, slot_comp_of(s, (uint32_t)b), (uint32_t)b, gb, P_LENT));
	slot_drop(s, (uint32_t)b);
	assert_int_equal(atomic_load(pt), 1);
	assert_int_equal(atomic_load(ct), 1);
	slot_drop(s, (uint32_t)a);
	assert_int_equal(atomic_load(pt), 0);
	assert_int_equal(atomic_load(ct), 0);
	assert_int_equal(pool_in_use(s, 0, NULL), 0);
	proc_detach_all(s);
	seg_close(s);
}

static void
test_a_freed_guarantee_takes_back_a_lent_permit_at_once(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;
	int slot[5];
	uint32_t derived;

	(void)state;
	for (int i = 0; i < 5; i++)
		assert_true((slot[i] = take_one(s, 0, false, &why)) >= 0);
	assert_int_equal(lent(s), 2);
	/* Two of the guaranteed ones go: the two lent ones move onto the
	 * guarantee and the shared part has both back. */
	slot_drop(s, (uint32_t)slot[0]);
	assert_int_equal(lent(s), 1);
	slot_drop(s, (uint32_t)slot[1]);
	assert_int_equal(lent(s), 0);
	assert_int_equal(guar_held(s, 0), 3);
	assert_int_equal(pool_in_use(s, 0, &derived), 3);
	assert_int_equal(derived, 0);
	for (int i = 2; i < 5; i++)
		slot_drop(s, (uint32_t)slot[i]);
	assert_int_equal(guar_held(s, 0), 0);
	assert_int_equal(atomic_load(&s->comp[0].in_use), 0);
	proc_detach_all(s);
	seg_close(s);
}

static void
test_a_waiter_is_woken_when_another_compartment_frees_the_pool(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;
	pthread_t t;
	uint64_t t0, took;
	int slot = -1;

	(void)state;
	/* a holds its 3, c all of the shared 5: a's fourth must wait for the
	 * pool, which c frees, not a. */
	for (int i = 0; i < 3; i++)
		assert_true(take_one(s, 0, false, &why) >= 0);
	for (int i = 0; i < 5; i++)
		assert_true((slot = take_one(s, 2, false, &why)) >= 0);
	atomic_store(&s->comp[0].max_wait_ms, 5000);
	atomic_store(&s->comp[0].max_waiting, 2);
	wait_seg = s;
	pthread_create(&t, NULL, late_release, (void *)(uintptr_t)slot);
	t0 = now_mono_us();
	assert_true(take_one(s, 0, true, &why) >= 0);
	took = now_mono_us() - t0;
	pthread_join(t, NULL);
	/* Woken by the release after ~50 ms, long before the 5 s limit (the
	 * poll for dead holders is every 100 ms: a wake within 90 ms is the
	 * pool's own). */
	assert_true(took >= 40000 && took < 90000);
	assert_int_equal(atomic_load(&s->h->pools[0].sleepers), 0);
	proc_detach_all(s);
	seg_close(s);
}

static void
test_shrinking_the_pool_refuses_until_it_drains(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;
	int slot[4];

	(void)state;
	for (int i = 0; i < 4; i++)
		assert_true((slot[i] = take_one(s, 2, false, &why)) >= 0);
	/* Size 8, reserved 2: room 6, guarantees 5, shared 1 < 4 lent. */
	atomic_store(&s->h->pools[0].size, 8);
	pool_update_shared(s, 0);
	assert_int_equal(atomic_load(&s->h->pools[0].shared), 1);
	assert_int_equal(atomic_load(&s->comp[2].in_use), 4);	/* nothing closed */
	assert_int_equal(take_one(s, 2, false, &why), -EBUSY);
	assert_int_equal(why, REASON_POOL_FULL);
	for (int i = 0; i < 3; i++)
		slot_drop(s, (uint32_t)slot[i]);
	assert_int_equal(take_one(s, 2, false, &why), -EBUSY);	/* 1 lent of 1 */
	slot_drop(s, (uint32_t)slot[3]);
	assert_true(take_one(s, 2, false, &why) >= 0);
	proc_detach_all(s);
	seg_close(s);
}

static void
test_a_guarantee_raised_live_takes_lent_permits_onto_it(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;

	(void)state;
	for (int i = 0; i < 3; i++)
		assert_true(take_one(s, 2, false, &why) >= 0);
	assert_int_equal(lent(s), 3);
	comps[2].guaranteed = 2;
	comps[0].guaranteed = 1;
	pool_apply(s, &cfg, s->cmap, false);
	assert_int_equal(guar_held(s, 2), 2);
	assert_int_equal(lent(s), 1);
	/* Room 10 - guarantees 1 + 2 + 2 = shared 5. */
	assert_int_equal(atomic_load(&s->h->pools[0].shared), 5);
	proc_detach_all(s);
	seg_close(s);
}

static void
test_a_pool_lent_beyond_its_shared_part_lends_and_guarantees_nothing_until_it_drains(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;
	int slot[5];

	(void)state;
	for (int i = 0; i < 5; i++)
		assert_true((slot[i] = take_one(s, 2, false, &why)) >= 0);
	/* b's guarantee raised live to 5: guarantees 8, shared 2, 5 lent.
	 * Granting a its guarantee now would put 11 in a pool of 10. */
	comps[1].guaranteed = 5;
	pool_apply(s, &cfg, s->cmap, false);
	assert_int_equal(atomic_load(&s->h->pools[0].shared), 2);
	assert_int_equal(take_one(s, 0, false, &why), -EBUSY);
	assert_int_equal(why, REASON_POOL_FULL);
	for (int i = 0; i < 3; i++)
		slot_drop(s, (uint32_t)slot[i]);
	assert_true(take_one(s, 0, false, &why) >= 0);
	assert_true(take_one(s, 1, false, &why) >= 0);
	proc_detach_all(s);
	seg_close(s);
}

/*
 * A process reclaims before it has a record of its own (at attach, or when
 * the table is full); killed while releasing a dead process's slot, it
 * leaves the slot RELEASING under its pid with permits still counted, and
 * no record whose reclaim would finish it. The next unthrottled reclaim
 * does (found by the chaos run with a pool: a permit leaked).
 */
static void
test_a_release_left_by_a_dead_process_without_a_record_is_finished(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;
	int rec, a = take_one(s, 0, false, &why);
	pid_t dead = fork();

	(void)state;
	if (dead == 0)
		_exit(0);
	waitpid(dead, NULL, 0);
	assert_true(a >= 0);
	rec = proc_record(s);
	/* Our hold gone, the slot claimed for release by the dead pid. */
	atomic_fetch_and(&seg_row(s, (uint32_t)rec)[a / 64], ~(1ULL << (a % 64)));
	atomic_store(&s->slots[a].holders, 0);
	atomic_store(&s->lcount[a], 0);
	atomic_store(&s->slots[a].state, SLOT_BUSY(SLOT_RELEASING, dead));
	assert_int_equal(atomic_load(&s->comp[0].in_use), 1);
	proc_reclaim(s, false);
	assert_int_equal(atomic_load(&s->slots[a].state), SLOT_FREE);
	assert_int_equal(atomic_load(&s->comp[0].in_use), 0);
	assert_int_equal(guar_held(s, 0), 0);
	seg_close(s);
}

/* Every pool count back to 0 and every slot free. */
static void
assert_pool_back(struct seg *s, int round)
{
	for (int i = 0; i < 3; i++) {
		struct seg_comp *c = &s->comp[i];

		if (atomic_load(&c->in_use) != 0 || guar_held(s, (uint32_t)(c - s->comp)) != 0)
			fail_msg("after kill %d: %s in_use %u guaranteed in use %u", round, c->name,
			    atomic_load(&c->in_use), guar_held(s, (uint32_t)(c - s->comp)));
	}
	if (lent(s) != 0)
		fail_msg("after kill %d: lent %u", round, lent(s));
	for (uint32_t i = 0; i < s->h->nslots; i++) {
		if (atomic_load(&s->slots[i].state) != SLOT_FREE)
			fail_msg("after kill %d: slot %u still in state %u", round, i,
			    atomic_load(&s->slots[i].state));
	}
}

/* The killed child's work: connections of the three compartments opened and
 * closed in an order that keeps up to 16 open, so that lent permits move
 * onto freed guarantees. */
static void
hold_and_release(struct seg *s)
{
	enum bs_reason why;
	int held[16];

	for (int k = 0; k < 16; k++)
		held[k] = -1;
	for (uint64_t i = 0;; i++) {
		int k = (int)(i * 7 % 16);

		if (held[k] >= 0) {
			slot_drop(s, (uint32_t)held[k]);
			held[k] = -1;
		} else {
			held[k] = permit_acquire(s, seg_comp(s, (uint32_t)(i % 3)), 0, 5000 + i, false, &why);
		}
	}
}

/*
 * A process taking and giving pool permits in three compartments, with
 * connections held across iterations so that lent permits move onto freed
 * guarantees, is SIGKILLed at random instants, 200 times; after each kill
 * the reclaim leaves every count at 0. While it runs, the parent checks the
 * single words that bound the pool: no guarantee and no lending over its
 * limit.
 */
static void
test_kills_at_random_instants_leave_the_pool_exact(void **state)
{
	struct seg *s = attach();
	unsigned seed = (unsigned)getpid();
	uint32_t total;

	(void)state;
	for (int round = 0; round < 200; round++) {
		pid_t pid = start_child(s, hold_and_release);
		uint64_t until = now_mono_us() + (uint64_t)(rand_r(&seed) % 3000);

		while (now_mono_us() < until) {
			assert_true(lent(s) <= 5);
			for (int i = 0; i < 3; i++)
				assert_true(atomic_load(&s->comp[i].in_use) <= comps[i].max_connections);
		}
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		/* Frozen now: the marks say exactly which permits are within a
		 * guarantee, and with the lent ones they fit the pool. */
		total = lent(s);
		for (int i = 0; i < 3; i++) {
			assert_true(guar_held(s, i) <= comps[i].guaranteed);
			total += guar_held(s, i);
		}
		assert_true(total <= 10);
		proc_reclaim(s, false);
		assert_pool_back(s, round);
		/* The pool is empty: the reclaim set the use statistic to 0;
		 * the peak never passed the room. */
		assert_int_equal(atomic_load(&s->h->pools[0].in_use_stat), 0);
		assert_true(atomic_load(&s->h->pools[0].peak) <= 10);
	}
	seg_close(s);
}

/* Threads of two processes hammer the pool; the words bounding it never
 * pass their limits and all is back to 0 at the end. */
/* A witness of what the hammers hold, shared across the fork: counted
 * after an acquire returns and before the drop, so never above what is
 * held; [0] the pool, [1 + i] compartment i, [4] the worst pool total. */
static _Atomic uint32_t *held_now;

static void
note_held(uint32_t comp, int delta)
{
	uint32_t n;

	if (delta < 0) {
		atomic_fetch_sub(&held_now[1 + comp], 1);
		atomic_fetch_sub(&held_now[0], 1);
		return;
	}
	if (atomic_fetch_add(&held_now[1 + comp], 1) + 1 > comps[comp].max_connections)
		atomic_store(&held_now[5], 1);
	n = atomic_fetch_add(&held_now[0], 1) + 1;
	for (uint32_t w = atomic_load(&held_now[4]); n > w &&
	    !atomic_compare_exchange_weak(&held_now[4], &w, n);)
		;
}

/* hammer: compartments (false) or c0's classes (true) by index. */
static bool hammer_classes;

static void *
hammer(void *arg)
{
	struct seg *s = arg;
	enum bs_reason why;
	int held[4] = { -1, -1, -1, -1 };
	uint32_t idx[4] = { 0, 0, 0, 0 };

	for (uint64_t i = 0; i < 20000; i++) {
		int k = (int)(i % 4);

		if (held[k] >= 0) {
			note_held(idx[k], -1);
			slot_drop(s, (uint32_t)held[k]);
			held[k] = -1;
			continue;
		}
		idx[k] = (uint32_t)((i / 4 + (uintptr_t)&held % 3) % 3);
		/* Inode 0: these permits stand for no socket, so a reconcile
		 * (a class at its cap runs one, reconcile_class_full) leaves
		 * them alone instead of finding their made-up sockets gone. */
		held[k] = permit_acquire(s, seg_comp(s, hammer_classes ? 0 : idx[k]), hammer_classes ? idx[k] : 0,
		    0, false, &why);
		if (held[k] >= 0)
			note_held(idx[k], 1);
	}
	for (int k = 0; k < 4; k++)
		if (held[k] >= 0) {
			note_held(idx[k], -1);
			slot_drop(s, (uint32_t)held[k]);
		}
	return NULL;
}

/* Four hammer threads here and four in a forked process of their own
 * attachment, while `watch` checks the single words meanwhile; then the
 * witness's worst is checked against the pool's room (`room`). */
static void
hammer_two_processes(struct seg *s, uint32_t room, void (*watch)(struct seg *))
{
	pthread_t t[4];
	pid_t pid;
	int st;

	held_now = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_true(held_now != MAP_FAILED);
	pid = fork();
	if (pid == 0) {
		struct seg *s2 = NULL;

		if (seg_attach(&cfg, &s2, err, sizeof(err)) != 0)
			_exit(2);
		for (int i = 0; i < 4; i++)
			pthread_create(&t[i], NULL, hammer, s2);
		for (int i = 0; i < 4; i++)
			pthread_join(t[i], NULL);
		proc_detach_all(s2);
		_exit(0);
	}
	for (int i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, hammer, s);
	for (int r = 0; r < 2000; r++)
		watch(s);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	waitpid(pid, &st, 0);
	assert_int_equal(WEXITSTATUS(st), 0);
	/* What the threads held never passed the room or a ceiling. */
	if (atomic_load(&held_now[4]) > room)
		fail_msg("the hammers held %u at once, room %u", atomic_load(&held_now[4]), room);
	assert_int_equal(atomic_load(&held_now[5]), 0);
	assert_int_equal(atomic_load(&held_now[0]), 0);
	munmap((void *)(uintptr_t)held_now, 4096);
}

static void
watch_pool(struct seg *s)
{
	assert_true(lent(s) <= 5);
	for (int i = 0; i < 3; i++)
		assert_true(atomic_load(&s->comp[i].in_use) <= comps[i].max_connections);
}

static void
test_threads_of_two_processes_keep_the_pool_exact(void **state)
{
	struct seg *s = attach();

	(void)state;
	hammer_classes = false;
	hammer_two_processes(s, 10, watch_pool);
	proc_reclaim(s, false);
	assert_pool_back(s, 0);
	/* The peak from the use statistic never passed the room. */
	assert_true(atomic_load(&s->h->pools[0].peak) <= 10);
	seg_close(s);
}

/* ---- the same mechanism one level down: classes of one compartment ---- */

/* Compartment "pg" (no pool), max_connections 10, classes "web"
 * (guarantee 6, ceiling 10) and "batch" (guarantee 0, ceiling 8), and
 * "default" (guarantee 1, ceiling 10): the unguaranteed part is 3. */
enum { WEB = 1, BATCH = 2 };

static int
setup_classes(void **state)
{
	setup(state);
	cfg.ncomp = 1;
	cfg.npools = 0;
	comps[0].pool = BS_NO_POOL;
	comps[0].guaranteed = 0;
	comps[0].max_connections = 10;
	snprintf(cfg.classes[WEB].name, sizeof(cfg.classes[WEB].name), "web");
	snprintf(cfg.classes[BATCH].name, sizeof(cfg.classes[BATCH].name), "batch");
	cfg.nclass = 3;
	comps[0].class_shares = true;
	comps[0].class_guaranteed[0] = 1;
	comps[0].class_guaranteed[WEB] = 6;
	comps[0].class_limit[0] = 10;
	comps[0].class_limit[WEB] = 10;
	comps[0].class_limit[BATCH] = 8;
	return 0;
}

static uint32_t
cls_guar_held(struct seg *s, uint32_t cls)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < s->h->nslots; i++) {
		uint64_t m = atomic_load(&s->slots[i].mark);

		if (atomic_load(&s->slots[i].cls) == cls && tally_held(s, slot_comp_of(s, i), i, MARK_GEN(m), P_CLASS) &&
		    (m & MARK_GUARANTEED(SHARE_CLASS)))
			n++;
	}
	return n;
}

static void
test_a_class_keeps_its_guarantee_while_another_floods_the_compartment(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;

	(void)state;
	assert_int_equal(atomic_load(&s->comp[0].cls_shared), 3);
	/* batch has no guarantee: it borrows the unguaranteed 3, no more,
	 * though its ceiling is 8 and the compartment has 10. */
	for (int i = 0; i < 3; i++)
		assert_true(permit_acquire(s, seg_comp(s, 0), BATCH, next_ino++, false, &why) >= 0);
	for (int i = 0; i < 5; i++) {
		assert_int_equal(permit_acquire(s, seg_comp(s, 0), BATCH, next_ino++, false, &why), -EBUSY);
		assert_int_equal(why, REASON_CLASS_SHARED_FULL);
	}
	assert_int_equal(atomic_load(&s->comp[0].cls_lent), 3);
	assert_int_equal(atomic_load(&s->comp[0].cls[BATCH].rejected), 5);
	assert_int_equal(atomic_load(stat_reason_count(&s->comp[0], REASON_CLASS_SHARED_FULL,
	    false)), 5);
	assert_string_equal(stat_reason_name(REASON_CLASS_SHARED_FULL), "class_shared_full");
	/* web gets its 6 at once, default its 1. */
	for (int i = 0; i < 6; i++)
		assert_true(permit_acquire(s, seg_comp(s, 0), WEB, next_ino++, false, &why) >= 0);
	assert_true(permit_acquire(s, seg_comp(s, 0), 0, next_ino++, false, &why) >= 0);
	assert_int_equal(cls_guar_held(s, WEB), 6);
	assert_int_equal(atomic_load(&s->comp[0].in_use), 10);
	/* Beyond its guarantee web must borrow, and nothing is left. */
	assert_int_equal(permit_acquire(s, seg_comp(s, 0), WEB, next_ino++, false, &why), -EBUSY);
	assert_int_equal(why, REASON_CLASS_SHARED_FULL);
	/* The refusals gave every class permit back. */
	assert_int_equal(atomic_load(&s->comp[0].cls[WEB].in_use), 6);
	assert_int_equal(atomic_load(&s->comp[0].cls[BATCH].in_use), 3);
	proc_detach_all(s);
	assert_int_equal(atomic_load(&s->comp[0].cls_lent), 0);
	assert_int_equal(atomic_load(&s->comp[0].in_use), 0);
	seg_close(s);
}

static void
test_a_freed_class_guarantee_takes_back_a_lent_permit_at_once(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;
	int slot[8];

	(void)state;
	/* web holds 6 within its guarantee and 2 borrowed. */
	for (int i = 0; i < 8; i++)
		assert_true((slot[i] = permit_acquire(s, seg_comp(s, 0), WEB, next_ino++, false, &why)) >= 0);
	assert_int_equal(atomic_load(&s->comp[0].cls_lent), 2);
	/* Two guaranteed ones go: the borrowed ones move onto the guarantee
	 * and the unguaranteed part has them back at once. */
	slot_drop(s, (uint32_t)slot[0]);
	assert_int_equal(atomic_load(&s->comp[0].cls_lent), 1);
	slot_drop(s, (uint32_t)slot[1]);
	assert_int_equal(atomic_load(&s->comp[0].cls_lent), 0);
	assert_int_equal(cls_guar_held(s, WEB), 6);
	/* So batch may borrow all 3 again... */
	for (int i = 0; i < 3; i++)
		assert_true(permit_acquire(s, seg_comp(s, 0), BATCH, next_ino++, false, &why) >= 0);
	/* ...and a borrowed permit that goes just goes back. */
	slot_drop(s, (uint32_t)slot[7]);
	assert_int_equal(atomic_load(&s->comp[0].cls_lent), 3);
	assert_int_equal(cls_guar_held(s, WEB), 5);
	proc_detach_all(s);
	seg_close(s);
}

/* The compartment refuses after the class's permits were taken (its own
 * limit lowered live): the class permits go back, and a guaranteed one
 * passes its guarantee on. */
static void
test_a_compartment_refusal_gives_the_class_share_back(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;

	(void)state;
	atomic_store(&s->comp[0].limit, 2);
	assert_true(permit_acquire(s, seg_comp(s, 0), WEB, next_ino++, false, &why) >= 0);
	assert_true(permit_acquire(s, seg_comp(s, 0), BATCH, next_ino++, false, &why) >= 0);
	assert_int_equal(permit_acquire(s, seg_comp(s, 0), WEB, next_ino++, false, &why), -EBUSY);
	assert_int_equal(why, REASON_FULL);
	assert_int_equal(permit_acquire(s, seg_comp(s, 0), BATCH, next_ino++, false, &why), -EBUSY);
	assert_int_equal(atomic_load(&s->comp[0].cls[WEB].in_use), 1);
	assert_int_equal(atomic_load(&s->comp[0].cls[BATCH].in_use), 1);
	assert_int_equal(atomic_load(&s->comp[0].cls_lent), 1);
	assert_int_equal(cls_guar_held(s, WEB), 1);
	proc_detach_all(s);
	seg_close(s);
}

static void
watch_classes(struct seg *s)
{
	assert_true(atomic_load(&s->comp[0].cls_lent) <= 3);
}

/* Threads of two processes in three classes; the witness of what they hold
 * never sees a class above its ceiling or the compartment above 10, and
 * every count is back at 0 at the end. */
static void
test_threads_of_two_processes_keep_the_classes_exact(void **state)
{
	struct seg *s = attach();

	(void)state;
	/* note_held checks each index against comps[i].max_connections:
	 * here the indexes are classes, whose ceilings are 10, 10 and 8. */
	comps[1].max_connections = 10;
	comps[2].max_connections = 8;
	hammer_classes = true;
	hammer_two_processes(s, 10, watch_classes);
	proc_reclaim(s, false);
	assert_int_equal(atomic_load(&s->comp[0].cls_lent), 0);
	assert_int_equal(atomic_load(&s->comp[0].in_use), 0);
	for (int k = 0; k < 3; k++)
		assert_int_equal(atomic_load(&s->comp[0].cls[k].in_use), 0);
	seg_close(s);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_a_borrowed_permit_is_taken_and_given_back_exactly,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(test_the_pool_lends_its_shared_part_and_no_more, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_class_keeps_its_guarantee_while_another_floods_the_compartment, setup_classes, teardown),
		cmocka_unit_test_setup_teardown(test_a_freed_class_guarantee_takes_back_a_lent_permit_at_once, setup_classes, teardown),
		cmocka_unit_test_setup_teardown(test_a_compartment_refusal_gives_the_class_share_back, setup_classes, teardown),
		cmocka_unit_test_setup_teardown(test_threads_of_two_processes_keep_the_classes_exact, setup_classes, teardown),
		cmocka_unit_test_setup_teardown(test_a_compartment_below_its_guarantee_is_never_refused_for_the_pool, setup, teardown),
		cmocka_unit_test_setup_teardown(test_the_pool_peak_counts_its_members_only, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_reset_restarts_the_pool_peak_from_what_is_in_use, setup, teardown),
		cmocka_unit_test_setup_teardown(test_no_compartment_exceeds_its_ceiling, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_freed_guarantee_takes_back_a_lent_permit_at_once, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_waiter_is_woken_when_another_compartment_frees_the_pool, setup, teardown),
		cmocka_unit_test_setup_teardown(test_shrinking_the_pool_refuses_until_it_drains, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_guarantee_raised_live_takes_lent_permits_onto_it, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_pool_lent_beyond_its_shared_part_lends_and_guarantees_nothing_until_it_drains, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_release_left_by_a_dead_process_without_a_record_is_finished, setup, teardown),
		cmocka_unit_test_setup_teardown(test_kills_at_random_instants_leave_the_pool_exact, setup, teardown),
		cmocka_unit_test_setup_teardown(test_threads_of_two_processes_keep_the_pool_exact, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

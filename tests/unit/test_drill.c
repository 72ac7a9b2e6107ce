/* test_drill.c - unit tests of a drill's words: read whole, over at the deadline, picked by connection, one writer at a time. */
#include "admit/admit.h"
#include "log.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

static void
allowed_comp(struct seg_comp *c)
{
	memset(c, 0, sizeof(*c));
	atomic_store(&c->drill.allowed, 1);
}

static struct drill_view
plan(uint32_t faults, uint64_t deadline, uint32_t ppm)
{
	struct drill_view v;

	memset(&v, 0, sizeof(v));
	v.faults = faults;
	v.deadline_ms = deadline;
	v.delay_ms = 250;
	v.fraction_ppm = ppm;
	return v;
}

static void
test_runs_until_its_deadline(void **state)
{
	struct seg_comp c;
	struct drill_view v = plan(DRILL_DELAY | DRILL_RESET, 2000, 0), got;

	(void)state;
	allowed_comp(&c);
	assert_int_equal(drill_read(&c, 1000, &got), 0);
	assert_int_equal(drill_start(&c, &v, 1000, 5, 42), 0);
	assert_int_equal(drill_read(&c, 1000, &got), DRILL_DELAY | DRILL_RESET);
	assert_int_equal(got.delay_ms, 250);
	assert_int_equal(got.deadline_ms, 2000);
	assert_int_equal(atomic_load(&c.drill.by_pid), 42);
	assert_int_equal(drill_read(&c, 1999, &got), DRILL_DELAY | DRILL_RESET);
	/* Over at the deadline with nothing written: a killed CLI's drill ends. */
	assert_int_equal(drill_read(&c, 2000, &got), 0);
	assert_int_equal(got.faults, 0);
	assert_false(drill_running_at(&c, 2001));
	/* A dead drill does not keep another from starting. */
	v.deadline_ms = 9000;
	assert_int_equal(drill_start(&c, &v, 3000, 5, 43), 0);
	assert_true(drill_running_at(&c, 3000));
}

static void
test_one_drill_at_a_time_and_only_where_allowed(void **state)
{
	struct seg_comp c;
	struct drill_view v = plan(DRILL_STALL, 5000, 0);

	(void)state;
	memset(&c, 0, sizeof(c));
	assert_int_equal(drill_start(&c, &v, 1000, 0, 1), -EPERM);
	assert_int_equal(atomic_load(&c.drill.faults), 0);
	allowed_comp(&c);
	assert_int_equal(drill_start(&c, &v, 1000, 0, 1), 0);
	assert_int_equal(drill_start(&c, &v, 1500, 0, 2), -EBUSY);
	assert_int_equal(atomic_load(&c.drill.by_pid), 1);
	assert_true(drill_end(&c));
	assert_false(drill_running_at(&c, 1600));
	assert_false(drill_end(&c));
	assert_int_equal(drill_start(&c, &v, 1700, 0, 2), 0);
	/* Faults written where drills are not allowed (an old CLI, a reload
	 * that took the permission away) are not acted on. */
	atomic_store(&c.drill.allowed, 0);
	assert_false(drill_running_at(&c, 1800));
}

static void
test_a_reader_never_acts_on_words_being_written(void **state)
{
	struct seg_comp c;
	struct drill_view v = plan(DRILL_REFUSE, 5000, 0), got;
	uint64_t id;

	(void)state;
	allowed_comp(&c);
	assert_int_equal(drill_start(&c, &v, 1000, 0, 1), 0);
	id = atomic_load(&c.drill.id);
	assert_int_equal(id % 2, 0);
	/* A writer holds the words (odd id): the reader takes no drill. */
	atomic_store(&c.drill.id, id + 1);
	assert_int_equal(drill_read(&c, 1000, &got), 0);
	assert_int_equal(drill_start(&c, &v, 6000, 0, 2), -EBUSY);
	atomic_store(&c.drill.id, id);
	assert_int_equal(drill_read(&c, 1000, &got), DRILL_REFUSE);
	assert_int_equal(got.id, id);
	/* A stop moves the id on: a wait of the old drill sees it end. */
	assert_true(drill_end(&c));
	assert_true(atomic_load(&c.drill.id) > id);
}

static void
test_words_no_drill_could_have_are_not_acted_on(void **state)
{
	struct seg_comp c;
	struct drill_view v = plan(DRILL_STALL, 1000 + DRILL_MAX_MS, 0), got;

	(void)state;
	allowed_comp(&c);
	assert_int_equal(drill_start(&c, &v, 1000, 0, 1), 0);
	assert_int_equal(drill_read(&c, 2000, &got), DRILL_STALL);
	/* A deadline further than the longest drill, as only a damaged or
	 * forged segment has: a stall that long would hang the program. */
	atomic_store(&c.drill.deadline_ms, 1001 + DRILL_MAX_MS);
	assert_int_equal(drill_read(&c, 2000, &got), 0);
	atomic_store(&c.drill.deadline_ms, UINT64_MAX);
	assert_int_equal(drill_read(&c, 2000, &got), 0);
	/* A start in the future. */
	atomic_store(&c.drill.deadline_ms, 90000);
	atomic_store(&c.drill.start_ms, 80000);
	assert_int_equal(drill_read(&c, 2000, &got), 0);
	assert_int_equal(drill_read(&c, 79500, &got), DRILL_STALL);
}

static void
test_a_fraction_picks_about_that_share_the_same_way_for_the_whole_drill(void **state)
{
	struct drill_view v = plan(DRILL_DELAY, 1, DRILL_PPM / 4), w;
	unsigned n = 0, same = 0;

	(void)state;
	v.id = 2;
	w = v;
	w.id = 4;
	for (uint64_t ino = 1000; ino < 11000; ino++) {
		bool p = drill_picks(&v, ino);

		n += p;
		assert_int_equal(p, drill_picks(&v, ino));
		same += p == drill_picks(&w, ino);
	}
	assert_in_range(n, 2300, 2700);
	/* Another drill picks anew: not the same connections. */
	assert_in_range(same, 5500, 7000);
	v.fraction_ppm = 0;
	assert_true(drill_picks(&v, 7));
	v.fraction_ppm = DRILL_PPM;
	assert_true(drill_picks(&v, 7));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_runs_until_its_deadline),
		cmocka_unit_test(test_one_drill_at_a_time_and_only_where_allowed),
		cmocka_unit_test(test_a_reader_never_acts_on_words_being_written),
		cmocka_unit_test(test_words_no_drill_could_have_are_not_acted_on),
		cmocka_unit_test(test_a_fraction_picks_about_that_share_the_same_way_for_the_whole_drill),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

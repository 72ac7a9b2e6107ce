/* test_drill_verdict.c - unit tests of a drill's verdict: each wall, the tolerances at their edges, and the window of a probe's attempt. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "../../tools/cli_format.c"
#include "../../tools/drill_seg.c"
#include "../../tools/drill_verdict.c"

/* Two compartments (0 drilled, 1 other) and one probe, every window run
 * and held: 100 % success, p99 10 ms; the drilled compartment at 2/4. */
static char names[2][BS_NAME_MAX] = { "recs", "payments" };
static bool enforce[2] = { true, true };
static uint32_t max_wait[2];
static struct drill_cwin win[2][PH_N];
static struct drill_pwin pwin[1][PH_N];
static struct drill_probe probe[1];
static struct drill_report rep;
static FILE *devnull;

static int
setup(void **state)
{
	(void)state;
	memset(win, 0, sizeof(win));
	memset(pwin, 0, sizeof(pwin));
	memset(&rep, 0, sizeof(rep));
	probe[0].what = (char *)"http://shop/checkout";
	probe[0].url = true;
	for (int ph = 0; ph < PH_N; ph++) {
		for (int i = 0; i < 2; i++) {
			win[i][ph].measured = true;
			win[i][ph].max_in_use = win[i][ph].end_in_use = 2;
			win[i][ph].end_limit = win[i][ph].late_limit = 4;
			win[i][ph].late = true;
			win[i][ph].late_min_in_use = 1;
		}
		pwin[0][ph] = (struct drill_pwin){ 50, 50, 5, 10 };
		rep.phase_ms[ph] = 5000;
	}
	rep.segment = "shop";
	rep.compartment = "recs";
	rep.comp = 0;
	rep.spec = (struct drill_spec){ DRILL_DELAY, 2000, 0, 0, 5000 };
	rep.tol = (struct drill_tol){ 5, 3, 250 };
	rep.ncomp = 2;
	rep.names = names;
	rep.enforce = enforce;
	rep.max_wait_ms = max_wait;
	rep.win = win;
	rep.nprobe = 1;
	rep.probe = probe;
	rep.pwin = pwin;
	if (devnull == NULL)
		devnull = fopen("/dev/null", "w");
	return 0;
}

static int
verdict(void)
{
	return drill_verdict(devnull, &rep, false);
}

static void
every_wall_held_is_contained(void **state)
{
	(void)state;
	assert_int_equal(verdict(), DRILL_EX_CONTAINED);
	assert_int_equal(drill_verdict(devnull, &rep, true), DRILL_EX_CONTAINED);
}

static void
no_drill_window_is_not_run(void **state)
{
	(void)state;
	rep.phase_ms[PH_DRILL] = 0;
	assert_int_equal(verdict(), DRILL_EX_NOT_RUN);
}

static void
success_may_fall_five_points_not_more(void **state)
{
	(void)state;
	pwin[0][PH_DRILL].ok = 48;	/* 96 % */
	assert_int_equal(verdict(), DRILL_EX_CONTAINED);
	pwin[0][PH_DRILL].ok = 47;	/* 94 % */
	assert_int_equal(verdict(), DRILL_EX_LEAKED);
}

static void
p99_may_grow_to_three_times_or_by_the_slack(void **state)
{
	(void)state;
	pwin[0][PH_DRILL].p99_ms = 260;		/* 10 + 250 */
	assert_int_equal(verdict(), DRILL_EX_CONTAINED);
	pwin[0][PH_DRILL].p99_ms = 261;
	assert_int_equal(verdict(), DRILL_EX_LEAKED);
	pwin[0][PH_BASELINE].p99_ms = 200;
	pwin[0][PH_DRILL].p99_ms = 600;		/* 3 x 200 */
	assert_int_equal(verdict(), DRILL_EX_CONTAINED);
	pwin[0][PH_DRILL].p99_ms = 601;
	assert_int_equal(verdict(), DRILL_EX_LEAKED);
	rep.tol.slack_ms = 2500;
	assert_int_equal(verdict(), DRILL_EX_CONTAINED);
}

static void
a_probe_not_back_after_the_drill_leaks(void **state)
{
	(void)state;
	pwin[0][PH_AFTER].ok = 10;
	assert_int_equal(verdict(), DRILL_EX_LEAKED);
	/* Without an after window, recovery is not judged. */
	rep.phase_ms[PH_AFTER] = 0;
	assert_int_equal(verdict(), DRILL_EX_CONTAINED);
}

static void
the_drilled_compartment_past_its_limit_or_over_leaks(void **state)
{
	(void)state;
	win[0][PH_DRILL].samples_over = 1;
	assert_int_equal(verdict(), DRILL_EX_LEAKED);
	win[0][PH_DRILL].samples_over = 0;
	win[0][PH_DRILL].over_grew = 3;
	assert_int_equal(verdict(), DRILL_EX_LEAKED);
	win[0][PH_DRILL].over_grew = 0;
	/* Still full all through the after window's second half. */
	win[0][PH_AFTER].late_min_in_use = 4;
	assert_int_equal(verdict(), DRILL_EX_LEAKED);
}

static void
slow_refusals_leak(void **state)
{
	(void)state;
	win[0][PH_DRILL].rejected = 10;
	win[0][PH_DRILL].wait.bucket[10] = 10;	/* below 1 ms */
	win[0][PH_DRILL].wait.total = 10;
	assert_int_equal(verdict(), DRILL_EX_CONTAINED);
	win[0][PH_DRILL].wait.bucket[10] = 0;
	win[0][PH_DRILL].wait.bucket[17] = 10;	/* about 100 ms */
	assert_int_equal(verdict(), DRILL_EX_LEAKED);
	max_wait[0] = 200;			/* the compartment waits, on purpose */
	assert_int_equal(verdict(), DRILL_EX_CONTAINED);
	max_wait[0] = 0;
}

static void
another_compartments_reply_time_is_a_wall(void **state)
{
	(void)state;
	win[1][PH_BASELINE].reply.bucket[14] = 100;	/* ~16 ms */
	win[1][PH_BASELINE].reply.total = 100;
	win[1][PH_DRILL].reply.bucket[18] = 100;	/* ~262 ms: within 16 + 250 */
	win[1][PH_DRILL].reply.total = 100;
	assert_int_equal(verdict(), DRILL_EX_CONTAINED);
	win[1][PH_DRILL].reply.bucket[18] = 0;
	win[1][PH_DRILL].reply.bucket[21] = 100;	/* ~2 s */
	assert_int_equal(verdict(), DRILL_EX_LEAKED);
	/* The drilled compartment's own replies are the drill, not a leak. */
	memcpy(&win[0][PH_DRILL].reply, &win[1][PH_DRILL].reply, sizeof(struct cli_hist));
	memset(&win[1][PH_DRILL].reply, 0, sizeof(struct cli_hist));
	assert_int_equal(verdict(), DRILL_EX_CONTAINED);
}

static void
an_attempt_met_by_the_drill_counts_in_its_window(void **state)
{
	const uint64_t start[PH_N] = { 1000, 6000, 11000 };
	struct drill_sample in_base = { 2000, 100, true }, straddles = { 5500, 2100, true };
	struct drill_sample in_after = { 12000, 10, true }, late = { 16000, 10, true };
	struct drill_sample early = { 500, 10, true };

	(void)state;
	assert_int_equal(window_of(&in_base, start, 16000), PH_BASELINE);
	assert_int_equal(window_of(&straddles, start, 16000), PH_DRILL);
	assert_int_equal(window_of(&in_after, start, 16000), PH_AFTER);
	assert_int_equal(window_of(&late, start, 16000), -1);
	assert_int_equal(window_of(&early, start, 16000), -1);
}

static void
spec_and_durations_read_as_written(void **state)
{
	struct drill_spec spec = { DRILL_DELAY | DRILL_CONNECT_DELAY | DRILL_REFUSE, 2000, 500,
		250000, 1000 };
	char buf[128];

	(void)state;
	assert_string_equal(drill_spec_text(&spec, buf, sizeof(buf)),
	    "delay 2s, refuse, connect delay 500ms on 25% of connections");
	assert_string_equal(drill_duration(120000, buf, sizeof(buf)), "2m");
	assert_string_equal(drill_duration(1500, buf, sizeof(buf)), "1.5s");
	assert_string_equal(cli_drill_faults(DRILL_STALL | DRILL_RESET, buf, sizeof(buf)),
	    "stall,reset");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(every_wall_held_is_contained, setup),
		cmocka_unit_test_setup(no_drill_window_is_not_run, setup),
		cmocka_unit_test_setup(success_may_fall_five_points_not_more, setup),
		cmocka_unit_test_setup(p99_may_grow_to_three_times_or_by_the_slack, setup),
		cmocka_unit_test_setup(a_probe_not_back_after_the_drill_leaks, setup),
		cmocka_unit_test_setup(the_drilled_compartment_past_its_limit_or_over_leaks, setup),
		cmocka_unit_test_setup(slow_refusals_leak, setup),
		cmocka_unit_test_setup(another_compartments_reply_time_is_a_wall, setup),
		cmocka_unit_test_setup(an_attempt_met_by_the_drill_counts_in_its_window, setup),
		cmocka_unit_test_setup(spec_and_durations_read_as_written, setup),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

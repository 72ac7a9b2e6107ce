/* test_adaptive_published.c - unit tests of the published controllers: each step function on
 * synthetic windows, and their state through ctl. */
#include "../../shim/admit/ad_published.c"

#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <cmocka.h>

#include "config/config.h"

static const struct ad_pub_params P = {
	.min = 1, .max = 200, .tolerance_pct = AD_DEF_GRADIENT2_TOLERANCE_PCT,
	.timeout_ms = AD_DEF_TIMEOUT_MS, .backoff_pct = AD_DEF_BACKOFF_PCT,
	.min_rtt_interval_ms = 1000, .min_concurrency = AD_DEF_MIN_CONCURRENCY,
};

/* A window of 100 replies of mean `us` at mean concurrency `conc` (whole), closed at `end`. */
static struct ad_window
win(uint64_t us, uint64_t conc, uint64_t end)
{
	return (struct ad_window){ .n = 100, .mean_us = us, .conc16 = conc * 16, .end_us = end };
}

static void
test_pack_round_trips_through_ctl(void **state)
{
	struct ad_pub_state a = { .limit16 = 37 * 16 + 5, .lat_us = 12345, .phase = 0x2a5 }, b = { 0 };

	(void)state;
	ad_pub_unpack(ad_pub_pack(&a), &b);
	assert_int_equal(b.limit16, a.limit16);
	assert_int_equal(b.lat_us, a.lat_us);
	assert_int_equal(b.phase, a.phase);
	/* Out of range, each field saturates instead of spilling into the next. */
	a.limit16 = 1u << 30;
	a.lat_us = 1u << 30;
	ad_pub_unpack(ad_pub_pack(&a), &b);
	assert_int_equal(b.limit16, (1u << AD_LIMIT_BITS) - 1);
	assert_int_equal(b.lat_us, AD_BASE_MAX);
	assert_int_equal(b.phase, a.phase);
	/* Envoy's minRTT window: no latency for the stall check. */
	a = (struct ad_pub_state){ .limit16 = 48, .lat_us = 40 * 16, .phase = AD_ENVOY_MINRTT };
	assert_int_equal(ad_alg_latency_us(AD_ALG_ENVOY, ad_pub_pack(&a)), 0);
	assert_int_equal(ad_alg_latency_us(AD_ALG_VEGAS, ad_pub_pack(&a)), 40 * 16);
}

static void
test_vegas_grows_without_a_queue_and_shrinks_with_one(void **state)
{
	/* Each window: its mean latency and concurrency, then what Vegas does. */
	static const struct {
		uint64_t us, conc;
		enum ad_reason why;
		uint32_t limit;
	} steps[] = {
		/* The first sample is the no-load RTT (10 ms). */
		{ 10000, 50, AD_R_NONE, 50 },
		/* queue = ceil(50 x (1 - 10/10.1)) = 1 <= threshold log10(50) = 1:
		 * grows by beta, 6 x log10. */
		{ 10100, 50, AD_R_GROW, 56 },
		/* queue = ceil(56 x (1 - 10/10.4)) = 3: neither under alpha = 3
		 * nor over beta = 6: holds. */
		{ 10400, 56, AD_R_NONE, 56 },
		/* queue = 28 > beta: shrinks by log10. */
		{ 20000, 56, AD_R_QUEUE, 55 },
		/* queue = 2, between threshold and alpha: grows by log10. */
		{ 10300, 55, AD_R_GROW, 56 },
		/* App-limited (inflight x 2 < limit): no increase. */
		{ 10000, 20, AD_R_NONE, 56 },
		/* A drop (mean past timeout_ms) shrinks even an app-limited limit. */
		{ 6000000, 1, AD_R_QUEUE, 55 },
	};
	struct ad_pub_state st = { .limit16 = 50 * 16 };

	(void)state;
	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		struct ad_window w = win(steps[i].us, steps[i].conc, i + 1);

		assert_int_equal(ad_vegas_step(&P, &st, &w), steps[i].why);
		assert_int_equal(st.limit16, steps[i].limit * 16);
		assert_int_equal(st.lat_us, 10000);
	}
}

static void
test_vegas_takes_a_new_noload_rtt_every_probe_period(void **state)
{
	struct ad_pub_state st = { .limit16 = 10 * 16, .lat_us = 10000 };
	struct ad_window w;
	int i;

	(void)state;
	/* A probe comes within probeMultiplier 30 x limit 10 x jitter [0.5, 1)
	 * samples: the latency it finds is the new no-load RTT, even higher. */
	for (i = 0; i < 300 && st.lat_us == 10000; i++) {
		w = win(30000, 1, (uint64_t)i + 1);
		ad_vegas_step(&P, &st, &w);
	}
	assert_true(i >= 150 && i <= 301);
	assert_int_equal(st.lat_us, 30000);
	assert_int_equal(st.aux[0] & 0xffffffffu, 0);
}

static void
test_gradient2_shrinks_past_the_tolerance_and_leaves_an_app_limited_limit(void **state)
{
	struct ad_pub_state st = { .limit16 = 100 * 16 };
	struct ad_window w;
	uint32_t before;

	(void)state;
	/* Warm-up: the long RTT is the average of the first samples; at
	 * gradient 1 the limit grows by queueSize 4 x smoothing 0.2. */
	for (int i = 0; i < 10; i++) {
		w = win(10000, 100, (uint64_t)i);
		ad_gradient2_step(&P, &st, &w);
	}
	assert_int_equal(st.lat_us, 10000);
	assert_int_equal(st.phase, 10);
	assert_true(st.limit16 > 100 * 16);
	/* Short RTT 3 x long: gradient 1.5 x 1/3 = 0.5, smoothed by 0.2:
	 * limit x (0.8 + 0.2 x 0.5) + 0.8. */
	before = st.limit16;
	w = win(30000, before / 16, 11);
	assert_int_equal(ad_gradient2_step(&P, &st, &w), AD_R_QUEUE);
	/* (The long RTT moved 67 us toward the sample first: a hair above 0.5.) */
	assert_in_range(st.limit16, (before * 8 + (before / 2 + 64) * 2) / 10,
	    (before * 8 + (before / 2 + 64) * 2) / 10 + 2);
	/* Within the tolerance (short <= 1.5 x long): no shrink. */
	before = st.limit16;
	w = win(14000, before / 16, 12);
	assert_int_equal(ad_gradient2_step(&P, &st, &w), AD_R_GROW);
	/* App-limited: the same high latency leaves the limit alone. */
	before = st.limit16;
	w = win(30000, before / 16 / 2 - 1, 13);
	assert_int_equal(ad_gradient2_step(&P, &st, &w), AD_R_NONE);
	assert_int_equal(st.limit16, before);
}

static void
test_gradient2_long_rtt_comes_down_after_an_overload(void **state)
{
	struct ad_pub_state st = { .limit16 = 20 * 16, .lat_us = 50000, .phase = 10 };
	struct ad_window w = win(10000, 20, 1);

	(void)state;
	/* long / short > 2: the long RTT is cut by 5 % besides the average. */
	ad_gradient2_step(&P, &st, &w);
	assert_true(st.lat_us < 50000 * 95 / 100);
	assert_true(st.lat_us > 45000);
}

static void
test_aimd_backs_off_on_a_drop_and_adds_one_in_use(void **state)
{
	struct ad_pub_params p = P;
	struct ad_pub_state st = { .limit16 = 40 * 16 };
	struct ad_window w;

	(void)state;
	p.timeout_ms = 50;
	w = win(10000, 30, 1);		/* in use: 30 x 2 >= 40 */
	assert_int_equal(ad_aimd_step(&p, &st, &w), AD_R_GROW);
	assert_int_equal(st.limit16, 41 * 16);
	w = win(10000, 10, 2);		/* not in use */
	assert_int_equal(ad_aimd_step(&p, &st, &w), AD_R_NONE);
	assert_int_equal(st.limit16, 41 * 16);
	w = win(60000, 41, 3);		/* a drop: x 0.9, truncated */
	assert_int_equal(ad_aimd_step(&p, &st, &w), AD_R_QUEUE);
	assert_int_equal(st.limit16, 36 * 16);
	assert_int_equal(st.lat_us, 60000);
	/* Clamped to min. */
	p.min = 35;
	assert_int_equal(ad_aimd_step(&p, &st, &w), AD_R_QUEUE);
	assert_int_equal(st.limit16, 35 * 16);
}

static void
test_envoy_pins_min_concurrency_for_a_minrtt_window_then_applies_the_gradient(void **state)
{
	struct ad_pub_state st;
	struct ad_window w;
	uint64_t t = 1000000;

	(void)state;
	ad_pub_start(AD_ALG_ENVOY, &P, 40, &st);
	assert_int_equal(st.limit16, AD_DEF_MIN_CONCURRENCY * 16);
	assert_true(st.phase & AD_ENVOY_MINRTT);
	/* 30 samples: fewer than request_count 50, still measuring. */
	w = (struct ad_window){ .n = 30, .mean_us = 10000, .conc16 = 48, .end_us = t };
	assert_int_equal(ad_envoy_step(&P, &st, &w), AD_R_NONE);
	assert_int_equal(st.limit16, 48);
	/* 30 more of 14 ms: the minRTT is their mean, 11.5 ms, and the limit
	 * returns to 40; the next window is due after the interval plus up to
	 * 15 % jitter. */
	w = (struct ad_window){ .n = 30, .mean_us = 13000, .conc16 = 48, .end_us = t + 100000 };
	assert_int_equal(ad_envoy_step(&P, &st, &w), AD_R_GROW);
	assert_int_equal(st.limit16, 40 * 16);
	assert_int_equal(st.lat_us, 11500);
	assert_false(st.phase & AD_ENVOY_MINRTT);
	assert_true(st.aux[0] > t + 100000 + 1000000 && st.aux[0] <= t + 100000 + 1150001);
	/* Sample 2 x minRTT: gradient 1.25 / 2 = 0.625; 40 x 0.625 = 25,
	 * + sqrt(25) = 30. */
	w = win(23000, 40, t + 200000);
	assert_int_equal(ad_envoy_step(&P, &st, &w), AD_R_QUEUE);
	assert_int_equal(st.limit16, 30 * 16);
	/* Sample at minRTT: gradient 1.25: 37.5 + 6.1 = 43. */
	w = win(11500, 30, t + 300000);
	assert_int_equal(ad_envoy_step(&P, &st, &w), AD_R_GROW);
	assert_int_equal(st.limit16, 43 * 16);
	/* Past the deadline: a new minRTT window, 43 waiting in the latency field. */
	w = win(11500, 30, st.aux[0]);
	assert_int_equal(ad_envoy_step(&P, &st, &w), AD_R_QUEUE);
	assert_int_equal(st.limit16, AD_DEF_MIN_CONCURRENCY * 16);
	assert_int_equal(st.lat_us, 43 * 16);
}

static void
test_envoy_measures_again_after_five_windows_at_the_floor(void **state)
{
	struct ad_pub_state st = { .limit16 = 3 * 16, .lat_us = 1000 };
	struct ad_window w;
	int i;

	(void)state;
	/* Latency far above the minRTT keeps the limit at min_concurrency. */
	for (i = 0; i < 5; i++) {
		w = win(100000, 3, (uint64_t)i + 1);
		ad_envoy_step(&P, &st, &w);
		assert_false(st.phase & AD_ENVOY_MINRTT);
	}
	w = win(100000, 3, 10);
	ad_envoy_step(&P, &st, &w);
	assert_true(st.phase & AD_ENVOY_MINRTT);
}

static void
test_steps_ignore_an_empty_window(void **state)
{
	struct ad_pub_state st = { .limit16 = 9 * 16, .lat_us = 100 }, was = st;
	struct ad_window w = { 0 };

	(void)state;
	assert_int_equal(ad_vegas_step(&P, &st, &w), AD_R_NONE);
	assert_int_equal(ad_gradient2_step(&P, &st, &w), AD_R_NONE);
	assert_int_equal(ad_aimd_step(&P, &st, &w), AD_R_NONE);
	assert_int_equal(ad_envoy_step(&P, &st, &w), AD_R_NONE);
	assert_memory_equal(&st, &was, sizeof(st));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pack_round_trips_through_ctl),
		cmocka_unit_test(test_vegas_grows_without_a_queue_and_shrinks_with_one),
		cmocka_unit_test(test_vegas_takes_a_new_noload_rtt_every_probe_period),
		cmocka_unit_test(test_gradient2_shrinks_past_the_tolerance_and_leaves_an_app_limited_limit),
		cmocka_unit_test(test_gradient2_long_rtt_comes_down_after_an_overload),
		cmocka_unit_test(test_aimd_backs_off_on_a_drop_and_adds_one_in_use),
		cmocka_unit_test(test_envoy_pins_min_concurrency_for_a_minrtt_window_then_applies_the_gradient),
		cmocka_unit_test(test_envoy_measures_again_after_five_windows_at_the_floor),
		cmocka_unit_test(test_steps_ignore_an_empty_window),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

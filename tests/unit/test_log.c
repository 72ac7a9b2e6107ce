/* test_log.c - unit tests of the signal-safe formatter, log levels, the rejection rate limit and JSON lines. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../shim/log.c"

static void
test_format_handles_each_conversion(void **state)
{
	char buf[128];
	const char *volatile nothing = NULL;

	(void)state;
	bs_format(buf, sizeof(buf), "%s %d %u %x %c %% %ld %llu %lld", "str", -42, 42u, 255u, 'z',
	    -7L, 18446744073709551615ULL, -9223372036854775807LL - 1);
	assert_string_equal(buf, "str -42 42 ff z % -7 18446744073709551615 -9223372036854775808");
	bs_format(buf, sizeof(buf), "%s", nothing);
	assert_string_equal(buf, "(null)");
}

static void
test_format_truncates_without_overflow(void **state)
{
	char buf[8];
	size_t n;

	(void)state;
	memset(buf, 'X', sizeof(buf));
	n = bs_format(buf, 6, "%s", "abcdefghij");
	assert_int_equal(n, 5);
	assert_string_equal(buf, "abcde");
	assert_int_equal(buf[6], 'X');
}

static void
test_unknown_level_word_is_refused(void **state)
{
	(void)state;
	assert_int_equal(log_set_level("debug"), 0);
	assert_int_equal(log_get_level(), LOG_DEBUG);
	assert_int_equal(log_set_level("loud"), -EINVAL);
	assert_int_equal(log_get_level(), LOG_DEBUG);
	assert_int_equal(log_set_level("off"), 0);
	assert_int_equal(log_get_level(), LOG_OFF);
	assert_int_equal(log_set_level("warn"), 0);
}

/* Captures what the logger writes to descriptor 2 while fn runs. */
static size_t
capture(void (*fn)(void), char *out, size_t len)
{
	int p[2], saved = dup(2);
	ssize_t n;

	assert_int_equal(pipe(p), 0);
	dup2(p[1], 2);
	close(p[1]);
	fn();
	dup2(saved, 2);
	close(saved);
	fcntl(p[0], F_SETFL, O_NONBLOCK);
	n = read(p[0], out, len - 1);
	close(p[0]);
	out[n > 0 ? n : 0] = '\0';
	return n > 0 ? (size_t)n : 0;
}

static void
ten_rejections(void)
{
	for (int i = 0; i < 10; i++)
		log_rejection(3, "slow full (%u/%u): connect to %s refused", 4u, 4u, "127.0.0.1:9");
}

static void
test_rejections_log_at_most_once_a_second_per_compartment(void **state)
{
	char out[4096];
	const char *p;
	int lines = 0;

	(void)state;
	log_set_level("warn");
	capture(ten_rejections, out, sizeof(out));
	for (p = out; (p = strchr(p, '\n')) != NULL; p++)
		lines++;
	/* Ten within a second of each other: one line. */
	assert_int_equal(lines, 1);
	assert_non_null(strstr(out, "]: slow full (4/4): connect to 127.0.0.1:9 refused"));
	assert_memory_equal(out, "bulkshim[", 9);
	/* The next line, a second later, says how many were suppressed. */
	sleep(1);
	capture(ten_rejections, out, sizeof(out));
	assert_non_null(strstr(out, "similar suppressed)"));
}

static void
quiet_rejection(void)
{
	log_rejection(5, "x");
	bs_log(LOG_INFO, "info line");
}

static void
test_off_and_warn_levels_silence_what_they_should(void **state)
{
	char out[256];

	(void)state;
	log_set_level("off");
	assert_int_equal(capture(quiet_rejection, out, sizeof(out)), 0);
	log_set_level("warn");
	capture(quiet_rejection, out, sizeof(out));
	assert_null(strstr(out, "info line"));
	assert_non_null(strstr(out, ": x\n"));
}

/* ---- JSON lines ---- */

static void
test_format_word_is_text_or_json(void **state)
{
	(void)state;
	assert_int_equal(log_set_format("json"), 0);
	assert_true(log_is_json());
	assert_int_equal(log_set_format("xml"), -EINVAL);
	assert_true(log_is_json());
	assert_int_equal(log_set_format("text"), 0);
	assert_false(log_is_json());
}

/* The civil date agrees with gmtime_r, leap days and century years included. */
static void
test_time_matches_gmtime(void **state)
{
	static const long long secs[] = {
		0, 951782400, 951868799, 4107542400LL, 4107628800LL, 1798761599, 1709164800,
		253402300799LL, 1234567890,
	};

	(void)state;
	for (size_t i = 0; i < sizeof(secs) / sizeof(secs[0]); i++) {
		char got[64], want[64];
		size_t n = 0;
		time_t t = (time_t)secs[i];
		struct tm tm;

		put_time(got, sizeof(got), &n, (uint64_t)secs[i] * 1000 + 7);
		got[n] = '\0';
		gmtime_r(&t, &tm);
		strftime(want, sizeof(want), "\"%Y-%m-%dT%H:%M:%S.007Z\"", &tm);
		assert_string_equal(got, want);
	}
}

static char hostile[3000];

static void
hostile_refusal(void)
{
	struct log_refusal r = {
		.message = hostile, .compartment = "pay\"ments", .reason = "full",
		.operation = "connect", .destination = hostile, .in_use = 4, .limit = UINT32_MAX,
	};
	uint64_t skipped = 0;

	if (log_rejection_due(7, &skipped))
		log_refusal(&r, skipped);
}

/* Quotes, backslashes and control characters are escaped, and a huge
 * destination is cut so that the object still closes on its one line. */
static void
test_hostile_fields_stay_one_valid_line(void **state)
{
	char out[8192];
	size_t n;

	(void)state;
	for (size_t i = 0; i < sizeof(hostile) - 1; i++)
		hostile[i] = "a\"\\\n\t\x01/"[i % 7];
	log_set_level("warn");
	log_set_format("json");
	n = capture(hostile_refusal, out, sizeof(out));
	log_set_format("text");
	assert_true(n > 0 && n < JSON_LINE_MAX);
	assert_int_equal(out[n - 1], '\n');
	assert_int_equal(out[n - 2], '}');
	assert_ptr_equal(strchr(out, '\n'), out + n - 1);
	assert_null(memchr(out, '\t', n));
	assert_null(memchr(out, 1, n));
	assert_non_null(strstr(out, "\"compartment\": \"pay\\\"ments\""));
	assert_non_null(strstr(out, "a\\\"\\\\\\n\\t\\u0001/"));
	assert_non_null(strstr(out, "\"limit\": null"));
	assert_non_null(strstr(out, "...\""));
	assert_memory_equal(out, "{\"time\": \"", 10);
}

static void
ten_refusals(void)
{
	struct log_refusal r = {
		.message = "slow full (4/4): connect to 127.0.0.1:9 refused", .compartment = "slow",
		.reason = "full", .operation = "connect", .destination = "127.0.0.1:9",
		.in_use = 4, .limit = 4,
	};

	for (int i = 0; i < 10; i++) {
		uint64_t skipped = 0;

		if (log_rejection_due(9, &skipped))
			log_refusal(&r, skipped);
	}
}

static void
test_json_refusals_are_rate_limited_and_count_the_suppressed(void **state)
{
	char out[4096];

	(void)state;
	log_set_level("warn");
	log_set_format("json");
	capture(ten_refusals, out, sizeof(out));
	assert_non_null(strstr(out, "\"suppressed\": 0, \"message\": \"slow full (4/4)"));
	assert_ptr_equal(strchr(out, '\n'), out + strlen(out) - 1);
	sleep(1);
	capture(ten_refusals, out, sizeof(out));
	log_set_format("text");
	assert_non_null(strstr(out, "\"in_use\": 4, \"limit\": 4, \"suppressed\": 9,"));
	assert_ptr_equal(strchr(out, '\n'), out + strlen(out) - 1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_format_handles_each_conversion),
		cmocka_unit_test(test_format_truncates_without_overflow),
		cmocka_unit_test(test_unknown_level_word_is_refused),
		cmocka_unit_test(test_rejections_log_at_most_once_a_second_per_compartment),
		cmocka_unit_test(test_off_and_warn_levels_silence_what_they_should),
		cmocka_unit_test(test_format_word_is_text_or_json),
		cmocka_unit_test(test_time_matches_gmtime),
		cmocka_unit_test(test_hostile_fields_stay_one_valid_line),
		cmocka_unit_test(test_json_refusals_are_rate_limited_and_count_the_suppressed),
	};

	return cmocka_run_group_tests_name("log", tests, NULL, NULL);
}

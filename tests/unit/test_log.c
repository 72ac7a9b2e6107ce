/* test_log.c - unit tests of the signal-safe formatter, log levels and the rejection rate limit. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
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

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_format_handles_each_conversion),
		cmocka_unit_test(test_format_truncates_without_overflow),
		cmocka_unit_test(test_unknown_level_word_is_refused),
		cmocka_unit_test(test_rejections_log_at_most_once_a_second_per_compartment),
		cmocka_unit_test(test_off_and_warn_levels_silence_what_they_should),
	};

	return cmocka_run_group_tests_name("log", tests, NULL, NULL);
}

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

/* A compartment's refusal gate, as the segment gives each (log_gate). */
static _Atomic uint64_t gates[16];

/* A refusal line of compartment comp, as the shim writes one: through the
 * compartment's gate. */
static void
refusal_line(unsigned comp, const char *msg)
{
	struct log_refusal r = { .message = msg, .limit = UINT32_MAX };
	uint64_t skipped = 0;

	if (log_gate_due(&gates[comp], &skipped))
		log_refusal(&r, skipped);
}

static void
ten_rejections(void)
{
	char msg[128];

	bs_format(msg, sizeof(msg), "slow full (%u/%u): connect to %s refused", 4u, 4u,
	    "127.0.0.1:9");
	for (int i = 0; i < 10; i++)
		refusal_line(3, msg);
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
	refusal_line(5, "x");
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

	if (log_gate_due(&gates[7], &skipped))
		log_refusal(&r, skipped);
}

/* Quotes and backslashes are escaped, control characters replaced, and a
 * huge destination is cut so that the object still closes on its one line. */
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
	assert_non_null(strstr(out, "a\\\"\\\\??" "?/"));
	assert_non_null(strstr(out, "\"limit\": null"));
	assert_non_null(strstr(out, "...\""));
	assert_memory_equal(out, "{\"time\": \"", 10);
}

/* Each case: what goes in, what log_scrub leaves of it. */
static void
test_scrub_leaves_printable_text_only(void **state)
{
	static const struct {
		const char *in, *out;
	} cases[] = {
		{ "plain text 1.2:3", "plain text 1.2:3" },
		{ "a\nb\rc\td", "a?b?c?d" },
		{ "\x1b[31mred\x1b[0m", "?[31mred?[0m" },
		{ "del\x7f", "del?" },
		{ "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80" },
		{ "csi\x9b" "31m", "csi?31m" },			/* C1, raw */
		{ "csi\xc2\x9b" "31m", "csi??31m" },		/* C1, UTF-8 encoded */
		{ "nel\xc2\x85", "nel??" },
		{ "ls\xe2\x80\xa8ps\xe2\x80\xa9", "ls???ps???" },
		{ "overlong\xc0\xaf\xe0\x80\xaf", "overlong?????" },
		{ "surrogate\xed\xa0\x80", "surrogate???" },
		{ "beyond\xf4\x90\x80\x80", "beyond????" },
		{ "cut\xe2\x82", "cut??" },
		{ "lone\x80\xbf", "lone??" },
	};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char buf[64];

		snprintf(buf, sizeof(buf), "%s", cases[i].in);
		log_scrub(buf, strlen(buf));
		assert_string_equal(buf, cases[i].out);
	}
}

static void
test_name_keeps_only_what_a_config_accepts(void **state)
{
	char out[BS_NAME_MAX], field[16];

	(void)state;
	assert_true(log_name(out, sizeof(out), "db-1.pg_main", 16));
	assert_string_equal(out, "db-1.pg_main");
	assert_false(log_name(out, sizeof(out), "a\nbulkshim[1]: FORGED \x1b[31m", 40));
	assert_string_equal(out, "a?bulkshim?1???FORGED???31m");
	assert_false(log_name(out, sizeof(out), "", 8));
	assert_string_equal(out, "?");
	assert_false(log_name(out, sizeof(out), "caf\xc3\xa9", 8));
	assert_string_equal(out, "caf??");
	/* No NUL within the field: read no further than it. */
	memset(field, 'A', sizeof(field));
	assert_false(log_name(out, sizeof(out), field, sizeof(field)));
	assert_string_equal(out, "AAAAAAAAAAAAAAAA");
	/* Cut to the room there is, in place too. */
	assert_false(log_name(out, 4, "abcdef", 8));
	assert_string_equal(out, "abc");
	snprintf(field, sizeof(field), "x y");
	assert_false(log_name(field, sizeof(field), field, sizeof(field)));
	assert_string_equal(field, "x?y");
	assert_false(log_name(out, 0, "abc", 4));
}

static void
forged_line(void)
{
	errno = EDOM;
	bs_log(LOG_WARN, "compartment %s full", "a\nbulkshim[1]: FORGED LINE \x1b[31mX");
	assert_int_equal(errno, EDOM);
}

/* Whatever its arguments hold, a text or JSON line is one line of
 * printable text, and errno is left as it was. */
static void
test_a_line_is_one_line_whatever_its_arguments(void **state)
{
	char out[1024];
	size_t n;

	(void)state;
	log_set_level("warn");
	n = capture(forged_line, out, sizeof(out));
	assert_true(n > 0);
	assert_ptr_equal(strchr(out, '\n'), out + n - 1);
	assert_null(strchr(out, '\x1b'));
	assert_non_null(strstr(out, ": compartment a?bulkshim[1]: FORGED LINE ?[31mX full\n"));
	log_set_format("json");
	n = capture(forged_line, out, sizeof(out));
	log_set_format("text");
	assert_true(n > 0);
	assert_ptr_equal(strchr(out, '\n'), out + n - 1);
	assert_null(strchr(out, '\x1b'));
	assert_null(strstr(out, "\\n"));
	assert_non_null(strstr(out, "\"message\": \"compartment a?bulkshim[1]: FORGED LINE ?[31mX "
	    "full\"}"));
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

		if (log_gate_due(&gates[9], &skipped))
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

/* The gate a segment's processes share: one line a second between them,
 * the others counted in the word and handed to the next line; the count
 * saturates; a time from the future (a damaged word) lets a line through. */
static void
test_shared_gate_lets_one_line_a_second_and_counts_the_rest(void **state)
{
	_Atomic uint64_t gate = 0;
	uint64_t skipped = 99, now;

	(void)state;
	log_set_level("warn");
	assert_true(log_gate_due(&gate, &skipped));
	assert_int_equal(skipped, 0);
	for (int i = 0; i < 9; i++)
		assert_false(log_gate_due(&gate, &skipped));
	assert_int_equal(atomic_load(&gate) & ((1ULL << LOG_GATE_COUNT_BITS) - 1), 9);
	/* The line a second later (as another process would see it). */
	now = now_mono_ms() + 1;
	atomic_store(&gate, (now - 1000) << LOG_GATE_COUNT_BITS | 9);
	assert_true(log_gate_due(&gate, &skipped));
	assert_int_equal(skipped, 9);
	/* Saturated, not wrapped. */
	atomic_store(&gate, now << LOG_GATE_COUNT_BITS | ((1ULL << LOG_GATE_COUNT_BITS) - 1));
	assert_false(log_gate_due(&gate, &skipped));
	assert_int_equal(atomic_load(&gate) & ((1ULL << LOG_GATE_COUNT_BITS) - 1),
	    (1ULL << LOG_GATE_COUNT_BITS) - 1);
	/* A time ahead of this clock: the line goes out. */
	atomic_store(&gate, (now + 3600000) << LOG_GATE_COUNT_BITS | 5);
	assert_true(log_gate_due(&gate, &skipped));
	assert_int_equal(skipped, 5);
	/* A process that logs no warnings neither claims nor counts. */
	atomic_store(&gate, 0);
	log_set_level("error");
	assert_false(log_gate_due(&gate, &skipped));
	assert_int_equal(atomic_load(&gate), 0);
	log_set_level("warn");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_format_handles_each_conversion),
		cmocka_unit_test(test_format_truncates_without_overflow),
		cmocka_unit_test(test_unknown_level_word_is_refused),
		cmocka_unit_test(test_rejections_log_at_most_once_a_second_per_compartment),
		cmocka_unit_test(test_shared_gate_lets_one_line_a_second_and_counts_the_rest),
		cmocka_unit_test(test_off_and_warn_levels_silence_what_they_should),
		cmocka_unit_test(test_format_word_is_text_or_json),
		cmocka_unit_test(test_time_matches_gmtime),
		cmocka_unit_test(test_hostile_fields_stay_one_valid_line),
		cmocka_unit_test(test_json_refusals_are_rate_limited_and_count_the_suppressed),
		cmocka_unit_test(test_scrub_leaves_printable_text_only),
		cmocka_unit_test(test_name_keeps_only_what_a_config_accepts),
		cmocka_unit_test(test_a_line_is_one_line_whatever_its_arguments),
	};

	return cmocka_run_group_tests_name("log", tests, NULL, NULL);
}

/* test_abbrev.c - unit tests of the names the views abbreviate: kept apart, kept whole when they fit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "../../tools/cli_format.c"

static char out[64][CLI_ABBREV_MAX];

static void
names_that_fit_are_kept_whole(void **state)
{
	const char *names[] = { "db", "payments", "exactly-twelve" };

	(void)state;
	cli_abbrev(names, 3, 14, out);
	for (int i = 0; i < 3; i++)
		assert_string_equal(out[i], names[i]);
}

static void
names_differing_at_their_end_keep_it(void **state)
{
	char buf[30][40];
	const char *names[30];

	(void)state;
	for (int i = 0; i < 30; i++) {
		snprintf(buf[i], sizeof(buf[i]), "svc-with-a-rather-long-name-%02d", i);
		names[i] = buf[i];
	}
	cli_abbrev(names, 30, 24, out);
	for (int i = 0; i < 30; i++) {
		char end[4];

		snprintf(end, sizeof(end), "%02d", i);
		assert_true(strlen(out[i]) <= 24);
		assert_non_null(strchr(out[i], '~'));
		assert_string_equal(out[i] + strlen(out[i]) - 2, end);
		assert_memory_equal(out[i], "svc-with-a", 10);
		for (int j = 0; j < i; j++)
			assert_string_not_equal(out[i], out[j]);
	}
}

static void
names_differing_only_in_their_middle_get_numbers(void **state)
{
	const char *names[] = { "frontend-alpha-cluster-service", "frontend-bravo-cluster-service",
	    "frontend-gamma-cluster-service" };

	(void)state;
	cli_abbrev(names, 3, 12, out);
	for (int i = 0; i < 3; i++) {
		assert_true(strlen(out[i]) <= 12);
		for (int j = 0; j < i; j++)
			assert_string_not_equal(out[i], out[j]);
	}
	assert_string_equal(out[2] + strlen(out[2]) - 2, "~3");
}

static void
a_long_name_beside_short_ones_is_cut_to_the_width(void **state)
{
	const char *names[] = { "a", "a-name-of-sixty-three-characters-that-no-column-of-a-view-has" };

	(void)state;
	cli_abbrev(names, 2, 8, out);
	assert_string_equal(out[0], "a");
	assert_int_equal(strlen(out[1]), 8);
	assert_int_equal(out[1][0], 'a');
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(names_that_fit_are_kept_whole),
		cmocka_unit_test(names_differing_at_their_end_keep_it),
		cmocka_unit_test(names_differing_only_in_their_middle_get_numbers),
		cmocka_unit_test(a_long_name_beside_short_ones_is_cut_to_the_width),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

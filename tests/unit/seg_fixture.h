/* seg_fixture.h - what the segment unit tests share: a config of their own, teardown, attach. */
#ifndef BULKSHIM_SEG_FIXTURE_H
#define BULKSHIM_SEG_FIXTURE_H

/* Each test's setup fills cfg, naming a fresh segment with counter. */
static struct bs_config cfg;
static char err[BS_ERRLEN];
static int counter;

/* Removes the test's segment. */
static int
teardown(void **state)
{
	char name[BS_NAME_MAX + 16];

	(void)state;
	snprintf(name, sizeof(name), "/bulkshim.%s", cfg.segment);
	shm_unlink(name);
	return 0;
}

/* Attaches cfg's segment as the shim would; fails the test on error. */
static struct seg *
attach(void)
{
	struct seg *s = NULL;
	int r = seg_attach(&cfg, &s, err, sizeof(err));

	if (r != 0)
		print_error("seg_attach: %s\n", err);
	assert_int_equal(r, 0);
	return s;
}

#endif

/* test_guard.c - a segment that shrinks under its mapping: the fault is the guard's, the process lives on. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#include "admit/admit.h"
#include "seg_fixture.h"

static struct cfg_compartment comps[1];

static int
setup(void **state)
{
	(void)state;
	memset(comps, 0, sizeof(comps));
	snprintf(comps[0].name, sizeof(comps[0].name), "web");
	comps[0].max_connections = 2;
	fixture_config("guard", comps, 1);
	return 0;
}

static _Atomic int faults;

/* What the library's and the CLI's handlers do: the guard's fault is
 * retried on zero pages; any other ends the test. */
static void
on_sigbus(int sig, siginfo_t *info, void *uc)
{
	(void)sig;
	(void)uc;
	if (guard_fault(info->si_addr) != NULL) {
		faults++;
		return;
	}
	abort();
}

static void
shrink(const struct seg *s, off_t size)
{
	char name[BS_NAME_MAX + 16];
	int fd;

	(void)s;
	seg_shm_name(cfg.segment, name, sizeof(name));
	fd = shm_open(name, O_RDWR, 0);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, size), 0);
	close(fd);
}

static void
test_a_truncated_segment_reads_zeros_and_is_marked_lost(void **state)
{
	struct sigaction sa, old;
	struct seg *s = attach();
	volatile uint32_t *last = (volatile uint32_t *)((char *)s->base + s->size - 4);

	(void)state;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO;
	assert_int_equal(sigaction(SIGBUS, &sa, &old), 0);
	assert_false(guard_lost(s));
	assert_int_not_equal(seg_header(s)->magic, 0);
	*last = 7;
	shrink(s, 4096);
	/* The first page is still there; the last is gone. */
	assert_int_not_equal(seg_header(s)->magic, 0);
	assert_int_equal(*last, 0);
	assert_int_equal(faults, 1);
	assert_true(guard_lost(s));
	/* The whole mapping was replaced: writes stay in this process. */
	assert_int_equal(seg_header(s)->magic, 0);
	*last = 9;
	assert_int_equal(*last, 9);
	assert_int_equal(faults, 1);
	seg_close(s);
	sigaction(SIGBUS, &old, NULL);
}

static void
test_a_fault_outside_every_segment_is_not_the_guards(void **state)
{
	struct seg *s = attach();
	char *mine = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	(void)state;
	assert_true(mine != MAP_FAILED);
	assert_null(guard_fault(mine));
	assert_null(guard_fault((char *)s->base + s->size));
	assert_false(guard_lost(s));
	/* Once closed, its range is no longer the guard's either. */
	{
		void *base = s->base;

		seg_close(s);
		assert_null(guard_fault(base));
	}
	munmap(mine, 4096);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_a_truncated_segment_reads_zeros_and_is_marked_lost,
		    setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_fault_outside_every_segment_is_not_the_guards,
		    setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

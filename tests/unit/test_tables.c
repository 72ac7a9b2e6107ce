/* test_tables.c - unit tests of the socket and process tables: pending entries, watched slots, table-full reasons. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../shim/admit/segment.c"
#include "seg_fixture.h"

static struct cfg_compartment comps[2];

/* "a" limit 3 and "b" limit 1, both enforcing; 16 processes, 64 sockets. */
static int
setup(void **state)
{
	(void)state;
	memset(comps, 0, sizeof(comps));
	snprintf(comps[0].name, sizeof(comps[0].name), "a");
	comps[0].max_connections = 3;
	snprintf(comps[1].name, sizeof(comps[1].name), "b");
	comps[1].max_connections = 1;
	for (int i = 0; i < 2; i++) {
		comps[i].enforce = true;
		comps[i].reject_errno = ECONNREFUSED;
	}
	fixture_config("tt", comps, 2);
	return 0;
}

/* One connection permit of compartment comp for inode ino; the slot, or
 * -EBUSY with *why. */
static int
acq_why(struct seg *s, uint32_t comp, uint64_t ino, enum bs_reason *why)
{
	return permit_acquire(s, seg_comp(s, comp), 0, ino, false, why);
}

/* A permit of compartment "a" for a real socket (sv[0] of a new pair of
 * Unix stream sockets, so that the kernel can be asked about it); its slot,
 * watched if `watched`. */
static int
real_socket_permit(struct seg *s, int sv[2], bool watched)
{
	enum bs_reason why = REASON_MAX;
	struct stat st;
	int slot;

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	assert_int_equal(fstat(sv[0], &st), 0);
	slot = acq_why(s, 0, (uint64_t)st.st_ino, &why);
	assert_true(slot >= 0);
	if (watched)
		assert_true(slot_watch(s, (uint32_t)slot));
	return slot;
}

/* Slot (of sv[0]'s socket, from real_socket_permit) is held by the kernel
 * alone: its permit stays while the socket is open, as it could be in a
 * process the tables cannot name, and goes back once no file of it is
 * left. Closes both sockets. */
static void
kernel_keeps_it_until_closed(struct seg *s, int sv[2], int slot)
{
	assert_int_equal(atomic_load(&s->slots[slot].state), SLOT_KERNEL);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 1);
	reconcile_run(s, NULL);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 1);
	close(sv[0]);
	close(sv[1]);
	reconcile_run(s, NULL);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 0);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->reconciled), 1);
	assert_int_equal(atomic_load(&s->slots[slot].state), SLOT_FREE);
}

static void
test_pending_entries_of_a_fork_leave_the_room_admissions_need(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;
	int rec = proc_record(s), n = 0, slot, got[4];

	(void)state;
	/* Unconnected sockets shared by a fork, more than the table holds. */
	while ((slot = slot_claim_shared(s, rec, 5000 + (uint64_t)n)) >= 0) {
		/* Never one of the 3 + 1 slots the limits may need. */
		assert_true(slot >= 4);
		n++;
	}
	assert_int_equal(slot, -ENOSPC);
	assert_int_equal(n, 64 - 4);
	/* Every permit the limits allow is still admitted. */
	for (int i = 0; i < 3; i++) {
		got[i] = acq_why(s, 0, 100 + (uint64_t)i, &why);
		assert_true(got[i] >= 0);
	}
	got[3] = acq_why(s, 1, 200, &why);
	assert_true(got[3] >= 0);
	/* The next is refused by its compartment's limit, and said so: the
	 * table is full too, but that is not why. */
	assert_int_equal(acq_why(s, 0, 300, &why), -EBUSY);
	assert_int_equal(why, REASON_FULL);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->rejected_by[REASON_FULL]), 1);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->rejected_by[REASON_NO_SLOT]), 0);
	proc_detach_all(s);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 0);
	seg_close(s);
}

static void
test_a_compartment_nothing_bounds_leaves_pending_entries_half_the_table(void **state)
{
	struct seg *s;
	int rec, n = 0;

	(void)state;
	comps[0].enforce = false;	/* observe mode: every connect counted */
	s = attach();
	rec = proc_record(s);
	while (slot_claim_shared(s, rec, 5000 + (uint64_t)n) >= 0)
		n++;
	assert_int_equal(n, 32);
	proc_detach_all(s);
	seg_close(s);
}

static void
test_a_full_socket_table_is_no_slot(void **state)
{
	struct seg *s;
	enum bs_reason why = REASON_MAX;
	int n = 0;

	(void)state;
	comps[0].max_connections = 0;	/* nothing but the table bounds it */
	cfg.max_sockets = 4;
	s = attach();
	while (acq_why(s, 0, 100 + (uint64_t)n, &why) >= 0)
		n++;
	assert_int_equal(n, 4);
	assert_int_equal(why, REASON_NO_SLOT);
	assert_int_equal(atomic_load(stat_reason_count(seg_comp(s, 0), REASON_NO_SLOT, false)), 1);
	proc_detach_all(s);
	seg_close(s);
}

/* In a process of its own without a record: tries one permit and exits
 * with 0 if the process table refused it, 1 if it was admitted, 2 if
 * refused for another reason. */
static void
acquire_without_a_record(struct seg *s)
{
	enum bs_reason why = REASON_MAX;

	if (acq_why(s, 0, 777, &why) >= 0)
		_exit(1);
	_exit(why == REASON_PROCESS_TABLE_FULL ? 0 : 2);
}

static void
test_a_full_process_table_is_its_own_reason(void **state)
{
	struct seg *s;
	int st;
	pid_t pid;

	(void)state;
	cfg.max_processes = 1;
	s = attach();
	assert_true(acq_why(s, 0, 1, &(enum bs_reason){ REASON_MAX }) >= 0);
	pid = start_child(s, acquire_without_a_record);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_int_equal(atomic_load(stat_reason_count(seg_comp(s, 0), REASON_PROCESS_TABLE_FULL,
	    false)), 1);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->rejected_by[REASON_NO_SLOT]), 0);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 1);
	proc_detach_all(s);
	seg_close(s);
}

static void
test_a_watched_slot_keeps_its_permit_until_no_file_of_its_socket_is_left(void **state)
{
	struct seg *s = attach();
	int sv[2], slot = real_socket_permit(s, sv, true);

	(void)state;
	/* The last hold the tables know of goes: the permit stays. */
	slot_drop(s, (uint32_t)slot);
	kernel_keeps_it_until_closed(s, sv, slot);
	seg_close(s);
}

static void
test_a_watched_slot_dropped_by_a_killed_holder_stays_the_kernels(void **state)
{
	struct seg *s = attach();
	int sv[2], slot = real_socket_permit(s, sv, true);

	(void)state;
	/* Its holder killed between the drop of its last hold and the
	 * release: whoever finds it finishes the release, which keeps the
	 * permit for the kernel to decide. */
	atomic_store(&s->slots[slot].holders, 0);
	atomic_store(&s->slots[slot].holders_tag, 0);
	slot_release_orphan(s, (uint32_t)slot, 12345);
	kernel_keeps_it_until_closed(s, sv, slot);
	seg_close(s);
}

static void
test_a_fork_without_a_child_record_keeps_the_parents_permits(void **state)
{
	struct seg *s;
	struct proc_fork f;
	int sv[2], slot;

	(void)state;
	cfg.max_processes = 1;	/* the parent's record is the only one */
	s = attach();
	slot = real_socket_permit(s, sv, false);
	proc_gate_close(s);
	proc_fork_prepare(s, &f);
	assert_int_equal(f.rec, -1);
	/* No fork() here: the socket stands in for the child's copy. */
	proc_fork_parent(s, &f, 4242);
	assert_int_equal(atomic_load(&s->slots[slot].state), SLOT_WATCHED);
	slot_drop(s, (uint32_t)slot);
	kernel_keeps_it_until_closed(s, sv, slot);
	seg_close(s);
}

static void
test_a_spawn_watches_what_the_process_holds_inside_the_gate(void **state)
{
	struct seg *s = attach();
	int sv[2], slot = real_socket_permit(s, sv, false);

	(void)state;
	proc_spawn_prepare(s);
	/* The gate stays closed until the call that makes the child returns. */
	assert_int_equal(atomic_load(&s->forking), 1);
	assert_int_equal(atomic_load(&s->slots[slot].state), SLOT_WATCHED);
	/* No child here: the socket stands in for the child's copy. */
	proc_spawn_done(s);
	assert_int_equal(atomic_load(&s->forking), 0);
	slot_drop(s, (uint32_t)slot);
	kernel_keeps_it_until_closed(s, sv, slot);
	/* A slot taken after the child was made is an ordinary one. */
	slot = real_socket_permit(s, sv, false);
	assert_int_equal(atomic_load(&s->slots[slot].state), SLOT_USED);
	slot_drop(s, (uint32_t)slot);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 0);
	close(sv[0]);
	close(sv[1]);
	seg_close(s);
}

static void
test_a_watched_slot_can_be_held_again_until_its_last_drop(void **state)
{
	struct seg *s = attach();
	enum bs_reason why = REASON_MAX;
	int slot;

	(void)state;
	slot = acq_why(s, 0, 99, &why);
	assert_true(slot >= 0);
	assert_true(slot_watch(s, (uint32_t)slot));
	/* A copy (dup) and an exec'd image find it like any slot in use. */
	slot_hold(s, (uint32_t)slot);
	assert_int_equal(slot_find_inode(s, 99), slot);
	slot_drop(s, (uint32_t)slot);
	assert_int_equal(atomic_load(&s->slots[slot].state), SLOT_WATCHED);
	slot_drop(s, (uint32_t)slot);
	assert_int_equal(atomic_load(&s->slots[slot].state), SLOT_KERNEL);
	/* Gone from the tables' view: nobody finds it by inode any more, and
	 * a release by a reclaim does nothing to it. */
	assert_int_equal(slot_find_inode(s, 99), -1);
	slot_release_orphans(s, 12345);
	assert_int_equal(atomic_load(&s->slots[slot].state), SLOT_KERNEL);
	/* No socket of inode 99 exists: the kernel lists none. */
	reconcile_run(s, NULL);
	assert_int_equal(atomic_load(&s->slots[slot].state), SLOT_FREE);
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 0);
	seg_close(s);
}

static void
test_a_segment_nobody_has_a_record_of_keeps_what_the_kernel_holds(void **state)
{
	struct seg *s = attach();
	int sv[2], slot = real_socket_permit(s, sv, true);

	(void)state;
	slot_drop(s, (uint32_t)slot);
	proc_detach_all(s);
	seg_close(s);
	/* No process has a record, yet a copy of the socket may be open in
	 * one the tables cannot name: the next attach resets nothing. */
	s = attach();
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 1);
	seg_close(s);
	close(sv[0]);
	close(sv[1]);
	s = attach();
	assert_int_equal(atomic_load(&seg_comp(s, 0)->in_use), 0);
	assert_int_equal(atomic_load(&s->slots[slot].state), SLOT_FREE);
	seg_close(s);
}

static void
test_the_table_advice_doubles_up_to_the_maximum(void **state)
{
	(void)state;
	assert_int_equal(seg_table_grown(2, BS_MAX_PROCESSES), 4);
	assert_int_equal(seg_table_grown(40000, BS_MAX_PROCESSES), BS_MAX_PROCESSES);
	assert_int_equal(seg_table_grown(BS_MAX_SOCKETS, BS_MAX_SOCKETS), BS_MAX_SOCKETS);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(
		    test_pending_entries_of_a_fork_leave_the_room_admissions_need, setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_a_compartment_nothing_bounds_leaves_pending_entries_half_the_table, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(test_a_full_socket_table_is_no_slot, setup, teardown),
		cmocka_unit_test_setup_teardown(test_a_full_process_table_is_its_own_reason, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(
		    test_a_watched_slot_keeps_its_permit_until_no_file_of_its_socket_is_left, setup,
		    teardown),
		cmocka_unit_test_setup_teardown(
		    test_a_watched_slot_dropped_by_a_killed_holder_stays_the_kernels, setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_a_fork_without_a_child_record_keeps_the_parents_permits, setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_a_spawn_watches_what_the_process_holds_inside_the_gate, setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_a_watched_slot_can_be_held_again_until_its_last_drop, setup, teardown),
		cmocka_unit_test_setup_teardown(
		    test_a_segment_nobody_has_a_record_of_keeps_what_the_kernel_holds, setup,
		    teardown),
		cmocka_unit_test(test_the_table_advice_doubles_up_to_the_maximum),
	};

	return cmocka_run_group_tests_name("tables", tests, NULL, NULL);
}

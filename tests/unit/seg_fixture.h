/* seg_fixture.h - what the segment unit tests share: a config of their own, teardown, attach. */
#ifndef BULKSHIM_SEG_FIXTURE_H
#define BULKSHIM_SEG_FIXTURE_H

#include <signal.h>
#include <sys/wait.h>

/* The compartment that slot i stands in, as admission looks it up. */
static inline struct seg_comp *
slot_comp_of(const struct seg *s, uint32_t i)
{
	return seg_slot_comp(s, &s->slots[i]);
}

/* Each test's setup fills cfg, naming a fresh segment with counter. */
static struct bs_config cfg;
static char err[BS_ERRLEN];
static int counter;

/* Fills cfg with n compartments and a fresh segment named prefix<pid>_<n>:
 * class "default" only, mode 0600, 16 processes, 64 sockets. */
static inline void
fixture_config(const char *prefix, struct cfg_compartment *comps, size_t n)
{
	memset(&cfg, 0, sizeof(cfg));
	snprintf(cfg.segment, sizeof(cfg.segment), "%s%d_%d", prefix, (int)getpid(), counter++);
	snprintf(cfg.path, sizeof(cfg.path), "unit.cfg");
	snprintf(cfg.classes[0].name, sizeof(cfg.classes[0].name), "default");
	cfg.nclass = 1;
	cfg.comp = comps;
	cfg.ncomp = n;
	cfg.mode = 0600;
	cfg.max_processes = 16;
	cfg.max_sockets = 64;
}

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

/* Forks a child that runs as a forked process of this one (with no
 * record of its own) and calls work(s) forever; returns once it runs. */
static __attribute__((unused)) pid_t
start_child(struct seg *s, void (*work)(struct seg *))
{
	int go[2];
	char c;
	pid_t pid;

	assert_int_equal(pipe(go), 0);
	pid = fork();
	if (pid == 0) {
		struct proc_fork none = { -1, 0, -1 };

		proc_fork_child(s, &none);
		if (write(go[1], "x", 1) != 1)
			_exit(2);
		work(s);
		_exit(0);
	}
	assert_int_equal(read(go[0], &c, 1), 1);
	close(go[0]);
	close(go[1]);
	return pid;
}

/* A thread that drops a slot of wait_seg 50 ms after it starts (arg: the
 * slot), to wake a waiter. */
static struct seg *wait_seg;

static __attribute__((unused)) void *
late_release(void *arg)
{
	usleep(50000);
	slot_drop(wait_seg, (uint32_t)(uintptr_t)arg);
	return NULL;
}

/* SIGKILLs pid, reaps it and takes back what it held. */
static __attribute__((unused)) void
kill_and_reclaim(struct seg *s, pid_t pid)
{
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	proc_reclaim(s, false);
}

#endif

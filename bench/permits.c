/* permits.c - acquire/release throughput of one compartment, calling the segment code directly. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "admit/admit.h"
#include "log.h"
#include "sys.h"

/*
 * usage: permits CONFIG threads N MS
 *        permits CONFIG procs N MS
 *
 * Attaches to the segment CONFIG names, exactly as the shim does, and has
 * N threads of one process (or N processes, each attached on its own) take
 * and give back a permit of the first compartment in a loop for MS
 * milliseconds: permit_acquire then slot_drop, the pair a counted connect and
 * its close cost once the socket is known, without the system calls and
 * the descriptor table around them. Prints "pairs_per_s=... ns_per_pair=...
 * refused=..."; ns_per_pair is wall time divided by all pairs of all
 * workers, so it is the cost the compartment's cache line imposes when the
 * workers contend for it.
 */

struct worker {
	pthread_t tid;
	struct seg *s;
	uint32_t comp;
	uint64_t ino;
	uint64_t start_ns, end_ns;
	long pairs, refused;
};

static uint64_t
mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *
loop(void *arg)
{
	struct worker *w = arg;

	while (mono_ns() < w->start_ns)
		;
	while (mono_ns() < w->end_ns) {
		for (int i = 0; i < 64; i++) {
			enum bs_reason why = REASON_MAX;
			int slot = permit_acquire(w->s, seg_comp(w->s, w->comp), 0, w->ino, false, &why);

			if (slot < 0) {
				w->refused++;
				continue;
			}
			slot_drop(w->s, (uint32_t)slot);
			w->pairs++;
		}
	}
	return NULL;
}

/* Loads the config and attaches its segment; exits on failure. */
static struct seg *
attach(const char *path, struct bs_config *cfg, uint32_t *comp)
{
	char err[BS_ERRLEN];
	struct seg *s;
	int c;

	if (cfg_load(path, cfg, false, err, sizeof(err)) < 0) {
		fprintf(stderr, "permits: %s\n", err);
		exit(1);
	}
	if (seg_attach(cfg, &s, err, sizeof(err)) < 0) {
		fprintf(stderr, "permits: %s\n", err);
		exit(1);
	}
	c = seg_comp_index(s, 0);
	if (c < 0) {
		fprintf(stderr, "permits: no compartment in %s\n", path);
		exit(1);
	}
	*comp = (uint32_t)c;
	return s;
}

static void
print(long pairs, long refused, uint64_t ns)
{
	double secs = (double)ns / 1e9;

	printf("pairs_per_s=%.0f ns_per_pair=%.1f refused=%ld\n", (double)pairs / secs,
	    pairs > 0 ? (double)ns / (double)pairs : 0.0, refused);
}

static int
run_threads(const char *path, int n, long ms)
{
	struct bs_config cfg;
	struct worker *w = calloc((size_t)n, sizeof(*w));
	uint32_t comp;
	struct seg *s = attach(path, &cfg, &comp);
	uint64_t start = mono_ns() + 20000000u, end = start + (uint64_t)ms * 1000000u;
	long pairs = 0, refused = 0;

	if (w == NULL)
		return 1;
	for (int i = 0; i < n; i++) {
		w[i] = (struct worker){ .s = s, .comp = comp, .ino = 1000u + (uint64_t)i,
		    .start_ns = start, .end_ns = end };
		if (pthread_create(&w[i].tid, NULL, loop, &w[i]) != 0)
			return 1;
	}
	for (int i = 0; i < n; i++) {
		pthread_join(w[i].tid, NULL);
		pairs += w[i].pairs;
		refused += w[i].refused;
	}
	print(pairs, refused, end - start);
	proc_detach_all(s);
	seg_close(s);
	cfg_free(&cfg);
	free(w);
	return 0;
}

/* Each process attaches on its own (as separate programs would), waits for
 * a common start time and reports its pairs through a pipe. */
static int
run_procs(const char *path, int n, long ms)
{
	uint64_t start = mono_ns() + 200000000u, end = start + (uint64_t)ms * 1000000u;
	long pairs = 0, refused = 0, got[2];
	int p[2], status;

	if (pipe(p) < 0)
		return 1;
	for (int i = 0; i < n; i++) {
		pid_t pid = fork();

		if (pid < 0)
			return 1;
		if (pid == 0) {
			struct bs_config cfg;
			uint32_t comp;
			struct seg *s = attach(path, &cfg, &comp);
			struct worker w = { .s = s, .comp = comp, .ino = 2000u + (uint64_t)i,
			    .start_ns = start, .end_ns = end };

			close(p[0]);
			loop(&w);
			got[0] = w.pairs;
			got[1] = w.refused;
			if (write(p[1], got, sizeof(got)) != (ssize_t)sizeof(got))
				_exit(1);
			proc_detach_all(s);
			_exit(0);
		}
	}
	close(p[1]);
	for (int i = 0; i < n; i++) {
		if (read(p[0], got, sizeof(got)) != (ssize_t)sizeof(got))
			return 1;
		pairs += got[0];
		refused += got[1];
	}
	while (wait(&status) > 0)
		;
	print(pairs, refused, end - start);
	return 0;
}

int
main(int argc, char **argv)
{
	int n;
	long ms;

	if (argc != 5 || (n = atoi(argv[3])) < 1 || n > 1024 || (ms = atol(argv[4])) < 1) {
		fprintf(stderr, "usage: permits CONFIG threads|procs N MS\n");
		return 2;
	}
	log_set_level("error");
	if (strcmp(argv[2], "threads") == 0)
		return run_threads(argv[1], n, ms);
	if (strcmp(argv[2], "procs") == 0)
		return run_procs(argv[1], n, ms);
	fprintf(stderr, "usage: permits CONFIG threads|procs N MS\n");
	return 2;
}

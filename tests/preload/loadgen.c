/* loadgen.c - the bench's closed-loop load (see loadgen.h), shared by its C clients. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loadgen.h"

struct rec {
	double t, ms;
	const char *what;
};

struct worker {
	pthread_t th;
	struct rec *r;
	size_t n, cap;
};

static double start_s, end_s, pause_ms;
static const char *(*request)(void);

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *
run(void *arg)
{
	struct worker *w = arg;

	while (now_s() < end_s) {
		double t0 = now_s(), t1;
		const char *what = request();

		t1 = now_s();
		if (w->n == w->cap) {
			w->cap = w->cap ? 2 * w->cap : 1024;
			w->r = realloc(w->r, w->cap * sizeof(*w->r));
			if (w->r == NULL)
				abort();
		}
		w->r[w->n++] = (struct rec){ t1 - start_s, (t1 - t0) * 1000, what };
		if (strcmp(what, "ok") != 0) {
			struct timespec ts = { 0, (long)(pause_ms * 1e6) };

			nanosleep(&ts, NULL);
		}
	}
	return NULL;
}

static int
by_time(const void *a, const void *b)
{
	const struct rec *x = a, *y = b;

	return x->t < y->t ? -1 : x->t > y->t;
}

int
loadgen_run(int threads, double seconds, double pause, const char *(*one)(void))
{
	struct worker *ws = calloc((size_t)threads, sizeof(*ws));
	struct rec *all;
	size_t total = 0, k = 0;

	if (ws == NULL)
		return 1;
	request = one;
	pause_ms = pause;
	start_s = now_s();
	end_s = start_s + seconds;
	for (int i = 0; i < threads; i++)
		if (pthread_create(&ws[i].th, NULL, run, &ws[i]) != 0)
			return 1;
	for (int i = 0; i < threads; i++) {
		pthread_join(ws[i].th, NULL);
		total += ws[i].n;
	}
	all = malloc((total + 1) * sizeof(*all));
	if (all == NULL)
		abort();
	for (int i = 0; i < threads; i++)
		for (size_t j = 0; j < ws[i].n; j++)
			all[k++] = ws[i].r[j];
	qsort(all, total, sizeof(*all), by_time);
	putchar('[');
	for (size_t i = 0; i < total; i++)
		printf("%s[%.4f, \"%s\", %.2f]", i ? ", " : "", all[i].t, all[i].what, all[i].ms);
	puts("]");
	return 0;
}

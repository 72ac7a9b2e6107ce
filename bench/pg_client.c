/* pg_client.c - the PostgreSQL row's client for `make bench-adaptive`: a thread per query, one connection per query. */
#include <libpq-fe.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/*
 * usage: pg_client CONNINFO QUERY THREADS SECONDS [PAUSE_MS]
 *
 * Each thread connects, runs QUERY, disconnects, and starts again until
 * SECONDS have passed. A connection per query makes the shim's connection
 * limit a limit of queries in flight: the connection's life is the
 * request, which is what an adaptive limit without max_inflight measures.
 * A connection the shim refuses fails in connect() with ECONNREFUSED,
 * which libpq reports as "Connection refused"; that thread then pauses
 * PAUSE_MS (default 50) as legacy_client does. Output: the same JSON list
 * as legacy_client, [end time s, outcome, latency ms] sorted by time, with
 * outcome "ok", "refused", "connect" or "query".
 */

struct rec {
	double t, ms;
	const char *what;
};

struct worker {
	pthread_t th;
	struct rec *r;
	size_t n, cap;
};

static const char *conninfo, *query;
static double start_s, end_s, pause_ms = 50;

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One query on a new connection; its outcome. */
static const char *
one(void)
{
	PGconn *c = PQconnectdb(conninfo);
	const char *what = "ok";
	PGresult *r;

	if (PQstatus(c) != CONNECTION_OK) {
		what = strstr(PQerrorMessage(c), "refused") ? "refused" : "connect";
		PQfinish(c);
		return what;
	}
	r = PQexec(c, query);
	if (PQresultStatus(r) != PGRES_TUPLES_OK)
		what = "query";
	PQclear(r);
	PQfinish(c);
	return what;
}

static void *
run(void *arg)
{
	struct worker *w = arg;

	while (now_s() < end_s) {
		double t0 = now_s(), t1;
		const char *what = one();

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
main(int argc, char **argv)
{
	struct worker *ws;
	struct rec *all;
	size_t total = 0, k = 0;
	int threads;

	if (argc < 5) {
		fprintf(stderr, "usage: pg_client CONNINFO QUERY THREADS SECONDS [PAUSE_MS]\n");
		return 2;
	}
	conninfo = argv[1];
	query = argv[2];
	threads = atoi(argv[3]);
	if (argc > 5)
		pause_ms = atof(argv[5]);
	if (threads < 1 || threads > 1024)
		return 2;
	ws = calloc((size_t)threads, sizeof(*ws));
	if (ws == NULL)
		return 1;
	start_s = now_s();
	end_s = start_s + atof(argv[4]);
	for (int i = 0; i < threads; i++)
		if (pthread_create(&ws[i].th, NULL, run, &ws[i]) != 0)
			return 1;
	for (int i = 0; i < threads; i++) {
		pthread_join(ws[i].th, NULL);
		total += ws[i].n;
	}
	all = malloc((total + 1) * sizeof(*all));
	if (all == NULL)
		return 1;
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

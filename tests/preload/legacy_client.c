/* legacy_client.c - legacy_client.py in C, for `make bench-adaptive`: a thread per request, no timeouts. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/*
 * usage: legacy_client PORT THREADS SECONDS [PAUSE_MS]
 *
 * The same client as legacy_client.py (see there), with the same output
 * (one JSON list of [end time s, outcome, latency ms]), but without an
 * interpreter in every latency: the Python client adds a few ms to each
 * request, which the benchmark's p99 comparisons should not carry. It knows
 * nothing of the shim; run it under it.
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

static int port;
static double start_s, end_s, pause_ms = 50;

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One request on a new connection; its outcome. */
static const char *
one(void)
{
	static const char req[] = "GET / HTTP/1.0\r\nHost: backend\r\n\r\n";
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	char buf[4096], head[16] = "";
	size_t got = 0;
	ssize_t k;
	const char *what = "ok";
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return "socket";
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		what = errno == ECONNREFUSED ? "refused" : "connect";
		goto done;
	}
	if (send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) != (ssize_t)sizeof(req) - 1) {
		what = errno == ECONNREFUSED ? "refused" : "send";
		goto done;
	}
	while ((k = recv(fd, buf, sizeof(buf), 0)) > 0) {
		if (got < sizeof(head) - 1) {
			size_t m = (size_t)k < sizeof(head) - 1 - got ? (size_t)k : sizeof(head) - 1 - got;

			memcpy(head + got, buf, m);
			got += m;
		}
	}
	if (k < 0)
		what = errno == ECONNREFUSED ? "refused" : "recv";
	else if (strncmp(head, "HTTP/1.0 200", 12) != 0)
		what = "bad";
done:
	close(fd);
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

	if (argc < 4)
		return 2;
	port = atoi(argv[1]);
	threads = atoi(argv[2]);
	if (argc > 4)
		pause_ms = atof(argv[4]);
	if (threads < 1 || threads > 4096)
		return 2;
	ws = calloc((size_t)threads, sizeof(*ws));
	start_s = now_s();
	end_s = start_s + atof(argv[3]);
	for (int i = 0; i < threads; i++)
		if (pthread_create(&ws[i].th, NULL, run, &ws[i]) != 0)
			return 1;
	for (int i = 0; i < threads; i++) {
		pthread_join(ws[i].th, NULL);
		total += ws[i].n;
	}
	all = malloc((total + 1) * sizeof(*all));
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

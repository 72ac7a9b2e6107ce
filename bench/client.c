/* client.c - the measured program of `make bench`, run with and without the shim preloaded. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* Callgrind runs the client with --instr-atstart=no: start-up (where the
 * shim may parse thousands of rules) runs uninstrumented and the loops
 * switch instrumentation on. Natively the request is a few instructions. */
#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#endif
#endif
#ifndef CALLGRIND_START_INSTRUMENTATION
#define CALLGRIND_START_INSTRUMENTATION do { } while (0)
#endif

/*
 * usage: client connect  PORT|PATH BATCHES PER_BATCH
 *        client pingpong PORT BATCHES PER_BATCH SIZE
 *        client threads  PORT NTHREADS MS
 *        client syscalls BATCHES PER_BATCH
 *
 * Every mode times only its loop (never start-up, where the shim loads its
 * configuration) and prints one line of key=value pairs:
 *   connect  - socket + connect + close (a reset: see bench_connect_close)
 *              to 127.0.0.1:PORT, or to the unix socket PATH (one that
 *              begins with /), BATCHES batches;
 *              min_ns is the fastest batch's time per iteration;
 *   pingpong - one connection, then SIZE bytes out and SIZE bytes back per
 *              iteration; min_ns as above, per round trip;
 *   threads  - NTHREADS threads loop connect + close for MS milliseconds;
 *              ops_per_s counts them all;
 *   syscalls - what one getpid, fstat, getsockopt and clock_gettime cost
 *              here, to read the other figures against.
 * The measured calls sit in functions of their own (bench_connect_close,
 * bench_send, bench_recv) so that callgrind can report their inclusive
 * cost per call. The program is linked with -z now: no lazy binding
 * lands inside them.
 */

int bench_connect_close(const struct sockaddr *to, socklen_t len);
ssize_t bench_send(int fd, const char *buf, size_t n);
ssize_t bench_recv(int fd, char *buf, size_t n);

static struct sockaddr_in dst;
/* What connect mode connects to: dst, or a unix socket's path. */
static struct sockaddr_storage target;
static socklen_t target_len;
static long errors;

static double
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* The close is a reset (SO_LINGER 0): a normal close leaves the client's
 * side in TIME_WAIT for a minute, and tens of thousands of those slow the
 * kernel's search for a free ephemeral port until later runs are slower
 * than earlier ones whatever is preloaded. The shim does not wrap
 * setsockopt, so both sides pay the same for it. */
__attribute__((noinline)) int
bench_connect_close(const struct sockaddr *to, socklen_t len)
{
	struct linger lg = { .l_onoff = 1, .l_linger = 0 };
	int fd = socket(to->sa_family, SOCK_STREAM, 0), r;

	if (fd < 0)
		return -1;
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	r = connect(fd, to, len);
	close(fd);
	return r;
}

/* One send, as the program under test would make it. */
__attribute__((noinline)) ssize_t
bench_send(int fd, const char *buf, size_t n)
{
	return send(fd, buf, n, 0);
}

/* Receives exactly n bytes (one call unless the kernel splits them). */
__attribute__((noinline)) ssize_t
bench_recv(int fd, char *buf, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = recv(fd, buf + got, n - got, 0);

		if (r <= 0)
			return -1;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

static void
report(long batches, long per, double min_batch, double total)
{
	printf("min_ns=%.1f mean_ns=%.1f ops=%ld errors=%ld\n", min_batch / (double)per,
	    total / (double)(batches * per), batches * per, errors);
}

static int
run_connect(long batches, long per)
{
	double min = 1e30, total = 0;

	CALLGRIND_START_INSTRUMENTATION;
	for (long b = 0; b < batches; b++) {
		double t0 = now_ns(), t;

		for (long i = 0; i < per; i++) {
			if (bench_connect_close((const struct sockaddr *)&target, target_len) < 0)
				errors++;
		}
		t = now_ns() - t0;
		total += t;
		if (t < min)
			min = t;
	}
	report(batches, per, min, total);
	return errors == 0 ? 0 : 1;
}

static int
run_pingpong(long batches, long per, size_t size)
{
	char out[4096], in[4096];
	double min = 1e30, total = 0;
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

	if (size == 0 || size > sizeof(out) || fd < 0)
		return 2;
	memset(out, 'x', sizeof(out));
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (connect(fd, (const struct sockaddr *)&dst, sizeof(dst)) < 0) {
		perror("client: connect");
		return 1;
	}
	CALLGRIND_START_INSTRUMENTATION;
	for (long b = 0; b < batches; b++) {
		double t0 = now_ns(), t;

		for (long i = 0; i < per; i++) {
			if (bench_send(fd, out, size) != (ssize_t)size ||
			    bench_recv(fd, in, size) != (ssize_t)size) {
				perror("client: ping-pong");
				return 1;
			}
		}
		t = now_ns() - t0;
		total += t;
		if (t < min)
			min = t;
	}
	close(fd);
	report(batches, per, min, total);
	return 0;
}

struct worker {
	pthread_t tid;
	double deadline;
	long ops, errs;
};

static void *
connect_worker(void *arg)
{
	struct worker *w = arg;

	while (now_ns() < w->deadline) {
		for (int i = 0; i < 16; i++) {
			if (bench_connect_close((const struct sockaddr *)&dst, sizeof(dst)) < 0)
				w->errs++;
			else
				w->ops++;
		}
	}
	return NULL;
}

static int
run_threads(int n, long ms)
{
	struct worker *w = calloc((size_t)n, sizeof(*w));
	double t0 = now_ns(), t;
	long ops = 0;

	if (w == NULL || n < 1)
		return 2;
	for (int i = 0; i < n; i++) {
		w[i].deadline = t0 + (double)ms * 1e6;
		if (pthread_create(&w[i].tid, NULL, connect_worker, &w[i]) != 0)
			return 1;
	}
	for (int i = 0; i < n; i++) {
		pthread_join(w[i].tid, NULL);
		ops += w[i].ops;
		errors += w[i].errs;
	}
	t = now_ns() - t0;
	printf("ops_per_s=%.0f ops=%ld errors=%ld\n", (double)ops / (t / 1e9), ops, errors);
	free(w);
	return 0;
}

/* Times `per` calls of one system call, best of `batches`, in ns per call. */
#define TIME_CALL(label, call) do {					\
	double best_ = 1e30;						\
	for (long b_ = 0; b_ < batches; b_++) {				\
		double t0_ = now_ns();					\
		for (long i_ = 0; i_ < per; i_++)			\
			(void)(call);					\
		if (now_ns() - t0_ < best_)				\
			best_ = now_ns() - t0_;				\
	}								\
	printf("%s=%.1f ", label, best_ / (double)per);			\
} while (0)

static int
run_syscalls(long batches, long per)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0), type;
	socklen_t tlen = sizeof(type);
	struct timespec ts;
	struct stat st;

	if (fd < 0)
		return 1;
	TIME_CALL("getpid_ns", syscall(SYS_getpid));
	TIME_CALL("fstat_ns", fstat(fd, &st));
	TIME_CALL("getsockopt_ns", getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen));
	TIME_CALL("clock_gettime_ns", clock_gettime(CLOCK_MONOTONIC, &ts));
	printf("\n");
	close(fd);
	return 0;
}

static void
usage(void)
{
	fprintf(stderr, "usage: client connect PORT|PATH BATCHES PER_BATCH\n"
	    "       client pingpong PORT BATCHES PER_BATCH SIZE\n"
	    "       client threads PORT NTHREADS MS\n"
	    "       client syscalls BATCHES PER_BATCH\n");
	exit(2);
}

int
main(int argc, char **argv)
{
	long a, b;

	if (argc < 4)
		usage();
	if (strcmp(argv[1], "syscalls") == 0)
		return run_syscalls(atol(argv[2]), atol(argv[3]));
	if (argc < 5)
		usage();
	memset(&dst, 0, sizeof(dst));
	dst.sin_family = AF_INET;
	dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	dst.sin_port = htons((uint16_t)atoi(argv[2]));
	memcpy(&target, &dst, sizeof(dst));
	target_len = sizeof(dst);
	if (argv[2][0] == '/') {
		struct sockaddr_un *un = (struct sockaddr_un *)&target;

		if (strlen(argv[2]) >= sizeof(un->sun_path))
			usage();
		memset(&target, 0, sizeof(target));
		un->sun_family = AF_UNIX;
		strcpy(un->sun_path, argv[2]);
		target_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) +
		    strlen(argv[2]) + 1);
	}
	a = atol(argv[3]);
	b = atol(argv[4]);
	if (a < 1 || b < 1)
		usage();
	if (strcmp(argv[1], "connect") == 0)
		return run_connect(a, b);
	if (strcmp(argv[1], "pingpong") == 0 && argc == 6)
		return run_pingpong(a, b, (size_t)atol(argv[5]));
	if (strcmp(argv[1], "threads") == 0)
		return run_threads((int)a, b);
	usage();
	return 2;
}

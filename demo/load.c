/* load.c - the demo's open-loop load generator: fixed rates, a client timeout, a CSV row per request. */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "demo.h"

/*
 * Open loop: requests start on a fixed schedule whether or not earlier ones
 * have been answered, the way users keep arriving at a site that has stopped
 * answering. Closed-loop clients would slow down with the server and hide the
 * very queueing the demo is about. One thread, non-blocking sockets, epoll.
 *
 * Each request is a new connection carrying "GET PATH HTTP/1.0"; the answer
 * is read until the server closes. Outcomes:
 *   ok        200 with real content ("recs ..." for /home, "paid" for /checkout)
 *   fallback  200 from /home with the cached "fallback ..." list
 *   failed    any other status, or a connection error
 *   timeout   no complete answer within the client timeout
 * Latency runs from the moment the request started (its socket() call) to its
 * outcome, so a timeout's latency is the timeout.
 */

#define MAX_REQUESTS	1000000
#define HEAD_MAX	256	/* bytes of an answer kept for classifying it */
#define NONE		UINT32_MAX

enum path { PATH_HOME, PATH_CHECKOUT };
enum outcome { OUT_PENDING, OUT_OK, OUT_FALLBACK, OUT_FAILED, OUT_TIMEOUT };
enum state { ST_CONNECTING, ST_READING };

static const char *const path_names[] = { "home", "checkout" };
static const char *const outcome_names[] = { "pending", "ok", "fallback", "failed", "timeout" };

struct req {
	uint64_t start_ns, end_ns;
	uint32_t prev, next;	/* the in-flight list, oldest first */
	int fd;
	int err;		/* errno of a failed request */
	short status;		/* HTTP status, 0 if none */
	unsigned char path, outcome, state;
};

/* What has been read on a descriptor; indexed by fd. */
struct conn {
	uint32_t req;
	uint32_t got;
	char head[HEAD_MAX];
};

static const char usage_text[] =
    "usage: load -t ADDR:PORT [-r HOME_RATE] [-c CHECKOUT_RATE] [-d SECONDS]\n"
    "            [-T TIMEOUT_S] [-o CSV] [-z T0FILE]\n"
    "  -t, --target A:P         the shop\n"
    "  -r, --home-rate R        requests per second on /home (default 100)\n"
    "  -c, --checkout-rate R    requests per second on /checkout (default 20)\n"
    "  -d, --duration S         seconds during which requests start (default 20)\n"
    "  -T, --timeout S          client timeout of each request (default 10)\n"
    "  -o, --output FILE        CSV of every request (default standard output):\n"
    "                           start_ms,path,latency_ms,outcome,detail\n"
    "  -z, --t0-file FILE       write the wall-clock start (ms since the epoch) to FILE\n";

static struct req *reqs;
static struct conn *conns;
static size_t nconns;
static uint32_t head_req = NONE, tail_req = NONE;	/* in-flight list */
static size_t inflight;
static struct sockaddr_in target;
static int ep;

static uint64_t
mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double
parse_num(const char *text, const char *what, double max)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(text, &end);
	if (errno != 0 || *end != '\0' || end == text || !(v >= 0 && v <= max)) {
		fprintf(stderr, "load: %s must be a number from 0 to %g\n", what, max);
		exit(2);
	}
	return v;
}

static const char *
errno_name(int e)
{
	static char buf[32];

	switch (e) {
	case ECONNREFUSED: return "ECONNREFUSED";
	case ECONNRESET: return "ECONNRESET";
	case EPIPE: return "EPIPE";
	case ETIMEDOUT: return "ETIMEDOUT";
	case EMFILE: return "EMFILE";
	case ENFILE: return "ENFILE";
	case EADDRNOTAVAIL: return "EADDRNOTAVAIL";
	case EPROTO: return "EPROTO";
	default:
		snprintf(buf, sizeof(buf), "errno%d", e);
		return buf;
	}
}

static void
list_remove(uint32_t i)
{
	struct req *r = &reqs[i];

	if (r->prev != NONE)
		reqs[r->prev].next = r->next;
	else
		head_req = r->next;
	if (r->next != NONE)
		reqs[r->next].prev = r->prev;
	else
		tail_req = r->prev;
	inflight--;
}

static void
list_append(uint32_t i)
{
	reqs[i].prev = tail_req;
	reqs[i].next = NONE;
	if (tail_req != NONE)
		reqs[tail_req].next = i;
	else
		head_req = i;
	tail_req = i;
	inflight++;
}

/* Ends request i with an outcome and closes its connection. */
static void
finish(uint32_t i, int outcome, int err, uint64_t now)
{
	struct req *r = &reqs[i];

	r->outcome = (unsigned char)outcome;
	r->err = err;
	r->end_ns = now;
	if (r->fd >= 0) {
		close(r->fd);	/* also takes it out of the epoll set */
		r->fd = -1;
	}
	list_remove(i);
}

/* Classifies a complete answer. */
static void
classify(uint32_t i, const struct conn *c, uint64_t now)
{
	struct req *r = &reqs[i];
	const char *body;
	int status = 0;

	if (sscanf(c->head, "HTTP/%*d.%*d %d", &status) != 1) {
		finish(i, OUT_FAILED, EPROTO, now);
		return;
	}
	r->status = (short)status;
	body = strstr(c->head, "\r\n\r\n");
	body = body != NULL ? body + 4 : "";
	if (status != 200)
		finish(i, OUT_FAILED, 0, now);
	else if (r->path == PATH_HOME && strncmp(body, "recs", 4) == 0)
		finish(i, OUT_OK, 0, now);
	else if (r->path == PATH_HOME && strncmp(body, "fallback", 8) == 0)
		finish(i, OUT_FALLBACK, 0, now);
	else if (r->path == PATH_CHECKOUT && strncmp(body, "paid", 4) == 0)
		finish(i, OUT_OK, 0, now);
	else
		finish(i, OUT_FAILED, EPROTO, now);
}

static int
send_request(uint32_t i)
{
	char line[64];
	int len = snprintf(line, sizeof(line), "GET /%s HTTP/1.0\r\nHost: shop\r\n\r\n",
	    path_names[reqs[i].path]);
	ssize_t n = send(reqs[i].fd, line, (size_t)len, MSG_NOSIGNAL);

	if (n < 0)
		return -errno;
	/* 40 bytes into an empty socket buffer go out whole. */
	return n == len ? 0 : -EPROTO;
}

static void
start(uint32_t i, int path)
{
	struct req *r = &reqs[i];
	struct epoll_event ev;
	int fd, e;

	r->start_ns = mono_ns();
	r->path = (unsigned char)path;
	r->fd = -1;
	list_append(i);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		finish(i, OUT_FAILED, errno, mono_ns());
		return;
	}
	r->fd = fd;
	if ((size_t)fd >= nconns) {
		finish(i, OUT_FAILED, EMFILE, mono_ns());
		return;
	}
	conns[fd].req = i;
	conns[fd].got = 0;
	r->state = ST_CONNECTING;
	if (connect(fd, (struct sockaddr *)&target, sizeof(target)) < 0 && errno != EINPROGRESS) {
		finish(i, OUT_FAILED, errno, mono_ns());
		return;
	}
	ev.events = EPOLLOUT | EPOLLIN | EPOLLRDHUP;
	ev.data.u32 = i;
	if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
		e = errno;
		finish(i, OUT_FAILED, e, mono_ns());
	}
}

static void
on_event(uint32_t i, uint32_t events)
{
	struct req *r = &reqs[i];
	struct conn *c;
	struct epoll_event ev;
	char sink[4096];
	socklen_t len = sizeof(int);
	ssize_t n;
	int err = 0;

	if (r->outcome != OUT_PENDING || r->fd < 0)
		return;
	c = &conns[r->fd];
	if (r->state == ST_CONNECTING) {
		if (getsockopt(r->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
			err = errno;
		if (err == 0 && !(events & EPOLLOUT))
			return;
		if (err != 0) {
			finish(i, OUT_FAILED, err, mono_ns());
			return;
		}
		err = send_request(i);
		if (err < 0) {
			finish(i, OUT_FAILED, -err, mono_ns());
			return;
		}
		r->state = ST_READING;
		ev.events = EPOLLIN | EPOLLRDHUP;
		ev.data.u32 = i;
		epoll_ctl(ep, EPOLL_CTL_MOD, r->fd, &ev);
		return;
	}
	for (;;) {
		if (c->got < HEAD_MAX - 1)
			n = recv(r->fd, c->head + c->got, HEAD_MAX - 1 - c->got, 0);
		else
			n = recv(r->fd, sink, sizeof(sink), 0);
		if (n > 0) {
			if (c->got < HEAD_MAX - 1)
				c->got += (uint32_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (n < 0) {
			finish(i, OUT_FAILED, errno, mono_ns());
			return;
		}
		c->head[c->got] = '\0';
		classify(i, c, mono_ns());
		return;
	}
}

static int
write_csv(FILE *f, uint32_t n, uint64_t t0)
{
	fputs("start_ms,path,latency_ms,outcome,detail\n", f);
	for (uint32_t i = 0; i < n; i++) {
		const struct req *r = &reqs[i];
		char detail[32];

		if (r->outcome == OUT_TIMEOUT)
			snprintf(detail, sizeof(detail), "timeout");
		else if (r->err != 0)
			snprintf(detail, sizeof(detail), "%s", errno_name(r->err));
		else
			snprintf(detail, sizeof(detail), "%d", r->status);
		fprintf(f, "%.3f,%s,%.3f,%s,%s\n", (double)(r->start_ns - t0) / 1e6,
		    path_names[r->path], (double)(r->end_ns - r->start_ns) / 1e6,
		    outcome_names[r->outcome], detail);
	}
	return fflush(f) == 0 && !ferror(f) ? 0 : -1;
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "target", required_argument, NULL, 't' },
		{ "home-rate", required_argument, NULL, 'r' },
		{ "checkout-rate", required_argument, NULL, 'c' },
		{ "duration", required_argument, NULL, 'd' },
		{ "timeout", required_argument, NULL, 'T' },
		{ "output", required_argument, NULL, 'o' },
		{ "t0-file", required_argument, NULL, 'z' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *target_at = NULL, *output = NULL, *t0_file = NULL;
	double home_rate = 100, checkout_rate = 20, duration = 20, timeout_s = 10;
	uint64_t n_home, n_checkout, t0, now, next_home, next_checkout, timeout_ns;
	uint64_t max_lag = 0, i_home = 0, i_checkout = 0;
	struct epoll_event evs[256];
	struct timespec wall;
	struct rlimit rl;
	uint32_t n = 0;
	FILE *f;
	int c, wait_ms;

	while ((c = getopt_long(argc, argv, "t:r:c:d:T:o:z:h", longopts, NULL)) != -1) {
		switch (c) {
		case 't':
			target_at = optarg;
			break;
		case 'r':
			home_rate = parse_num(optarg, "--home-rate", 100000);
			break;
		case 'c':
			checkout_rate = parse_num(optarg, "--checkout-rate", 100000);
			break;
		case 'd':
			duration = parse_num(optarg, "--duration", 3600);
			break;
		case 'T':
			timeout_s = parse_num(optarg, "--timeout", 600);
			break;
		case 'o':
			output = optarg;
			break;
		case 'z':
			t0_file = optarg;
			break;
		case 'h':
			fputs(usage_text, stdout);
			return 0;
		default:
			fputs(usage_text, stderr);
			return 2;
		}
	}
	if (optind != argc || target_at == NULL || demo_parse_addr(target_at, &target) < 0) {
		fputs(usage_text, stderr);
		return 2;
	}
	n_home = (uint64_t)(home_rate * duration + 0.5);
	n_checkout = (uint64_t)(checkout_rate * duration + 0.5);
	if (n_home + n_checkout > MAX_REQUESTS || timeout_s <= 0) {
		fprintf(stderr, "load: at most %d requests, and a timeout above 0\n", MAX_REQUESTS);
		return 2;
	}
	timeout_ns = (uint64_t)(timeout_s * 1e9);

	/* Every request in flight holds a descriptor: up to rate x timeout. */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	nconns = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (1u << 20) ?
	    (size_t)rl.rlim_cur : (1u << 20);
	reqs = calloc(n_home + n_checkout + 1, sizeof(*reqs));
	conns = calloc(nconns, sizeof(*conns));
	ep = epoll_create1(EPOLL_CLOEXEC);
	if (reqs == NULL || conns == NULL || ep < 0) {
		fprintf(stderr, "load: %s\n", strerror(errno));
		return 1;
	}
	f = output != NULL ? fopen(output, "w") : stdout;
	if (f == NULL) {
		fprintf(stderr, "load: %s: %s\n", output, strerror(errno));
		return 1;
	}

	clock_gettime(CLOCK_REALTIME, &wall);
	t0 = mono_ns();
	if (t0_file != NULL) {
		FILE *z = fopen(t0_file, "w");

		if (z == NULL || fprintf(z, "%llu\n", (unsigned long long)wall.tv_sec * 1000 +
		    (unsigned long long)wall.tv_nsec / 1000000) < 0 || fclose(z) != 0) {
			fprintf(stderr, "load: %s: %s\n", t0_file, strerror(errno));
			return 1;
		}
	}
	/* /checkout runs half an interval behind /home, so the two do not
	 * always start in the same instant. */
	next_home = n_home > 0 ? t0 : UINT64_MAX;
	next_checkout = n_checkout > 0 ? t0 + (uint64_t)(0.5e9 / checkout_rate) : UINT64_MAX;
	for (;;) {
		uint64_t due, deadline;
		int nev;

		now = mono_ns();
		while ((due = next_home < next_checkout ? next_home : next_checkout) <= now) {
			if (now - due > max_lag)
				max_lag = now - due;
			if (due == next_home) {
				start(n++, PATH_HOME);
				i_home++;
				next_home = i_home < n_home ?
				    t0 + (uint64_t)((double)i_home * 1e9 / home_rate) : UINT64_MAX;
			} else {
				start(n++, PATH_CHECKOUT);
				i_checkout++;
				next_checkout = i_checkout < n_checkout ?
				    t0 + (uint64_t)(((double)i_checkout + 0.5) * 1e9 / checkout_rate) :
				    UINT64_MAX;
			}
			now = mono_ns();
		}
		/* All requests have the same timeout and start in order, so
		 * the oldest in flight is always the next to time out. */
		while (head_req != NONE && reqs[head_req].start_ns + timeout_ns <= now)
			finish(head_req, OUT_TIMEOUT, 0, now);
		if (due == UINT64_MAX && inflight == 0)
			break;
		deadline = head_req != NONE ? reqs[head_req].start_ns + timeout_ns : UINT64_MAX;
		if (due < deadline)
			deadline = due;
		wait_ms = deadline == UINT64_MAX ? 100 :
		    deadline <= now ? 0 : (int)((deadline - now + 999999) / 1000000);
		if (wait_ms > 100)
			wait_ms = 100;
		nev = epoll_wait(ep, evs, 256, wait_ms);
		for (int k = 0; k < nev; k++)
			on_event(evs[k].data.u32, evs[k].events);
	}
	if (write_csv(f, n, t0) < 0 || (f != stdout && fclose(f) != 0)) {
		fprintf(stderr, "load: cannot write %s\n", output != NULL ? output : "output");
		return 1;
	}
	fprintf(stderr, "load: %u requests (%llu /home, %llu /checkout) in %.1f s, "
	    "started at most %.1f ms late\n", n, (unsigned long long)n_home,
	    (unsigned long long)n_checkout, (double)(mono_ns() - t0) / 1e9, (double)max_lag / 1e6);
	return 0;
}

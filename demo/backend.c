/* backend.c - the demo's dependencies: answers each call after a delay and counts its live connections. */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "demo.h"

/*
 * One thread per connection, so that a slow answer never holds up another
 * connection: the backend must not be the bottleneck the demo is about. Each
 * connection sends one request line; the backend waits the current delay,
 * answers "OK <name>\n" and closes.
 *
 * SIGUSR1 switches to the slow delay ("the dependency has just gone slow") and
 * records when. SIGTERM or SIGINT writes the statistics file and exits.
 *
 * The live count is an independent witness of what the shim claims. It goes
 * up in the accepting thread and down just before close(), so it can never
 * run ahead of the client: the client sees end-of-file, and so gives its
 * permit back, only after the count went down.
 */

#define MAX_LINE	512

static const char usage_text[] =
    "usage: backend [-n NAME] [-l ADDR:PORT] [-d MS] [-s MS] [-S] [-m N]\n"
    "               [-p PORTFILE] [-o STATSFILE]\n"
    "  -n, --name NAME       name in replies and statistics (default backend)\n"
    "  -l, --listen A:P      address to listen on (default 127.0.0.1:0, any free port)\n"
    "  -d, --delay MS        delay before each answer (default 5)\n"
    "  -s, --slow-ms MS      delay once gone slow, after SIGUSR1 (default 8000)\n"
    "  -S, --slow            start slow\n"
    "  -m, --max-conns N     connections served at once; more are closed (default 4096)\n"
    "  -p, --port-file FILE  write the port listened on to FILE\n"
    "  -o, --stats FILE      write statistics to FILE on SIGTERM or SIGINT\n";

static const char *name = "backend";
static unsigned delay_ms = 5, slow_ms = 8000, max_conns = 4096;
static int listen_fd = -1;
static _Atomic int slow;
static _Atomic uint64_t slow_at_ms;	/* CLOCK_REALTIME, 0 = never */
static _Atomic unsigned live, peak, turned_away;
static _Atomic uint64_t accepted, answered;
static pthread_attr_t conn_attr;

static uint64_t
real_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void
sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static unsigned
parse_uint(const char *text, const char *what, unsigned max)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(text, &end, 10);
	if (errno != 0 || *end != '\0' || end == text || v > max) {
		fprintf(stderr, "backend: %s must be a number from 0 to %u\n", what, max);
		exit(2);
	}
	return (unsigned)v;
}

/* Writes text to path through a temporary file, so that a reader never
 * sees half of it. Returns 0 or -errno. */
static int
write_file(const char *path, const char *text)
{
	char tmp[4096];
	FILE *f;

	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= sizeof(tmp))
		return -ENAMETOOLONG;
	f = fopen(tmp, "w");
	if (f == NULL)
		return -errno;
	fputs(text, f);
	if (fclose(f) != 0 || rename(tmp, path) < 0)
		return -errno;
	return 0;
}

static void
note_peak(unsigned now)
{
	unsigned p = atomic_load(&peak);

	while (now > p && !atomic_compare_exchange_weak(&peak, &p, now))
		;
}

static void *
serve(void *arg)
{
	int fd = (int)(intptr_t)arg;
	char line[MAX_LINE], reply[128];
	size_t n = 0;
	ssize_t r;
	int len;

	/* The request line; it arrives right behind the connect. */
	while (n < sizeof(line)) {
		r = recv(fd, line + n, sizeof(line) - n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			goto done;
		if (memchr(line + n, '\n', (size_t)r) != NULL)
			break;
		n += (size_t)r;
	}
	sleep_ms(atomic_load(&slow) ? slow_ms : delay_ms);
	len = snprintf(reply, sizeof(reply), "OK %s\n", name);
	if (send(fd, reply, (size_t)len, MSG_NOSIGNAL) == len)
		atomic_fetch_add(&answered, 1);
done:
	atomic_fetch_sub(&live, 1);
	close(fd);
	return NULL;
}

static void *
acceptor(void *arg)
{
	pthread_t t;
	int fd;

	(void)arg;
	for (;;) {
		fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE || errno == ENOMEM)
				sleep_ms(10);
			continue;
		}
		atomic_fetch_add(&accepted, 1);
		if (atomic_load(&live) >= max_conns) {
			atomic_fetch_add(&turned_away, 1);
			close(fd);
			continue;
		}
		note_peak(atomic_fetch_add(&live, 1) + 1);
		if (pthread_create(&t, &conn_attr, serve, (void *)(intptr_t)fd) != 0) {
			atomic_fetch_sub(&live, 1);
			atomic_fetch_add(&turned_away, 1);
			close(fd);
		}
	}
	return NULL;
}

static void
write_stats(const char *path)
{
	char text[1024];
	int r;

	snprintf(text, sizeof(text),
	    "name=%s\naccepted=%llu\nanswered=%llu\nlive=%u\npeak=%u\nturned_away=%u\n"
	    "delay_ms=%u\nslow_ms=%u\nslow_at_ms=%llu\n",
	    name, (unsigned long long)atomic_load(&accepted),
	    (unsigned long long)atomic_load(&answered), atomic_load(&live), atomic_load(&peak),
	    atomic_load(&turned_away), delay_ms, slow_ms,
	    (unsigned long long)atomic_load(&slow_at_ms));
	r = write_file(path, text);
	if (r < 0)
		fprintf(stderr, "backend %s: %s: %s\n", name, path, strerror(-r));
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "name", required_argument, NULL, 'n' },
		{ "listen", required_argument, NULL, 'l' },
		{ "delay", required_argument, NULL, 'd' },
		{ "slow-ms", required_argument, NULL, 's' },
		{ "slow", no_argument, NULL, 'S' },
		{ "max-conns", required_argument, NULL, 'm' },
		{ "port-file", required_argument, NULL, 'p' },
		{ "stats", required_argument, NULL, 'o' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *listen_at = "127.0.0.1:0", *port_file = NULL, *stats_file = NULL;
	struct sockaddr_in sa;
	socklen_t salen = sizeof(sa);
	sigset_t sigs;
	pthread_t t;
	char text[32];
	int c, sig, one = 1;

	while ((c = getopt_long(argc, argv, "n:l:d:s:Sm:p:o:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'n':
			name = optarg;
			break;
		case 'l':
			listen_at = optarg;
			break;
		case 'd':
			delay_ms = parse_uint(optarg, "--delay", 3600000);
			break;
		case 's':
			slow_ms = parse_uint(optarg, "--slow-ms", 3600000);
			break;
		case 'S':
			atomic_store(&slow, 1);
			break;
		case 'm':
			max_conns = parse_uint(optarg, "--max-conns", 1000000);
			break;
		case 'p':
			port_file = optarg;
			break;
		case 'o':
			stats_file = optarg;
			break;
		case 'h':
			fputs(usage_text, stdout);
			return 0;
		default:
			fputs(usage_text, stderr);
			return 2;
		}
	}
	if (optind != argc || demo_parse_addr(listen_at, &sa) < 0) {
		fputs(usage_text, stderr);
		return 2;
	}
	if (atomic_load(&slow))
		atomic_store(&slow_at_ms, real_ms());

	/* Only this thread takes the signals; the others inherit the mask. */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGHUP);
	sigaddset(&sigs, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (listen_fd < 0 || setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(listen_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(listen_fd, 4096) < 0 ||
	    getsockname(listen_fd, (struct sockaddr *)&sa, &salen) < 0) {
		fprintf(stderr, "backend %s: cannot listen on %s: %s\n", name, listen_at,
		    strerror(errno));
		return 1;
	}
	pthread_attr_init(&conn_attr);
	pthread_attr_setdetachstate(&conn_attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&conn_attr, 64 * 1024);
	c = pthread_create(&t, NULL, acceptor, NULL);
	if (c != 0) {
		fprintf(stderr, "backend %s: cannot start: %s\n", name, strerror(c));
		return 1;
	}
	snprintf(text, sizeof(text), "%u\n", ntohs(sa.sin_port));
	if (port_file != NULL && (c = write_file(port_file, text)) < 0) {
		fprintf(stderr, "backend %s: %s: %s\n", name, port_file, strerror(-c));
		return 1;
	}

	for (;;) {
		if (sigwait(&sigs, &sig) != 0)
			continue;
		if (sig == SIGUSR1) {
			if (!atomic_exchange(&slow, 1))
				atomic_store(&slow_at_ms, real_ms());
			continue;
		}
		if (stats_file != NULL)
			write_stats(stats_file);
		/* Threads may still sleep in serve(); do not run exit handlers
		 * under them. */
		_exit(0);
	}
}

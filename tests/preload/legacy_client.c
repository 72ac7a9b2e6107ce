/* legacy_client.c - legacy_client.py in C, for `make bench-adaptive`: a thread per request, no timeouts. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "loadgen.h"

/*
 * usage: legacy_client PORT THREADS SECONDS [PAUSE_MS]
 *
 * The same client as legacy_client.py (see there), with the same output
 * (one JSON list of [end time s, outcome, latency ms]), but without an
 * interpreter in every latency: the Python client adds a few ms to each
 * request, which the benchmark's p99 comparisons should not carry. It knows
 * nothing of the shim; run it under it.
 */

static int port;

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

int
main(int argc, char **argv)
{
	int threads;

	if (argc < 4)
		return 2;
	port = atoi(argv[1]);
	threads = atoi(argv[2]);
	if (threads < 1 || threads > 4096)
		return 2;
	return loadgen_run(threads, atof(argv[3]), argc > 4 ? atof(argv[4]) : 50, one);
}

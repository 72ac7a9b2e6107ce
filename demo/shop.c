/* shop.c - the demo's legacy frontend: a fixed pool of workers, no timeouts, no limits. */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "demo.h"

/*
 * Written the way old services are: N worker threads share one listening
 * socket, each serving one HTTP/1.0 request at a time. A request that needs a
 * dependency opens a new connection to it and waits for the answer for as
 * long as it takes. Nothing here knows about bulkshim; under it, a connect()
 * to a full compartment fails with ECONNREFUSED, which this code already
 * handles as "that service is down".
 *
 *   GET /checkout  calls payments; 200 "paid" or 503 when the call fails.
 *   GET /home      calls recommendations; 200 "recs ..." or, when the call
 *                  fails, 200 "fallback ..." from a cached list.
 */

#define MAX_REQUEST	4096
#define MAX_REPLY	512

static const char usage_text[] =
    "usage: shop --payments ADDR:PORT --recommendations ADDR:PORT\n"
    "            [-l ADDR:PORT] [-w WORKERS] [-p PORTFILE]\n"
    "  --payments A:P          the payments backend (called by /checkout)\n"
    "  --recommendations A:P   the recommendations backend (called by /home)\n"
    "  -l, --listen A:P        address to listen on (default 127.0.0.1:0, any free port)\n"
    "  -w, --workers N         worker threads (default 32)\n"
    "  -p, --port-file FILE    write the port listened on to FILE\n";

static const char popular_items[] = "popular items: kettle, umbrella, headphones";

static struct sockaddr_in payments, recommendations;
static int listen_fd = -1;

static int
send_all(int fd, const char *buf, size_t len)
{
	ssize_t r;

	while (len > 0) {
		r = send(fd, buf, len, MSG_NOSIGNAL);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		buf += r;
		len -= (size_t)r;
	}
	return 0;
}

/* Opens a new connection to a backend, sends one request line and reads the
 * answer until the backend closes, with no timeout anywhere, like the code
 * this stands for. Returns 0 with the answer in reply, or -errno. */
static int
call_backend(const struct sockaddr_in *to, const char *request, char *reply, size_t len)
{
	size_t n = 0;
	ssize_t r;
	int fd, err = 0;

	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (const struct sockaddr *)to, sizeof(*to)) < 0) {
		err = -errno;
		goto done;
	}
	err = send_all(fd, request, strlen(request));
	if (err < 0)
		goto done;
	for (;;) {
		r = recv(fd, reply + n, len - 1 - n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			err = -errno;
			goto done;
		}
		if (r == 0)
			break;
		n += (size_t)r;
		if (n == len - 1)	/* The rest is not needed. */
			break;
	}
	reply[n] = '\0';
	if (strncmp(reply, "OK", 2) != 0)
		err = -EPROTO;
done:
	close(fd);
	return err;
}

static void
respond(int fd, int status, const char *body)
{
	char buf[MAX_REPLY + 256];
	int len;

	len = snprintf(buf, sizeof(buf),
	    "HTTP/1.0 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
	    "Connection: close\r\n\r\n%s",
	    status, status == 200 ? "OK" : status == 503 ? "Service Unavailable" : "Not Found",
	    strlen(body), body);
	if (len > 0)
		(void)send_all(fd, buf, (size_t)len < sizeof(buf) ? (size_t)len : sizeof(buf) - 1);
}

static void
handle(int fd, const char *path)
{
	char reply[MAX_REPLY], body[MAX_REPLY + 128];
	int r;

	if (strcmp(path, "/checkout") == 0) {
		r = call_backend(&payments, "POST /charge\n", reply, sizeof(reply));
		if (r == 0) {
			respond(fd, 200, "paid\n");
		} else {
			snprintf(body, sizeof(body), "payments unavailable: %s\n", strerror(-r));
			respond(fd, 503, body);
		}
	} else if (strcmp(path, "/home") == 0) {
		r = call_backend(&recommendations, "GET /for-you\n", reply, sizeof(reply));
		if (r == 0)
			snprintf(body, sizeof(body), "recs: %s", reply);
		else
			snprintf(body, sizeof(body), "fallback: %s (recommendations: %s)\n",
			    popular_items, strerror(-r));
		respond(fd, 200, body);
	} else {
		respond(fd, 404, "not found\n");
	}
}

/* Reads the request head; returns the path in path, or -1. */
static int
read_request(int fd, char *path, size_t len)
{
	char buf[MAX_REQUEST + 1], *sp, *end;
	size_t n = 0;
	ssize_t r;

	while (n < MAX_REQUEST) {
		r = recv(fd, buf + n, MAX_REQUEST - n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		n += (size_t)r;
		buf[n] = '\0';
		if (strstr(buf, "\r\n\r\n") != NULL || strstr(buf, "\n\n") != NULL)
			break;
	}
	buf[n] = '\0';
	if (strncmp(buf, "GET ", 4) != 0)
		return -1;
	sp = buf + 4;
	end = sp + strcspn(sp, " \r\n");
	if ((size_t)(end - sp) >= len)
		return -1;
	memcpy(path, sp, (size_t)(end - sp));
	path[end - sp] = '\0';
	return 0;
}

static void *
worker(void *arg)
{
	char path[256];
	int fd;

	(void)arg;
	for (;;) {
		fd = accept(listen_fd, NULL, NULL);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE)
				usleep(10000);
			continue;
		}
		if (read_request(fd, path, sizeof(path)) == 0)
			handle(fd, path);
		else
			respond(fd, 404, "bad request\n");
		close(fd);
	}
	return NULL;
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "payments", required_argument, NULL, 'P' },
		{ "recommendations", required_argument, NULL, 'R' },
		{ "listen", required_argument, NULL, 'l' },
		{ "workers", required_argument, NULL, 'w' },
		{ "port-file", required_argument, NULL, 'p' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *listen_at = "127.0.0.1:0", *port_file = NULL;
	const char *pay_at = NULL, *recs_at = NULL;
	struct sockaddr_in sa;
	socklen_t salen = sizeof(sa);
	unsigned long workers = 32;
	sigset_t sigs;
	pthread_t t;
	FILE *f;
	char *end;
	int c, sig, one = 1;

	while ((c = getopt_long(argc, argv, "l:w:p:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'P':
			pay_at = optarg;
			break;
		case 'R':
			recs_at = optarg;
			break;
		case 'l':
			listen_at = optarg;
			break;
		case 'w':
			errno = 0;
			workers = strtoul(optarg, &end, 10);
			if (errno != 0 || *end != '\0' || workers < 1 || workers > 10000) {
				fprintf(stderr, "shop: --workers must be 1 to 10000\n");
				return 2;
			}
			break;
		case 'p':
			port_file = optarg;
			break;
		case 'h':
			fputs(usage_text, stdout);
			return 0;
		default:
			fputs(usage_text, stderr);
			return 2;
		}
	}
	if (optind != argc || pay_at == NULL || recs_at == NULL ||
	    demo_parse_addr(pay_at, &payments) < 0 || demo_parse_addr(recs_at, &recommendations) < 0 ||
	    demo_parse_addr(listen_at, &sa) < 0) {
		fputs(usage_text, stderr);
		return 2;
	}

	/* The workers inherit a mask without these; main waits for them. */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (listen_fd < 0 || setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(listen_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(listen_fd, 4096) < 0 ||
	    getsockname(listen_fd, (struct sockaddr *)&sa, &salen) < 0) {
		fprintf(stderr, "shop: cannot listen on %s: %s\n", listen_at, strerror(errno));
		return 1;
	}
	for (unsigned long i = 0; i < workers; i++) {
		c = pthread_create(&t, NULL, worker, NULL);
		if (c != 0) {
			fprintf(stderr, "shop: cannot start worker %lu: %s\n", i, strerror(c));
			return 1;
		}
	}
	if (port_file != NULL) {
		char tmp[4096];

		snprintf(tmp, sizeof(tmp), "%s.tmp", port_file);
		f = fopen(tmp, "w");
		if (f == NULL || fprintf(f, "%u\n", ntohs(sa.sin_port)) < 0 || fclose(f) != 0 ||
		    rename(tmp, port_file) < 0) {
			fprintf(stderr, "shop: %s: %s\n", port_file, strerror(errno));
			return 1;
		}
	}
	while (sigwait(&sigs, &sig) != 0)
		;
	/* An orderly exit, so that a preloaded shim's exit handlers give back
	 * what this process holds; workers still blocked in a call are ended
	 * with the process. */
	exit(0);
}

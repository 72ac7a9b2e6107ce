/* poolserver.c - a server with a fixed pool of worker threads calling a slow and a fast backend. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/*
 * usage: poolserver SLOW_PORT FAST_PORT [NWORKERS]
 *
 * Listens on 127.0.0.1 (ephemeral port, printed as "port N"). NWORKERS
 * threads (default 16) share the listening socket; each takes one client at a
 * time and reads one request line:
 *   "slow" - connect to 127.0.0.1:SLOW_PORT, send "slow\n" and wait for the
 *            reply with no timeout, then answer "ok\n";
 *   "fast" - connect to 127.0.0.1:FAST_PORT, send "fast\n", wait for the
 *            echo, then answer "ok\n".
 * When the backend connect (or its reply) fails the answer is "err\n" at once,
 * the path a real server takes when a dependency is down. This is the
 * classic thread-pool server whose pool a single stalled dependency drains.
 */

static int listen_fd;
static uint16_t slow_port, fast_port;

static void answer(int fd, const char *s)
{
	(void)send(fd, s, strlen(s), MSG_NOSIGNAL);
}

static int read_line(int fd, char *buf, size_t len)
{
	size_t n = 0;
	ssize_t r;

	while (n + 1 < len) {
		r = recv(fd, buf + n, 1, 0);
		if (r <= 0)
			return -1;
		if (buf[n] == '\n')
			break;
		n++;
	}
	buf[n] = '\0';
	return (int)n;
}

/* Calls a backend; returns 0 when it answered, -1 otherwise. */
static int call_backend(uint16_t port, const char *req)
{
	struct sockaddr_in a;
	char buf[64];
	int fd, r = -1;

	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons(port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
		goto done;
	if (send(fd, req, strlen(req), MSG_NOSIGNAL) < 0)
		goto done;
	if (recv(fd, buf, sizeof(buf), 0) > 0)	/* no timeout, on purpose */
		r = 0;
done:
	close(fd);
	return r;
}

static void *worker(void *arg)
{
	char line[64];
	int c, r;

	(void)arg;
	for (;;) {
		c = accept(listen_fd, NULL, NULL);
		if (c < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			perror("poolserver: accept");
			exit(1);
		}
		if (read_line(c, line, sizeof(line)) >= 0) {
			if (strcmp(line, "slow") == 0)
				r = call_backend(slow_port, "slow\n");
			else if (strcmp(line, "fast") == 0)
				r = call_backend(fast_port, "fast\n");
			else
				r = -1;
			answer(c, r == 0 ? "ok\n" : "err\n");
		}
		close(c);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	struct sockaddr_in a;
	socklen_t alen = sizeof(a);
	pthread_t th;
	int i, n = 16, one = 1;

	if (argc < 3) {
		fprintf(stderr, "usage: poolserver SLOW_PORT FAST_PORT [NWORKERS]\n");
		return 2;
	}
	slow_port = (uint16_t)atoi(argv[1]);
	fast_port = (uint16_t)atoi(argv[2]);
	if (argc > 3)
		n = atoi(argv[3]);
	signal(SIGPIPE, SIG_IGN);
	listen_fd = socket(AF_INET, SOCK_STREAM, 0);
	if (listen_fd < 0) {
		perror("poolserver: socket");
		return 1;
	}
	setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(listen_fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(listen_fd, 512) < 0 ||
	    getsockname(listen_fd, (struct sockaddr *)&a, &alen) < 0) {
		perror("poolserver: bind");
		return 1;
	}
	for (i = 0; i < n; i++) {
		if (pthread_create(&th, NULL, worker, NULL) != 0) {
			fprintf(stderr, "poolserver: pthread_create failed\n");
			return 1;
		}
		pthread_detach(th);
	}
	printf("port %d\n", ntohs(a.sin_port));
	fflush(stdout);
	for (;;)
		pause();
}

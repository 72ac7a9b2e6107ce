/* backend.c - loopback servers for `make bench`: accept-and-close, echo, and HTTP keep-alive. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

/*
 * usage: backend close|echo|http
 *
 * Listens on 127.0.0.1 at an ephemeral port with a backlog of 4096 and prints
 * "port N" on stdout, then serves until it is killed. It never runs under
 * the shim: it is the far end of what is measured.
 *   close - accepts and closes inline in a tight loop, so that a connect loop
 *           never finds the accept queue full (a dropped SYN costs a 1 s
 *           retransmit, which would swamp any figure);
 *   echo  - sends back whatever arrives (the ping-pong peer), with epoll;
 *   http  - answers every request of a keep-alive HTTP/1.1 connection with
 *           a 13-byte body, with epoll; requests may be pipelined.
 */

#define BACKLOG		4096
#define MAX_EVENTS	64
#define BUF_LEN		16384

static const char response[] =
    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n\r\nhello, world\n";

/* Per connection: how much of "\r\n\r\n" the bytes so far end with. */
struct conn {
	int fd;
	int matched;
};

static int
listen_loopback(void)
{
	struct sockaddr_in a;
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;

	if (fd < 0)
		return -1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, BACKLOG) < 0 ||
	    getsockname(fd, (struct sockaddr *)&a, &len) < 0) {
		close(fd);
		return -1;
	}
	printf("port %u\n", (unsigned)ntohs(a.sin_port));
	fflush(stdout);
	return fd;
}

/* Writes all of buf, waiting for room when the socket is full. Returns 0 or -1. */
static int
write_all(int fd, const char *buf, size_t n)
{
	struct pollfd p = { .fd = fd, .events = POLLOUT };

	while (n > 0) {
		ssize_t w = send(fd, buf, n, MSG_NOSIGNAL);

		if (w > 0) {
			buf += w;
			n -= (size_t)w;
		} else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
			poll(&p, 1, 1000);
		} else {
			return -1;
		}
	}
	return 0;
}

/* Counts the complete request heads in buf, carrying a partial "\r\n\r\n". */
static int
count_requests(struct conn *c, const char *buf, size_t n)
{
	static const char end[] = "\r\n\r\n";
	int reqs = 0;

	for (size_t i = 0; i < n; i++) {
		if (buf[i] == end[c->matched])
			c->matched++;
		else
			c->matched = buf[i] == '\r' ? 1 : 0;
		if (c->matched == 4) {
			reqs++;
			c->matched = 0;
		}
	}
	return reqs;
}

/* Serves one readable connection; returns -1 when it is to be closed. */
static int
serve(struct conn *c, int http)
{
	static char buf[BUF_LEN], out[BUF_LEN];
	const size_t rlen = sizeof(response) - 1;

	for (;;) {
		ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
		int reqs;

		if (n == 0)
			return -1;
		if (n < 0)
			return errno == EAGAIN || errno == EINTR ? 0 : -1;
		if (!http) {
			if (write_all(c->fd, buf, (size_t)n) < 0)
				return -1;
			continue;
		}
		reqs = count_requests(c, buf, (size_t)n);
		while (reqs > 0) {
			size_t k = 0;

			while (reqs > 0 && k + rlen <= sizeof(out)) {
				memcpy(out + k, response, rlen);
				k += rlen;
				reqs--;
			}
			if (write_all(c->fd, out, k) < 0)
				return -1;
		}
	}
}

static int
run_close(int lfd)
{
	for (;;) {
		int fd = accept(lfd, NULL, NULL);

		if (fd >= 0)
			close(fd);
		else if (errno != EINTR && errno != ECONNABORTED && errno != EMFILE)
			return 1;
	}
}

static int
run_epoll(int lfd, int http)
{
	struct epoll_event ev, evs[MAX_EVENTS];
	int ep = epoll_create1(EPOLL_CLOEXEC), one = 1;

	if (ep < 0)
		return 1;
	fcntl(lfd, F_SETFL, fcntl(lfd, F_GETFL) | O_NONBLOCK);
	ev.events = EPOLLIN;
	ev.data.ptr = NULL;	/* NULL stands for the listening socket */
	if (epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev) < 0)
		return 1;
	for (;;) {
		int n = epoll_wait(ep, evs, MAX_EVENTS, -1);

		if (n < 0 && errno != EINTR)
			return 1;
		for (int i = 0; i < n; i++) {
			struct conn *c = evs[i].data.ptr;

			if (c != NULL) {
				if (serve(c, http) < 0) {
					close(c->fd);
					free(c);
				}
				continue;
			}
			for (;;) {
				int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK);

				if (fd < 0)
					break;
				c = calloc(1, sizeof(*c));
				if (c == NULL) {
					close(fd);
					continue;
				}
				c->fd = fd;
				setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
				ev.events = EPOLLIN;
				ev.data.ptr = c;
				if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
					close(fd);
					free(c);
				}
			}
		}
	}
}

int
main(int argc, char **argv)
{
	int lfd;

	signal(SIGPIPE, SIG_IGN);
	if (argc != 2 || (strcmp(argv[1], "close") != 0 && strcmp(argv[1], "echo") != 0 &&
	    strcmp(argv[1], "http") != 0)) {
		fprintf(stderr, "usage: backend close|echo|http\n");
		return 2;
	}
	lfd = listen_loopback();
	if (lfd < 0) {
		perror("backend: listen");
		return 1;
	}
	if (strcmp(argv[1], "close") == 0)
		return run_close(lfd);
	return run_epoll(lfd, strcmp(argv[1], "http") == 0);
}

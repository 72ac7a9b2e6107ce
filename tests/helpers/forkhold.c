/* forkhold.c - a prefork server in miniature: N forked workers each connect once and hold it. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/*
 * usage: forkhold HOST PORT N [HELD]
 *
 * With HELD (any value) the parent first connects to HOST:PORT itself and
 * keeps that connection, so that every worker inherits it (as a master's
 * log or database connection is). Then it forks N workers, one after the
 * other; each connects to HOST:PORT once, reports "y" (connected) or the
 * errno of its failure on a pipe, and holds its connection until the
 * parent's stdin is closed. The parent prints "ok=N failed=N" and the
 * errnos of the failures, one line, then waits for stdin to close, ends
 * the workers and reaps them. Exit status 0 if every worker connected.
 */

struct report {
	int err;	/* 0: connected */
};

int
main(int argc, char **argv)
{
	struct sockaddr_in addr = { .sin_family = AF_INET };
	int n, rep[2], hold[2], ok = 0, failed = 0, master = -1;
	pid_t *pids;
	char buf[64];

	if (argc < 4 || (n = atoi(argv[3])) <= 0) {
		fprintf(stderr, "usage: forkhold HOST PORT N [HELD]\n");
		return 2;
	}
	addr.sin_port = htons((unsigned short)atoi(argv[2]));
	if (inet_pton(AF_INET, argv[1], &addr.sin_addr) != 1)
		return 2;
	pids = calloc((size_t)n, sizeof(*pids));
	if (pids == NULL || pipe(rep) < 0 || pipe(hold) < 0)
		return 2;
	if (argc > 4) {
		master = socket(AF_INET, SOCK_STREAM, 0);
		if (master < 0 || connect(master, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
			printf("master: connect failed: errno %d\n", errno);
			return 1;
		}
	}
	for (int i = 0; i < n; i++) {
		pids[i] = fork();
		if (pids[i] < 0) {
			printf("fork %d failed: errno %d\n", i, errno);
			n = i;
			break;
		}
		if (pids[i] == 0) {
			struct report r = { 0 };
			int fd = socket(AF_INET, SOCK_STREAM, 0);

			close(rep[0]);
			close(hold[1]);
			if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0)
				r.err = errno;
			if (write(rep[1], &r, sizeof(r)) != (ssize_t)sizeof(r))
				_exit(3);
			/* Holds the connection until the parent lets go. */
			while (read(hold[0], buf, sizeof(buf)) > 0)
				;
			_exit(0);
		}
	}
	close(rep[1]);
	close(hold[0]);
	for (int i = 0; i < n; i++) {
		struct report r;

		if (read(rep[0], &r, sizeof(r)) != (ssize_t)sizeof(r))
			break;
		if (r.err == 0) {
			ok++;
		} else {
			if (failed < 8)
				printf("errno=%d ", r.err);
			failed++;
		}
	}
	printf("ok=%d failed=%d\n", ok, failed);
	fflush(stdout);
	while (read(0, buf, sizeof(buf)) > 0)
		;
	close(hold[1]);
	for (int i = 0; i < n; i++)
		waitpid(pids[i], NULL, 0);
	if (master >= 0)
		close(master);
	return ok == n && failed == 0 ? 0 : 1;
}

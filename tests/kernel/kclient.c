/* kclient.c - a connect client the preloaded library cannot see (static, io_uring, setuid) for the kernel engine's tests. */
#include <arpa/inet.h>
#include <errno.h>
#include <liburing.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/*
 * usage: kclient [-u] ADDRESS PORT COUNT
 *
 * Opens COUNT TCP connections to ADDRESS (IPv4 or IPv6) and PORT one after
 * the other, with connect(2), or with -u through an io_uring connect
 * submission (liburing). Prints one line per attempt, "ok" or
 * "err ERRNO MICROSECONDS", then "held N", keeps the connections open until
 * its standard input ends, closes them, and prints "closed".
 */

static long long
now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* io_uring connect: the result of the completion, 0 or -errno. */
static int
uring_connect(struct io_uring *ring, int fd, const struct sockaddr *sa, socklen_t len)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
	struct io_uring_cqe *cqe;
	int r;

	if (sqe == NULL)
		return -EBUSY;
	io_uring_prep_connect(sqe, fd, sa, len);
	if ((r = io_uring_submit(ring)) < 0)
		return r;
	if ((r = io_uring_wait_cqe(ring, &cqe)) < 0)
		return r;
	r = cqe->res;
	io_uring_cqe_seen(ring, cqe);
	return r;
}

int
main(int argc, char **argv)
{
	struct sockaddr_storage ss;
	struct io_uring ring;
	socklen_t len;
	int uring = 0, n, held = 0, *fds;
	char buf[64];

	if (argc == 5 && strcmp(argv[1], "-u") == 0) {
		uring = 1;
		argv++;
		argc--;
	}
	if (argc != 4 || (n = atoi(argv[3])) <= 0 || n > 10000) {
		fprintf(stderr, "usage: kclient [-u] ADDRESS PORT COUNT\n");
		return 2;
	}
	memset(&ss, 0, sizeof(ss));
	if (inet_pton(AF_INET, argv[1], &((struct sockaddr_in *)&ss)->sin_addr) == 1) {
		ss.ss_family = AF_INET;
		((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)atoi(argv[2]));
		len = sizeof(struct sockaddr_in);
	} else if (inet_pton(AF_INET6, argv[1], &((struct sockaddr_in6 *)&ss)->sin6_addr) == 1) {
		ss.ss_family = AF_INET6;
		((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)atoi(argv[2]));
		len = sizeof(struct sockaddr_in6);
	} else {
		fprintf(stderr, "kclient: bad address %s\n", argv[1]);
		return 2;
	}
	if (uring && io_uring_queue_init(8, &ring, 0) < 0) {
		fprintf(stderr, "kclient: io_uring_queue_init failed\n");
		return 3;
	}
	fds = calloc((size_t)n, sizeof(*fds));
	if (fds == NULL)
		return 1;
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (int i = 0; i < n; i++) {
		int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), r;
		long long t0 = now_us();

		if (fd < 0)
			return 1;
		if (uring)
			r = uring_connect(&ring, fd, (struct sockaddr *)&ss, len);
		else
			r = connect(fd, (struct sockaddr *)&ss, len) < 0 ? -errno : 0;
		if (r == 0) {
			fds[held++] = fd;
			printf("ok\n");
		} else {
			printf("err %d %lld\n", -r, now_us() - t0);
			close(fd);
		}
	}
	printf("held %d\n", held);
	while (fgets(buf, sizeof(buf), stdin) != NULL)
		;
	for (int i = 0; i < held; i++)
		close(fds[i]);
	printf("closed\n");
	return 0;
}

/* rawclose.c - leaks counted sockets on purpose: closes them with the system call instruction, past every hook. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

/*
 * rawclose PORT N [free]: connects N sockets to 127.0.0.1:PORT through libc
 * (the shim counts them), closes each with a raw close system call (the
 * shim does not see it), opens N files so the numbers are taken by
 * something that is not a socket (with `free`, leaves the numbers free and
 * prints them after "leaked N"), then obeys stdin, one word a line:
 *   try     connect once more: "ok FD" or "err ERRNO"
 *   close   close what `try` opened (through libc)
 *   socket  socket() with errno set to EDOM first: "socket FD errno E"
 *   quit    exit
 */

static long
raw_close(long fd)
{
	long r;
#if defined(__x86_64__)
	__asm__ volatile ("syscall" : "=a"(r) : "a"((long)SYS_close), "D"(fd) : "rcx", "r11", "memory");
#elif defined(__aarch64__)
	register long x8 __asm__("x8") = SYS_close;
	register long x0 __asm__("x0") = fd;

	__asm__ volatile ("svc 0" : "+r"(x0) : "r"(x8) : "memory");
	r = x0;
#else
#error "rawclose: no raw system call for this architecture"
#endif
	return r;
}

static int
tcp(int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;

		close(fd);
		return -e;
	}
	return fd;
}

int
main(int argc, char **argv)
{
	char line[64];
	int port, n, last = -1;

	bool keep_free = argc == 4 && strcmp(argv[3], "free") == 0;

	if (argc != 3 && !keep_free)
		return 2;
	port = atoi(argv[1]);
	n = atoi(argv[2]);
	setvbuf(stdout, NULL, _IOLBF, 0);
	int fds[64];

	if (n < 1 || n > 64)
		return 2;
	for (int i = 0; i < n; i++) {
		fds[i] = tcp(port);
		if (fds[i] < 0) {
			printf("err %d\n", -fds[i]);
			return 1;
		}
	}
	for (int i = 0; i < n; i++) {
		if (raw_close(fds[i]) != 0) {
			printf("raw close failed\n");
			return 1;
		}
	}
	for (int i = 0; i < n && !keep_free; i++) {
		if (open("/dev/null", O_RDONLY) < 0)
			return 1;
	}
	printf("leaked %d", n);
	for (int i = 0; i < n && keep_free; i++)
		printf(" %d", fds[i]);
	printf("\n");
	while (fgets(line, sizeof(line), stdin) != NULL) {
		if (strncmp(line, "try", 3) == 0) {
			last = tcp(port);
			if (last < 0)
				printf("err %d\n", -last);
			else
				printf("ok %d\n", last);
		} else if (strncmp(line, "close", 5) == 0) {
			printf("%d\n", last >= 0 ? close(last) : -1);
			last = -1;
		} else if (strncmp(line, "socket", 6) == 0) {
			int fd, e;

			errno = EDOM;
			fd = socket(AF_INET, SOCK_STREAM, 0);
			e = errno;
			printf("socket %d errno %d\n", fd, e);
		} else if (strncmp(line, "quit", 4) == 0) {
			break;
		}
	}
	return 0;
}

/* fdops.c - runs descriptor operations read from stdin so that tests can call each libc entry point by name. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sched.h>
#include <signal.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/syscall.h>
#include <unistd.h>

/*
 * One command per line, one reply per command on stdout: "ok VALUE" or
 * "err ERRNO". Descriptors are plain numbers; FILE streams from fdopen are
 * named by their index in a small table.
 *
 *   tcp HOST PORT           socket + connect (IPv4 or IPv6), replies the fd
 *   unix PATH               AF_UNIX stream socket + connect
 *   devnull                 open("/dev/null"), replies the fd
 *   dup FD | dup2 A B | dup3 A B CLOEXEC(0|1)
 *   fcntl FD dupfd|dupfd_cloexec MIN     through fcntl()
 *   fcntl64 FD dupfd|dupfd_cloexec MIN   through fcntl64()
 *   close FD | close_range FIRST LAST | closefrom FD
 *   fdopen FD               replies the stream index
 *   fclose INDEX
 *   pid
 *   vfork_close FD | _Fork_close FD | clone_close FD | sysfork_close FD
 *                           a child made by vfork(), _Fork(), clone() (no
 *                           shared memory) or syscall(SYS_fork) closes FD and
 *                           exits; replies
 *                           once the child is gone
 *   vfork_socket FD         a vfork() child closes FD and makes stream
 *                           sockets until one gets FD's number; replies once
 *                           it is gone (an error if none did)
 *   exit STATUS             exit(3): a normal exit, nothing closed first
 *   _exit STATUS
 */

#define MAX_STREAMS 64

static FILE *streams[MAX_STREAMS];

static void reply(long r)
{
	if (r < 0)
		printf("err %d\n", errno);
	else
		printf("ok %ld\n", r);
	fflush(stdout);
}

static int do_tcp(const char *host, int port)
{
	struct sockaddr_in6 a6;
	struct sockaddr_in a4;
	int fd, r, e;

	memset(&a4, 0, sizeof(a4));
	memset(&a6, 0, sizeof(a6));
	if (inet_pton(AF_INET, host, &a4.sin_addr) == 1) {
		a4.sin_family = AF_INET;
		a4.sin_port = htons((uint16_t)port);
		fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd < 0)
			return -1;
		r = connect(fd, (struct sockaddr *)&a4, sizeof(a4));
	} else if (inet_pton(AF_INET6, host, &a6.sin6_addr) == 1) {
		a6.sin6_family = AF_INET6;
		a6.sin6_port = htons((uint16_t)port);
		fd = socket(AF_INET6, SOCK_STREAM, 0);
		if (fd < 0)
			return -1;
		r = connect(fd, (struct sockaddr *)&a6, sizeof(a6));
	} else {
		errno = EINVAL;
		return -1;
	}
	if (r < 0) {
		e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

static int do_unix(const char *path)
{
	struct sockaddr_un a;
	int fd, e;

	memset(&a, 0, sizeof(a));
	a.sun_family = AF_UNIX;
	if (strlen(path) >= sizeof(a.sun_path)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(a.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

static int dup_cmd(const char *name)
{
	if (strcmp(name, "dupfd") == 0)
		return F_DUPFD;
	if (strcmp(name, "dupfd_cloexec") == 0)
		return F_DUPFD_CLOEXEC;
	return -1;
}

static long do_fdopen(int fd)
{
	FILE *f;
	int i;

	for (i = 0; i < MAX_STREAMS && streams[i]; i++)
		;
	if (i == MAX_STREAMS) {
		errno = EMFILE;
		return -1;
	}
	f = fdopen(fd, "r+");
	if (!f)
		return -1;
	streams[i] = f;
	return i;
}

static long do_fclose(int i)
{
	FILE *f;

	if (i < 0 || i >= MAX_STREAMS || !streams[i]) {
		errno = EINVAL;
		return -1;
	}
	f = streams[i];
	streams[i] = NULL;
	return fclose(f) == 0 ? 0 : -1;
}

/* The child of clone_close: closes the descriptor in its own copy. */
static int clone_child(void *arg)
{
	close(*(int *)arg);
	return 0;
}

/* Makes a child by `how` that closes fd (and for vfork_socket makes a
 * socket under its number) and exits; returns 0 once it is gone, -1 if it
 * did not exit with 0. */
static long child_close(const char *how, int fd)
{
	static char stack[64 * 1024] __attribute__((aligned(16)));
	int st;
	pid_t pid;

	if (strcmp(how, "vfork_close") == 0) {
		pid = vfork();
		if (pid == 0) {
			close(fd);
			_exit(0);
		}
	} else if (strcmp(how, "vfork_socket") == 0) {
		pid = vfork();
		if (pid == 0) {
			int s;

			close(fd);
			do
				s = socket(AF_INET, SOCK_STREAM, 0);
			while (s >= 0 && s < fd);
			_exit(s == fd ? 0 : 1);
		}
	} else if (strcmp(how, "_Fork_close") == 0) {
		pid = _Fork();
		if (pid == 0) {
			close(fd);
			_exit(0);
		}
	} else if (strcmp(how, "sysfork_close") == 0) {
		pid = (pid_t)syscall(SYS_fork);
		if (pid == 0) {
			close(fd);
			_exit(0);
		}
	} else {
		pid = clone(clone_child, stack + sizeof(stack), SIGCHLD, &fd);
	}
	if (pid < 0 || waitpid(pid, &st, 0) < 0)
		return -1;
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		errno = ECHILD;
		return -1;
	}
	return 0;
}

int main(void)
{
	char line[512], a[256], b[256], c[256];
	int n, cmd;

	setvbuf(stdout, NULL, _IOLBF, 0);
	while (fgets(line, sizeof(line), stdin)) {
		a[0] = b[0] = c[0] = '\0';
		n = sscanf(line, "%255s %255s %255s", a, b, c);
		if (n < 1)
			continue;
		errno = 0;
		if (strcmp(a, "tcp") == 0 && n == 3) {
			reply(do_tcp(b, atoi(c)));
		} else if (strcmp(a, "unix") == 0 && n == 2) {
			reply(do_unix(b));
		} else if (strcmp(a, "devnull") == 0) {
			reply(open("/dev/null", O_RDWR));
		} else if (strcmp(a, "dup") == 0 && n == 2) {
			reply(dup(atoi(b)));
		} else if (strcmp(a, "dup2") == 0 && n == 3) {
			reply(dup2(atoi(b), atoi(c)));
		} else if (strcmp(a, "dup3") == 0 && n >= 3) {
			char d[16] = "0";
			sscanf(line, "%*s %*s %*s %15s", d);
			reply(dup3(atoi(b), atoi(c), atoi(d) ? O_CLOEXEC : 0));
		} else if ((strcmp(a, "fcntl") == 0 || strcmp(a, "fcntl64") == 0) && n == 3) {
			char d[16] = "0";
			sscanf(line, "%*s %*s %*s %15s", d);
			cmd = dup_cmd(c);
			if (cmd < 0) {
				errno = EINVAL;
				reply(-1);
			} else if (strcmp(a, "fcntl") == 0) {
				reply(fcntl(atoi(b), cmd, atoi(d)));
			} else {
				reply(fcntl64(atoi(b), cmd, atoi(d)));
			}
		} else if (strcmp(a, "close") == 0 && n == 2) {
			reply(close(atoi(b)));
		} else if (strcmp(a, "close_range") == 0 && n == 3) {
			reply(close_range((unsigned)atoi(b), (unsigned)strtoul(c, NULL, 0), 0));
		} else if (strcmp(a, "closefrom") == 0 && n == 2) {
			closefrom(atoi(b));
			reply(0);
		} else if (strcmp(a, "fdopen") == 0 && n == 2) {
			reply(do_fdopen(atoi(b)));
		} else if (strcmp(a, "fclose") == 0 && n == 2) {
			reply(do_fclose(atoi(b)));
		} else if ((strcmp(a, "vfork_close") == 0 || strcmp(a, "_Fork_close") == 0 ||
		    strcmp(a, "clone_close") == 0 || strcmp(a, "sysfork_close") == 0 ||
		    strcmp(a, "vfork_socket") == 0) && n == 2) {
			reply(child_close(a, atoi(b)));
		} else if (strcmp(a, "pid") == 0) {
			reply(getpid());
		} else if (strcmp(a, "exit") == 0 && n == 2) {
			exit(atoi(b));
		} else if (strcmp(a, "_exit") == 0 && n == 2) {
			_exit(atoi(b));
		} else {
			errno = EINVAL;
			reply(-1);
		}
	}
	return 0;
}

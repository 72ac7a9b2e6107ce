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
#include <spawn.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/sched.h>

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
 *   spawn HOW FD ENV        a child made by HOW (vfork, posix_spawn,
 *                           posix_spawnp, clone, clone_vfork, sys_clone,
 *                           sys_clone3, _Fork) inherits FD and execs
 *                           `sleep 3600`, with this environment (ENV keep)
 *                           or without LD_PRELOAD (ENV bare); the parent
 *                           closes FD as soon as the call that made the
 *                           child returns, and replies the child's pid
 *   reap PID                SIGKILLs and waits for a child of spawn
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

extern char **environ;

static char *sleep_argv[] = { "sleep", "3600", NULL };
static char **spawn_envp;

/* The child of spawn: execs sleep, holding what it inherited. */
static int exec_sleep(void *arg)
{
	(void)arg;
	execve("/bin/sleep", sleep_argv, spawn_envp);
	_exit(127);
}

/* environ, without LD_PRELOAD if bare; built before any child is made. */
static char **child_env(int bare)
{
	static char *env[512];
	int n = 0;

	for (char **e = environ; *e != NULL && n < 511; e++) {
		if (bare && strncmp(*e, "LD_PRELOAD=", 11) == 0)
			continue;
		env[n++] = *e;
	}
	env[n] = NULL;
	return env;
}

/* Makes a child by `how` that inherits fd (not close-on-exec here) and
 * execs sleep, then closes fd; returns the child's pid. */
static long spawn_child(const char *how, int fd, int bare)
{
	static char stack[64 * 1024] __attribute__((aligned(16)));
	pid_t pid = -1;
	int err;

	spawn_envp = child_env(bare);
	if (strcmp(how, "vfork") == 0) {
		pid = vfork();
		if (pid == 0)
			exec_sleep(NULL);
	} else if (strcmp(how, "posix_spawn") == 0 || strcmp(how, "posix_spawnp") == 0) {
		err = how[11] == 'p' ?
		    posix_spawnp(&pid, "sleep", NULL, NULL, sleep_argv, spawn_envp) :
		    posix_spawn(&pid, "/bin/sleep", NULL, NULL, sleep_argv, spawn_envp);
		if (err != 0) {
			errno = err;
			return -1;
		}
	} else if (strcmp(how, "clone") == 0) {
		pid = clone(exec_sleep, stack + sizeof(stack), SIGCHLD, NULL);
	} else if (strcmp(how, "clone_vfork") == 0) {
		pid = clone(exec_sleep, stack + sizeof(stack), CLONE_VM | CLONE_VFORK | SIGCHLD, NULL);
	} else if (strcmp(how, "sys_clone") == 0) {
		pid = (pid_t)syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
		if (pid == 0)
			exec_sleep(NULL);
	} else if (strcmp(how, "sys_clone3") == 0) {
		struct clone_args ca;

		memset(&ca, 0, sizeof(ca));
		ca.exit_signal = SIGCHLD;
		pid = (pid_t)syscall(SYS_clone3, &ca, sizeof(ca));
		if (pid == 0)
			exec_sleep(NULL);
	} else if (strcmp(how, "_Fork") == 0) {
		pid = _Fork();
		if (pid == 0)
			exec_sleep(NULL);
	} else {
		errno = EINVAL;
	}
	if (pid > 0)
		close(fd);
	return pid;
}

static long reap(pid_t pid)
{
	int st;

	kill(pid, SIGKILL);
	return waitpid(pid, &st, 0) == pid ? 0 : -1;
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
		} else if (strcmp(a, "spawn") == 0 && n == 3) {
			char d[16] = "keep";
			sscanf(line, "%*s %*s %*s %15s", d);
			reply(spawn_child(b, atoi(c), strcmp(d, "bare") == 0));
		} else if (strcmp(a, "reap") == 0 && n == 2) {
			reply(reap(atoi(b)));
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

/* sys.c - raw system calls for every layer: the instruction, futexes, small /proc reads. */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "sys.h"

#if !defined(__x86_64__) && !defined(__aarch64__)
/* On other machines the library exports no syscall() wrapper (the same
 * machines as interpose/syscall.c's): the symbol is libc's alone, named
 * here by its assembler name. */
extern long libc_syscall(long n, ...) __asm__("syscall");
#endif

long
sys_call(long n, long a1, long a2, long a3, long a4, long a5, long a6)
{
	long r;
#if defined(__x86_64__)
	register long r10 __asm__("r10") = a4;
	register long r8 __asm__("r8") = a5;
	register long r9 __asm__("r9") = a6;

	__asm__ volatile ("syscall"
	    : "=a"(r)
	    : "a"(n), "D"(a1), "S"(a2), "d"(a3), "r"(r10), "r"(r8), "r"(r9)
	    : "rcx", "r11", "memory");
#elif defined(__aarch64__)
	register long x8 __asm__("x8") = n;
	register long x0 __asm__("x0") = a1;
	register long x1 __asm__("x1") = a2;
	register long x2 __asm__("x2") = a3;
	register long x3 __asm__("x3") = a4;
	register long x4 __asm__("x4") = a5;
	register long x5 __asm__("x5") = a6;

	__asm__ volatile ("svc 0"
	    : "+r"(x0)
	    : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
	    : "memory");
	r = x0;
#else
	return libc_syscall(n, a1, a2, a3, a4, a5, a6);
#endif
	if (r < 0 && r > -4096) {
		errno = (int)-r;
		return -1;
	}
	return r;
}

void
sys_futex_wait(_Atomic uint32_t *word, uint32_t val, uint64_t us)
{
	struct timespec ts = { (time_t)(us / 1000000), (long)(us % 1000000) * 1000 };

	sys_call(SYS_futex, (long)(uintptr_t)word, FUTEX_WAIT, (long)val, (long)&ts, 0, 0);
}

void
sys_futex_wake(_Atomic uint32_t *word, int n)
{
	sys_call(SYS_futex, (long)(uintptr_t)word, FUTEX_WAKE, n, 0, 0, 0);
}

int
sys_close(int fd)
{
	return (int)sys_call(SYS_close, fd, 0, 0, 0, 0, 0);
}

int
sys_fcntl(int fd, int cmd, void *arg)
{
	return (int)sys_call(SYS_fcntl, fd, cmd, (long)arg, 0, 0, 0);
}

int
sys_socket(int domain, int type, int protocol)
{
	return (int)sys_call(SYS_socket, domain, type, protocol, 0, 0, 0);
}

long
sys_sendto(int fd, const void *buf, size_t len, int flags, const void *sa, unsigned salen)
{
	return sys_call(SYS_sendto, fd, (long)buf, (long)len, flags, (long)sa, (long)salen);
}

long
sys_recv(int fd, void *buf, size_t len, int flags)
{
	return sys_call(SYS_recvfrom, fd, (long)buf, (long)len, flags, 0, 0);
}

long
sys_read(int fd, void *buf, size_t len)
{
	return sys_call(SYS_read, fd, (long)buf, (long)len, 0, 0, 0);
}

pid_t
sys_getpid(void)
{
	return (pid_t)sys_call(SYS_getpid, 0, 0, 0, 0, 0, 0);
}

long
sys_read_small(const char *path, char *buf, size_t len)
{
	long fd, n;

	fd = sys_call(SYS_openat, AT_FDCWD, (long)path, O_RDONLY | O_CLOEXEC, 0, 0, 0);
	if (fd < 0)
		return -errno;
	n = sys_read((int)fd, buf, len - 1);
	if (n < 0)
		n = -errno;
	sys_close((int)fd);
	if (n >= 0)
		buf[n] = '\0';
	return n;
}

/* "/proc/PID/stat" into path (room for 32 bytes), without stdio. */
static void
stat_path(pid_t pid, char *path)
{
	char digits[16];
	size_t n = 0, k = 0;
	unsigned v = (unsigned)pid;

	do {
		digits[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v != 0 && n < sizeof(digits));
	memcpy(path, "/proc/", 6);
	k = 6;
	while (n > 0)
		path[k++] = digits[--n];
	memcpy(path + k, "/stat", 6);
}

/* Parses /proc/PID/stat: the state letter, the thread count (field 20) and
 * field 22 (start time). The command name may hold spaces and parentheses,
 * so parsing starts after the last ')'. Returns 0, -ENOENT if the process
 * is gone, or another -errno. */
static int
proc_stat(pid_t pid, char *state, uint64_t *start, uint64_t *threads)
{
	char path[32], buf[1024];
	char *p;
	long n;
	int field = 2;

	stat_path(pid, path);
	n = sys_read_small(path, buf, sizeof(buf));
	if (n < 0)
		return (int)n;
	p = strrchr(buf, ')');
	if (p == NULL || p[1] != ' ')
		return -EINVAL;
	p += 2;
	*state = *p;
	*threads = 0;
	for (field = 3; field < 22 && *p; p++) {
		if (*p == ' ' && ++field == 20) {
			for (const char *q = p + 1; *q >= '0' && *q <= '9'; q++)
				*threads = *threads * 10 + (uint64_t)(*q - '0');
		}
	}
	*start = 0;
	while (*p >= '0' && *p <= '9')
		*start = *start * 10 + (uint64_t)(*p++ - '0');
	return 0;
}

uint64_t
sys_pid_start(pid_t pid)
{
	char state;
	uint64_t start, threads;

	return proc_stat(pid, &state, &start, &threads) == 0 ? start : 0;
}

bool
sys_pid_alive(pid_t pid, uint64_t start)
{
	char state;
	uint64_t st, threads;
	int r;

	if (pid <= 0)
		return false;
	r = proc_stat(pid, &state, &st, &threads);
	if (r == -ENOENT || r == -ESRCH)
		return false;
	if (r < 0) {
		/* No /proc (or hidepid): fall back to a signal probe, which
		 * cannot tell a zombie or a reused PID, so it errs on "alive". */
		return !(kill(pid, 0) < 0 && errno == ESRCH);
	}
	/* A zombie has closed all its descriptors: its permits are free. But
	 * a thread-group leader that called pthread_exit() shows as a zombie
	 * while its other threads live on, holding the descriptors; the
	 * thread count (field 20) tells the two apart. */
	if ((state == 'Z' || state == 'X' || state == 'x') && threads <= 1)
		return false;
	return start == 0 || st == start;
}


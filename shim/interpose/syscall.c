/* syscall.c - syscall(), forwarded for every number; the descriptor calls get their libc names' bookkeeping. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "interpose/interpose.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

/* ---- syscall(): libuv closes every descriptor this way ---- */

/*
 * syscall() is forwarded with all six arguments for every number; only the
 * numbers that end, copy or connect a descriptor get the bookkeeping their
 * libc names get. The shim's own raw calls (getpid, futex, reading /proc)
 * reach this wrapper too and go straight through: the descriptor numbers
 * act only on descriptors the table counts, and the forward is libc's
 * syscall(), or the instruction itself before libc is bound, never this.
 */
/* Only where real.c makes the system call without libc's syscall(), which
 * would otherwise be this wrapper again. */
#if defined(__x86_64__) || defined(__aarch64__)
static long
call_forward(long n, const long a[6])
{
	return real_syscall6(n, a);
}

/* close(2) of a counted descriptor by number: as in close() above. */
static long
call_close(long n, const long a[6])
{
	int fd = (int)a[0], saved;
	uint32_t e;
	long r;

	if (fdt_get(fd) == 0 || !shim_active() || shim_foreign())
		return call_forward(n, a);
	e = fdt_take(fd);
	r = call_forward(n, a);
	saved = errno;
	slot_drop(shim.seg, e - 1);
	errno = saved;
	return r;
}

static long
call_close_range(long n, const long a[6])
{
	long r = call_forward(n, a);
	int saved = errno;

	if (r == 0 && !((unsigned)a[2] & CLOSE_RANGE_CLOEXEC) && (unsigned)a[0] <= (unsigned)a[1]) {
		fds_drop_range((unsigned)a[0], (unsigned)a[1]);
		errno = saved;
	}
	return r;
}

/* dup, dup2, dup3 and fcntl(F_DUPFD*) by number: the copy holds the socket. */
static long
call_copy(long n, const long a[6], bool over)
{
	int oldfd = (int)a[0];
	bool in = fds_gate_copy(oldfd);
	long r = call_forward(n, a);
	int saved = errno, newfd = over ? (int)a[1] : (int)r;

	if (r >= 0 && oldfd != newfd && (fdt_get(oldfd) != 0 || fdt_get(newfd) != 0))
		fds_copy(oldfd, newfd);
	fds_gate_done(in);
	errno = saved;
	return r;
}

/* fork and clone by number: the child is one the fork wrapper did not
 * prepare, so shim_foreign() asks the kernel for the pid while it may run
 * (as clone() in spawn.c does), and what it may inherit is watched
 * (spawn_prepare) unless it shares our descriptor table. A child sharing
 * our memory for good keeps the count raised. */
static long
call_spawn(long n, const long a[6], unsigned long flags)
{
	bool prepared = !(flags & CLONE_FILES) && spawn_prepare();
	long r;
	int saved;

	atomic_fetch_add(&shim_unseen, 1);
	r = call_forward(n, a);
	saved = errno;
	if (r != 0) {
		if (!(flags & CLONE_VM) || (flags & CLONE_VFORK) || r < 0)
			atomic_fetch_sub(&shim_unseen, 1);
		spawn_done(prepared);
	}
	errno = saved;
	return r;
}

BS_EXPORT long
syscall(long n, ...)
{
	va_list ap;
	long a[6];

	va_start(ap, n);
	for (int i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	switch (n) {
	case SYS_close:
		return call_close(n, a);
#ifdef SYS_close_range
	case SYS_close_range:
		return call_close_range(n, a);
#endif
	case SYS_dup:
		return call_copy(n, a, false);
#ifdef SYS_dup2
	case SYS_dup2:
#endif
	case SYS_dup3:
		return call_copy(n, a, true);
	case SYS_fcntl:
		if (a[1] == F_DUPFD || a[1] == F_DUPFD_CLOEXEC)
			return call_copy(n, a, false);
		break;
	case SYS_connect:
		return connect((int)a[0], (const struct sockaddr *)a[1], (socklen_t)a[2]);
	case SYS_socket:
		return socket((int)a[0], (int)a[1], (int)a[2]);
	case SYS_accept4:
		return accept4((int)a[0], (struct sockaddr *)a[1], (socklen_t *)a[2], (int)a[3]);
#ifdef SYS_fork
	case SYS_fork:
		return call_spawn(n, a, 0);
#endif
	case SYS_clone:
		return call_spawn(n, a, (unsigned long)a[0]);
#ifdef SYS_clone3
	case SYS_clone3:
		return call_spawn(n, a, a[0] != 0 ? (unsigned long)*(const uint64_t *)a[0] : 0);
#endif
	}
	return call_forward(n, a);
}
#endif


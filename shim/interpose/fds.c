/* fds.c - descriptors that come and go: socket, accept, close, dup, fcntl, close_range, closefrom, fclose. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include "interpose/interpose.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

/* fresh_fd's rare case, out of line. */
static __attribute__((noinline)) void
stale_fd(int fd)
{
	int saved = errno;

	if (shim_active() && !shim_foreign())
		slot_drop(shim.seg, fdt_take(fd) - 1);
	errno = saved;
}

/* A descriptor number just handed out by the kernel: if the table still
 * marks it counted, the socket it stood for vanished unseen (closefrom,
 * a raw close system call), and its hold goes back now (stale_fd, which
 * keeps errno: the caller need not). fdt_get of a negative fd is 0. */
static inline void
fresh_fd(int fd)
{
	if (__builtin_expect(fdt_get(fd) != 0, 0))
		stale_fd(fd);
}

void
fds_copy(int oldfd, int newfd)
{
	uint32_t e = fdt_get(oldfd);

	if (!shim_active() || shim_foreign())
		return;
	if (e != 0)
		slot_hold(shim.seg, e - 1);
	slot_drop(shim.seg, (e != 0 ? fdt_set(newfd, e - 1) : fdt_take(newfd)) - 1);
}

BS_EXPORT int
close(int fd)
{
	uint32_t e;
	int r, saved;

	if (fdt_get(fd) == 0)
		return real.close(fd);
	if (!shim_active() || shim_foreign())
		return real.close(fd);
	/* The entry goes first: once the real close returns, the number may
	 * already belong to a new socket of another thread. Linux frees the
	 * descriptor even when close fails, so the hold always goes. */
	e = fdt_take_counted(fd);
	r = real.close(fd);
	saved = errno;
	slot_drop(shim.seg, e - 1);
	errno = saved;
	return r;
}

/*
 * Copying a counted descriptor happens inside the fork gate: a fork between
 * the copy and its bookkeeping would give the child two descriptors of the
 * socket and a count of one, and its first close would free a socket it
 * still has. Returns true if the caller must leave the gate.
 */
bool
fds_gate_copy(int fd)
{
	if (fdt_get(fd) == 0 || !shim_active() || shim_foreign())
		return false;
	proc_gate_enter(shim.seg);
	return true;
}

void
fds_gate_done(bool in)
{
	if (in)
		proc_gate_leave(shim.seg);
}

BS_EXPORT int
dup(int fd)
{
	bool in = fds_gate_copy(fd);
	int r = real.dup(fd), saved = errno;

	if (r >= 0 && (fdt_get(fd) != 0 || fdt_get(r) != 0))
		fds_copy(fd, r);
	fds_gate_done(in);
	errno = saved;
	return r;
}

/* dup2 and dup3 close newfd first: a counted socket there loses a holder. */
static int
dup_over(int oldfd, int newfd, int r, bool in)
{
	int saved = errno;

	if (r >= 0 && oldfd != newfd && (fdt_get(oldfd) != 0 || fdt_get(newfd) != 0))
		fds_copy(oldfd, newfd);
	fds_gate_done(in);
	errno = saved;
	return r;
}

BS_EXPORT int
dup2(int oldfd, int newfd)
{
	bool in = fds_gate_copy(oldfd);

	return dup_over(oldfd, newfd, real.dup2(oldfd, newfd), in);
}

BS_EXPORT int
dup3(int oldfd, int newfd, int flags)
{
	bool in = fds_gate_copy(oldfd);

	return dup_over(oldfd, newfd, real.dup3(oldfd, newfd, flags), in);
}

/* fcntl's third argument is an int or a pointer; passing it on as a
 * pointer-sized value is what glibc itself does on every ABI we run on. */
static int
fcntl_common(int (*fn)(int, int, ...), int fd, int cmd, void *arg)
{
	bool dupfd = cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC;
	bool in = dupfd && fds_gate_copy(fd);
	int r = fn(fd, cmd, arg), saved = errno;

	if (r >= 0 && dupfd && (fdt_get(fd) != 0 || fdt_get(r) != 0))
		fds_copy(fd, r);
	fds_gate_done(in);
	errno = saved;
	return r;
}

BS_EXPORT int
fcntl(int fd, int cmd, ...)
{
	va_list ap;
	void *arg;

	va_start(ap, cmd);
	arg = va_arg(ap, void *);
	va_end(ap);
	return fcntl_common(real.fcntl, fd, cmd, arg);
}

BS_EXPORT int
fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	void *arg;

	va_start(ap, cmd);
	arg = va_arg(ap, void *);
	va_end(ap);
	return fcntl_common(real.fcntl64, fd, cmd, arg);
}

/* Forgets every counted descriptor in [first, last] after a range close. */
void
fds_drop_range(unsigned first, unsigned last)
{
	unsigned high = (unsigned)fdt_high();

	if (!shim_active() || shim_foreign())
		return;
	if (last >= high)
		last = high == 0 ? 0 : high - 1;
	for (unsigned fd = first; fd <= last && fd < high; fd++) {
		if (fdt_get((int)fd) != 0)
			slot_drop(shim.seg, fdt_take((int)fd) - 1);
	}
}

/* Forgets every table entry without giving anything back: the record
 * they were held under is gone. */
void
fds_forget_all(void)
{
	for (int fd = 0; fd < fdt_high(); fd++)
		fdt_take(fd);
}

BS_EXPORT int
close_range(unsigned first, unsigned last, int flags)
{
	int r = real.close_range(first, last, flags), saved = errno;

	/* With CLOSE_RANGE_CLOEXEC nothing closes now; the descriptors go
	 * at exec, and the new image drops their holds when it starts. */
	if (r == 0 && !(flags & CLOSE_RANGE_CLOEXEC) && first <= last) {
		fds_drop_range(first, last);
		errno = saved;
	}
	return r;
}

BS_EXPORT void
closefrom(int lowfd)
{
	int saved;

	real.closefrom(lowfd);
	saved = errno;
	fds_drop_range(lowfd < 0 ? 0 : (unsigned)lowfd, ~0U);
	errno = saved;
}

BS_EXPORT int
fclose(FILE *fp)
{
	int saved = errno, fd, r;
	uint32_t e;

	/* fileno sets EBADF for streams without a descriptor (fmemopen):
	 * a successful fclose must not leave that behind. */
	fd = fp != NULL ? fileno(fp) : -1;
	errno = saved;
	if (fd < 0 || fdt_get(fd) == 0 || !shim_active() || shim_foreign())
		return real.fclose(fp);
	/* fclose closes through glibc's internal close, which no wrapper
	 * sees: this is the only place to notice an fdopen'ed socket go. */
	e = fdt_take(fd);
	r = real.fclose(fp);
	saved = errno;
	slot_drop(shim.seg, e - 1);
	errno = saved;
	return r;
}

void
shim_adopt_fd(int fd, uint32_t slot)
{
	fdt_set(fd, slot);
}

/* Sockets a fork may share before they are connected are marked (inside
 * the fork gate, so a fork sees the mark or no socket). */
BS_EXPORT int
socket(int domain, int type, int protocol)
{
	bool mark = (type & 0xf) == SOCK_STREAM &&
	    (domain == AF_INET || domain == AF_INET6 || domain == AF_UNIX) && shim_active();
	int r;

	/* No getpid here: in a vfork child (which shares our memory but not
	 * our descriptors) a mark is at worst stale, and stale marks are
	 * harmless (fork and connect check the socket behind the number). */
	if (mark)
		proc_gate_enter(shim.seg);
	/* Nothing after the real call sets errno (fresh_fd keeps it). */
	r = real.socket(domain, type, protocol);
	fresh_fd(r);
	if (r >= 0) {
		if (mark)
			fdt_mark_fresh(r);
		else
			fdt_clear_fresh(r);
	}
	if (mark)
		proc_gate_leave(shim.seg);
	return r;
}

BS_EXPORT int
accept(int fd, struct sockaddr *sa, socklen_t *len)
{
	int r = real.accept(fd, sa, len);

	fresh_fd(r);
	return r;
}

BS_EXPORT int
accept4(int fd, struct sockaddr *sa, socklen_t *len, int flags)
{
	int r = real.accept4(fd, sa, len, flags);

	fresh_fd(r);
	return r;
}


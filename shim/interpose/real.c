/* real.c - binding the real libc functions behind the wrappers, once. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "interpose/interpose.h"

/*
 * Every entry of `real` starts out pointing at a trampoline below. The first
 * call binds all entries with dlsym(RTLD_NEXT) and then forwards. dlsym may
 * call malloc, and a preloaded malloc may call back into a wrapper: such a
 * recursive call (or one from another thread while binding runs) finds the
 * binding in progress and uses the raw system call instead, so nothing ever
 * waits or recurses. The entries are never NULL.
 */

enum { BIND_NONE, BIND_RUNNING, BIND_DONE };

/* The trampolines' fallback before libc is bound: the system call itself
 * (sys.c), never the exported syscall() wrapper, which would enter the
 * shim again. */
#define RAW(n, a1, a2, a3) sys_call((n), (long)(a1), (long)(a2), (long)(a3), 0, 0, 0)
/* The fallbacks that names.h writes: the system call, ENOSYS, the size
 * check of the _FORTIFY_SOURCE entry points. */
#define FB_SYS(type, n, a1, a2, a3)	((type)RAW(n, a1, a2, a3))
#define FB_SYS6(type, n, a1, a2, a3, a4, a5, a6)				\
	((type)sys_call((n), (long)(a1), (long)(a2), (long)(a3), (long)(a4), (long)(a5),	\
	    (long)(a6)))
#define FB_ENOSYS(v)	(errno = ENOSYS, (v))
#define FB_CHECKED(n, buflen, call)	((n) > (buflen) ? (abort(), (ssize_t)0) : (call))

static _Atomic int bind_state;
/* libc's syscall(), apart from `real`: it is variadic, and reached only
 * through real_syscall6 below, which falls back to the instruction. */
static long (*libc_syscall)(long, ...);

#define TR_DECLARE(kind, field, sym, ret, params, args, fallback) static ret tr_##field params;
BS_NAMES(TR_DECLARE)

#define TR_INIT(kind, field, sym, ret, params, args, fallback) .field = tr_##field,
struct real_fns real = {
	BS_NAMES(TR_INIT)
};

static void *
bind_one(const char *name, void *self)
{
	void *p = dlsym(RTLD_NEXT, name);

	if (p != NULL && p == self) {
		static const char msg[] =
		    "bulkshim: dlsym(RTLD_NEXT) returned the shim's own wrapper; aborting\n";
		RAW(SYS_write, 2, msg, sizeof(msg) - 1);
		abort();
	}
	return p;
}

/* Binds one entry, and aborts if dlsym hands back the shim's own wrapper
 * (its exported definition of that name). */
#define BIND(kind, field, sym, ret, params, args, fallback) do {		\
	void *p_ = bind_one(#sym, (void *)sym);					\
	if (p_ != NULL)								\
		memcpy(&fns.field, &p_, sizeof(p_));				\
} while (0);

void
real_bind(void)
{
	int expected = BIND_NONE;
	struct real_fns fns = real;
	int saved = errno;

	if (atomic_load_explicit(&bind_state, memory_order_acquire) == BIND_DONE)
		return;
	if (!atomic_compare_exchange_strong(&bind_state, &expected, BIND_RUNNING))
		return;		/* recursion, or another thread is binding */
	BS_NAMES(BIND)
	{
		void *p = bind_one("syscall", (void *)syscall);

		memcpy(&libc_syscall, &p, sizeof(p));
	}
	/* glibc before 2.28 has no fcntl64; fcntl is then the same call. */
	if (fns.fcntl64 == tr_fcntl64 && fns.fcntl != tr_fcntl)
		fns.fcntl64 = fns.fcntl;
	real = fns;
	atomic_store_explicit(&bind_state, BIND_DONE, memory_order_release);
	errno = saved;
}

bool
real_bound(void)
{
	return atomic_load_explicit(&bind_state, memory_order_acquire) == BIND_DONE;
}

/*
 * The trampolines. After real_bind() the entry points at libc unless libc
 * lacks the symbol, in which case it still points here and the fallback of
 * names.h serves: the raw system call (close_range and closefrom before
 * glibc 2.34), or ENOSYS.
 */
#define FORWARD(field, tramp, ...) do {					\
	real_bind();							\
	if (real.field != tramp)					\
		return real.field(__VA_ARGS__);				\
} while (0)

#define TR_TRAMP(field, ret, params, args, fallback)				\
static ret									\
tr_##field params								\
{										\
	real_bind();								\
	if (real.field != tr_##field)						\
		return real.field args;						\
	return fallback;							\
}
#define TR_DEFINE_TRAMP(field, sym, ret, params, args, fallback)		\
	TR_TRAMP(field, ret, params, args, fallback)
#define TR_DEFINE_HAND(field, sym, ret, params, args, fallback)
#define TR_DEFINE(kind, field, sym, ret, params, args, fallback)		\
	TR_DEFINE_##kind(field, sym, ret, params, args, fallback)
BS_NAMES(TR_DEFINE)

/* The variadic ones and closefrom, by hand. */
static int
tr_fcntl(int fd, int cmd, ...)
{
	va_list ap;
	void *arg;

	va_start(ap, cmd);
	arg = va_arg(ap, void *);
	va_end(ap);
	FORWARD(fcntl, tr_fcntl, fd, cmd, arg);
	return (int)RAW(SYS_fcntl, fd, cmd, arg);
}

static int
tr_fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	void *arg;

	va_start(ap, cmd);
	arg = va_arg(ap, void *);
	va_end(ap);
	FORWARD(fcntl64, tr_fcntl64, fd, cmd, arg);
	return (int)RAW(SYS_fcntl, fd, cmd, arg);
}

static void
tr_closefrom(int lowfd)
{
	real_bind();
	if (real.closefrom != tr_closefrom) {
		real.closefrom(lowfd);
		return;
	}
	if (lowfd < 0)
		lowfd = 0;
	RAW(SYS_close_range, (unsigned)lowfd, ~0U, 0);
}

static int
tr_clone(int (*fn)(void *), void *stack, int flags, void *arg, ...)
{
	va_list ap;
	void *ptid, *tls, *ctid;

	va_start(ap, arg);
	ptid = va_arg(ap, void *);
	tls = va_arg(ap, void *);
	ctid = va_arg(ap, void *);
	va_end(ap);
	FORWARD(clone, tr_clone, fn, stack, flags, arg, ptid, tls, ctid);
	errno = ENOSYS;
	return -1;
}

long
real_syscall6(long n, const long a[6])
{
	real_bind();
	if (real_bound() && libc_syscall != NULL)
		return libc_syscall(n, a[0], a[1], a[2], a[3], a[4], a[5]);
	return sys_call(n, a[0], a[1], a[2], a[3], a[4], a[5]);
}

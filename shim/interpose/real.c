/* real.c - binding the real libc functions behind the wrappers, once. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <sched.h>
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
static _Atomic int bind_state;
/* libc's syscall(), apart from `real`: it is variadic, and reached only
 * through real_syscall6 below, which falls back to the instruction. */
static long (*libc_syscall)(long, ...);

static int tr_connect(int, const struct sockaddr *, socklen_t);
static int tr_close(int);
static int tr_dup(int);
static int tr_dup2(int, int);
static int tr_dup3(int, int, int);
static int tr_fcntl(int, int, ...);
static int tr_fcntl64(int, int, ...);
static int tr_close_range(unsigned, unsigned, int);
static void tr_closefrom(int);
static int tr_fclose(void *);
static pid_t tr_fork(void);
static int tr_socket(int, int, int);
static int tr_accept(int, struct sockaddr *, socklen_t *);
static int tr_accept4(int, struct sockaddr *, socklen_t *, int);
static ssize_t tr_sendto(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
static ssize_t tr_sendmsg(int, const struct msghdr *, int);
static int tr_getaddrinfo(const char *, const char *, const struct addrinfo *,
    struct addrinfo **);
static ssize_t tr_send(int, const void *, size_t, int);
static ssize_t tr_write(int, const void *, size_t);
static ssize_t tr_writev(int, const struct iovec *, int);
static int tr_sendmmsg(int, struct mmsghdr *, unsigned, int);
static ssize_t tr_sendfile(int, int, off_t *, size_t);
static ssize_t tr_sendfile64(int, int, off_t *, size_t);
static ssize_t tr_recv(int, void *, size_t, int);
static ssize_t tr_recvfrom(int, void *, size_t, int, struct sockaddr *, socklen_t *);
static ssize_t tr_recvmsg(int, struct msghdr *, int);
static int tr_recvmmsg(int, struct mmsghdr *, unsigned, int, struct timespec *);
static ssize_t tr_read(int, void *, size_t);
static ssize_t tr_readv(int, const struct iovec *, int);
static ssize_t tr_recv_chk(int, void *, size_t, size_t, int);
static ssize_t tr_recvfrom_chk(int, void *, size_t, size_t, int, struct sockaddr *, socklen_t *);
static ssize_t tr_read_chk(int, void *, size_t, size_t);
static pid_t tr__Fork(void);
static int tr_clone(int (*)(void *), void *, int, void *, ...);
static void *tr_dlopen(const char *, int);
static void *tr_dlmopen(long, const char *, int);

struct real_fns real = {
	.connect = tr_connect,
	.close = tr_close,
	.dup = tr_dup,
	.dup2 = tr_dup2,
	.dup3 = tr_dup3,
	.fcntl = tr_fcntl,
	.fcntl64 = tr_fcntl64,
	.close_range = tr_close_range,
	.closefrom = tr_closefrom,
	.fclose = tr_fclose,
	.fork = tr_fork,
	.socket = tr_socket,
	.accept = tr_accept,
	.accept4 = tr_accept4,
	.sendto = tr_sendto,
	.sendmsg = tr_sendmsg,
	.getaddrinfo = tr_getaddrinfo,
	.send = tr_send,
	.write = tr_write,
	.writev = tr_writev,
	.sendmmsg = tr_sendmmsg,
	.sendfile = tr_sendfile,
	.sendfile64 = tr_sendfile64,
	.recv = tr_recv,
	.recvfrom = tr_recvfrom,
	.recvmsg = tr_recvmsg,
	.recvmmsg = tr_recvmmsg,
	.read = tr_read,
	.readv = tr_readv,
	.recv_chk = tr_recv_chk,
	.recvfrom_chk = tr_recvfrom_chk,
	.read_chk = tr_read_chk,
	._Fork = tr__Fork,
	.clone = tr_clone,
	.dlopen = tr_dlopen,
	.dlmopen = tr_dlmopen,
};

/* Our own exported wrappers, to detect dlsym handing them back. */
extern int connect(int, const struct sockaddr *, socklen_t);
extern int close(int);

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

#define BIND(field, name, self) do {					\
	void *p_ = bind_one(name, self);				\
	if (p_ != NULL)							\
		memcpy(&fns.field, &p_, sizeof(p_));			\
} while (0)

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
	BIND(connect, "connect", (void *)connect);
	BIND(close, "close", (void *)close);
	BIND(dup, "dup", NULL);
	BIND(dup2, "dup2", NULL);
	BIND(dup3, "dup3", NULL);
	BIND(fcntl, "fcntl", NULL);
	BIND(fcntl64, "fcntl64", NULL);
	BIND(close_range, "close_range", NULL);
	BIND(closefrom, "closefrom", NULL);
	BIND(fclose, "fclose", NULL);
	BIND(fork, "fork", NULL);
	BIND(socket, "socket", NULL);
	BIND(accept, "accept", NULL);
	BIND(accept4, "accept4", NULL);
	BIND(sendto, "sendto", NULL);
	BIND(sendmsg, "sendmsg", NULL);
	BIND(getaddrinfo, "getaddrinfo", NULL);
	BIND(send, "send", NULL);
	BIND(write, "write", NULL);
	BIND(writev, "writev", NULL);
	BIND(sendmmsg, "sendmmsg", NULL);
	BIND(sendfile, "sendfile", NULL);
	BIND(sendfile64, "sendfile64", NULL);
	BIND(recv, "recv", NULL);
	BIND(recvfrom, "recvfrom", NULL);
	BIND(recvmsg, "recvmsg", NULL);
	BIND(recvmmsg, "recvmmsg", NULL);
	BIND(read, "read", NULL);
	BIND(readv, "readv", NULL);
	BIND(recv_chk, "__recv_chk", NULL);
	BIND(recvfrom_chk, "__recvfrom_chk", NULL);
	BIND(read_chk, "__read_chk", NULL);
	BIND(_Fork, "_Fork", NULL);
	BIND(clone, "clone", NULL);
	{
		void *p = bind_one("syscall", (void *)syscall);

		memcpy(&libc_syscall, &p, sizeof(p));
	}
	BIND(dlopen, "dlopen", (void *)dlopen);
	BIND(dlmopen, "dlmopen", (void *)dlmopen);
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
 * lacks the symbol, in which case it still points here and the raw system
 * call serves (close_range and closefrom before glibc 2.34).
 */
#define FORWARD(field, tramp, ...) do {					\
	real_bind();							\
	if (real.field != tramp)					\
		return real.field(__VA_ARGS__);				\
} while (0)

static int
tr_connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	FORWARD(connect, tr_connect, fd, sa, len);
	return (int)RAW(SYS_connect, fd, sa, len);
}

static int
tr_close(int fd)
{
	FORWARD(close, tr_close, fd);
	return (int)RAW(SYS_close, fd, 0, 0);
}

static int
tr_dup(int fd)
{
	FORWARD(dup, tr_dup, fd);
	return (int)RAW(SYS_dup, fd, 0, 0);
}

static int
tr_dup2(int fd, int fd2)
{
	FORWARD(dup2, tr_dup2, fd, fd2);
	if (fd == fd2)
		return (int)RAW(SYS_fcntl, fd, F_GETFD, 0) < 0 ? -1 : fd;
	return (int)RAW(SYS_dup3, fd, fd2, 0);
}

static int
tr_dup3(int fd, int fd2, int flags)
{
	FORWARD(dup3, tr_dup3, fd, fd2, flags);
	return (int)RAW(SYS_dup3, fd, fd2, flags);
}

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

static int
tr_close_range(unsigned first, unsigned last, int flags)
{
	FORWARD(close_range, tr_close_range, first, last, flags);
	return (int)RAW(SYS_close_range, first, last, flags);
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
tr_fclose(void *fp)
{
	FORWARD(fclose, tr_fclose, fp);
	errno = ENOSYS;
	return EOF;
}

static pid_t
tr_fork(void)
{
	FORWARD(fork, tr_fork);
	errno = ENOSYS;
	return -1;
}

/* _Fork is glibc 2.34's. */
static pid_t
tr__Fork(void)
{
	FORWARD(_Fork, tr__Fork);
	errno = ENOSYS;
	return -1;
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

static int
tr_socket(int domain, int type, int protocol)
{
	FORWARD(socket, tr_socket, domain, type, protocol);
	return (int)RAW(SYS_socket, domain, type, protocol);
}

static int
tr_accept(int fd, struct sockaddr *sa, socklen_t *len)
{
	FORWARD(accept, tr_accept, fd, sa, len);
	return (int)RAW(SYS_accept4, fd, sa, len);
}

static int
tr_accept4(int fd, struct sockaddr *sa, socklen_t *len, int flags)
{
	FORWARD(accept4, tr_accept4, fd, sa, len, flags);
	return (int)sys_call(SYS_accept4, fd, (long)sa, (long)len, flags, 0, 0);
}

static ssize_t
tr_sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *sa,
    socklen_t len)
{
	FORWARD(sendto, tr_sendto, fd, buf, n, flags, sa, len);
	return sys_call(SYS_sendto, fd, (long)buf, (long)n, flags, (long)sa, (long)len);
}

static ssize_t
tr_sendmsg(int fd, const struct msghdr *msg, int flags)
{
	FORWARD(sendmsg, tr_sendmsg, fd, msg, flags);
	return RAW(SYS_sendmsg, fd, msg, flags);
}

static int
tr_getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
    struct addrinfo **res)
{
	FORWARD(getaddrinfo, tr_getaddrinfo, node, service, hints, res);
	errno = ENOSYS;
	return EAI_SYSTEM;
}

static ssize_t
tr_send(int fd, const void *buf, size_t n, int flags)
{
	FORWARD(send, tr_send, fd, buf, n, flags);
	return sys_call(SYS_sendto, fd, (long)buf, (long)n, flags, 0, 0);
}

static ssize_t
tr_write(int fd, const void *buf, size_t n)
{
	FORWARD(write, tr_write, fd, buf, n);
	return RAW(SYS_write, fd, buf, n);
}

static ssize_t
tr_writev(int fd, const struct iovec *iov, int cnt)
{
	FORWARD(writev, tr_writev, fd, iov, cnt);
	return RAW(SYS_writev, fd, iov, cnt);
}

static int
tr_sendmmsg(int fd, struct mmsghdr *v, unsigned n, int flags)
{
	FORWARD(sendmmsg, tr_sendmmsg, fd, v, n, flags);
	return (int)sys_call(SYS_sendmmsg, fd, (long)v, n, flags, 0, 0);
}

static ssize_t
tr_sendfile(int out, int in, off_t *off, size_t n)
{
	FORWARD(sendfile, tr_sendfile, out, in, off, n);
	return sys_call(SYS_sendfile, out, in, (long)off, (long)n, 0, 0);
}

static ssize_t
tr_sendfile64(int out, int in, off_t *off, size_t n)
{
	FORWARD(sendfile64, tr_sendfile64, out, in, off, n);
	return sys_call(SYS_sendfile, out, in, (long)off, (long)n, 0, 0);
}

static ssize_t
tr_recv(int fd, void *buf, size_t n, int flags)
{
	FORWARD(recv, tr_recv, fd, buf, n, flags);
	return sys_call(SYS_recvfrom, fd, (long)buf, (long)n, flags, 0, 0);
}

static ssize_t
tr_recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *sa, socklen_t *len)
{
	FORWARD(recvfrom, tr_recvfrom, fd, buf, n, flags, sa, len);
	return sys_call(SYS_recvfrom, fd, (long)buf, (long)n, flags, (long)sa, (long)len);
}

static ssize_t
tr_recvmsg(int fd, struct msghdr *msg, int flags)
{
	FORWARD(recvmsg, tr_recvmsg, fd, msg, flags);
	return RAW(SYS_recvmsg, fd, msg, flags);
}

static int
tr_recvmmsg(int fd, struct mmsghdr *v, unsigned n, int flags, struct timespec *tmo)
{
	FORWARD(recvmmsg, tr_recvmmsg, fd, v, n, flags, tmo);
	return (int)sys_call(SYS_recvmmsg, fd, (long)v, n, flags, (long)tmo, 0);
}

static ssize_t
tr_read(int fd, void *buf, size_t n)
{
	FORWARD(read, tr_read, fd, buf, n);
	return RAW(SYS_read, fd, buf, n);
}

static ssize_t
tr_readv(int fd, const struct iovec *iov, int cnt)
{
	FORWARD(readv, tr_readv, fd, iov, cnt);
	return RAW(SYS_readv, fd, iov, cnt);
}

/* The _FORTIFY_SOURCE entry points check the buffer size, then receive. */
static ssize_t
tr_recv_chk(int fd, void *buf, size_t n, size_t buflen, int flags)
{
	FORWARD(recv_chk, tr_recv_chk, fd, buf, n, buflen, flags);
	if (n > buflen)
		abort();
	return tr_recv(fd, buf, n, flags);
}

static ssize_t
tr_recvfrom_chk(int fd, void *buf, size_t n, size_t buflen, int flags, struct sockaddr *sa,
    socklen_t *len)
{
	FORWARD(recvfrom_chk, tr_recvfrom_chk, fd, buf, n, buflen, flags, sa, len);
	if (n > buflen)
		abort();
	return tr_recvfrom(fd, buf, n, flags, sa, len);
}

static ssize_t
tr_read_chk(int fd, void *buf, size_t n, size_t buflen)
{
	FORWARD(read_chk, tr_read_chk, fd, buf, n, buflen);
	if (n > buflen)
		abort();
	return tr_read(fd, buf, n);
}

static void *
tr_dlopen(const char *file, int mode)
{
	FORWARD(dlopen, tr_dlopen, file, mode);
	return NULL;
}

static void *
tr_dlmopen(long ns, const char *file, int mode)
{
	FORWARD(dlmopen, tr_dlmopen, ns, file, mode);
	return NULL;
}

long
real_syscall6(long n, const long a[6])
{
	real_bind();
	if (real_bound() && libc_syscall != NULL)
		return libc_syscall(n, a[0], a[1], a[2], a[3], a[4], a[5]);
	return sys_call(n, a[0], a[1], a[2], a[3], a[4], a[5]);
}

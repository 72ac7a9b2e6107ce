/* names.h - every libc name the library exports, written once: real.c's table, trampolines and binding, and the export test read it. */
#ifndef BULKSHIM_NAMES_H
#define BULKSHIM_NAMES_H

/*
 * BS_NAMES(X) lists the names whose libc function the wrappers reach through
 * `real` (real.c), one X(kind, field, symbol, ret, params, args, fallback)
 * each, in the order of struct real_fns:
 *   kind      TRAMP: real.c writes the trampoline from this line; HAND:
 *             real.c writes it by hand (variadic, or returning nothing)
 *   field     the member of struct real_fns
 *   symbol    the C name the library exports and dlsym binds (the wrapper
 *             of the same name: interpose/connect.c, fds.c, io.c, spawn.c,
 *             deepbind.c)
 *   ret, params, args  the function's type, and its parameters as passed on
 *   fallback  what the trampoline does when libc lacks the name, or while
 *             a recursive bind is under way: the system call itself
 *             (FB_SYS, FB_SYS6), or ENOSYS (FB_ENOSYS), as an expression
 *             of the parameters. Defined by the includer.
 * BS_NAMES_ONLY(Y) lists the names exported without a `real` entry: Y(symbol).
 * Nothing else is exported: the library is built hidden (BS_EXPORT marks
 * these), and tests/preload/test_exports.py holds `nm -D` and the list in
 * libbulkshim(7) to this file.
 */
#include <spawn.h>

/* signal()'s type, which the list cannot write as `ret`. */
typedef void (*bs_sighandler)(int);

#define BS_NAMES(X)								\
	X(TRAMP, connect, connect, int, (int fd, const struct sockaddr *sa, socklen_t len),	\
	    (fd, sa, len), FB_SYS(int, SYS_connect, fd, sa, len))			\
	X(TRAMP, close, close, int, (int fd), (fd), FB_SYS(int, SYS_close, fd, 0, 0))	\
	X(TRAMP, dup, dup, int, (int fd), (fd), FB_SYS(int, SYS_dup, fd, 0, 0))		\
	X(TRAMP, dup2, dup2, int, (int fd, int fd2), (fd, fd2),			\
	    fd == fd2 ? (FB_SYS(int, SYS_fcntl, fd, F_GETFD, 0) < 0 ? -1 : fd) :	\
	    FB_SYS(int, SYS_dup3, fd, fd2, 0))						\
	X(TRAMP, dup3, dup3, int, (int fd, int fd2, int flags), (fd, fd2, flags),	\
	    FB_SYS(int, SYS_dup3, fd, fd2, flags))					\
	X(HAND, fcntl, fcntl, int, (int fd, int cmd, ...), (), 0)			\
	X(HAND, fcntl64, fcntl64, int, (int fd, int cmd, ...), (), 0)			\
	X(TRAMP, close_range, close_range, int, (unsigned first, unsigned last, int flags),	\
	    (first, last, flags), FB_SYS(int, SYS_close_range, first, last, flags))	\
	X(HAND, closefrom, closefrom, void, (int lowfd), (), 0)			\
	X(TRAMP, fclose, fclose, int, (void *fp), (fp), FB_ENOSYS(EOF))		\
	X(TRAMP, fork, fork, pid_t, (void), (), FB_ENOSYS(-1))				\
	X(TRAMP, socket, socket, int, (int domain, int type, int protocol),		\
	    (domain, type, protocol), FB_SYS(int, SYS_socket, domain, type, protocol))	\
	X(TRAMP, accept, accept, int, (int fd, struct sockaddr *sa, socklen_t *len),	\
	    (fd, sa, len), FB_SYS(int, SYS_accept4, fd, sa, len))			\
	X(TRAMP, accept4, accept4, int,						\
	    (int fd, struct sockaddr *sa, socklen_t *len, int flags), (fd, sa, len, flags),	\
	    FB_SYS6(int, SYS_accept4, fd, sa, len, flags, 0, 0))			\
	X(TRAMP, sendto, sendto, ssize_t, (int fd, const void *buf, size_t n, int flags,	\
	    const struct sockaddr *sa, socklen_t len), (fd, buf, n, flags, sa, len),	\
	    FB_SYS6(ssize_t, SYS_sendto, fd, buf, n, flags, sa, len))			\
	X(TRAMP, sendmsg, sendmsg, ssize_t, (int fd, const struct msghdr *msg, int flags),	\
	    (fd, msg, flags), FB_SYS(ssize_t, SYS_sendmsg, fd, msg, flags))		\
	X(TRAMP, getaddrinfo, getaddrinfo, int, (const char *node, const char *service,	\
	    const struct addrinfo *hints, struct addrinfo **res), (node, service, hints, res),	\
	    FB_ENOSYS(EAI_SYSTEM))							\
	X(TRAMP, send, send, ssize_t, (int fd, const void *buf, size_t n, int flags),	\
	    (fd, buf, n, flags), FB_SYS6(ssize_t, SYS_sendto, fd, buf, n, flags, 0, 0))	\
	X(TRAMP, write, write, ssize_t, (int fd, const void *buf, size_t n), (fd, buf, n),	\
	    FB_SYS(ssize_t, SYS_write, fd, buf, n))					\
	X(TRAMP, writev, writev, ssize_t, (int fd, const struct iovec *iov, int cnt),	\
	    (fd, iov, cnt), FB_SYS(ssize_t, SYS_writev, fd, iov, cnt))			\
	X(TRAMP, sendmmsg, sendmmsg, int, (int fd, struct mmsghdr *v, unsigned n, int flags),	\
	    (fd, v, n, flags), FB_SYS6(int, SYS_sendmmsg, fd, v, n, flags, 0, 0))	\
	X(TRAMP, sendfile, sendfile, ssize_t, (int out, int in, off_t *off, size_t n),	\
	    (out, in, off, n), FB_SYS6(ssize_t, SYS_sendfile, out, in, off, n, 0, 0))	\
	X(TRAMP, sendfile64, sendfile64, ssize_t, (int out, int in, off_t *off, size_t n),	\
	    (out, in, off, n), FB_SYS6(ssize_t, SYS_sendfile, out, in, off, n, 0, 0))	\
	X(TRAMP, recv, recv, ssize_t, (int fd, void *buf, size_t n, int flags),	\
	    (fd, buf, n, flags), FB_SYS6(ssize_t, SYS_recvfrom, fd, buf, n, flags, 0, 0))	\
	X(TRAMP, recvfrom, recvfrom, ssize_t, (int fd, void *buf, size_t n, int flags,	\
	    struct sockaddr *sa, socklen_t *len), (fd, buf, n, flags, sa, len),	\
	    FB_SYS6(ssize_t, SYS_recvfrom, fd, buf, n, flags, sa, len))		\
	X(TRAMP, recvmsg, recvmsg, ssize_t, (int fd, struct msghdr *msg, int flags),	\
	    (fd, msg, flags), FB_SYS(ssize_t, SYS_recvmsg, fd, msg, flags))		\
	X(TRAMP, recvmmsg, recvmmsg, int, (int fd, struct mmsghdr *v, unsigned n, int flags,	\
	    struct timespec *tmo), (fd, v, n, flags, tmo),				\
	    FB_SYS6(int, SYS_recvmmsg, fd, v, n, flags, tmo, 0))			\
	X(TRAMP, read, read, ssize_t, (int fd, void *buf, size_t n), (fd, buf, n),	\
	    FB_SYS(ssize_t, SYS_read, fd, buf, n))					\
	X(TRAMP, readv, readv, ssize_t, (int fd, const struct iovec *iov, int cnt),	\
	    (fd, iov, cnt), FB_SYS(ssize_t, SYS_readv, fd, iov, cnt))			\
	X(TRAMP, recv_chk, __recv_chk, ssize_t,					\
	    (int fd, void *buf, size_t n, size_t buflen, int flags), (fd, buf, n, buflen, flags),	\
	    FB_CHECKED(n, buflen, tr_recv(fd, buf, n, flags)))				\
	X(TRAMP, recvfrom_chk, __recvfrom_chk, ssize_t, (int fd, void *buf, size_t n,	\
	    size_t buflen, int flags, struct sockaddr *sa, socklen_t *len),		\
	    (fd, buf, n, buflen, flags, sa, len),					\
	    FB_CHECKED(n, buflen, tr_recvfrom(fd, buf, n, flags, sa, len)))		\
	X(TRAMP, read_chk, __read_chk, ssize_t, (int fd, void *buf, size_t n, size_t buflen),	\
	    (fd, buf, n, buflen), FB_CHECKED(n, buflen, tr_read(fd, buf, n)))		\
	X(TRAMP, _Fork, _Fork, pid_t, (void), (), FB_ENOSYS(-1))			\
	X(TRAMP, posix_spawn, posix_spawn, int, (pid_t *pid, const char *path,		\
	    const posix_spawn_file_actions_t *fa, const posix_spawnattr_t *attr,	\
	    char *const argv[], char *const envp[]), (pid, path, fa, attr, argv, envp),	\
	    ENOSYS)									\
	X(TRAMP, posix_spawnp, posix_spawnp, int, (pid_t *pid, const char *file,	\
	    const posix_spawn_file_actions_t *fa, const posix_spawnattr_t *attr,	\
	    char *const argv[], char *const envp[]), (pid, file, fa, attr, argv, envp),	\
	    ENOSYS)									\
	X(TRAMP, popen, popen, void *, (const char *cmd, const char *mode), (cmd, mode),	\
	    FB_ENOSYS(NULL))								\
	X(TRAMP, system, system, int, (const char *cmd), (cmd), FB_ENOSYS(-1))	\
	X(HAND, clone, clone, int, (int (*fn)(void *), void *stack, int flags, void *arg, ...),	\
	    (), 0)									\
	X(TRAMP, sigaction, sigaction, int, (int sig, const struct sigaction *act,	\
	    struct sigaction *old), (sig, act, old), FB_ENOSYS(-1))			\
	X(TRAMP, signal, signal, bs_sighandler, (int sig, bs_sighandler h), (sig, h),	\
	    FB_ENOSYS(SIG_ERR))								\
	X(TRAMP, dlopen, dlopen, void *, (const char *file, int mode), (file, mode), NULL)	\
	X(TRAMP, dlmopen, dlmopen, void *, (long ns, const char *file, int mode),	\
	    (ns, file, mode), NULL)

/* syscall() is bound apart (real_syscall6: it is variadic, and its wrapper
 * forwards through it); vfork exists only on x86_64 (spawn.c). */
#if defined(__x86_64__)
#define BS_NAMES_ONLY(Y)	Y(syscall) Y(vfork)
#elif defined(__aarch64__)
#define BS_NAMES_ONLY(Y)	Y(syscall)
#else
#define BS_NAMES_ONLY(Y)
#endif

#endif

/* io.c - the send and receive families: requests in flight and I/O timeouts. */
#include <errno.h>
#include <poll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include "shim.h"

/* glibc declares these only for _FORTIFY_SOURCE builds. */
ssize_t __recv_chk(int, void *, size_t, size_t, int);
ssize_t __recvfrom_chk(int, void *, size_t, size_t, int, struct sockaddr *, socklen_t *);
ssize_t __read_chk(int, void *, size_t, size_t);

/*
 * A counted socket is in flight from its first send after being idle until
 * a receive returns at least one byte, end of file or a hard error (or the
 * socket closes). That is the window in which a slow dependency holds its
 * caller. Every wrapper here starts with the one table lookup; a descriptor
 * the shim does not count goes straight to libc with errno untouched.
 */

static struct seg_comp *
comp_of(uint32_t e)
{
	struct seg_slot *sl = seg_slot(shim.seg, e - 1);

	return sl != NULL ? seg_slot_comp(shim.seg, sl) : NULL;
}

/* The program's own SO_RCVTIMEO/SO_SNDTIMEO in ms, 0 if none. */
static uint64_t
own_timeout_ms(int fd, int opt)
{
	struct timeval tv = { 0, 0 };
	socklen_t len = sizeof(tv);

	if (getsockopt(fd, SOL_SOCKET, opt, &tv, &len) < 0)
		return 0;
	return (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000;
}

/*
 * io_timeout_ms for binaries that have none: before a blocking call, wait
 * for readiness at most that long. A shorter timeout the program set
 * itself wins (then its own call times out first). Returns 0 to go on, or
 * -1 with errno ETIMEDOUT.
 */
static int
wait_ready(int fd, uint32_t e, struct seg_comp *c, int flags, short events)
{
	uint32_t limit = c != NULL ? atomic_load(&c->io_timeout_ms) : 0;
	struct pollfd p = { .fd = fd, .events = events };
	uint64_t own, deadline, now;
	int r;

	if (limit == 0 || !shim_blocking(fd, flags))
		return 0;
	own = own_timeout_ms(fd, events == POLLIN ? SO_RCVTIMEO : SO_SNDTIMEO);
	if (own != 0 && own <= limit)
		return 0;
	deadline = now_mono_ms() + limit;
	for (;;) {
		now = now_mono_ms();
		if (now >= deadline)
			break;
		r = poll(&p, 1, (int)(deadline - now));
		if (r > 0 || (r < 0 && errno != EINTR))
			return 0;	/* ready, or let the real call report it */
	}
	atomic_fetch_add(&c->io_timeouts, 1);
	/* A call that timed out ends the request: the caller gives up. No
	 * reply came, so no reply latency is recorded. */
	seg_inflight_cancel(shim.seg, e - 1);
	errno = ETIMEDOUT;
	return -1;
}

/* Before a send on a counted socket: the request may begin (or be refused,
 * with errno set, returning -1). *began says this call made it in flight. */
static int
send_begin(int fd, uint32_t e, int flags, const char *what, bool *began)
{
	struct seg_slot *sl = seg_slot(shim.seg, e - 1);
	uint32_t comp = sl != NULL ? atomic_load(&sl->comp) : 0;
	struct seg_comp *c = sl != NULL ? seg_comp(shim.seg, comp) : NULL;
	enum bs_reason why = REASON_MAX;
	bool may_wait;
	int r;

	*began = false;
	if (c == NULL || !shim_active())
		return 0;
	seg_connect_done(shim.seg, e - 1);
	may_wait = atomic_load(&c->max_wait_ms) != 0 &&
	    atomic_load(&c->inflight) >= atomic_load(&c->inflight_limit) &&
	    shim_blocking(fd, flags);
	r = seg_inflight_begin(shim.seg, e - 1, may_wait, &why);
	if (r == -EBUSY) {
		shim_log_refusal(comp, why, what, "a counted socket");
		errno = shim_reject_errno(c);
		return -1;
	}
	*began = r == 1;
	/* A timeout here has already ended the request it began. */
	return wait_ready(fd, e, c, flags, POLLOUT);
}

/* After a send: one that sent nothing does not leave a request in flight. */
static void
send_end(uint32_t e, long r, bool began)
{
	int saved = errno;

	if (r < 0 && began)
		seg_inflight_cancel(shim.seg, e - 1);
	errno = saved;
}

/* After a receive: a byte, end of file or a hard error ends the request. */
static void
recv_end(uint32_t e, long r, bool asked)
{
	int saved = errno;

	if (!shim_active())
		return;
	seg_connect_done(shim.seg, e - 1);
	if (r > 0 || (r == 0 && asked))
		seg_inflight_end(shim.seg, e - 1);
	else if (r < 0 && saved != EAGAIN && saved != EWOULDBLOCK && saved != EINTR)
		seg_inflight_cancel(shim.seg, e - 1);
	errno = saved;
}

static bool
iov_asks(const struct iovec *iov, int cnt)
{
	for (int i = 0; iov != NULL && i < cnt; i++) {
		if (iov[i].iov_len > 0)
			return true;
	}
	return false;
}

/* Wraps one send-family call: SEND(real call expression). */
#define SEND_WRAP(fd, flags, what, call) do {				\
	uint32_t e_ = fdt_get(fd);					\
	bool began_;							\
	long r_;							\
									\
	if (e_ == 0)							\
		return call;						\
	if (send_begin(fd, e_, flags, what, &began_) < 0)		\
		return -1;						\
	r_ = call;							\
	send_end(e_, r_, began_);					\
	return r_;							\
} while (0)

/* Wraps one receive-family call; `asked` says a byte was asked for, so a
 * zero return means end of file rather than an empty request. */
#define RECV_WRAP(fd, flags, asked, call) do {				\
	uint32_t e_ = fdt_get(fd);					\
	long r_;							\
									\
	if (e_ == 0)							\
		return call;						\
	if (shim_active() && wait_ready(fd, e_, comp_of(e_), flags, POLLIN) < 0) \
		return -1;						\
	r_ = call;							\
	recv_end(e_, r_, asked);					\
	return r_;							\
} while (0)

BS_EXPORT ssize_t
send(int fd, const void *buf, size_t n, int flags)
{
	SEND_WRAP(fd, flags, "send", real.send(fd, buf, n, flags));
}

BS_EXPORT ssize_t
write(int fd, const void *buf, size_t n)
{
	SEND_WRAP(fd, 0, "write", real.write(fd, buf, n));
}

BS_EXPORT ssize_t
writev(int fd, const struct iovec *iov, int cnt)
{
	SEND_WRAP(fd, 0, "writev", real.writev(fd, iov, cnt));
}

BS_EXPORT int
sendmmsg(int fd, struct mmsghdr *v, unsigned n, int flags)
{
	SEND_WRAP(fd, flags, "sendmmsg", real.sendmmsg(fd, v, n, flags));
}

BS_EXPORT ssize_t
sendfile(int out, int in, off_t *off, size_t n)
{
	SEND_WRAP(out, 0, "sendfile", real.sendfile(out, in, off, n));
}

BS_EXPORT ssize_t
sendfile64(int out, int in, off_t *off, size_t n)
{
	SEND_WRAP(out, 0, "sendfile", real.sendfile64(out, in, off, n));
}

/* sendto and sendmsg also connect implicitly with MSG_FASTOPEN. */
BS_EXPORT ssize_t
sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *sa, socklen_t len)
{
	int saved = errno;
	enum admit a;
	ssize_t r;

	if (!(flags & MSG_FASTOPEN) || sa == NULL || !shim_active())
		SEND_WRAP(fd, flags, "sendto", real.sendto(fd, buf, n, flags, sa, len));
	a = shim_admit(fd, sa, len, "sendto");
	if (a == ADMIT_REFUSED)
		return -1;
	errno = saved;
	r = real.sendto(fd, buf, n, flags, sa, len);
	if (a == ADMIT_COUNTED)
		shim_settle(fd, r);
	return r;
}

BS_EXPORT ssize_t
sendmsg(int fd, const struct msghdr *msg, int flags)
{
	int saved = errno;
	enum admit a;
	ssize_t r;

	if (!(flags & MSG_FASTOPEN) || msg == NULL || msg->msg_name == NULL || !shim_active())
		SEND_WRAP(fd, flags, "sendmsg", real.sendmsg(fd, msg, flags));
	a = shim_admit(fd, msg->msg_name, msg->msg_namelen, "sendmsg");
	if (a == ADMIT_REFUSED)
		return -1;
	errno = saved;
	r = real.sendmsg(fd, msg, flags);
	if (a == ADMIT_COUNTED)
		shim_settle(fd, r);
	return r;
}

BS_EXPORT ssize_t
recv(int fd, void *buf, size_t n, int flags)
{
	RECV_WRAP(fd, flags, n > 0, real.recv(fd, buf, n, flags));
}

BS_EXPORT ssize_t
recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *sa, socklen_t *len)
{
	RECV_WRAP(fd, flags, n > 0, real.recvfrom(fd, buf, n, flags, sa, len));
}

BS_EXPORT ssize_t
recvmsg(int fd, struct msghdr *msg, int flags)
{
	RECV_WRAP(fd, flags, msg != NULL && iov_asks(msg->msg_iov, (int)msg->msg_iovlen),
	    real.recvmsg(fd, msg, flags));
}

BS_EXPORT int
recvmmsg(int fd, struct mmsghdr *v, unsigned n, int flags, struct timespec *tmo)
{
	RECV_WRAP(fd, flags, n > 0, real.recvmmsg(fd, v, n, flags, tmo));
}

BS_EXPORT ssize_t
read(int fd, void *buf, size_t n)
{
	RECV_WRAP(fd, 0, n > 0, real.read(fd, buf, n));
}

BS_EXPORT ssize_t
readv(int fd, const struct iovec *iov, int cnt)
{
	RECV_WRAP(fd, 0, iov_asks(iov, cnt), real.readv(fd, iov, cnt));
}

/* The _FORTIFY_SOURCE entry points that hardened builds call instead. */
BS_EXPORT ssize_t
__recv_chk(int fd, void *buf, size_t n, size_t buflen, int flags)
{
	RECV_WRAP(fd, flags, n > 0, real.recv_chk(fd, buf, n, buflen, flags));
}

BS_EXPORT ssize_t
__recvfrom_chk(int fd, void *buf, size_t n, size_t buflen, int flags, struct sockaddr *sa,
    socklen_t *len)
{
	RECV_WRAP(fd, flags, n > 0, real.recvfrom_chk(fd, buf, n, buflen, flags, sa, len));
}

BS_EXPORT ssize_t
__read_chk(int fd, void *buf, size_t n, size_t buflen)
{
	RECV_WRAP(fd, 0, n > 0, real.read_chk(fd, buf, n, buflen));
}

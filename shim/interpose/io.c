/* io.c - the send and receive families: requests in flight and I/O timeouts. */
#include <errno.h>
#include <poll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include "interpose/interpose.h"

/*
 * A counted socket is in flight from its first send after being idle until
 * a receive returns at least one byte, end of file or a hard error (or the
 * socket closes). That is the window in which a slow dependency holds its
 * caller. Every wrapper here starts with the one table lookup; a descriptor
 * the shim does not count goes straight to libc with errno untouched.
 *
 * Most compartments limit only connections: their sockets' I/O has nothing
 * to count or bound. The first I/O on such a socket caches that verdict in
 * its table entry (FDT_PLAIN with the segment's settings sequence), and
 * from then on its sends and receives go straight to libc too, until a
 * `bulkshim set` or `reload` bumps the sequence. A limit set live thus takes
 * effect on an open socket at its next send or receive: a request that was
 * already in flight then is not counted (at most one request late). A
 * limit removed live lets the request in flight end normally first.
 *
 * Those sockets' reply latency (h_reply, which `bulkshim suggest` reads) is
 * sampled: one send in IO_SAMPLE of each thread goes the slow way, times
 * its reply and records it with weight IO_SAMPLE.
 *
 * In a compartment with max_inflight every request is counted, but its
 * reply latency too is sampled: one request in REQ_SAMPLE of the
 * compartment (by its inflight_admitted count, so the first is one) is
 * timed and recorded with weight REQ_SAMPLE; the others read no clock.
 * While the compartment's adaptive limit is on, every request is timed
 * with weight 1 (permit.c, permit_request_begin).
 */
#define IO_SAMPLE	64u

static __thread unsigned io_tick __attribute__((tls_model("initial-exec")));

/* Whether slot sl of compartment c has a request counted in flight. */
static bool
in_flight(struct seg_slot *sl, struct seg_comp *c)
{
	return permit_in_flight(shim.seg, (uint32_t)(sl - shim.seg->slots), c);
}

/*
 * Caches the verdict "nothing to do on I/O" for fd (entry e, of slot sl in
 * compartment c) if it holds: no in-flight limit, no I/O timeout, no
 * request still counted in flight and the connect already timed. The
 * sequence is read before the settings, so a change after it makes the
 * verdict stale at once. Returns whether it holds.
 */
static __attribute__((noinline)) bool
cache_plain_now(int fd, uint64_t e, struct seg_slot *sl, struct seg_comp *c)
{
	uint32_t seq = fdt_seq();

	if (atomic_load(&c->inflight_limit) != UINT32_MAX || atomic_load(&c->io_timeout_ms) != 0 ||
	    in_flight(sl, c) || drill_running(c) ||
	    atomic_load_explicit(&sl->connect_us, memory_order_relaxed) != 0)
		return false;
	fdt_verdict(fd, e, FDT_PLAIN | seq);
	/* Another thread's send may have begun a request (under the limit
	 * it read before the change) since the mark was read: then the
	 * verdict goes again, so that the reply ends that request. Either
	 * this load sees its mark, or its check in send_begin sees our
	 * verdict (both sequentially consistent). */
	if (in_flight(sl, c)) {
		fdt_verdict(fd, (uint64_t)(FDT_PLAIN | seq) << 32 | (uint32_t)e, 0);
		return false;
	}
	return true;
}

/* A compartment that limits requests or bounds I/O never has a plain
 * verdict: said inline, before the sequence is read (a verdict refused on
 * settings about to change is only one more slow call). */
static inline bool
cache_plain(int fd, uint64_t e, struct seg_slot *sl, struct seg_comp *c)
{
	if (atomic_load_explicit(&c->inflight_limit, memory_order_relaxed) != UINT32_MAX ||
	    atomic_load_explicit(&c->io_timeout_ms, memory_order_relaxed) != 0)
		return false;
	return cache_plain_now(fd, e, sl, c);
}

/* After a request began on fd (entry e): a plain verdict cached meanwhile
 * by another thread is dropped (see cache_plain). */
static inline __attribute__((always_inline)) void
drop_plain(int fd, uint64_t e)
{
	uint64_t now = fdt_entry_sync(fd);

	if (__builtin_expect((now >> 32 & FDT_PLAIN) != 0, 0) && (uint32_t)now == (uint32_t)e &&
	    fdt_plain(now))
		fdt_verdict(fd, now, 0);
}
uint64_t
shim_own_timeout_ms(int fd, int opt)
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
wait_ready_for(int fd, uint32_t e, struct seg_comp *c, uint32_t limit, int flags, short events)
{
	struct pollfd p = { .fd = fd, .events = events };
	uint64_t own, deadline, now;
	int r;

	if (!shim_blocking(fd, flags))
		return 0;
	own = shim_own_timeout_ms(fd, events == POLLIN ? SO_RCVTIMEO : SO_SNDTIMEO);
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
	permit_inflight_cancel(shim.seg, e - 1);
	errno = ETIMEDOUT;
	return -1;
}

static inline int
wait_ready(int fd, uint32_t e, struct seg_comp *c, int flags, short events)
{
	uint32_t limit = c != NULL ? atomic_load(&c->io_timeout_ms) : 0;

	return limit == 0 ? 0 : wait_ready_for(fd, e, c, limit, flags, events);
}

/* The connect of slot sl (of compartment c) is timed at its first use,
 * unless it was already. */
static inline void
connect_done(struct seg_slot *sl, uint32_t slot, struct seg_comp *c)
{
	if (atomic_load_explicit(&sl->connect_us, memory_order_relaxed) != 0)
		stat_connect_time(shim.seg, slot, c);
}

/* A plain verdict bit at all: its sequence is looked up only then. */
static inline bool
io_plain(uint64_t e)
{
	return (e >> 32 & FDT_PLAIN) != 0 && fdt_plain(e);
}

/* The refusal of a request on a counted socket: logged, errno set. */
static __attribute__((noinline)) int
send_refused(struct seg_comp *c, enum bs_reason why, const char *what)
{
	shim_log_refusal(c, why, what, "a counted socket");
	errno = shim_reject_errno(c);
	return -1;
}

/* A sampled request of a socket with a plain verdict: its receive goes
 * the slow way once, to time the reply. */
static __attribute__((noinline)) void
plain_sample(int fd, uint64_t e, struct seg_slot *sl)
{
	atomic_store(&sl->sent_us, now_mono_us());
	fdt_verdict(fd, e, 0);
}

/* Before a send on a counted socket (entry e): 1 if this call made a
 * request in flight, 0 if not, -1 with errno set if it was refused (or
 * timed out waiting to be writable, which ended the request it began). */
static __attribute__((noinline)) int
send_begin(int fd, uint64_t e, int flags, const char *what)
{
	uint32_t slot = (uint32_t)e - 1;
	struct seg *s = shim.seg;
	struct seg_slot *sl = seg_slot(s, slot);
	enum bs_reason why = REASON_MAX;
	struct seg_comp *c;
	bool may_wait;
	uint64_t m;
	int r;

	if (sl == NULL)
		return 0;
	/* The mark before the compartment (see permit_request_begin). */
	m = atomic_load_explicit(&sl->mark, memory_order_acquire);
	c = seg_slot_comp(s, sl);
	if (c == NULL || !shim_active())
		return 0;
	if (__builtin_expect(atomic_load_explicit(&c->drill.faults, memory_order_relaxed) != 0, 0) &&
	    drill_send(fd, sl, c) < 0)
		return -1;
	if (io_plain(e)) {
		plain_sample(fd, e, sl);
		return 0;
	}
	connect_done(sl, slot, c);
	if (cache_plain(fd, e, sl, c))
		return 0;
	may_wait = atomic_load_explicit(&c->max_wait_ms, memory_order_relaxed) != 0 &&
	    atomic_load(&c->inflight) >= ad_limit(c, P_INFLIGHT, atomic_load(&c->inflight_limit)) &&
	    shim_blocking(fd, flags);
	r = permit_request_begin(s, slot, m, c, may_wait, &why);
	if (__builtin_expect(r < 0, 0))
		return send_refused(c, why, what);
	if (r == 1)
		drop_plain(fd, e);
	/* A timeout here has already ended the request it began. */
	return wait_ready(fd, slot + 1, c, flags, POLLOUT) < 0 ? -1 : r;
}

#define SEND_WHOLE	2

/* send_begin's common case inline, without a frame of its own: a limited
 * compartment without I/O timeout, no plain verdict, the connect already
 * timed (then permit_request_quick). SEND_WHOLE: not that case, nothing
 * done (send_begin goes the whole way). */
static inline __attribute__((always_inline)) int
send_quick(int fd, uint64_t e)
{
	uint32_t slot = (uint32_t)e - 1;
	struct seg *s = shim.seg;
	struct seg_slot *sl;
	struct seg_comp *c;
	uint64_t m;
	int r;

	if ((e >> 32 & FDT_PLAIN) != 0 || !shim_active() || (sl = seg_slot(s, slot)) == NULL)
		return SEND_WHOLE;
	m = atomic_load_explicit(&sl->mark, memory_order_acquire);
	c = seg_slot_comp(s, sl);
	if (c == NULL || atomic_load_explicit(&sl->connect_us, memory_order_relaxed) != 0 ||
	    atomic_load_explicit(&c->io_timeout_ms, memory_order_relaxed) != 0 ||
	    atomic_load_explicit(&c->inflight_limit, memory_order_relaxed) == UINT32_MAX ||
	    atomic_load_explicit(&c->drill.faults, memory_order_relaxed) != 0)
		return SEND_WHOLE;
	r = permit_request_quick(s, slot, m, c);
	if (r == 1)
		drop_plain(fd, e);
	return r < 0 ? SEND_WHOLE : r;
}

/* After a send: one that sent nothing does not leave a request in flight. */
static inline void
send_end(uint64_t e, long r, int began)
{
	int saved;

	if (r >= 0 || began != 1)
		return;
	saved = errno;
	permit_inflight_cancel(shim.seg, (uint32_t)e - 1);
	errno = saved;
}

/* What a receive on a counted socket read before its call: the slot, its
 * mark, then its compartment (NULL: nothing to do). After the call they
 * are used again: were the slot released and reused meanwhile (another
 * thread's close), its generation in m no longer matches and nothing of
 * the new socket's is touched. */
struct io_recv {
	struct seg_slot *sl;
	struct seg_comp *c;
	uint64_t m;
};

static inline int
recv_begin(int fd, uint64_t e, int flags, struct io_recv *q)
{
	struct seg *s = shim.seg;

	q->sl = shim_active() ? seg_slot(s, (uint32_t)e - 1) : NULL;
	q->c = NULL;
	if (q->sl == NULL)
		return 0;
	q->m = atomic_load_explicit(&q->sl->mark, memory_order_acquire);
	q->c = seg_slot_comp(s, q->sl);
	if (q->c != NULL &&
	    __builtin_expect(atomic_load_explicit(&q->c->drill.faults, memory_order_relaxed) != 0, 0) &&
	    drill_recv(fd, q->sl, q->c, (uint32_t)e, flags) < 0)
		return -1;
	return wait_ready(fd, (uint32_t)e, q->c, flags, POLLIN);
}

/* The plain-verdict side of recv_end: a sampled reply is recorded with
 * its weight. */
static __attribute__((noinline)) void
recv_plain_sample(struct seg_slot *sl, struct seg_comp *c, bool done)
{
	uint64_t t = done ? atomic_exchange(&sl->sent_us, 0) & ~SENT_WEIGHTED : 0, now;

	if (t != 0) {
		now = now_mono_us();
		stat_hist_add_n(&c->h_reply, now > t ? now - t : 0, IO_SAMPLE);
	}
}

/* After a receive: a byte, end of file or a hard error ends the request. A
 * sampled one records its reply latency; then the verdict is cached again
 * if it holds. errno is left as the call set it (nothing here sets it on
 * the way of a reply; an error's is kept around the cancel). */
static inline __attribute__((always_inline)) void
recv_end(int fd, uint64_t e, const struct io_recv *q, long r, bool asked)
{
	uint32_t slot = (uint32_t)e - 1;
	bool done = r > 0 || (r == 0 && asked);
	int saved;

	if (q->c == NULL)
		return;
	connect_done(q->sl, slot, q->c);
	/* The common reply first: an untimed request of this socket's own
	 * ends by the give on its own take (a socket with no request in
	 * flight finds no such take and goes on). */
	if (done && __builtin_expect(atomic_load_explicit(&q->sl->sent_us,
	    memory_order_relaxed) == 0, 1) &&
	    permit_reply_quick(shim.seg, slot, MARK_GEN(q->m), q->c))
		return;
	if (cache_plain(fd, e, q->sl, q->c)) {
		recv_plain_sample(q->sl, q->c, done);
	} else if (done) {
		permit_request_end(shim.seg, slot, q->m, q->c, true);
	} else if (r < 0) {
		saved = errno;
		if (saved != EAGAIN && saved != EWOULDBLOCK && saved != EINTR)
			permit_request_end(shim.seg, slot, q->m, q->c, false);
		errno = saved;
	}
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

/* The slow half of a send-family wrapper, for a counted socket (entry e)
 * whose verdict is not plain or whose request is sampled. */
#define SEND_SLOW(e, fd, flags, what, call) do {				\
	int began_ = send_quick(fd, e);					\
	long r_;							\
									\
	if (began_ == SEND_WHOLE)					\
		began_ = send_begin(fd, e, flags, what);		\
	if (began_ < 0)							\
		return -1;						\
	r_ = call;							\
	send_end(e, r_, began_);					\
	return r_;							\
} while (0)

/* The slow half of a receive-family wrapper; `asked` says a byte was asked
 * for, so a zero return means end of file rather than an empty request. */
#define RECV_SLOW(e, fd, flags, asked, call) do {				\
	struct io_recv q_;						\
	long r_;							\
									\
	if (recv_begin(fd, e, flags, &q_) < 0)				\
		return -1;						\
	r_ = call;							\
	recv_end(fd, e, &q_, r_, asked);				\
	return r_;							\
} while (0)

/* A send on entry e goes straight to libc: not counted, or a plain verdict
 * and not this thread's sample. Inline, so that the wrapper is a table
 * load, a compare and a tail call; the rest is out of line (`*_counted`). */
static inline bool
send_plain(uint64_t e)
{
	return __builtin_expect((uint32_t)e == 0, 1) ||
	    __builtin_expect(fdt_plain(e) && (++io_tick & (IO_SAMPLE - 1)) != 0, 1);
}

static inline bool
recv_plain(uint64_t e)
{
	return __builtin_expect((uint32_t)e == 0 || fdt_plain(e), 1);
}

static __attribute__((noinline)) ssize_t
send_counted(uint64_t e, int fd, const void *buf, size_t n, int flags)
{
	SEND_SLOW(e, fd, flags, "send", real.send(fd, buf, n, flags));
}

BS_EXPORT ssize_t
send(int fd, const void *buf, size_t n, int flags)
{
	uint64_t e = fdt_entry(fd);

	if (send_plain(e))
		return real.send(fd, buf, n, flags);
	return send_counted(e, fd, buf, n, flags);
}

static __attribute__((noinline)) ssize_t
write_counted(uint64_t e, int fd, const void *buf, size_t n)
{
	SEND_SLOW(e, fd, 0, "write", real.write(fd, buf, n));
}

BS_EXPORT ssize_t
write(int fd, const void *buf, size_t n)
{
	uint64_t e = fdt_entry(fd);

	if (send_plain(e))
		return real.write(fd, buf, n);
	return write_counted(e, fd, buf, n);
}

static __attribute__((noinline)) ssize_t
writev_counted(uint64_t e, int fd, const struct iovec *iov, int cnt)
{
	SEND_SLOW(e, fd, 0, "writev", real.writev(fd, iov, cnt));
}

BS_EXPORT ssize_t
writev(int fd, const struct iovec *iov, int cnt)
{
	uint64_t e = fdt_entry(fd);

	if (send_plain(e))
		return real.writev(fd, iov, cnt);
	return writev_counted(e, fd, iov, cnt);
}

static __attribute__((noinline)) int
sendmmsg_counted(uint64_t e, int fd, struct mmsghdr *v, unsigned n, int flags)
{
	SEND_SLOW(e, fd, flags, "sendmmsg", real.sendmmsg(fd, v, n, flags));
}

BS_EXPORT int
sendmmsg(int fd, struct mmsghdr *v, unsigned n, int flags)
{
	uint64_t e = fdt_entry(fd);

	if (send_plain(e))
		return real.sendmmsg(fd, v, n, flags);
	return sendmmsg_counted(e, fd, v, n, flags);
}

static __attribute__((noinline)) ssize_t
sendfile_counted(uint64_t e, int out, int in, off_t *off, size_t n)
{
	SEND_SLOW(e, out, 0, "sendfile", real.sendfile(out, in, off, n));
}

BS_EXPORT ssize_t
sendfile(int out, int in, off_t *off, size_t n)
{
	uint64_t e = fdt_entry(out);

	if (send_plain(e))
		return real.sendfile(out, in, off, n);
	return sendfile_counted(e, out, in, off, n);
}

static __attribute__((noinline)) ssize_t
sendfile64_counted(uint64_t e, int out, int in, off_t *off, size_t n)
{
	SEND_SLOW(e, out, 0, "sendfile", real.sendfile64(out, in, off, n));
}

BS_EXPORT ssize_t
sendfile64(int out, int in, off_t *off, size_t n)
{
	uint64_t e = fdt_entry(out);

	if (send_plain(e))
		return real.sendfile64(out, in, off, n);
	return sendfile64_counted(e, out, in, off, n);
}

static __attribute__((noinline)) ssize_t
sendto_counted(uint64_t e, int fd, const void *buf, size_t n, int flags,
    const struct sockaddr *sa, socklen_t len)
{
	SEND_SLOW(e, fd, flags, "sendto", real.sendto(fd, buf, n, flags, sa, len));
}

static __attribute__((noinline)) ssize_t
sendmsg_counted(uint64_t e, int fd, const struct msghdr *msg, int flags)
{
	SEND_SLOW(e, fd, flags, "sendmsg", real.sendmsg(fd, msg, flags));
}

/* sendto and sendmsg also connect implicitly with MSG_FASTOPEN. */
BS_EXPORT ssize_t
sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *sa, socklen_t len)
{
	uint64_t e;
	int saved = errno;
	struct admitted got;
	enum take a;
	ssize_t r;

	if (!(flags & MSG_FASTOPEN) || sa == NULL || !shim_active()) {
		e = fdt_entry(fd);
		if (send_plain(e))
			return real.sendto(fd, buf, n, flags, sa, len);
		return sendto_counted(e, fd, buf, n, flags, sa, len);
	}
	a = shim_admit(fd, sa, len, "sendto", &got);
	if (a == TAKE_FULL)
		return -1;
	errno = saved;
	r = real.sendto(fd, buf, n, flags, sa, len);
	if (a == TAKE_OK)
		shim_settle(fd, r, &got);
	return r;
}

BS_EXPORT ssize_t
sendmsg(int fd, const struct msghdr *msg, int flags)
{
	uint64_t e;
	int saved = errno;
	struct admitted got;
	enum take a;
	ssize_t r;

	if (!(flags & MSG_FASTOPEN) || msg == NULL || msg->msg_name == NULL || !shim_active()) {
		e = fdt_entry(fd);
		if (send_plain(e))
			return real.sendmsg(fd, msg, flags);
		return sendmsg_counted(e, fd, msg, flags);
	}
	a = shim_admit(fd, msg->msg_name, msg->msg_namelen, "sendmsg", &got);
	if (a == TAKE_FULL)
		return -1;
	errno = saved;
	r = real.sendmsg(fd, msg, flags);
	if (a == TAKE_OK)
		shim_settle(fd, r, &got);
	return r;
}

static __attribute__((noinline)) ssize_t
recv_counted(uint64_t e, int fd, void *buf, size_t n, int flags)
{
	RECV_SLOW(e, fd, flags, n > 0, real.recv(fd, buf, n, flags));
}

BS_EXPORT ssize_t
recv(int fd, void *buf, size_t n, int flags)
{
	uint64_t e = fdt_entry(fd);

	if (recv_plain(e))
		return real.recv(fd, buf, n, flags);
	return recv_counted(e, fd, buf, n, flags);
}

static __attribute__((noinline)) ssize_t
recvfrom_counted(uint64_t e, int fd, void *buf, size_t n, int flags, struct sockaddr *sa,
    socklen_t *len)
{
	RECV_SLOW(e, fd, flags, n > 0, real.recvfrom(fd, buf, n, flags, sa, len));
}

BS_EXPORT ssize_t
recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *sa, socklen_t *len)
{
	uint64_t e = fdt_entry(fd);

	if (recv_plain(e))
		return real.recvfrom(fd, buf, n, flags, sa, len);
	return recvfrom_counted(e, fd, buf, n, flags, sa, len);
}

static __attribute__((noinline)) ssize_t
recvmsg_counted(uint64_t e, int fd, struct msghdr *msg, int flags)
{
	RECV_SLOW(e, fd, flags, msg != NULL && iov_asks(msg->msg_iov, (int)msg->msg_iovlen),
	    real.recvmsg(fd, msg, flags));
}

BS_EXPORT ssize_t
recvmsg(int fd, struct msghdr *msg, int flags)
{
	uint64_t e = fdt_entry(fd);

	if (recv_plain(e))
		return real.recvmsg(fd, msg, flags);
	return recvmsg_counted(e, fd, msg, flags);
}

static __attribute__((noinline)) int
recvmmsg_counted(uint64_t e, int fd, struct mmsghdr *v, unsigned n, int flags,
    struct timespec *tmo)
{
	RECV_SLOW(e, fd, flags, n > 0, real.recvmmsg(fd, v, n, flags, tmo));
}

BS_EXPORT int
recvmmsg(int fd, struct mmsghdr *v, unsigned n, int flags, struct timespec *tmo)
{
	uint64_t e = fdt_entry(fd);

	if (recv_plain(e))
		return real.recvmmsg(fd, v, n, flags, tmo);
	return recvmmsg_counted(e, fd, v, n, flags, tmo);
}

static __attribute__((noinline)) ssize_t
read_counted(uint64_t e, int fd, void *buf, size_t n)
{
	RECV_SLOW(e, fd, 0, n > 0, real.read(fd, buf, n));
}

BS_EXPORT ssize_t
read(int fd, void *buf, size_t n)
{
	uint64_t e = fdt_entry(fd);

	if (recv_plain(e))
		return real.read(fd, buf, n);
	return read_counted(e, fd, buf, n);
}

static __attribute__((noinline)) ssize_t
readv_counted(uint64_t e, int fd, const struct iovec *iov, int cnt)
{
	RECV_SLOW(e, fd, 0, iov_asks(iov, cnt), real.readv(fd, iov, cnt));
}

BS_EXPORT ssize_t
readv(int fd, const struct iovec *iov, int cnt)
{
	uint64_t e = fdt_entry(fd);

	if (recv_plain(e))
		return real.readv(fd, iov, cnt);
	return readv_counted(e, fd, iov, cnt);
}

/* The _FORTIFY_SOURCE entry points that hardened builds call instead. */
static __attribute__((noinline)) ssize_t
recv_chk_counted(uint64_t e, int fd, void *buf, size_t n, size_t buflen, int flags)
{
	RECV_SLOW(e, fd, flags, n > 0, real.recv_chk(fd, buf, n, buflen, flags));
}

BS_EXPORT ssize_t
__recv_chk(int fd, void *buf, size_t n, size_t buflen, int flags)
{
	uint64_t e = fdt_entry(fd);

	if (recv_plain(e))
		return real.recv_chk(fd, buf, n, buflen, flags);
	return recv_chk_counted(e, fd, buf, n, buflen, flags);
}

static __attribute__((noinline)) ssize_t
recvfrom_chk_counted(uint64_t e, int fd, void *buf, size_t n, size_t buflen, int flags,
    struct sockaddr *sa, socklen_t *len)
{
	RECV_SLOW(e, fd, flags, n > 0, real.recvfrom_chk(fd, buf, n, buflen, flags, sa, len));
}

BS_EXPORT ssize_t
__recvfrom_chk(int fd, void *buf, size_t n, size_t buflen, int flags, struct sockaddr *sa,
    socklen_t *len)
{
	uint64_t e = fdt_entry(fd);

	if (recv_plain(e))
		return real.recvfrom_chk(fd, buf, n, buflen, flags, sa, len);
	return recvfrom_chk_counted(e, fd, buf, n, buflen, flags, sa, len);
}

static __attribute__((noinline)) ssize_t
read_chk_counted(uint64_t e, int fd, void *buf, size_t n, size_t buflen)
{
	RECV_SLOW(e, fd, 0, n > 0, real.read_chk(fd, buf, n, buflen));
}

BS_EXPORT ssize_t
__read_chk(int fd, void *buf, size_t n, size_t buflen)
{
	uint64_t e = fdt_entry(fd);

	if (recv_plain(e))
		return real.read_chk(fd, buf, n, buflen);
	return read_chk_counted(e, fd, buf, n, buflen);
}

/* interpose.c - the exported libc names: look up the descriptor, decide, call the real one. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include "shim.h"

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

bool
shim_active(void)
{
	return atomic_load_explicit(&shim.ready, memory_order_acquire) != 0;
}

#define active() shim_active()

/* Gives back the hold that a table entry (slot + 1) stood for. */
static void
drop_entry(uint32_t e)
{
	if (e != 0)
		seg_drop(shim.seg, e - 1);
}

/* fresh_fd's rare case, out of line. */
static __attribute__((noinline)) void
stale_fd(int fd)
{
	int saved = errno;

	if (active() && !shim_foreign())
		drop_entry(fdt_take(fd));
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

/* newfd is now a copy of oldfd: it holds the same socket, if any. */
static void
copy_fd(int oldfd, int newfd)
{
	uint32_t e = fdt_get(oldfd);

	if (!active() || shim_foreign())
		return;
	if (e != 0)
		seg_hold(shim.seg, e - 1);
	drop_entry(e != 0 ? fdt_set(newfd, e - 1) : fdt_take(newfd));
}

int
shim_reject_errno(const struct seg_comp *c)
{
	int e = atomic_load(&c->reject_errno);

	/* Only the allowed values are taken from the shared segment,
	 * whatever it holds. */
	return cfg_errno_name(e) != NULL ? e : ECONNREFUSED;
}

bool
shim_blocking(int fd, int flags)
{
	int fl;

	if (flags & MSG_DONTWAIT)
		return false;
	fl = real.fcntl(fd, F_GETFL);
	return fl >= 0 && !(fl & O_NONBLOCK);
}

void
shim_log_refusal(uint32_t comp, enum bs_reason why, const char *what, const char *dest)
{
	struct seg_comp *c = seg_comp(shim.seg, comp);
	unsigned cls = shim.cls < BS_MAX_CLASSES ? shim.cls : 0;
	struct log_refusal r;
	uint64_t skipped;
	char msg[400];

	if (c == NULL || !log_rejection_due(comp, &skipped))
		return;
	r.message = msg;
	r.compartment = c->name;
	r.reason = seg_reason_name(why);
	r.operation = what;
	r.destination = dest;
	r.in_use = atomic_load(&c->in_use);
	r.limit = atomic_load(&c->limit);
	switch (why) {
	case REASON_FULL:
		r.limit = ad_limit(c, P_CONN, seg_conn_limit(c));
		bs_format(msg, sizeof(msg), "%s full (%u/%u%s): %s to %s refused", c->name,
		    r.in_use, r.limit, ad_limit(c, P_CONN, UINT32_MAX) != UINT32_MAX ? ", adaptive" : "",
		    what, dest);
		break;
	case REASON_INFLIGHT_FULL:
		r.in_use = atomic_load(&c->inflight);
		r.limit = ad_limit(c, P_INFLIGHT, atomic_load(&c->inflight_limit));
		bs_format(msg, sizeof(msg), "%s: %u/%u requests in flight%s: %s to %s refused", c->name,
		    r.in_use, r.limit,
		    ad_limit(c, P_INFLIGHT, UINT32_MAX) != UINT32_MAX ? " (adaptive limit)" : "", what,
		    dest);
		break;
	case REASON_WAIT_TIMEOUT:
		bs_format(msg, sizeof(msg), "%s full: waited %u ms in vain: %s to %s refused", c->name,
		    atomic_load(&c->max_wait_ms), what, dest);
		break;
	case REASON_TOO_MANY_WAITING:
		bs_format(msg, sizeof(msg), "%s full and %u callers already wait: %s to %s refused",
		    c->name, atomic_load(&c->waiting), what, dest);
		break;
	case REASON_CLASS_FULL:
		r.in_use = atomic_load(&c->cls[cls].in_use);
		r.limit = atomic_load(&c->cls[cls].limit);
		bs_format(msg, sizeof(msg), "%s: class %s at its limit of %u: %s to %s refused", c->name,
		    shim.cls < BS_MAX_CLASSES ? seg_header(shim.seg)->class_name[shim.cls] : "?",
		    r.limit, what, dest);
		break;
	case REASON_POOL_FULL: {
		struct seg_pool *pool = seg_pool_of(shim.seg, c);

		if (pool != NULL) {
			r.in_use = atomic_load(&pool->shared);
			r.limit = r.in_use;
		}
		bs_format(msg, sizeof(msg), "%s: pool %s has lent all %u of its shared permits "
		    "(pool_full; %s holds %u, guaranteed %u): %s to %s refused", c->name,
		    pool != NULL ? pool->name : "?", pool != NULL ? atomic_load(&pool->shared) : 0,
		    c->name, atomic_load(&c->in_use), atomic_load(&c->guaranteed), what, dest);
		break;
	}
	case REASON_CLASS_SHARED_FULL:
		r.in_use = atomic_load(&c->cls_shared);
		r.limit = r.in_use;
		bs_format(msg, sizeof(msg), "%s has lent all %u of its unguaranteed permits to its "
		    "classes (class_shared_full; class %s holds %u, guaranteed %u): %s to %s refused",
		    c->name, r.limit,
		    shim.cls < BS_MAX_CLASSES ? seg_header(shim.seg)->class_name[shim.cls] : "?",
		    cls < BS_MAX_CLASSES ? atomic_load(&c->cls[cls].in_use) : 0,
		    cls < BS_MAX_CLASSES ? atomic_load(&c->cls_guaranteed[cls]) : 0, what, dest);
		break;
	default:
		bs_format(msg, sizeof(msg), "%s: the socket or process table of segment %s is full: "
		    "%s to %s refused", c->name, seg_header(shim.seg)->name, what, dest);
		break;
	}
	log_refusal(&r, skipped);
}

/*
 * The slot fd's socket is admitted in: a pending one that a fork made for it
 * (then *shared is true), or a new one. Either way the slot is in the table
 * before the fork gate opens again, so a fork copies both or neither. -1 if
 * the segment's tables are full. fd is one that fdt_valid passed.
 */
static int
claim_slot(int fd, uint64_t ino, bool *shared)
{
	uint32_t e;
	int slot;

	seg_gate_enter(shim.seg);
	e = (uint32_t)fdt_entry_valid(fd);
	if (e != 0 && seg_slot_pending(shim.seg, e - 1) &&
	    atomic_load(&seg_slot(shim.seg, e - 1)->inode) == ino) {
		*shared = true;
		slot = (int)(e - 1);
	} else {
		*shared = false;
		slot = seg_pending_slot(shim.seg, ino);
		if (slot >= 0)
			drop_entry(fdt_set_valid(fd, (uint32_t)slot));
	}
	seg_gate_leave(shim.seg);
	return slot;
}

/*
 * Admits slot into comp. When another process sharing the socket (a fork
 * made both hold it before its connect) is admitting it right now, its
 * verdict is awaited: its permit counts for this connect too, and if it was
 * refused, this connect tries for itself. Returns 0 (admitted here), 1
 * (admitted by the other), or -EBUSY with *why.
 */
static int
admit_slot(uint32_t slot, int comp, int wait, enum bs_reason *why)
{
	struct timespec nap = { 0, 1000000 };
	uint64_t deadline = 0;
	int r;

	for (;;) {
		r = seg_acquire_pending(shim.seg, slot, (uint32_t)comp, shim.cls, wait, why);
		if (r != -EALREADY)
			return r;
		if (seg_slot_admitted(shim.seg, slot))
			return 1;
		if (seg_slot_pending(shim.seg, slot))
			continue;	/* the other was refused: our turn */
		if (deadline == 0) {
			struct seg_comp *c = seg_comp(shim.seg, (uint32_t)comp);

			deadline = now_mono_ms() + 1000 + (c != NULL ? seg_max_wait_ms(c) : 0);
		} else if (now_mono_ms() >= deadline) {
			*why = REASON_WAIT_TIMEOUT;
			seg_count_rejection(shim.seg, (uint32_t)comp, *why);
			return -EBUSY;
		}
		nanosleep(&nap, NULL);
	}
}

/*
 * Decides a connect (or a TCP Fast Open send) of fd to sa: ADMIT_PASS when
 * the shim has nothing to count, ADMIT_COUNTED when a permit was taken and
 * recorded for fd, ADMIT_REFUSED with errno set when the compartment refused.
 */
enum admit
shim_admit(int fd, const struct sockaddr *sa, socklen_t len, const char *what,
    struct admitted *got)
{
	/* The descriptor's one lookup: its entry says whether the shim
	 * counts it already and whether it is fresh from socket(). */
	bool valid = fdt_valid(fd);
	uint64_t ent = valid ? fdt_entry_valid(fd) : 0;
	uint32_t e = (uint32_t)ent;
	int comp = match_find(atomic_load(&shim.m), sa, len), type = 0, slot, r;
	socklen_t tlen = sizeof(type);
	enum bs_reason why = REASON_MAX;
	struct seg_comp *c;
	struct stat st;
	char dest[128];
	bool shared;

	if (comp < 0 && e == 0)
		return ADMIT_PASS;
	if (shim_foreign() || fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
		return ADMIT_PASS;
	if (e != 0) {
		struct seg_slot *sl = seg_slot(shim.seg, e - 1);

		/* A connect retried on the same socket (EINPROGRESS,
		 * EALREADY, EISCONN; hiredis polls this way) already has
		 * its permit, unless the slot is one a fork shared before
		 * the socket was connected. Any other socket behind the
		 * number is new. */
		if (sl != NULL && atomic_load(&sl->inode) == (uint64_t)st.st_ino) {
			if (comp < 0 || seg_slot_admitted(shim.seg, e - 1))
				return ADMIT_PASS;
			/* Pending, or being admitted by the other process
			 * sharing it: admit_slot waits for that verdict. */
		} else {
			drop_entry(fdt_take(fd));
		}
	}
	c = comp >= 0 ? seg_comp(shim.seg, (uint32_t)comp) : NULL;
	if (c == NULL || !valid)
		return ADMIT_PASS;
	/* A socket from our socket() is known to be a stream socket. */
	got->fresh = ent == FDT_FRESH;
	if (!got->fresh &&
	    (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) < 0 || type != SOCK_STREAM))
		return ADMIT_PASS;
	slot = claim_slot(fd, (uint64_t)st.st_ino, &shared);
	if (slot < 0) {
		why = REASON_NO_SLOT;
		seg_count_rejection(shim.seg, (uint32_t)comp, why);
	} else {
		/* Whether the descriptor blocks is asked only if the
		 * compartment is full and waits (permit.c's take_wait). */
		r = admit_slot((uint32_t)slot, comp, fd, &why);
		if (r == 0) {
			got->slot = (uint32_t)slot;
			got->c = c;
			return ADMIT_COUNTED;
		}
		if (r > 0)
			return ADMIT_PASS;
		/* Refused: a slot of our own goes (the socket stays as fresh
		 * as it was); one a fork shared stays pending for the process
		 * it is shared with. */
		if (!shared)
			drop_entry(fdt_unclaim(fd, got->fresh));
	}
	match_format(sa, len, dest, sizeof(dest));
	shim_log_refusal((uint32_t)comp, why, what, dest);
	/* connect is a cancellation point: a thread cancelled while it
	 * would have been refused must see the cancellation first. */
	pthread_testcancel();
	errno = shim_reject_errno(c);
	return ADMIT_REFUSED;
}

/* After the real call: a connect that failed at once gives its permit back.
 * EINPROGRESS and EINTR leave the connection under way; EALREADY and EISCONN
 * answer a retry. */
void
shim_settle(int fd, long r, const struct admitted *got)
{
	int err;

	if (r >= 0)
		return;
	err = errno;
	if (err != EINPROGRESS && err != EINTR && err != EALREADY && err != EISCONN)
		drop_entry(fdt_unclaim(fd, got->fresh));
	errno = err;
}

/* A blocking connect (fl: its F_GETFL flags) bounded by the compartment's
 * connect_timeout_ms: made non-blocking for the attempt, then waited for
 * with poll. */
static int
connect_timed(int fd, const struct sockaddr *sa, socklen_t len, struct seg_comp *c,
    uint32_t timeout_ms, int fl, bool *aborted)
{
	int r, err = 0, saved;
	uint64_t deadline = now_mono_ms() + timeout_ms, now;
	socklen_t elen = sizeof(err);
	struct pollfd p = { .fd = fd, .events = POLLOUT };

	if (real.fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return real.connect(fd, sa, len);
	r = real.connect(fd, sa, len);
	if (r < 0 && errno == EINPROGRESS) {
		for (;;) {
			now = now_mono_ms();
			if (now >= deadline) {
				/* The caller gives up: the attempt must not go
				 * on to connect without its permit, which goes
				 * back when this returns. Disconnecting aborts
				 * it; if that fails, the permit stays. */
				struct sockaddr unspec = { .sa_family = AF_UNSPEC };

				atomic_fetch_add(&c->connect_timeouts, 1);
				*aborted = real.connect(fd, &unspec, sizeof(unspec)) == 0;
				errno = ETIMEDOUT;
				r = -1;
				break;
			}
			r = poll(&p, 1, (int)(deadline - now));
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0)
				continue;
			if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) < 0)
				err = errno;
			errno = err;
			r = err != 0 ? -1 : 0;
			break;
		}
	}
	saved = errno;
	real.fcntl(fd, F_SETFL, fl);
	errno = saved;
	return r;
}

/* A socket whose connect succeeded or is under way can no longer be
 * shared by a fork before its connect; one whose connect failed can, as
 * it may be connected again. Keeps errno. */
static inline bool
connect_began(int r)
{
	return r == 0 || errno == EINPROGRESS || errno == EALREADY || errno == EISCONN;
}

static void
connected(int fd, int r)
{
	if (connect_began(r))
		fdt_clear_fresh(fd);
}

BS_EXPORT int
connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	int saved = errno, r;
	struct admitted got;
	struct seg_comp *c;
	uint32_t timeout;
	int fl;
	bool timed_out = false, aborted = false;

	if (!active())
		return real.connect(fd, sa, len);
	shim_maybe_reload();
	switch (shim_admit(fd, sa, len, "connect", &got)) {
	case ADMIT_REFUSED:
		return -1;
	case ADMIT_PASS:
		errno = saved;
		r = real.connect(fd, sa, len);
		connected(fd, r);
		return r;
	case ADMIT_COUNTED:
		break;
	}
	c = got.c;
	timeout = atomic_load(&c->connect_timeout_ms);
	/* SO_SNDTIMEO bounds a blocking connect on Linux: a shorter one that
	 * the program set itself wins. The flags are read once, for both. */
	if (timeout != 0 && (fl = real.fcntl(fd, F_GETFL)) >= 0 && !(fl & O_NONBLOCK)) {
		struct timeval tv = { 0, 0 };
		socklen_t tvlen = sizeof(tv);
		uint64_t own = getsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, &tvlen) == 0 ?
		    (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000 : 0;

		errno = saved;
		if (own != 0 && own <= timeout) {
			r = real.connect(fd, sa, len);
		} else {
			r = connect_timed(fd, sa, len, c, timeout, fl, &aborted);
			timed_out = r < 0 && errno == ETIMEDOUT;
		}
	} else {
		errno = saved;
		r = real.connect(fd, sa, len);
	}
	saved = errno;
	/* A connect that ended here, well or not (a timeout is what the
	 * caller waited), is timed now; one still under way is timed at the
	 * socket's first use instead (io.c). */
	if (r == 0 || (saved != EINPROGRESS && saved != EINTR))
		seg_connect_done_in(shim.seg, got.slot, c);
	errno = saved;
	/* A timed-out attempt that could not be aborted may still connect:
	 * it keeps its permit until the socket is closed. (The slot recorded
	 * for the descriptor cleared its fresh mark; a connect that failed at
	 * once gets it back from shim_settle.) */
	if (!timed_out || aborted)
		shim_settle(fd, r, &got);
	return r;
}

BS_EXPORT int
close(int fd)
{
	uint32_t e;
	int r, saved;

	if (fdt_get(fd) == 0)
		return real.close(fd);
	if (!active() || shim_foreign())
		return real.close(fd);
	/* The entry goes first: once the real close returns, the number may
	 * already belong to a new socket of another thread. Linux frees the
	 * descriptor even when close fails, so the hold always goes. */
	e = fdt_take_counted(fd);
	r = real.close(fd);
	saved = errno;
	drop_entry(e);
	errno = saved;
	return r;
}

/*
 * Copying a counted descriptor happens inside the fork gate: a fork between
 * the copy and its bookkeeping would give the child two descriptors of the
 * socket and a count of one, and its first close would free a socket it
 * still has. Returns true if the caller must leave the gate.
 */
static bool
gate_copy(int fd)
{
	if (fdt_get(fd) == 0 || !active() || shim_foreign())
		return false;
	seg_gate_enter(shim.seg);
	return true;
}

static void
gate_done(bool in)
{
	if (in)
		seg_gate_leave(shim.seg);
}

BS_EXPORT int
dup(int fd)
{
	bool in = gate_copy(fd);
	int r = real.dup(fd), saved = errno;

	if (r >= 0 && (fdt_get(fd) != 0 || fdt_get(r) != 0))
		copy_fd(fd, r);
	gate_done(in);
	errno = saved;
	return r;
}

/* dup2 and dup3 close newfd first: a counted socket there loses a holder. */
static int
dup_over(int oldfd, int newfd, int r, bool in)
{
	int saved = errno;

	if (r >= 0 && oldfd != newfd && (fdt_get(oldfd) != 0 || fdt_get(newfd) != 0))
		copy_fd(oldfd, newfd);
	gate_done(in);
	errno = saved;
	return r;
}

BS_EXPORT int
dup2(int oldfd, int newfd)
{
	bool in = gate_copy(oldfd);

	return dup_over(oldfd, newfd, real.dup2(oldfd, newfd), in);
}

BS_EXPORT int
dup3(int oldfd, int newfd, int flags)
{
	bool in = gate_copy(oldfd);

	return dup_over(oldfd, newfd, real.dup3(oldfd, newfd, flags), in);
}

/* fcntl's third argument is an int or a pointer; passing it on as a
 * pointer-sized value is what glibc itself does on every ABI we run on. */
static int
fcntl_common(int (*fn)(int, int, ...), int fd, int cmd, void *arg)
{
	bool dupfd = cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC;
	bool in = dupfd && gate_copy(fd);
	int r = fn(fd, cmd, arg), saved = errno;

	if (r >= 0 && dupfd && (fdt_get(fd) != 0 || fdt_get(r) != 0))
		copy_fd(fd, r);
	gate_done(in);
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
static void
drop_range(unsigned first, unsigned last)
{
	unsigned high = (unsigned)fdt_high();

	if (!active() || shim_foreign())
		return;
	if (last >= high)
		last = high == 0 ? 0 : high - 1;
	for (unsigned fd = first; fd <= last && fd < high; fd++) {
		if (fdt_get((int)fd) != 0)
			drop_entry(fdt_take((int)fd));
	}
}

/* Forgets every table entry without giving anything back: the record
 * they were held under is gone. */
static void
drop_range_local(void)
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
		drop_range(first, last);
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
	drop_range(lowfd < 0 ? 0 : (unsigned)lowfd, ~0U);
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
	if (fd < 0 || fdt_get(fd) == 0 || !active() || shim_foreign())
		return real.fclose(fp);
	/* fclose closes through glibc's internal close, which no wrapper
	 * sees: this is the only place to notice an fdopen'ed socket go. */
	e = fdt_take(fd);
	r = real.fclose(fp);
	saved = errno;
	drop_entry(e);
	errno = saved;
	return r;
}

void
shim_adopt_fd(int fd, uint32_t slot)
{
	fdt_set(fd, slot);
}

/*
 * A socket made before a fork and connected after it is one connection in
 * two processes, whichever of them connects. Each such socket (an
 * unconnected, non-listening stream socket from socket()) gets a pending
 * slot before the fork, so both processes hold it from the start and its
 * permit, once admitted, lasts until both are done with it.
 */
static void
share_unconnected(void)
{
	for (int fd = fdt_next_fresh(0); fd >= 0; fd = fdt_next_fresh(fd + 1)) {
		struct sockaddr_storage peer;
		socklen_t plen = sizeof(peer), ilen = sizeof(int);
		int type = 0, listening = 0, slot;
		struct stat st;

		fdt_clear_fresh(fd);
		if (fdt_get(fd) != 0 || fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
			continue;
		if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &ilen) < 0 || type != SOCK_STREAM)
			continue;
		ilen = sizeof(int);
		if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ilen) < 0 || listening)
			continue;
		if (getpeername(fd, (struct sockaddr *)&peer, &plen) == 0 || errno != ENOTCONN)
			continue;
		slot = seg_pending_slot(shim.seg, (uint64_t)st.st_ino);
		if (slot >= 0)
			drop_entry(fdt_set(fd, (uint32_t)slot));
	}
}

BS_EXPORT pid_t
fork(void)
{
	struct seg_fork f;
	int saved = errno;
	pid_t pid;

	if (!active() || shim_foreign())
		return real.fork();
	/* No thread may be between a change of what this process holds
	 * and its record of it while the child's record is copied. */
	seg_gate_close(shim.seg);
	share_unconnected();
	seg_fork_prepare(shim.seg, &f);
	errno = saved;
	pid = real.fork();
	saved = errno;
	if (pid == 0) {
		shim_forked_seen();
		if (!seg_fork_child(shim.seg, &f)) {
			drop_range_local();
			seg_adopt(shim.seg, shim_adopt_fd);
		}
	} else {
		seg_fork_parent(shim.seg, &f, pid);
	}
	errno = saved;
	return pid;
}

/* Sockets a fork may share before they are connected are marked (inside
 * the fork gate, so a fork sees the mark or no socket). */
BS_EXPORT int
socket(int domain, int type, int protocol)
{
	bool mark = (type & 0xf) == SOCK_STREAM &&
	    (domain == AF_INET || domain == AF_INET6 || domain == AF_UNIX) && active();
	int r;

	/* No getpid here: in a vfork child (which shares our memory but not
	 * our descriptors) a mark is at worst stale, and stale marks are
	 * harmless (fork and connect check the socket behind the number). */
	if (mark)
		seg_gate_enter(shim.seg);
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
		seg_gate_leave(shim.seg);
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

/* A host-name destination follows what the program itself resolves, so a
 * DNS change after start-up is followed too. */
BS_EXPORT int
getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
    struct addrinfo **res)
{
	int r = real.getaddrinfo(node, service, hints, res), saved = errno;

	if (r == 0 && node != NULL && active() && match_has_host(atomic_load(&shim.m), node)) {
		for (struct addrinfo *ai = *res; ai != NULL; ai = ai->ai_next) {
			if (ai->ai_addr != NULL &&
			    match_learn_in(&shim.m, &shim.m_next, node, ai->ai_addr) == -ENOSPC) {
				bs_log(LOG_WARN, "too many addresses learned for %s; "
				    "later ones are not counted", node);
				break;
			}
		}
	}
	errno = saved;
	return r;
}

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
sys_forward(long n, const long a[6])
{
	return real_syscall6(n, a);
}

/* close(2) of a counted descriptor by number: as in close() above. */
static long
sys_close(long n, const long a[6])
{
	int fd = (int)a[0], saved;
	uint32_t e;
	long r;

	if (fdt_get(fd) == 0 || !active() || shim_foreign())
		return sys_forward(n, a);
	e = fdt_take(fd);
	r = sys_forward(n, a);
	saved = errno;
	drop_entry(e);
	errno = saved;
	return r;
}

static long
sys_close_range(long n, const long a[6])
{
	long r = sys_forward(n, a);
	int saved = errno;

	if (r == 0 && !((unsigned)a[2] & CLOSE_RANGE_CLOEXEC) && (unsigned)a[0] <= (unsigned)a[1]) {
		drop_range((unsigned)a[0], (unsigned)a[1]);
		errno = saved;
	}
	return r;
}

/* dup, dup2, dup3 and fcntl(F_DUPFD*) by number: the copy holds the socket. */
static long
sys_copy(long n, const long a[6], bool over)
{
	int oldfd = (int)a[0];
	bool in = gate_copy(oldfd);
	long r = sys_forward(n, a);
	int saved = errno, newfd = over ? (int)a[1] : (int)r;

	if (r >= 0 && oldfd != newfd && (fdt_get(oldfd) != 0 || fdt_get(newfd) != 0))
		copy_fd(oldfd, newfd);
	gate_done(in);
	errno = saved;
	return r;
}

/* fork and clone by number: the child is one the fork wrapper did not
 * prepare, so shim_foreign() asks the kernel for the pid while it may run
 * (as clone() in procid.c does). A child sharing our memory for good keeps
 * the count raised. */
static long
sys_spawn(long n, const long a[6], unsigned long flags)
{
	long r;
	int saved;

	atomic_fetch_add(&shim_unseen, 1);
	r = sys_forward(n, a);
	saved = errno;
	if (r != 0 && (!(flags & CLONE_VM) || (flags & CLONE_VFORK) || r < 0))
		atomic_fetch_sub(&shim_unseen, 1);
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
		return sys_close(n, a);
#ifdef SYS_close_range
	case SYS_close_range:
		return sys_close_range(n, a);
#endif
	case SYS_dup:
		return sys_copy(n, a, false);
#ifdef SYS_dup2
	case SYS_dup2:
#endif
	case SYS_dup3:
		return sys_copy(n, a, true);
	case SYS_fcntl:
		if (a[1] == F_DUPFD || a[1] == F_DUPFD_CLOEXEC)
			return sys_copy(n, a, false);
		break;
	case SYS_connect:
		return connect((int)a[0], (const struct sockaddr *)a[1], (socklen_t)a[2]);
	case SYS_socket:
		return socket((int)a[0], (int)a[1], (int)a[2]);
	case SYS_accept4:
		return accept4((int)a[0], (struct sockaddr *)a[1], (socklen_t *)a[2], (int)a[3]);
#ifdef SYS_fork
	case SYS_fork:
		return sys_spawn(n, a, 0);
#endif
	case SYS_clone:
		return sys_spawn(n, a, (unsigned long)a[0]);
#ifdef SYS_clone3
	case SYS_clone3:
		return sys_spawn(n, a, a[0] != 0 ? (unsigned long)*(const uint64_t *)a[0] : 0);
#endif
	}
	return sys_forward(n, a);
}
#endif

/* ---- dlopen(): RTLD_DEEPBIND must not take a library past the shim ---- */

static void *
open_base(void *ctx, const char *file, int mode)
{
	(void)ctx;
	return real.dlopen(file, mode);
}

static void *
open_ns(void *ctx, const char *file, int mode)
{
	return real.dlmopen(*(long *)ctx, file, mode);
}

/* Without RTLD_DEEPBIND the call is passed on as a tail call, so libc sees
 * the program's own caller (whose RPATH and namespace dlopen uses). */
BS_EXPORT void *
dlopen(const char *file, int mode)
{
	if (!(mode & RTLD_DEEPBIND))
		return real.dlopen(file, mode);
	return deepbind_load(open_base, NULL, file, mode);
}

/* A new namespace (LM_ID_NEWLM) has a libc of its own, with its own errno:
 * its objects are left as they are. */
BS_EXPORT void *
dlmopen(long ns, const char *file, int mode)
{
	if (!(mode & RTLD_DEEPBIND) || ns != LM_ID_BASE)
		return real.dlmopen(ns, file, mode);
	return deepbind_load(open_ns, &ns, file, mode);
}

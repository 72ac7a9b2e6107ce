/* interpose.c - the exported libc names: look up the descriptor, decide, call the real one. */
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

struct shim_state shim;

/*
 * A process that shares our memory but is not the process the table
 * describes: a vfork child, or a child of a raw clone or _Fork that the
 * fork wrapper did not see. Its descriptors are not ours to account, so
 * every wrapper leaves them alone. Only asked on paths that already concern
 * a counted socket, so the system call is not on anyone's hot path.
 */
static bool
foreign_process(void)
{
	return (pid_t)syscall(SYS_getpid) != shim.pid;
}

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

/* A descriptor number just handed out by the kernel: if the table still
 * marks it counted, the socket it stood for vanished unseen (closefrom,
 * a raw close system call), and its hold goes back now. */
static void
fresh_fd(int fd)
{
	if (fd >= 0 && fdt_get(fd) != 0 && active() && !foreign_process())
		drop_entry(fdt_take(fd));
}

/* newfd is now a copy of oldfd: it holds the same socket, if any. */
static void
copy_fd(int oldfd, int newfd)
{
	uint32_t e = fdt_get(oldfd);

	if (!active() || foreign_process())
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

	if (c == NULL)
		return;
	switch (why) {
	case REASON_FULL:
		log_rejection(comp, "%s full (%u/%u): %s to %s refused", c->name,
		    atomic_load(&c->in_use), atomic_load(&c->limit), what, dest);
		break;
	case REASON_INFLIGHT_FULL:
		log_rejection(comp, "%s: %u/%u requests in flight: %s to %s refused", c->name,
		    atomic_load(&c->inflight), atomic_load(&c->inflight_limit), what, dest);
		break;
	case REASON_WAIT_TIMEOUT:
		log_rejection(comp, "%s full: waited %u ms in vain: %s to %s refused", c->name,
		    atomic_load(&c->max_wait_ms), what, dest);
		break;
	case REASON_TOO_MANY_WAITING:
		log_rejection(comp, "%s full and %u callers already wait: %s to %s refused",
		    c->name, atomic_load(&c->waiting), what, dest);
		break;
	case REASON_CLASS_FULL:
		log_rejection(comp, "%s: class %s at its limit of %u: %s to %s refused", c->name,
		    shim.cls < BS_MAX_CLASSES ? seg_header(shim.seg)->class_name[shim.cls] : "?",
		    atomic_load(&c->cls[shim.cls < BS_MAX_CLASSES ? shim.cls : 0].limit), what, dest);
		break;
	default:
		log_rejection(comp, "%s: the socket or process table of segment %s is full: "
		    "%s to %s refused", c->name, seg_header(shim.seg)->name, what, dest);
		break;
	}
}

/*
 * The slot fd's socket is admitted in: a pending one that a fork made for it
 * (then *shared is true), or a new one. Either way the slot is in the table
 * before the fork gate opens again, so a fork copies both or neither. -1 if
 * the segment's tables are full.
 */
static int
claim_slot(int fd, uint64_t ino, bool *shared)
{
	uint32_t e;
	int slot;

	seg_gate_enter(shim.seg);
	e = fdt_get(fd);
	if (e != 0 && seg_slot_pending(shim.seg, e - 1) &&
	    atomic_load(&seg_slot(shim.seg, e - 1)->inode) == ino) {
		*shared = true;
		slot = (int)(e - 1);
	} else {
		*shared = false;
		slot = seg_pending_slot(shim.seg, ino);
		if (slot >= 0)
			drop_entry(fdt_set(fd, (uint32_t)slot));
	}
	seg_gate_leave(shim.seg);
	return slot;
}

/*
 * Admits slot into comp. When another process sharing the socket (a fork
 * made both hold it before its connect) is admitting it right now, its
 * verdict is awaited: its permit counts for this connect too, and if it was
 * refused, this connect tries for itself. Returns 0, ADMIT_PASS (admitted
 * by the other), or -EBUSY with *why.
 */
static int
admit_slot(uint32_t slot, int comp, bool may_wait, enum bs_reason *why)
{
	struct timespec nap = { 0, 1000000 };
	uint64_t deadline = 0;
	int r;

	for (;;) {
		r = seg_acquire_pending(shim.seg, slot, (uint32_t)comp, shim.cls, may_wait, why);
		if (r != -EALREADY)
			return r;
		if (seg_slot_admitted(shim.seg, slot))
			return ADMIT_PASS;
		if (deadline == 0) {
			struct seg_comp *c = seg_comp(shim.seg, (uint32_t)comp);

			deadline = now_mono_ms() + 1000 + (c != NULL ? atomic_load(&c->max_wait_ms) : 0);
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
shim_admit(int fd, const struct sockaddr *sa, socklen_t len, const char *what)
{
	uint32_t e = fdt_get(fd);
	int comp = match_find(atomic_load(&shim.m), sa, len), type = 0, slot, r;
	socklen_t tlen = sizeof(type);
	enum bs_reason why = REASON_MAX;
	struct seg_comp *c;
	struct stat st;
	char dest[128];
	bool may_wait, shared;

	if (comp < 0 && e == 0)
		return ADMIT_PASS;
	if (foreign_process() || fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
		return ADMIT_PASS;
	fdt_clear_fresh(fd);
	if (e != 0) {
		struct seg_slot *sl = seg_slot(shim.seg, e - 1);

		/* A connect retried on the same socket (EINPROGRESS,
		 * EALREADY, EISCONN; hiredis polls this way) already has
		 * its permit, unless the slot is one a fork shared before
		 * the socket was connected. Any other socket behind the
		 * number is new. */
		if (sl != NULL && atomic_load(&sl->inode) == (uint64_t)st.st_ino) {
			if (comp < 0 || !seg_slot_pending(shim.seg, e - 1))
				return ADMIT_PASS;
		} else {
			drop_entry(fdt_take(fd));
		}
	}
	c = comp >= 0 ? seg_comp(shim.seg, (uint32_t)comp) : NULL;
	if (c == NULL || !fdt_valid(fd))
		return ADMIT_PASS;
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) < 0 || type != SOCK_STREAM)
		return ADMIT_PASS;
	may_wait = atomic_load(&c->max_wait_ms) != 0 && shim_blocking(fd, 0);
	slot = claim_slot(fd, (uint64_t)st.st_ino, &shared);
	if (slot < 0) {
		why = REASON_NO_SLOT;
		seg_count_rejection(shim.seg, (uint32_t)comp, why);
	} else {
		r = admit_slot((uint32_t)slot, comp, may_wait, &why);
		if (r == 0)
			return ADMIT_COUNTED;
		if (r == ADMIT_PASS)
			return ADMIT_PASS;
		/* Refused: a slot of our own goes; one a fork shared stays
		 * pending for the process it is shared with. */
		if (!shared)
			drop_entry(fdt_take(fd));
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
shim_settle(int fd, long r)
{
	int err = errno;

	if (r < 0 && err != EINPROGRESS && err != EINTR && err != EALREADY && err != EISCONN)
		drop_entry(fdt_take(fd));
	errno = err;
}

/* A blocking connect bounded by the compartment's connect_timeout_ms: made
 * non-blocking for the attempt, then waited for with poll. */
static int
connect_timed(int fd, const struct sockaddr *sa, socklen_t len, struct seg_comp *c,
    uint32_t timeout_ms)
{
	int fl = real.fcntl(fd, F_GETFL), r, err = 0, saved;
	uint64_t deadline = now_mono_ms() + timeout_ms, now;
	socklen_t elen = sizeof(err);
	struct pollfd p = { .fd = fd, .events = POLLOUT };

	if (fl < 0 || real.fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return real.connect(fd, sa, len);
	r = real.connect(fd, sa, len);
	if (r < 0 && errno == EINPROGRESS) {
		for (;;) {
			now = now_mono_ms();
			if (now >= deadline) {
				atomic_fetch_add(&c->connect_timeouts, 1);
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

BS_EXPORT int
connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	int saved = errno, r;
	struct seg_comp *c;
	struct seg_slot *sl;
	uint32_t timeout, slot;

	if (!active())
		return real.connect(fd, sa, len);
	shim_maybe_reload();
	switch (shim_admit(fd, sa, len, "connect")) {
	case ADMIT_REFUSED:
		return -1;
	case ADMIT_PASS:
		errno = saved;
		return real.connect(fd, sa, len);
	case ADMIT_COUNTED:
		break;
	}
	slot = fdt_get(fd) - 1;
	sl = seg_slot(shim.seg, slot);
	c = sl != NULL ? seg_comp(shim.seg, atomic_load(&sl->comp)) : NULL;
	timeout = c != NULL ? atomic_load(&c->connect_timeout_ms) : 0;
	/* SO_SNDTIMEO bounds a blocking connect on Linux: a shorter one that
	 * the program set itself wins. */
	if (timeout != 0 && shim_blocking(fd, 0)) {
		struct timeval tv = { 0, 0 };
		socklen_t tvlen = sizeof(tv);
		uint64_t own = getsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, &tvlen) == 0 ?
		    (uint64_t)tv.tv_sec * 1000 + (uint64_t)tv.tv_usec / 1000 : 0;

		errno = saved;
		r = own != 0 && own <= timeout ? real.connect(fd, sa, len) :
		    connect_timed(fd, sa, len, c, timeout);
	} else {
		errno = saved;
		r = real.connect(fd, sa, len);
	}
	saved = errno;
	/* A connect that ended here, well or not (a timeout is what the
	 * caller waited), is timed now; one still under way is timed at the
	 * socket's first use instead (io.c). */
	if (r == 0 || (saved != EINPROGRESS && saved != EINTR))
		seg_connect_done(shim.seg, slot);
	errno = saved;
	shim_settle(fd, r);
	return r;
}

BS_EXPORT int
close(int fd)
{
	uint32_t e;
	int r, saved;

	if (fdt_get(fd) == 0)
		return real.close(fd);
	if (!active() || foreign_process())
		return real.close(fd);
	/* The entry goes first: once the real close returns, the number may
	 * already belong to a new socket of another thread. Linux frees the
	 * descriptor even when close fails, so the hold always goes. */
	e = fdt_take(fd);
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
	if (fdt_get(fd) == 0 || !active() || foreign_process())
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

	if (!active() || foreign_process())
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
	if (fd < 0 || fdt_get(fd) == 0 || !active() || foreign_process())
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

static void
adopt_fd(int fd, uint32_t slot)
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
	int rec, saved = errno, lockfd;
	pid_t pid;

	if (!active() || foreign_process())
		return real.fork();
	/* No thread may be between a change of what this process holds
	 * and its record of it while the child's record is copied. */
	seg_gate_close(shim.seg);
	share_unconnected();
	rec = seg_fork_prepare(shim.seg, &lockfd);
	errno = saved;
	pid = real.fork();
	saved = errno;
	if (pid == 0) {
		shim.pid = (pid_t)syscall(SYS_getpid);
		if (!seg_fork_child(shim.seg, rec, lockfd)) {
			drop_range_local();
			seg_adopt(shim.seg, adopt_fd);
		}
	} else {
		seg_fork_parent(shim.seg, rec, pid, lockfd);
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
	    (domain == AF_INET || domain == AF_INET6 || domain == AF_UNIX) &&
	    active() && !foreign_process();
	int r, saved;

	if (mark)
		seg_gate_enter(shim.seg);
	r = real.socket(domain, type, protocol);
	saved = errno;
	fresh_fd(r);
	if (mark) {
		if (r >= 0)
			fdt_mark_fresh(r);
		seg_gate_leave(shim.seg);
	}
	errno = saved;
	return r;
}

BS_EXPORT int
accept(int fd, struct sockaddr *sa, socklen_t *len)
{
	int r = real.accept(fd, sa, len), saved = errno;

	fresh_fd(r);
	errno = saved;
	return r;
}

BS_EXPORT int
accept4(int fd, struct sockaddr *sa, socklen_t *len, int flags)
{
	int r = real.accept4(fd, sa, len, flags), saved = errno;

	fresh_fd(r);
	errno = saved;
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
			    match_learn(atomic_load(&shim.m), node, ai->ai_addr) == -ENOSPC) {
				bs_log(LOG_WARN, "too many addresses learned for %s; "
				    "later ones are not counted", node);
				break;
			}
		}
	}
	errno = saved;
	return r;
}

/* ---- start-up, reload and exit ---- */

/*
 * Builds the matcher for cfg with every rule pointing at the segment's
 * compartment of the same name, so the hot path needs no second lookup.
 * Rules of compartments the segment lacks are left out. NULL on error.
 */
static struct matcher *
build_matcher(const struct bs_config *cfg, char *err, size_t errlen)
{
	struct rule *rules = calloc(cfg->nrules ? cfg->nrules : 1, sizeof(*rules));
	struct seg_header *h = seg_header(shim.seg);
	struct matcher *m;
	size_t n = 0;

	if (rules == NULL) {
		bs_format(err, errlen, "out of memory");
		return NULL;
	}
	for (size_t i = 0; i < cfg->nrules; i++) {
		const char *name = cfg->comp[cfg->rules[i].comp].name;

		for (uint32_t j = 0; j < h->ncomp; j++) {
			if (strncmp(seg_comp(shim.seg, j)->name, name, BS_NAME_MAX) == 0) {
				rules[n] = cfg->rules[i];
				rules[n++].comp = (int)j;
				break;
			}
		}
	}
	m = match_build(rules, n, err, errlen);
	free(rules);
	return m;
}

/* The class of this process: BULKSHIM_CLASS, else the first class with a
 * pattern matching the program's name, else "default"; as an index into
 * the segment's class names. */
static uint32_t
find_class(const struct bs_config *cfg)
{
	const char *want = getenv("BULKSHIM_CLASS"), *prog = program_invocation_short_name;
	struct seg_header *h = seg_header(shim.seg);

	if (want != NULL && *want != '\0') {
		bool known = false;

		for (size_t k = 0; k < cfg->nclass; k++)
			known = known || strcmp(cfg->classes[k].name, want) == 0;
		if (!known) {
			bs_log(LOG_WARN, "BULKSHIM_CLASS=%s is not a class of %s; using default",
			    want, cfg->path);
			want = NULL;
		}
	} else {
		want = NULL;
		for (size_t k = 1; k < cfg->nclass && want == NULL; k++) {
			for (size_t i = 0; i < cfg->classes[k].npatterns; i++) {
				if (prog != NULL && fnmatch(cfg->classes[k].patterns[i], prog, 0) == 0) {
					want = cfg->classes[k].name;
					break;
				}
			}
		}
	}
	if (want == NULL)
		return 0;
	for (uint32_t k = 0; k < h->nclass && k < BS_MAX_CLASSES; k++) {
		if (strncmp(h->class_name[k], want, BS_CLASS_NAME_MAX) == 0)
			return k;
	}
	return 0;
}

/*
 * `bulkshim reload` bumps the segment's generation after it applied a new
 * config's limits; each process rebuilds its destination rules from that
 * file at its next connect. Host names are not resolved here (that could
 * stall a connect); they are learned from the program's getaddrinfo.
 */
void
shim_maybe_reload(void)
{
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	struct seg_header *h = seg_header(shim.seg);
	uint32_t g = atomic_load(&h->generation);
	char path[PATH_MAX], err[BS_ERRLEN];
	struct bs_config cfg;
	struct matcher *m;

	if (g == atomic_load(&shim.gen) || pthread_mutex_trylock(&lock) != 0)
		return;
	if (g != atomic_load(&shim.gen)) {
		memcpy(path, h->config_path, sizeof(path));
		path[sizeof(path) - 1] = '\0';
		if (cfg_load(path, &cfg, false, err, sizeof(err)) < 0) {
			bs_log(LOG_ERROR, "reload: %s; keeping the old destinations", err);
		} else {
			m = build_matcher(&cfg, err, sizeof(err));
			if (m == NULL)
				bs_log(LOG_ERROR, "reload: %s: %s; keeping the old destinations",
				    path, err);
			else
				/* The old matcher is left allocated: another
				 * thread may be reading it right now. */
				atomic_store(&shim.m, m);
			cfg_free(&cfg);
			bs_log(LOG_INFO, "reloaded destinations from %s", path);
		}
		atomic_store(&shim.gen, g);
	}
	pthread_mutex_unlock(&lock);
}

static bool
env_true(const char *v)
{
	return v != NULL && (strcmp(v, "1") == 0 || strcmp(v, "yes") == 0 ||
	    strcmp(v, "true") == 0 || strcmp(v, "on") == 0);
}

/* The shim cannot work: strict mode ends the process, the default leaves
 * the program running without limits. */
static void
give_up(bool strict, const char *why)
{
	if (strict) {
		bs_log(LOG_ERROR, "%s; exiting (strict mode)", why);
		_exit(BS_EX_CONFIG);
	}
	bs_log(LOG_ERROR, "%s; running without limits", why);
}

__attribute__((constructor)) static void
shim_init(void)
{
	char err[BS_ERRLEN], msg[BS_ERRLEN + 64];
	const char *path, *level;
	struct matcher *m;
	bool strict;
	int r;

	real_bind();
	shim.pid = (pid_t)syscall(SYS_getpid);
	/* In secure execution the environment belongs to someone else. */
	if (getauxval(AT_SECURE) != 0)
		return;
	level = getenv("BULKSHIM_LOG");
	if (level != NULL && log_set_level(level) < 0)
		bs_log(LOG_WARN, "BULKSHIM_LOG=%s is not off, error, warn, info or debug; using warn",
		    level);
	strict = env_true(getenv("BULKSHIM_STRICT"));
	path = getenv("BULKSHIM_CONFIG");
	if (path == NULL || *path == '\0')
		path = BS_DEFAULT_CONFIG;
	if (fdt_init() < 0) {
		give_up(strict, "cannot map the descriptor table");
		return;
	}
	r = cfg_load(path, &shim.cfg, true, err, sizeof(err));
	if (r == -ENOENT) {
		if (strict)
			give_up(true, err);
		bs_log(LOG_WARN, "no config file %s (set BULKSHIM_CONFIG); running without limits",
		    path);
		return;
	}
	if (r < 0) {
		give_up(strict || cfg_wants_strict(path), err);
		return;
	}
	strict = strict || shim.cfg.strict;
	r = seg_attach(&shim.cfg, &shim.seg, err, sizeof(err));
	if (r < 0) {
		bs_format(msg, sizeof(msg), "%s: %s", shim.cfg.path, err);
		give_up(strict, msg);
		return;
	}
	m = build_matcher(&shim.cfg, err, sizeof(err));
	if (m == NULL) {
		give_up(strict, err);
		return;
	}
	atomic_store(&shim.m, m);
	atomic_store(&shim.gen, atomic_load(&seg_header(shim.seg)->generation));
	shim.cls = find_class(&shim.cfg);
	seg_adopt(shim.seg, adopt_fd);
	atomic_store_explicit(&shim.ready, 1, memory_order_release);
	bs_log(LOG_INFO, "%s: %u compartments in segment %s, class %s", shim.cfg.path,
	    (unsigned)shim.cfg.ncomp, shim.cfg.segment, seg_header(shim.seg)->class_name[shim.cls]);
}

/* A normal exit gives every permit of this process back, once the kernel
 * has closed its sockets (see seg_exit). */
__attribute__((destructor)) static void
shim_fini(void)
{
	if (active() && !foreign_process())
		seg_exit(shim.seg);
}

/* connect.c - a connect's admission: the destination's compartment, its permits, the refusal, the timeout. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>

#include "interpose/interpose.h"

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
	fl = sys_fcntl(fd, F_GETFL, NULL);
	return fl >= 0 && !(fl & O_NONBLOCK);
}

/* The line of a refusal of compartment `name`'s connect for a full table
 * of the segment: the table, its size `now` (config key `key`, at most
 * `max`) and what to do: the value to set, or, when the config file asks
 * for more than the segment has already (a segment keeps the size it was
 * made with), when that takes effect. */
static void
table_full(char *msg, size_t len, const char *name, const char *table, const char *key,
    uint32_t now, uint32_t want, uint32_t max, const char *what, const char *dest)
{
	char advice[320];

	if (want > now)
		bs_format(advice, sizeof(advice), "%s sets %s = %u, the size the segment gets when "
		    "it is made again, once no process uses it", shim.cfg.path, key, want);
	else
		bs_format(advice, sizeof(advice), "set %s = %u in %s", key, seg_table_grown(now, max),
		    shim.cfg.path);
	bs_format(msg, len, "%s: the %s table of segment %s is full (%s = %u): %s to %s refused; %s",
	    name, table, shim.cfg.segment, key, now, what, dest, advice);
}

/* What binds a refusal for a full limit of kind p (P_CONN, P_INFLIGHT)
 * of c, by limit_why, after `pre`: nothing for the static limit (the line
 * stays as scripts know it), else "fleet floor", "fleet share; static 8"
 * or "adaptive limit; static 64". Async-signal-safe: bs_format and atomic
 * loads only. */
static void
bind_text(const struct seg_comp *c, int p, enum limit_by by, const char *pre, char *buf,
    size_t len)
{
	uint32_t st = atomic_load(p == P_INFLIGHT ? &c->inflight_limit : &c->limit);
	char num[16];

	buf[0] = '\0';
	if (by == LIMIT_BY_STATIC || by == LIMIT_BY_NONE)
		return;
	if (st == UINT32_MAX)
		bs_format(num, sizeof(num), "none");
	else
		bs_format(num, sizeof(num), "%u", st);
	bs_format(buf, len, "%s%s%s; static %s", pre, limit_by_name(by),
	    by == LIMIT_BY_ADAPTIVE ? " limit" : "", num);
}

void
shim_log_refusal(const struct seg_comp *c, enum bs_reason why, const char *what, const char *dest)
{
	uint32_t comp = (uint32_t)(c - shim.seg->comp);
	unsigned cls = shim.cls < BS_MAX_CLASSES ? shim.cls : 0;
	struct log_refusal r;
	enum limit_by by;
	uint64_t skipped;
	char msg[640], name[BS_NAME_MAX], cname[BS_CLASS_NAME_MAX], bind[64];

	if (c == NULL || !log_gate_due(&shim.seg->comp[comp].log_gate, &skipped))
		return;
	/* The names are the segment's, which anybody who may write it may
	 * have rewritten: logged only as a config could have given them. */
	log_name(name, sizeof(name), c->name, sizeof(c->name));
	log_name(cname, sizeof(cname), seg_header(shim.seg)->class_name[cls],
	    sizeof(cname));
	r.message = msg;
	r.compartment = name;
	r.reason = stat_reason_name(why);
	r.operation = what;
	r.destination = dest;
	r.in_use = atomic_load(&c->in_use);
	r.limit = atomic_load(&c->limit);
	switch (why) {
	case REASON_FULL:
		r.limit = limit_why(c, P_CONN, &by);
		bind_text(c, P_CONN, by, ", ", bind, sizeof(bind));
		bs_format(msg, sizeof(msg), "%s full (%u/%u%s): %s to %s refused", name,
		    r.in_use, r.limit, bind, what, dest);
		break;
	case REASON_INFLIGHT_FULL:
		r.in_use = atomic_load(&c->inflight);
		r.limit = limit_why(c, P_INFLIGHT, &by);
		bind_text(c, P_INFLIGHT, by, " (", bind, sizeof(bind));
		bs_format(msg, sizeof(msg), "%s: %u/%u requests in flight%s%s: %s to %s refused",
		    name, r.in_use, r.limit, bind, bind[0] != '\0' ? ")" : "", what, dest);
		break;
	case REASON_WAIT_TIMEOUT:
		bs_format(msg, sizeof(msg), "%s full: waited %u ms in vain: %s to %s refused", name,
		    atomic_load(&c->max_wait_ms), what, dest);
		break;
	case REASON_TOO_MANY_WAITING:
		bs_format(msg, sizeof(msg), "%s full and %u callers already wait: %s to %s refused",
		    name, atomic_load(&c->waiting), what, dest);
		break;
	case REASON_CLASS_FULL:
		r.in_use = atomic_load(&c->cls[cls].in_use);
		r.limit = atomic_load(&c->cls[cls].limit);
		bs_format(msg, sizeof(msg), "%s: class %s at its limit of %u: %s to %s refused", name,
		    cname, r.limit, what, dest);
		break;
	case REASON_POOL_FULL: {
		struct seg_pool *pool = seg_pool_of(shim.seg, c);
		char pname[BS_NAME_MAX] = "?";

		if (pool != NULL) {
			log_name(pname, sizeof(pname), pool->name, sizeof(pool->name));
			r.in_use = atomic_load(&pool->shared);
			r.limit = r.in_use;
		}
		bs_format(msg, sizeof(msg), "%s: pool %s has lent all %u of its shared permits "
		    "(pool_full; %s holds %u, guaranteed %u): %s to %s refused", name,
		    pname, pool != NULL ? atomic_load(&pool->shared) : 0,
		    name, atomic_load(&c->in_use), atomic_load(&c->guaranteed), what, dest);
		break;
	}
	case REASON_CLASS_SHARED_FULL:
		r.in_use = atomic_load(&c->cls_shared);
		r.limit = r.in_use;
		bs_format(msg, sizeof(msg), "%s has lent all %u of its unguaranteed permits to its "
		    "classes (class_shared_full; class %s holds %u, guaranteed %u): %s to %s refused",
		    name, r.limit, cname,
		    cls < BS_MAX_CLASSES ? atomic_load(&c->cls[cls].in_use) : 0,
		    cls < BS_MAX_CLASSES ? atomic_load(&c->cls_guaranteed[cls]) : 0, what, dest);
		break;
	case REASON_NO_SLOT:
		r.in_use = r.limit = shim.seg->nslots;
		table_full(msg, sizeof(msg), name, "socket", "max_sockets", shim.seg->nslots,
		    shim.cfg.max_sockets, BS_MAX_SOCKETS, what, dest);
		break;
	case REASON_PROCESS_TABLE_FULL:
		r.in_use = r.limit = shim.seg->nprocs;
		table_full(msg, sizeof(msg), name, "process", "max_processes", shim.seg->nprocs,
		    shim.cfg.max_processes, BS_MAX_PROCESSES, what, dest);
		break;
	default:
		bs_format(msg, sizeof(msg), "%s: refused (%s): %s to %s", name,
		    stat_reason_name(why), what, dest);
		break;
	}
	log_refusal(&r, skipped);
}

/*
 * The slot fd's socket is admitted in: a pending one that a fork made for it
 * (then *shared is true), or a new one, watched unless the socket is fresh
 * from this process's socket() since its last fork or spawn (one made
 * before a fork that gave it no pending slot, or before a child made
 * without fork, may be open in another process too). The mark is read
 * here, inside the gate: a fork or spawn that ran since the caller's look
 * has cleared it. Either way the slot is in the table before the fork
 * gate opens again, so a fork copies both or neither. -ENOSPC with *why if
 * the segment's tables are full. fd is one that fdt_valid passed.
 */
static int
claim_slot(int fd, uint64_t ino, struct seg_comp *c, bool *shared,
    enum bs_reason *why)
{
	uint64_t ent;
	uint32_t e;
	int slot = -ESTALE;

	proc_gate_enter(shim.seg);
	ent = fdt_entry_valid(fd);
	e = (uint32_t)ent;
	if (e != 0 && slot_pending(shim.seg, e - 1) &&
	    atomic_load(&seg_slot(shim.seg, e - 1)->inode) == ino)
		slot = permit_share(shim.seg, e - 1, ino, why);
	*shared = slot >= 0;
	if (slot == -ESTALE) {
		slot = permit_claim(shim.seg, c, ino, ent != FDT_FRESH, why);
		if (slot >= 0)
			slot_drop(shim.seg, fdt_set_valid(fd, (uint32_t)slot) - 1);
	}
	proc_gate_leave(shim.seg);
	return slot;
}

/*
 * Admits slot into c. When another process sharing the socket (a fork
 * made both hold it before its connect) is admitting it right now, its
 * verdict is awaited: its permit counts for this connect too, and if it was
 * refused, this connect tries for itself. TAKE_OK (admitted here),
 * TAKE_SHARED (admitted by the other), or TAKE_FULL with *why.
 */
static enum take
admit_or_await(uint32_t slot, struct seg_comp *c, int wait, enum bs_reason *why)
{
	struct timespec nap = { 0, 1000000 };
	uint64_t deadline = 0;
	enum take r;

	for (;;) {
		r = permit_admit(shim.seg, slot, c, shim.cls, wait, why);
		if (r != TAKE_SHARED)
			return r;
		if (slot_admitted(shim.seg, slot))
			return TAKE_SHARED;
		if (slot_pending(shim.seg, slot))
			continue;	/* the other was refused: our turn */
		if (deadline == 0) {
			deadline = now_mono_ms() + 1000 + seg_max_wait_ms(c);
		} else if (now_mono_ms() >= deadline) {
			*why = REASON_WAIT_TIMEOUT;
			stat_refused(shim.seg, c, *why);
			return TAKE_FULL;
		}
		nanosleep(&nap, NULL);
	}
}

/*
 * Decides a connect (or a TCP Fast Open send) of fd to sa: TAKE_PASS when
 * the shim has nothing to count, TAKE_OK when a permit was taken and
 * recorded for fd, TAKE_FULL with errno set when the compartment refused.
 */
enum take
shim_admit(int fd, const struct sockaddr *sa, socklen_t len, const char *what,
    struct admitted *got)
{
	/* The descriptor's one lookup: its entry says whether the shim
	 * counts it already and whether it is fresh from socket(). */
	bool valid = fdt_valid(fd);
	uint64_t ent = valid ? fdt_entry_valid(fd) : 0;
	uint32_t e = (uint32_t)ent;
	int comp = match_find(atomic_load(&shim.m), sa, len), type = 0, slot;
	socklen_t tlen = sizeof(type);
	enum bs_reason why = REASON_MAX;
	struct seg_comp *c;
	enum take r;
	struct stat st;
	char dest[128];
	bool shared;

	if (comp < 0 && e == 0)
		return TAKE_PASS;
	if (shim_foreign() || fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
		return TAKE_PASS;
	if (e != 0) {
		struct seg_slot *sl = seg_slot(shim.seg, e - 1);

		/* A connect retried on the same socket (EINPROGRESS,
		 * EALREADY, EISCONN; hiredis polls this way) already has
		 * its permit, unless the slot is one a fork shared before
		 * the socket was connected. Any other socket behind the
		 * number is new. */
		if (sl != NULL && atomic_load(&sl->inode) == (uint64_t)st.st_ino) {
			if (comp < 0 || slot_admitted(shim.seg, e - 1))
				return TAKE_PASS;
			/* Pending, or being admitted by the other process
			 * sharing it: admit_or_await waits for that verdict. */
		} else {
			slot_drop(shim.seg, fdt_take(fd) - 1);
		}
	}
	c = comp >= 0 ? seg_comp(shim.seg, (uint32_t)comp) : NULL;
	if (c == NULL || !valid)
		return TAKE_PASS;
	/* A socket from our socket() is known to be a stream socket. */
	got->fresh = ent == FDT_FRESH;
	if (!got->fresh &&
	    (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) < 0 || type != SOCK_STREAM))
		return TAKE_PASS;
	slot = claim_slot(fd, (uint64_t)st.st_ino, c, &shared, &why);
	if (slot < 0) {
		stat_refused(shim.seg, c, why);
	} else {
		/* Whether the descriptor blocks is asked only if the
		 * compartment is full and waits (permit.c's take_wait). */
		r = admit_or_await((uint32_t)slot, c, fd, &why);
		if (r == TAKE_OK) {
			got->slot = (uint32_t)slot;
			got->c = c;
			return TAKE_OK;
		}
		if (r == TAKE_SHARED)
			return TAKE_PASS;
		/* Refused: a slot of our own goes (the socket stays as fresh
		 * as it was); one a fork shared stays pending for the process
		 * it is shared with. */
		if (!shared)
			slot_drop(shim.seg, fdt_unclaim(fd, got->fresh) - 1);
	}
	match_format(sa, len, dest, sizeof(dest));
	shim_log_refusal(c, why, what, dest);
	/* connect is a cancellation point: a thread cancelled while it
	 * would have been refused must see the cancellation first. */
	pthread_testcancel();
	errno = shim_reject_errno(c);
	return TAKE_FULL;
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
		slot_drop(shim.seg, fdt_unclaim(fd, got->fresh) - 1);
	errno = err;
}

/*
 * The connect of fd bounded by compartment c's connect_timeout_ms (timeout,
 * not 0); errno is restored to saved before the real call. A blocking
 * socket without a shorter SO_SNDTIMEO of its own (which bounds a
 * blocking connect on Linux, and wins) is made non-blocking for the
 * attempt, which is then waited for with poll; *timed_out says that it
 * ran out (errno ETIMEDOUT), and *aborted that the attempt was undone
 * then (else it may still connect, and keeps its permit). Any other
 * socket connects the plain way. The flags are read once, for both.
 */
static int
connect_bounded(int fd, const struct sockaddr *sa, socklen_t len, struct seg_comp *c,
    uint32_t timeout, int saved, bool *timed_out, bool *aborted)
{
	struct pollfd p = { .fd = fd, .events = POLLOUT };
	socklen_t elen = sizeof(int);
	int fl = sys_fcntl(fd, F_GETFL, NULL), r, err = 0;
	uint64_t own, deadline, now;

	if (fl < 0 || (fl & O_NONBLOCK)) {
		errno = saved;
		return real.connect(fd, sa, len);
	}
	own = shim_own_timeout_ms(fd, SO_SNDTIMEO);
	errno = saved;
	if (own != 0 && own <= timeout)
		return real.connect(fd, sa, len);
	deadline = now_mono_ms() + timeout;
	if (sys_fcntl(fd, F_SETFL, (void *)(long)(fl | O_NONBLOCK)) < 0) {
		r = real.connect(fd, sa, len);
		*timed_out = r < 0 && errno == ETIMEDOUT;
		return r;
	}
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
	sys_fcntl(fd, F_SETFL, (void *)(long)fl);
	errno = saved;
	*timed_out = r < 0 && errno == ETIMEDOUT;
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

BS_EXPORT int
connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	int saved = errno, r;
	struct admitted got;
	struct seg_comp *c;
	enum take verdict;
	uint32_t timeout;
	bool timed_out = false, aborted = false;

	if (!shim_active())
		return real.connect(fd, sa, len);
	shim_maybe_reload();
	verdict = shim_admit(fd, sa, len, "connect", &got);
	if (verdict == TAKE_FULL)
		return -1;
	if (verdict != TAKE_OK) {
		errno = saved;
		r = real.connect(fd, sa, len);
		if (connect_began(r))
			fdt_clear_fresh(fd);
		return r;
	}
	c = got.c;
	timeout = atomic_load(&c->connect_timeout_ms);
	if (__builtin_expect(atomic_load_explicit(&c->drill.faults, memory_order_relaxed) != 0, 0) &&
	    drill_connect(fd, c, got.slot, &timeout) < 0) {
		/* Refused or timed out: the permit goes back as for any
		 * connect that failed at once; EINTR keeps it, as there. */
		saved = errno;
		shim_settle(fd, -1, &got);
		errno = saved;
		return -1;
	}
	if (timeout != 0) {
		r = connect_bounded(fd, sa, len, c, timeout, saved, &timed_out, &aborted);
	} else {
		errno = saved;
		r = real.connect(fd, sa, len);
	}
	saved = errno;
	/* A connect that ended here, well or not (a timeout is what the
	 * caller waited), is timed now; one still under way is timed at the
	 * socket's first use instead (io.c). */
	if (r == 0 || (saved != EINPROGRESS && saved != EINTR))
		stat_connect_done_in(shim.seg, got.slot, c);
	errno = saved;
	/* A timed-out attempt that could not be aborted may still connect:
	 * it keeps its permit until the socket is closed. (The slot recorded
	 * for the descriptor cleared its fresh mark; a connect that failed at
	 * once gets it back from shim_settle.) */
	if (!timed_out || aborted)
		shim_settle(fd, r, &got);
	return r;
}

/* A host-name destination follows what the program itself resolves, so a
 * DNS change after start-up is followed too. */
BS_EXPORT int
getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
    struct addrinfo **res)
{
	int r = real.getaddrinfo(node, service, hints, res), saved = errno;

	if (r == 0 && node != NULL && shim_active() && match_has_host(atomic_load(&shim.m), node)) {
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


/* faults.c - a running drill's faults on a counted socket: refused and delayed connects, delayed and stalled replies, resets. */
#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "interpose/interpose.h"

/*
 * `bulkshim drill` writes a drill into a compartment (admit/drill.c); the
 * wrappers find it at the next call on one of its sockets: a compartment
 * with a drill set is never given a plain verdict (io.c), so every call of
 * its sockets comes here while the drill's faults are set. Only sockets the
 * compartment counts are touched, and of those the drill's fraction.
 *
 *   refuse         the connect fails with ECONNREFUSED, as if nothing
 *                  listened; its permit goes back as for any failed connect
 *   connect-delay  the connect waits the delay first (its permit held)
 *   delay          the first receive after a send waits the delay first:
 *                  the reply arrives that much later, the same bytes
 *   stall          every receive waits until the drill ends
 *   reset          the next send or receive resets the connection (RST)
 *                  and fails with ECONNRESET
 *
 * A wait ends early when the drill ends (its deadline, a `drill stop`, a
 * reload that no longer allows drills), and where the call would have
 * ended anyway: at the program's own SO_RCVTIMEO / SO_SNDTIMEO (EAGAIN, or
 * ETIMEDOUT for a connect), at the compartment's io_timeout_ms or
 * connect_timeout_ms (ETIMEDOUT, counted as the library's timeouts), or on
 * a signal: the wait is a blocking read of a timer descriptor, which the
 * kernel restarts after a handler with SA_RESTART and ends with EINTR
 * after one without, as the call it stands in for. A receive retried after
 * EINTR waits only what was left of its delay. Sockets that do not block
 * (O_NONBLOCK, MSG_DONTWAIT) are spared the waits, since waiting there would
 * hold the program's event loop and every other connection of it: they
 * are counted in the drill's `spared`.
 */

/* The longest single wait: a stop or a reload is seen within this. */
#define DRILL_SLICE_MS	100u
/* Descriptors below this have a delay state; receives on those above are
 * spared a delay. */
#define DRILL_FDS	65536

/*
 * A socket's delay: the drill it belongs to (the id's low 24 bits) above
 * 40 bits of CLOCK_MONOTONIC milliseconds at which the delayed reply may be
 * read, DUE_SENT when a send asked for a delay that no receive started yet,
 * 0 for none. An entry of another drill is no entry.
 */
#define DUE_MS_BITS	40
#define DUE_MS_MASK	((1ULL << DUE_MS_BITS) - 1)
#define DUE_SENT	DUE_MS_MASK
static _Atomic uint64_t due[DRILL_FDS];

/* The drill whose start this process logged, per compartment, and how
 * many of them are set (0: no end to log). */
static _Atomic uint64_t seen[BS_MAX_COMPARTMENTS];
static _Atomic int nseen;

static uint64_t
due_tag(const struct drill_view *v)
{
	return (v->id & 0xffffffULL) << DUE_MS_BITS;
}

static void
faults_text(uint32_t f, const struct drill_view *v, char *buf, size_t len)
{
	size_t n = 0;

	buf[0] = '\0';
	if (f & DRILL_REFUSE)
		n += (size_t)bs_format(buf + n, len - n, "%srefuse", n ? ", " : "");
	if ((f & DRILL_CONNECT_DELAY) && n < len)
		n += (size_t)bs_format(buf + n, len - n, "%sconnect delay %u ms", n ? ", " : "",
		    v->connect_delay_ms);
	if ((f & DRILL_DELAY) && n < len)
		n += (size_t)bs_format(buf + n, len - n, "%sreply delay %u ms", n ? ", " : "",
		    v->delay_ms);
	if ((f & DRILL_STALL) && n < len)
		n += (size_t)bs_format(buf + n, len - n, "%sstall", n ? ", " : "");
	if ((f & DRILL_RESET) && n < len)
		bs_format(buf + n, len - n, "%sreset", n ? ", " : "");
}

/*
 * c's drill as of now, into v (its faults, 0 if none runs). The first call
 * of this process to see a drill logs its start; the first to see it over
 * logs its end.
 */
static uint32_t
drill_now(struct seg_comp *c, struct drill_view *v)
{
	uint64_t now = now_mono_ms(), old;
	uint32_t f = drill_read(c, now, v);
	size_t ci = (size_t)(c - seg_comp(shim.seg, 0));
	char what[128];

	if (ci >= BS_MAX_COMPARTMENTS)
		return f;
	old = atomic_load(&seen[ci]);
	if (f != 0 && old != v->id + 1 && atomic_compare_exchange_strong(&seen[ci], &old,
	    v->id + 1)) {
		if (old == 0)
			atomic_fetch_add(&nseen, 1);
		faults_text(f, v, what, sizeof(what));
		if (v->fraction_ppm != 0 && v->fraction_ppm < DRILL_PPM)
			bs_log(LOG_WARN, "drill on compartment %s: %s on %u.%u%% of its connections "
			    "for %llu s", c->name, what, v->fraction_ppm / 10000,
			    v->fraction_ppm / 1000 % 10, (unsigned long long)(v->deadline_ms - now + 999) / 1000);
		else
			bs_log(LOG_WARN, "drill on compartment %s: %s on its connections for %llu s",
			    c->name, what, (unsigned long long)(v->deadline_ms - now + 999) / 1000);
	} else if (f == 0 && old != 0 && atomic_compare_exchange_strong(&seen[ci], &old, 0)) {
		atomic_fetch_sub(&nseen, 1);
		bs_log(LOG_WARN, "drill on compartment %s ended: its connections run as before",
		    c->name);
	}
	return f;
}

bool
drill_running(struct seg_comp *c)
{
	struct drill_view v;

	if (atomic_load_explicit(&c->drill.faults, memory_order_relaxed) == 0 &&
	    atomic_load_explicit(&nseen, memory_order_relaxed) == 0)
		return false;
	return drill_now(c, &v) != 0;
}

/* Sleeps ms milliseconds in one blocking read of a timer descriptor (see
 * above): 0, or -1 with errno EINTR. Without a timer descriptor (none
 * left), a nanosleep that goes on after signals. */
static int
sleep_ms(uint64_t ms)
{
	struct itimerspec t = { .it_value = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000 } };
	struct timespec ts = t.it_value;
	uint64_t n;
	long r;
	int fd;

	if (ms == 0)
		return 0;
	fd = (int)sys_call(SYS_timerfd_create, CLOCK_MONOTONIC, TFD_CLOEXEC, 0, 0, 0, 0);
	if (fd < 0) {
		while (sys_call(SYS_nanosleep, (long)&ts, (long)&ts, 0, 0, 0, 0) < 0 &&
		    errno == EINTR) {
		}
		return 0;
	}
	r = sys_call(SYS_timerfd_settime, fd, 0, (long)&t, 0, 0, 0);
	if (r == 0)
		r = sys_read(fd, &n, sizeof(n));
	sys_close(fd);
	return r < 0 && errno == EINTR ? -1 : 0;
}

enum drill_end_by { END_TIME, END_DRILL, END_OWN, END_LIMIT, END_SIGNAL };

/* Waits until `until` (CLOCK_MONOTONIC ms), at most `own` ms if not 0 (the
 * program's timeout) and `limit` ms if not 0 (the compartment's), ending
 * early when drill v is over. Says what ended it. */
static enum drill_end_by
drill_wait(struct seg_comp *c, const struct drill_view *v, uint64_t until, uint64_t own,
    uint64_t limit)
{
	uint64_t start = now_mono_ms(), now = start, end = until;
	enum drill_end_by by = END_TIME;
	struct drill_view w;

	if (own != 0 && start + own < end) {
		end = start + own;
		by = END_OWN;
	}
	if (limit != 0 && start + limit < end) {
		end = start + limit;
		by = END_LIMIT;
	}
	while (now < end) {
		/* drill_now: the end, if this is it, is logged here. */
		if (drill_now(c, &w) == 0 || w.id != v->id)
			return END_DRILL;
		if (sleep_ms(end - now < DRILL_SLICE_MS ? end - now : DRILL_SLICE_MS) < 0)
			return END_SIGNAL;
		now = now_mono_ms();
	}
	return by;
}

/* Resets fd's connection: an RST to the peer (a disconnect of a TCP
 * socket that holds a connection), else both directions shut. The call
 * fails with ECONNRESET; a request in flight of slot e - 1 ends. */
static int
drill_reset(int fd, struct seg_comp *c, uint32_t e)
{
	struct sockaddr unspec = { .sa_family = AF_UNSPEC };

	if (real.connect(fd, &unspec, sizeof(unspec)) < 0)
		sys_call(SYS_shutdown, fd, SHUT_RDWR, 0, 0, 0, 0);
	atomic_fetch_add(&c->drill.touched, 1);
	if (e != 0)
		permit_inflight_cancel(shim.seg, e - 1);
	errno = ECONNRESET;
	return -1;
}

int
drill_connect(int fd, struct seg_comp *c, uint32_t slot, uint32_t *timeout_ms)
{
	struct seg_slot *sl = seg_slot(shim.seg, slot);
	uint64_t start, waited;
	struct drill_view v;
	enum drill_end_by by;
	uint32_t f = drill_now(c, &v);

	if (fd >= 0 && fd < DRILL_FDS)
		atomic_store(&due[fd], 0);
	if (f == 0 || sl == NULL || !drill_picks(&v, atomic_load(&sl->inode)))
		return 0;
	if (f & DRILL_REFUSE) {
		atomic_fetch_add(&c->drill.touched, 1);
		errno = ECONNREFUSED;
		return -1;
	}
	if (!(f & DRILL_CONNECT_DELAY) || v.connect_delay_ms == 0)
		return 0;
	if (!shim_blocking(fd, 0)) {
		atomic_fetch_add(&c->drill.spared, 1);
		return 0;
	}
	atomic_fetch_add(&c->drill.touched, 1);
	start = now_mono_ms();
	by = drill_wait(c, &v, start + v.connect_delay_ms, shim_own_timeout_ms(fd, SO_SNDTIMEO),
	    *timeout_ms);
	switch (by) {
	case END_SIGNAL:
		errno = EINTR;
		return -1;
	case END_LIMIT:
		atomic_fetch_add(&c->connect_timeouts, 1);
		/* fall through */
	case END_OWN:
		errno = ETIMEDOUT;
		return -1;
	case END_TIME:
	case END_DRILL:
		break;
	}
	waited = now_mono_ms() - start;
	if (*timeout_ms != 0)
		*timeout_ms = waited < *timeout_ms ? *timeout_ms - (uint32_t)waited : 1;
	return 0;
}

int
drill_send(int fd, struct seg_slot *sl, struct seg_comp *c)
{
	struct drill_view v;
	uint32_t f = drill_now(c, &v);
	uint64_t old;

	if (f == 0 || !drill_picks(&v, atomic_load(&sl->inode)))
		return 0;
	if (f & DRILL_RESET)
		return drill_reset(fd, c, 0);
	if ((f & DRILL_DELAY) && fd >= 0 && fd < DRILL_FDS) {
		old = atomic_load(&due[fd]);
		/* The first send since the last reply asks for the delay. */
		if ((old & ~DUE_MS_MASK) != due_tag(&v) || (old & DUE_MS_MASK) == 0)
			atomic_compare_exchange_strong(&due[fd], &old, due_tag(&v) | DUE_SENT);
	}
	return 0;
}

int
drill_recv(int fd, struct seg_slot *sl, struct seg_comp *c, uint32_t e, int flags)
{
	struct drill_view v;
	uint32_t f = drill_now(c, &v);
	uint64_t d = 0, until, now;
	enum drill_end_by by;

	if (f == 0 || !drill_picks(&v, atomic_load(&sl->inode)))
		return 0;
	if (f & DRILL_RESET)
		return drill_reset(fd, c, e);
	if (!(f & (DRILL_DELAY | DRILL_STALL)))
		return 0;
	if (f & DRILL_STALL) {
		until = v.deadline_ms;
	} else {
		if (fd < 0 || fd >= DRILL_FDS) {
			atomic_fetch_add(&c->drill.spared, 1);
			return 0;
		}
		d = atomic_load(&due[fd]);
		if ((d & ~DUE_MS_MASK) != due_tag(&v) || (d & DUE_MS_MASK) == 0)
			return 0;	/* no send asked for a delay */
		until = d & DUE_MS_MASK;
	}
	if (!shim_blocking(fd, flags)) {
		atomic_fetch_add(&c->drill.spared, 1);
		if (d != 0)
			atomic_store(&due[fd], 0);
		return 0;
	}
	now = now_mono_ms();
	if (d != 0 && (d & DUE_MS_MASK) == DUE_SENT) {
		/* The reply's delay starts at its first receive: kept, so
		 * that a receive retried after a signal waits the rest. */
		until = (now + v.delay_ms) & DUE_MS_MASK;
		atomic_store(&due[fd], due_tag(&v) | until);
		atomic_fetch_add(&c->drill.touched, 1);
	} else if (d == 0) {
		atomic_fetch_add(&c->drill.touched, 1);
	}
	by = drill_wait(c, &v, until, shim_own_timeout_ms(fd, SO_RCVTIMEO),
	    atomic_load(&c->io_timeout_ms));
	switch (by) {
	case END_SIGNAL:
		errno = EINTR;
		return -1;
	case END_OWN:
		errno = EAGAIN;
		return -1;
	case END_LIMIT:
		atomic_fetch_add(&c->io_timeouts, 1);
		permit_inflight_cancel(shim.seg, e - 1);
		errno = ETIMEDOUT;
		return -1;
	case END_TIME:
	case END_DRILL:
		break;
	}
	if (d != 0)
		atomic_store(&due[fd], 0);
	return 0;
}

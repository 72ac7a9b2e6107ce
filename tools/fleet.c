/* fleet.c - `bulkshim fleet`: the agent that leases this host's shares of fleet budgets, and --status. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "fleet.h"

#define WAIT_DEFAULT_S	60	/* for the service's segment, then exit EX_TEMPFAIL */
#define WAIT_MAX_S	86400
#define EX_TEMPFAIL	75	/* sysexits.h: systemd's Restart= starts the agent again */

/* Samples of demand remembered: a sample covers at least a quarter of the
 * interval (rounds closer than that add to the newest), so the ring spans
 * eight intervals, more than a lease at the default interval (a sixth of
 * it); an agent renewing less often than a sixth of its lease remembers
 * the last NEED_SAMPLES rounds only. */
#define NEED_SAMPLES	32

/* How often the agent looks at its own segment between rounds, for the
 * moments a round should come at once (see call_now): a tenth of the
 * interval, at most 25 ms, at least 5. */
#define TICK_MAX_MS	25
#define TICK_MIN_MS	5

/* One compartment of the segment in a fleet budget, as the agent follows it. */
struct fleet_comp {
	uint32_t idx;			/* in the segment */
	uint64_t rejected;		/* its rejected count at the last round */
	uint32_t state;			/* FLEET_* last written */
	uint32_t in_force;		/* the fleet's limit, as Redis last said */
	char note[256];			/* the last note or error, logged once */
	/* What the host needed at each of the last rounds, and when
	 * (CLOCK_MONOTONIC ms; 0 = no sample): a ring, next is the oldest. */
	uint32_t need[NEED_SAMPLES];
	uint64_t need_at[NEED_SAMPLES];
	uint32_t next;
	/* Share changes, each weighing less as a minute passes: about the
	 * changes of the last minute; and when it was last weighed. */
	double churn;
	uint64_t churn_at;
};

/* Weighs fc's churn to now, counting one more change if changed: an
 * exponential average over a minute, by its first-order step (rounds are
 * a few seconds apart at most). */
static uint32_t
count_churn(struct fleet_comp *fc, bool changed)
{
	uint64_t now = now_mono_ms();
	uint64_t dt = fc->churn_at != 0 && now > fc->churn_at ? now - fc->churn_at : 0;

	fc->churn = dt >= 60000 ? 0 : fc->churn * (1.0 - (double)dt / 60000.0);
	fc->churn += changed ? 1 : 0;
	fc->churn_at = now;
	return (uint32_t)(fc->churn * 100 + 0.5);
}

static volatile sig_atomic_t stop_signal;

static void
on_stop(int sig)
{
	stop_signal = sig;
}

static void
say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void
warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* One line on stderr, with the wall-clock time (the agent is a service),
 * or a JSON object as the library writes them (cli_log). */
static void
say_v(int level, const char *fmt, va_list ap)
{
	char when[32], prefix[64], msg[1024];
	struct tm tm;
	time_t t = time(NULL);

	strftime(when, sizeof(when), "%H:%M:%S", localtime_r(&t, &tm));
	snprintf(prefix, sizeof(prefix), "bulkshim fleet %s: ", when);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	cli_log(level, prefix, "%s", msg);
}

static void
say(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	say_v(LOG_INFO, fmt, ap);
	va_end(ap);
}

/* say() of something the operator should act on: a warning in JSON. */
static void
warn(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	say_v(LOG_WARN, fmt, ap);
	va_end(ap);
}

/*
 * What this host asks for: what it will need during the next lease. Each
 * round measures what it needs now: what it holds and waits for, the calls
 * it refused since the last round (each wanted a permit), and one more so
 * that a quiet host can start without a refusal. The demand is the most it
 * needed over the last lease: a bursty host (a pool that closes and opens
 * again, clients that connect once per query) keeps what it is about to use
 * again, and a host gone quiet gives its share back a lease later, not at
 * the first quiet moment. A rise counts at once.
 */
/* What the host needs now: what it holds and waits for, the calls it
 * refused since the last round (`refused`), and one more. */
static uint64_t
need_now(const struct seg_comp *c, uint64_t refused)
{
	return (uint64_t)atomic_load(&c->in_use) + atomic_load(&c->waiting) + refused + 1;
}

static uint32_t
demand(struct fleet_comp *fc, const struct seg_comp *c, uint64_t refused, uint32_t ceiling,
    uint32_t lease_ms, uint32_t interval_ms)
{
	uint64_t now = now_mono_ms();
	uint64_t need = need_now(c, refused);
	uint32_t newest = (fc->next + NEED_SAMPLES - 1) % NEED_SAMPLES;
	uint32_t most;

	if (need > ceiling)
		need = ceiling;
	if (fc->need_at[newest] != 0 && now < fc->need_at[newest] + interval_ms / 4) {
		/* A round soon after the last: one sample, the larger. */
		if (need > fc->need[newest])
			fc->need[newest] = (uint32_t)need;
	} else {
		fc->need[fc->next] = (uint32_t)need;
		fc->need_at[fc->next] = now;
		fc->next = (fc->next + 1) % NEED_SAMPLES;
	}
	most = 0;
	for (size_t i = 0; i < NEED_SAMPLES; i++)
		if (fc->need_at[i] != 0 && fc->need_at[i] + lease_ms > now && fc->need[i] > most)
			most = fc->need[i];
	return most;
}

/* Writes a granted share. Share first, then the lease's end with release
 * order: a reader that sees the new end sees the new share. The lease ends
 * a third of a lease before Redis's, counted from before the call was sent,
 * so this host drops to its floor before Redis can give the share away. */
static void
apply_share(struct seg_comp *c, uint32_t share, uint64_t t0, uint32_t lease_ms)
{
	atomic_store(&c->fleet_share, share);
	atomic_store_explicit(&c->fleet_expiry_ms, t0 + lease_ms - lease_ms / 3,
	    memory_order_release);
	atomic_store(&c->fleet_renewed_ms, now_mono_ms());
}

static void
set_state(struct fleet_comp *fc, struct seg_comp *c, uint32_t state, const char *note)
{
	atomic_store(&c->fleet_redis_ok, state);
	if (fc->state != state || strcmp(fc->note, note) != 0) {
		if (state == FLEET_OK && note[0] == '\0')
			say("%s: leasing from Redis", c->name);
		else if (state == FLEET_OK && strcmp(note, "quiet") == 0)
			say("%s: Redis has no recent state for this fleet (new, or restarted): "
			    "floors only for one lease", c->name);
		else if (state == FLEET_OK && strcmp(note, "floors") == 0)
			warn("%s: warning: the hosts' floors add up to more than fleet_limit %u",
			    c->name, fc->in_force ? fc->in_force : atomic_load(&c->fleet_limit));
		else if (state == FLEET_REFUSED)
			warn("%s: %s; this host is on its floor of %u", c->name, note,
			    atomic_load(&c->fleet_floor));
		else if (state != FLEET_OK)
			warn("%s: %s; this host is on its floor of %u once its lease ends", c->name,
			    note, atomic_load(&c->fleet_floor));
	}
	fc->state = state;
	snprintf(fc->note, sizeof(fc->note), "%.*s", (int)sizeof(fc->note) - 1, note);
}

/* Says when the fleet runs on a lower fleet_limit than this host's, and
 * when that ends: hosts configured differently, or a change of the limit
 * that has not reached every host yet. */
static void
note_limit(struct fleet_comp *fc, const struct seg_comp *c, const struct fleet_ask *a)
{
	if (a->in_force == fc->in_force)
		return;
	if (a->in_force < a->limit)
		warn("%s: fleet_limit %u here, but %u on host %s: the fleet keeps to the lowest "
		    "limit of its hosts, %u", c->name, a->limit, a->in_force, a->lowest,
		    a->in_force);
	else if (fc->in_force != 0)
		say("%s: the fleet keeps to fleet_limit %u again", c->name, a->in_force);
	fc->in_force = a->in_force;
}

/* This host's report on each compartment, into asks. */
static void
fill_asks(struct seg *s, struct fleet_comp *fcs, struct fleet_ask *asks, size_t n,
    const struct cfg_fleet *f, bool leave)
{
	for (size_t i = 0; i < n; i++) {
		struct seg_comp *c = seg_comp(s, fcs[i].idx);
		uint64_t rej = atomic_load(&c->rejected);
		uint32_t lim = atomic_load(&c->limit);

		asks[i].comp = c->name;
		asks[i].limit = atomic_load(&c->fleet_limit);
		asks[i].floor = atomic_load(&c->fleet_floor);
		asks[i].ceiling = lim > BS_MAX_LIMIT ? BS_MAX_LIMIT : lim;
		asks[i].held = atomic_load(&c->in_use) + atomic_load(&c->over);
		asks[i].want = demand(&fcs[i], c, rej - fcs[i].rejected, asks[i].ceiling, f->lease_ms,
		    f->interval_ms);
		asks[i].applied = limit_conn(c);
		asks[i].leave = leave;
		fcs[i].rejected = rej;
	}
}

/* The number of the next call. Each call carries a number above every
 * earlier one, even across restarts of the agent (wall-clock milliseconds:
 * 13 digits, which Lua's numbers keep exactly): Redis refuses a call that
 * waited behind a newer one (in a frozen server, on a connection given up). */
static uint64_t
next_seq(uint64_t *seq)
{
	uint64_t now = now_real_ms();

	*seq = now > *seq ? now : *seq + 1;
	return *seq;
}

/* What a round found, for when the next one comes. */
enum {
	ROUND_LOWERED = 1,	/* a share went down: Redis learns soon that it is applied */
	ROUND_SOON = 2,		/* short until other hosts lower theirs: ask again soon */
	ROUND_MOVED = 4,	/* a share changed */
};

/* One round: report every compartment and apply what Redis grants. Returns
 * ROUND_* flags: a share that went down brings the next round sooner, so
 * that Redis learns quickly that the host applied it and can hand the rest
 * on; so does Redis saying that more is coming once other hosts have
 * lowered theirs. */
static unsigned
round_trip(struct seg *s, struct fleet_conn **conn, const struct cfg_fleet *f,
    const struct fleet_me *me, struct fleet_comp *fcs, struct fleet_ask *asks, size_t n,
    uint64_t *seq, bool verbose)
{
	char err[BS_ERRLEN];
	bool refused;
	unsigned got = 0;
	uint64_t t0;
	int r;

	if (*conn == NULL) {
		*conn = fleet_connect(f, &refused, err, sizeof(err));
		if (*conn == NULL) {
			/* No answer to go by: call_now waits for the next
			 * round rather than retry at every tick. */
			for (size_t i = 0; i < n; i++) {
				asks[i].ok = false;
				set_state(&fcs[i], seg_comp(s, fcs[i].idx),
				    refused ? FLEET_REFUSED : FLEET_UNREACHABLE, err);
			}
			return 0;
		}
	}
	fill_asks(s, fcs, asks, n, f, false);
	t0 = now_mono_ms();
	r = fleet_renew(*conn, f, me, asks, n, next_seq(seq), err, sizeof(err));
	for (size_t i = 0; i < n; i++) {
		struct seg_comp *c = seg_comp(s, fcs[i].idx);
		uint32_t before = atomic_load(&c->fleet_share);

		if (asks[i].ok) {
			if (asks[i].share < asks[i].applied)
				got |= ROUND_LOWERED;
			if (asks[i].soon)
				got |= ROUND_SOON;
			if (asks[i].share != before)
				got |= ROUND_MOVED;
			apply_share(c, asks[i].share, t0, f->lease_ms);
			atomic_store(&c->fleet_hosts, asks[i].live);
			/* As Redis counts it: never below the floor. */
			atomic_store(&c->fleet_demand,
			    asks[i].want > asks[i].floor ? asks[i].want : asks[i].floor);
			atomic_store(&c->fleet_churn_c,
			    count_churn(&fcs[i], fcs[i].state == FLEET_OK && before != asks[i].share));
			note_limit(&fcs[i], c, &asks[i]);
			set_state(&fcs[i], c, FLEET_OK, asks[i].note);
			if (verbose && before != asks[i].share)
				say("%s: share %u -> %u (in use %u, want %u, %u hosts)", c->name, before,
				    asks[i].share, asks[i].held, asks[i].want, asks[i].live);
		} else if (asks[i].refused) {
			/* Redis said no (a name another agent holds, a stale
			 * call, nonsense): what this host held under the old
			 * answer is no longer vouched for, so it goes to its
			 * floor at once. */
			atomic_store(&c->fleet_expiry_ms, 0);
			set_state(&fcs[i], c, FLEET_REFUSED, asks[i].note);
		} else {
			set_state(&fcs[i], c, FLEET_UNREACHABLE, err);
		}
	}
	if (r < 0) {
		fleet_disconnect(*conn);
		*conn = NULL;
	}
	return got;
}

/*
 * Whether a round should come now rather than at the interval: this host
 * needs more than it asked for and than it has (a burst begins: every
 * moment it waits, callers are refused), or it held more than its share
 * and has since closed some (another host waits for exactly those). Read
 * off the segment, between rounds; the demand's samples are taken by
 * rounds only.
 */
static bool
call_now(struct seg *s, const struct fleet_comp *fcs, const struct fleet_ask *asks, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const struct seg_comp *c = seg_comp(s, fcs[i].idx);
		uint64_t held, need;

		if (!asks[i].ok)
			continue;
		held = (uint64_t)atomic_load(&c->in_use) + atomic_load(&c->over);
		need = need_now(c, atomic_load(&c->rejected) - fcs[i].rejected);
		if (need > asks[i].want && need > asks[i].share && asks[i].want < asks[i].ceiling)
			return true;
		if (asks[i].held > asks[i].share && held < asks[i].held)
			return true;
	}
	return false;
}

static void
sleep_ms(uint32_t ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 };

	/* A signal ends the sleep early (no SA_RESTART), and the loop stops. */
	nanosleep(&ts, NULL);
}

/*
 * The agent stops, its host already on its floors: tells Redis what the
 * host holds, so that Redis counts that (and the floor) rather than all
 * the host's last share could have opened, until the host is forgotten or
 * an agent reports again. It waits a third of a lease first, the margin a
 * lease's end has too, so that a connect that read the lease just before
 * it ended is counted. Best effort: if Redis cannot be told (or another
 * signal comes first), it keeps counting the whole share.
 */
static void
report_leaving(struct seg *s, struct fleet_conn **conn, const struct cfg_fleet *f,
    const struct fleet_me *me, struct fleet_comp *fcs, struct fleet_ask *asks, size_t n,
    uint64_t *seq)
{
	struct timespec ts = { .tv_sec = f->lease_ms / 3 / 1000,
			       .tv_nsec = (long)(f->lease_ms / 3 % 1000) * 1000000 };
	char err[BS_ERRLEN];
	bool refused;
	uint32_t held = 0;

	/* Another signal: the operator is in a hurry, and Redis goes on
	 * counting the last shares, which is safe. */
	if (nanosleep(&ts, NULL) != 0) {
		warn("stopped again: Redis counts this host's last shares until an agent reports "
		    "again");
		return;
	}
	if (*conn == NULL && (*conn = fleet_connect(f, &refused, err, sizeof(err))) == NULL) {
		warn("cannot tell Redis what this host holds (%s): it counts this host's last "
		    "shares until an agent reports again", err);
		return;
	}
	fill_asks(s, fcs, asks, n, f, true);
	if (fleet_renew(*conn, f, me, asks, n, next_seq(seq), err, sizeof(err)) < 0) {
		warn("cannot tell Redis what this host holds (%s): it counts this host's last "
		    "shares until an agent reports again", err);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		if (!asks[i].ok)
			warn("%s: Redis did not take what this host holds: %s", asks[i].comp,
			    asks[i].note);
		held += asks[i].held;
	}
	say("told Redis what this host holds (%u connection%s), which it counts until an "
	    "agent reports again", held, held == 1 ? "" : "s");
}

/* Removes a segment of no use to the service that the agent has just
 * created (seg_attach creates one again when it finds it gone, or made for
 * other compartments): no program has attached to it, so none holds
 * anything in it. */
static void
unlink_own(const struct bs_config *cfg, struct seg *s, uid_t self)
{
	char name[BS_NAME_MAX + 16];

	if (seg_header(s)->creator_uid != self || atomic_load(&seg_header(s)->attaches) != 0)
		return;
	seg_shm_name(cfg->segment, name, sizeof(name));
	if (shm_unlink(name) == 0)
		say("removed /dev/shm%s, which it had just created", name);
}

/*
 * Attaches to the segment as fleet_seg_plan says: at once to one that both
 * the service and the agent can use, after creating it when the agent may
 * give it to the config's owner, after waiting at most wait_s seconds for
 * the service's programs to create it otherwise. The segment is checked
 * again once attached: the service may have created it meanwhile, or the
 * owner may not have been applied. Returns 0 with *out, or the exit
 * status: EX_TEMPFAIL when the wait ran out, BS_EX_CONFIG when the segment
 * is of no use (said in one line with the fix), 1 on another error, 0 on a
 * signal during the wait (*out NULL).
 */
static int
open_segment(const struct bs_config *cfg, uint32_t wait_s, struct seg **out)
{
	uint64_t deadline = now_mono_ms() + (uint64_t)wait_s * 1000;
	char msg[BS_ERRLEN], err[BS_ERRLEN], perm[160];
	struct seg_user self, svc;
	bool waited = false;
	int status = 1;

	*out = NULL;
	memset(&svc, 0, sizeof(svc));
	if (seg_user_self(&self) < 0 || (cfg->has_owner && seg_user_of(cfg->owner, &svc) < 0)) {
		cli_log(LOG_ERROR, "bulkshim: ", "out of memory");
		seg_user_free(&self);
		return 1;
	}
	for (;;) {
		const struct seg_user *service = cfg->has_owner ? &svc : NULL;
		struct seg_perm p;
		off_t size = 0;
		int r = seg_perm_of(cfg->segment, &p, &size);
		/* Size 0: its creator has opened it and is setting it up. */
		bool there = r == 0 && size > 0;
		enum fleet_seg_step step = fleet_seg_plan(cfg, there ? &p : NULL, &self, service, msg,
		    sizeof(msg));

		if (r < 0 && r != -ENOENT)
			step = FSEG_ATTACH;	/* seg_attach says what is wrong */
		if (step == FSEG_REFUSE) {
			say("%s", msg);
			status = BS_EX_CONFIG;
			break;
		}
		if (step == FSEG_WAIT) {
			if (!waited && r != 0)
				say("%s: waiting for it, at most %u s", msg, wait_s);
			waited = waited || r != 0;
			if (stop_signal) {
				say("%s: stopped while waiting for the segment", strsignal(stop_signal));
				status = 0;
				break;
			}
			if (now_mono_ms() >= deadline) {
				warn("no segment /dev/shm/bulkshim.%s after %u s: start the service's "
				    "programs%s", cfg->segment, wait_s, cfg->has_owner ? "" :
				    ", or name their user in the config (owner) so that this agent "
				    "creates it");
				status = EX_TEMPFAIL;
				break;
			}
			sleep_ms(r == 0 ? 10 : 100);
			continue;
		}
		if (msg[0] != '\0')
			say("%s", msg);
		if (seg_attach(cfg, out, err, sizeof(err)) < 0) {
			cli_log(LOG_ERROR, "bulkshim: ", "%s", err);
			break;
		}
		if (seg_perm_of(cfg->segment, &p, NULL) == 0 &&
		    fleet_seg_plan(cfg, &p, &self, service, msg, sizeof(msg)) == FSEG_REFUSE) {
			say("%s", msg);
			unlink_own(cfg, *out, self.uid);
			seg_close(*out);
			*out = NULL;
			status = BS_EX_CONFIG;
			break;
		}
		if (waited)
			say("segment /dev/shm/bulkshim.%s is there (%s)", cfg->segment,
			    seg_perm_of(cfg->segment, &p, NULL) == 0 ?
			    seg_perm_text(&p, perm, sizeof(perm)) : "?");
		status = 0;
		break;
	}
	seg_user_free(&self);
	seg_user_free(&svc);
	return status;
}

static int
run_agent(const struct bs_config *cfg, uint32_t wait_s, bool verbose)
{
	struct fleet_comp *fcs = calloc(cfg->ncomp, sizeof(*fcs));
	struct fleet_ask *asks = calloc(cfg->ncomp, sizeof(*asks));
	struct fleet_conn *conn = NULL;
	struct fleet_me me;
	struct sigaction sa;
	struct seg *s = NULL;
	uint64_t seq = 0, due;
	uint32_t tick, quarter, soon_gap;
	size_t n = 0;
	int r;

	if (fcs == NULL || asks == NULL) {
		cli_log(LOG_ERROR, "bulkshim: ", "out of memory");
		free(fcs);
		free(asks);
		return 1;
	}
	/* Before the wait for the segment, which a signal must end too. */
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_stop;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	if ((r = open_segment(cfg, wait_s, &s)) != 0 || s == NULL) {
		free(fcs);
		free(asks);
		return r;
	}
	fleet_me_init(&me, cfg->segment);
	for (size_t i = 0; i < cfg->ncomp; i++) {
		int k = seg_comp_index(s, i);

		if (cfg->comp[i].fleet_limit == 0)
			continue;
		if (k < 0) {
			warn("%s: not in segment %s (added after it was created?); restart its "
			    "programs to lease for it", cfg->comp[i].name, cfg->segment);
			continue;
		}
		fcs[n].idx = (uint32_t)k;
		fcs[n].state = UINT32_MAX;
		fcs[n].rejected = atomic_load(&seg_comp(s, (uint32_t)k)->rejected);
		atomic_store(&seg_comp(s, (uint32_t)k)->fleet_agent_pid, (int32_t)getpid());
		n++;
	}
	say("host %s of fleet %s, Redis %s, lease %u ms, renewed every %u ms, %zu compartment%s",
	    cfg->fleet.host, cfg->fleet.name, cfg->fleet.redis, cfg->fleet.lease_ms,
	    cfg->fleet.interval_ms, n, n == 1 ? "" : "s");
	/*
	 * Rounds every interval; sooner after a lowered share (a quarter of
	 * it), while Redis says more is coming (from a tick, doubling while
	 * nothing moves, up to a quarter), and at the next tick when call_now
	 * says so. Between rounds the agent looks at its segment every tick.
	 */
	tick = cfg->fleet.interval_ms / 10;
	tick = tick > TICK_MAX_MS ? TICK_MAX_MS : tick < TICK_MIN_MS ? TICK_MIN_MS : tick;
	quarter = cfg->fleet.interval_ms / 4 + 1;
	soon_gap = tick;
	due = 0;
	while (!stop_signal && n > 0) {
		uint64_t now = now_mono_ms();
		unsigned got;

		if (now < due && !call_now(s, fcs, asks, n)) {
			sleep_ms(due - now < tick ? (uint32_t)(due - now) : tick);
			continue;
		}
		got = round_trip(s, &conn, &cfg->fleet, &me, fcs, asks, n, &seq, verbose);
		now = now_mono_ms();
		if (got & ROUND_SOON) {
			soon_gap = got & ROUND_MOVED ? tick : soon_gap * 2;
			if (soon_gap > quarter)
				soon_gap = quarter;
		} else {
			soon_gap = tick;
		}
		due = now + cfg->fleet.interval_ms;
		if (got & ROUND_LOWERED && due > now + quarter)
			due = now + quarter;
		if (got & ROUND_SOON)
			due = now + soon_gap;
		/* At least a tick between rounds, whatever call_now says. */
		if (!stop_signal)
			sleep_ms(tick);
	}
	/* Stopping: the host goes to its floors now rather than at the end of
	 * its leases; Redis frees the shares when they run out. */
	for (size_t i = 0; i < n; i++) {
		struct seg_comp *c = seg_comp(s, fcs[i].idx);

		if (c == NULL)
			continue;
		atomic_store(&c->fleet_expiry_ms, 0);
		atomic_store(&c->fleet_redis_ok, FLEET_NO_AGENT);
		atomic_store(&c->fleet_agent_pid, 0);
	}
	if (stop_signal) {
		say("%s: stopped; this host is on its floors", strsignal(stop_signal));
		if (n > 0)
			report_leaving(s, &conn, &cfg->fleet, &me, fcs, asks, n, &seq);
	}
	fleet_disconnect(conn);
	seg_close(s);
	free(fcs);
	free(asks);
	return n > 0 ? 0 : 1;
}

/* ---- --status: every host's share as Redis holds it ---- */

struct status_ctx {
	FILE *f;
	bool json, first;
	uint64_t now;
	uint32_t sum_share, sum_live_held, sum_held, sum_reserved;
};

/* Text from Redis, which any client of it may have written, made safe for
 * a terminal: printable ASCII kept, anything else a '?'. */
static const char *
safe_text(const char *in, char *out, size_t len)
{
	size_t n = 0;

	for (; *in != '\0' && n + 1 < len; in++)
		out[n++] = *in >= 0x20 && *in < 0x7f ? *in : '?';
	out[n] = '\0';
	return out;
}

static void
print_entry(const struct fleet_entry *e, void *arg)
{
	struct status_ctx *x = arg;
	long long left = (long long)e->expires - (long long)x->now;
	long long silent = (long long)x->now - (long long)e->seen;
	char host[BS_HOST_MAX], agent[256], lease[32];

	if (left > 0) {
		x->sum_share += (uint32_t)e->share;
		x->sum_live_held += (uint32_t)e->held;
	}
	x->sum_held += (uint32_t)e->held;
	x->sum_reserved += (uint32_t)e->reserved;
	safe_text(e->host, host, sizeof(host));
	safe_text(e->agent, agent, sizeof(agent));
	if (x->json) {
		fputs(x->first ? "{\"host\": " : ", {\"host\": ", x->f);
		cli_json_string(x->f, host);
		fputs(", \"agent\": ", x->f);
		cli_json_string(x->f, agent);
		fprintf(x->f, ", \"share\": %llu, \"held\": %llu, \"want\": %llu, \"floor\": %llu, "
		    "\"ceiling\": %llu, \"fleet_limit\": %llu, \"reserved\": %llu, "
		    "\"churn_per_min\": %.2f, \"lease_left_ms\": %lld, \"silent_ms\": %lld, "
		    "\"live\": %s}",
		    (unsigned long long)e->share, (unsigned long long)e->held,
		    (unsigned long long)e->want, (unsigned long long)e->floor,
		    (unsigned long long)e->ceiling, (unsigned long long)e->limit,
		    (unsigned long long)e->reserved, e->churn, left > 0 ? left : 0,
		    silent > 0 ? silent : 0, left > 0 ? "true" : "false");
	} else {
		if (left > 0)
			snprintf(lease, sizeof(lease), "live");
		else
			snprintf(lease, sizeof(lease), "expired %llds", silent > 0 ? silent / 1000 : 0);
		fprintf(x->f, "  %-24s %7llu %7llu %7llu %6.0f %7llu %7llu %8llu  %-12s %s\n", host,
		    (unsigned long long)e->share, (unsigned long long)e->held,
		    (unsigned long long)e->want, e->churn, (unsigned long long)e->floor,
		    (unsigned long long)e->limit, (unsigned long long)e->reserved, lease, agent);
	}
	x->first = false;
}

static int
show_status(const struct bs_config *cfg, bool json)
{
	struct status_ctx x = { .f = stdout, .json = json };
	char err[BS_ERRLEN];
	bool refused, first = true;
	struct fleet_conn *conn = fleet_connect(&cfg->fleet, &refused, err, sizeof(err));

	if (conn == NULL) {
		cli_log(LOG_ERROR, "bulkshim: ", "%s", err);
		return 1;
	}
	if (json) {
		fputs("{\"fleet\": ", stdout);
		cli_json_string(stdout, cfg->fleet.name);
		fputs(", \"redis\": ", stdout);
		cli_json_string(stdout, cfg->fleet.redis);
		fputs(", \"compartments\": [", stdout);
	} else {
		printf("fleet %s on Redis %s\n", cfg->fleet.name, cfg->fleet.redis);
	}
	for (size_t i = 0; i < cfg->ncomp; i++) {
		const struct cfg_compartment *cc = &cfg->comp[i];
		int r;

		if (cc->fleet_limit == 0)
			continue;
		x.first = true;
		x.sum_share = x.sum_live_held = x.sum_held = x.sum_reserved = 0;
		if (json) {
			fputs(first ? "{\"name\": " : ", {\"name\": ", stdout);
			cli_json_string(stdout, cc->name);
			fprintf(stdout, ", \"fleet_limit\": %u, \"hosts\": [", cc->fleet_limit);
		} else {
			printf("\n%s: fleet_limit %u\n  %-24s %7s %7s %7s %6s %7s %7s %8s  %-12s %s\n",
			    cc->name, cc->fleet_limit, "HOST", "SHARE", "HELD", "DEMAND", "CHURN", "FLOOR",
			    "LIMIT", "RESERVED", "LEASE", "AGENT");
		}
		r = fleet_entries(conn, cfg->fleet.name, cc->name, &x.now, print_entry, &x, err,
		    sizeof(err));
		if (r < 0) {
			if (json)
				fputs("]}]}\n", stdout);
			cli_log(LOG_ERROR, "bulkshim: ", "%s", err);
			fleet_disconnect(conn);
			return 1;
		}
		if (json)
			fprintf(stdout, "], \"live_share\": %u, \"live_held\": %u, \"held\": %u, "
			    "\"reserved\": %u}", x.sum_share, x.sum_live_held, x.sum_held,
			    x.sum_reserved);
		else
			printf("  %-24s %7u %7u %30s %8u  (shares of live leases; held and reserved "
			    "by all)\n", "total", x.sum_share, x.sum_held, "", x.sum_reserved);
		first = false;
	}
	if (json)
		fputs("]}\n", stdout);
	fleet_disconnect(conn);
	return 0;
}

int
cmd_fleet(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "status", no_argument, NULL, 'S' },
		{ "json", no_argument, NULL, 'j' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "wait", required_argument, NULL, 'w' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *path = NULL;
	bool status = false, json = false, verbose = false;
	uint64_t wait_s = WAIT_DEFAULT_S;
	struct bs_config cfg;
	char err[BS_ERRLEN];
	int c, r;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+c:vh", longopts, NULL)) != -1) {
		switch (c) {
		case 'c': path = optarg; break;
		case 'S': status = true; break;
		case 'j': json = true; break;
		case 'v': verbose = true; break;
		case 'w':
			if (!cli_parse_u64(optarg, &wait_s) || wait_s > WAIT_MAX_S) {
				fprintf(stderr, "bulkshim: --wait takes seconds, 0 to %d\n", WAIT_MAX_S);
				return 2;
			}
			break;
		case 'h': return cli_help("fleet", stdout, 0);
		default: return cli_help("fleet", stderr, 2);
		}
	}
	if (optind != argc || (json && !status))
		return cli_help("fleet", stderr, 2);
	if (path == NULL)
		path = cli_config_path(NULL);
	cli_log_init("bulkshim fleet", false);
	if (cfg_load(path, &cfg, false, err, sizeof(err)) < 0) {
		cli_log(LOG_ERROR, "bulkshim: ", "%s", err);
		return BS_EX_CONFIG;
	}
	if (!cfg.fleet.on) {
		cli_log(LOG_ERROR, "bulkshim: ", "%s has no fleet = { redis = ...; name = ...; } "
		    "block", path);
		cfg_free(&cfg);
		return BS_EX_CONFIG;
	}
	/* Line by line, so that a journal or a pipe sees each at once. */
	setvbuf(stderr, NULL, _IOLBF, 0);
	cli_log_init("bulkshim fleet", cfg.log_json);
	r = status ? show_status(&cfg, json) : run_agent(&cfg, (uint32_t)wait_s, verbose);
	cfg_free(&cfg);
	return r;
}

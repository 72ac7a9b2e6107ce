/* test_fleet_lease.c - the lease arithmetic of tools/fleet.lua against a real redis-server. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "fleet.h"

/*
 * One redis-server for the whole file, started here on a unix socket in a
 * directory of its own (no TCP port, no persistence) and stopped at the end
 * whatever happens: by the group teardown, at exit, and by the kernel if
 * this process dies first (PR_SET_PDEATHSIG). Each test has a fleet of its
 * own, so a key of its own. A "host" is what one agent is to Redis: a
 * connection made by fleet_connect, a name, the token of the segment it
 * serves, growing call numbers, and the limit it applies (its last share,
 * or its floor before any).
 */

#define COMP "db"
/* Long enough that a loaded machine does not let a live lease run out
 * between two calls of one step; the quiet time of a new fleet is two
 * thirds of it. */
#define LEASE_MS 600
#define MAX_HOSTS 8

static char dir[64], sock[sizeof(dir) + 16];
static pid_t redis_pid = -1;
static const char *skip_why;
static char err[BS_ERRLEN];

struct host {
	struct cfg_fleet f;
	struct fleet_me me;
	struct fleet_conn *fc;
	uint64_t seq;
	uint32_t applied;	/* the limit in force: the last share, or the floor */
	struct fleet_ask a;	/* the last call and its answer */
};

/* The hosts of the running test, disconnected by its teardown. */
static struct host hosts[MAX_HOSTS];
static size_t nhosts;
static char fleet[BS_NAME_MAX];

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static bool in_path(const char *prog)
{
	const char *p = getenv("PATH");
	char buf[PATH_MAX];

	for (p = p ? p : "/usr/bin:/bin"; *p; ) {
		size_t n = strcspn(p, ":");

		snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, p, prog);
		if (access(buf, X_OK) == 0)
			return true;
		p += n + (p[n] == ':');
	}
	return false;
}

/* Stops redis-server (SIGTERM, then SIGKILL after 5 s) and removes its
 * directory; safe to call twice. */
static void stop_redis(void)
{
	char path[200];
	int st;

	if (redis_pid > 0) {
		kill(redis_pid, SIGTERM);
		for (int i = 0; i < 500 && waitpid(redis_pid, &st, WNOHANG) == 0; i++)
			sleep_ms(10);
		if (kill(redis_pid, 0) == 0) {
			kill(redis_pid, SIGKILL);
			waitpid(redis_pid, &st, 0);
		}
		redis_pid = -1;
	}
	if (dir[0] != '\0') {
		unlink(sock);
		snprintf(path, sizeof(path), "%s/redis.log", dir);
		unlink(path);
		rmdir(dir);
		dir[0] = '\0';
	}
}

static void fleet_cfg(struct cfg_fleet *f, const char *host, uint32_t lease_ms, uint32_t max_hosts)
{
	memset(f, 0, sizeof(*f));
	f->on = true;
	snprintf(f->redis, sizeof(f->redis), "unix:%s", sock);
	snprintf(f->name, sizeof(f->name), "%s", fleet);
	snprintf(f->host, sizeof(f->host), "%s", host);
	f->lease_ms = lease_ms;
	f->interval_ms = 200;
	f->timeout_ms = 2000;
	f->max_hosts = max_hosts;
	/* Ten leases, as long as a test may wait for a silent host. */
	f->forget_s = lease_ms * 10 / 1000 ? lease_ms * 10 / 1000 : 1;
}

static int start_redis(void **state)
{
	char logfile[160];
	pid_t parent = getpid();
	struct cfg_fleet f;

	(void)state;
	if (!in_path("redis-server")) {
		skip_why = "redis-server is not installed (tests/deps.sh installs it): "
			   "the fleet lease tests are skipped";
		print_message("%s\n", skip_why);
		return 0;
	}
	snprintf(dir, sizeof(dir), "/tmp/bulkshim-lease-XXXXXX");
	if (mkdtemp(dir) == NULL) {
		print_error("mkdtemp: %s\n", strerror(errno));
		dir[0] = '\0';
		return -1;
	}
	snprintf(sock, sizeof(sock), "%s/redis.sock", dir);
	snprintf(logfile, sizeof(logfile), "%s/redis.log", dir);
	atexit(stop_redis);
	redis_pid = fork();
	if (redis_pid < 0) {
		print_error("fork: %s\n", strerror(errno));
		return -1;
	}
	if (redis_pid == 0) {
		int null = open("/dev/null", O_RDWR);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(1);
		dup2(null, 0);
		dup2(null, 1);
		dup2(null, 2);
		execlp("redis-server", "redis-server", "--port", "0", "--unixsocket", sock,
		    "--unixsocketperm", "700", "--save", "", "--appendonly", "no", "--dir", dir,
		    "--logfile", logfile, (char *)NULL);
		_exit(127);
	}
	/* Up once fleet_connect loads the script, within 10 s. */
	snprintf(fleet, sizeof(fleet), "probe");
	fleet_cfg(&f, "probe", LEASE_MS, 0);
	for (int i = 0; i < 1000; i++) {
		bool refused;
		struct fleet_conn *fc = fleet_connect(&f, &refused, err, sizeof(err));
		int st;

		if (fc != NULL) {
			fleet_disconnect(fc);
			return 0;
		}
		if (waitpid(redis_pid, &st, WNOHANG) == redis_pid) {
			redis_pid = -1;
			print_error("redis-server exited (see %s): %s\n", logfile, err);
			return -1;
		}
		sleep_ms(10);
	}
	print_error("redis-server did not answer on %s within 10 s: %s\n", sock, err);
	stop_redis();
	return -1;
}

static int end_redis(void **state)
{
	(void)state;
	stop_redis();
	return 0;
}

/* A fleet of its own, so a key of its own, for the hosts made from now on. */
static void new_fleet(void)
{
	static unsigned n;

	snprintf(fleet, sizeof(fleet), "t%d-%u", (int)getpid(), ++n);
}

static int begin(void **state)
{
	(void)state;
	new_fleet();
	nhosts = 0;
	return 0;
}

static int end(void **state)
{
	(void)state;
	for (size_t i = 0; i < nhosts; i++)
		fleet_disconnect(hosts[i].fc);
	nhosts = 0;
	return 0;
}

static void need_redis(void)
{
	if (skip_why != NULL)
		skip();
}

/* A new host of this test's fleet, connected, serving segment `segment`
 * (which makes its token). */
static struct host *add_agent(const char *name, const char *segment, uint32_t lease_ms,
    uint32_t max_hosts)
{
	struct host *h = &hosts[nhosts];
	bool refused;

	assert_true(nhosts < MAX_HOSTS);
	memset(h, 0, sizeof(*h));
	fleet_cfg(&h->f, name, lease_ms, max_hosts);
	snprintf(h->me.token, sizeof(h->me.token), "token-of-%s", segment);
	snprintf(h->me.agent, sizeof(h->me.agent), "agent %zu of segment %s", nhosts, segment);
	h->fc = fleet_connect(&h->f, &refused, err, sizeof(err));
	if (h->fc == NULL)
		fail_msg("host %s: fleet_connect: %s", name, err);
	nhosts++;
	return h;
}

/* A host with a segment of its own. */
static struct host *add_host_with(const char *name, uint32_t lease_ms, uint32_t max_hosts)
{
	return add_agent(name, name, lease_ms, max_hosts);
}

static struct host *add_host(const char *name)
{
	return add_host_with(name, LEASE_MS, 0);
}

/* One renewal of h's lease on COMP, as the agent makes it: the fleet's
 * limit, h's floor and ceiling (max_connections), what it holds and wants,
 * and the limit it applies. Returns the answer; h then applies the share
 * (or, refused, its floor). */
static const struct fleet_ask *renew_seq(struct host *h, uint64_t seq, uint32_t limit,
    uint32_t floor, uint32_t ceiling, uint32_t held, uint32_t want)
{
	struct fleet_ask *a = &h->a;

	memset(a, 0, sizeof(*a));
	a->comp = COMP;
	a->limit = limit;
	a->floor = floor;
	a->ceiling = ceiling;
	a->held = held;
	a->want = want;
	a->applied = h->seq == 0 ? floor : h->applied;
	if (fleet_renew(h->fc, &h->f, &h->me, a, 1, seq, err, sizeof(err)) != 0)
		fail_msg("host %s: fleet_renew: %s", h->f.host, err);
	h->seq = seq > h->seq ? seq : h->seq;
	h->applied = a->ok ? a->share : floor;
	return a;
}

static const struct fleet_ask *renew(struct host *h, uint32_t limit, uint32_t floor,
    uint32_t ceiling, uint32_t held, uint32_t want)
{
	return renew_seq(h, h->seq + 1, limit, floor, ceiling, held, want);
}

/* h's agent stops, its host on its floor and holding `held`: one last
 * report, which must be answered. */
static void leave(struct host *h, uint32_t limit, uint32_t floor, uint32_t ceiling, uint32_t held)
{
	struct fleet_ask *a = &h->a;

	memset(a, 0, sizeof(*a));
	a->comp = COMP;
	a->limit = limit;
	a->floor = floor;
	a->ceiling = ceiling;
	a->held = held;
	a->want = held;
	a->applied = floor;
	a->leave = true;
	if (fleet_renew(h->fc, &h->f, &h->me, a, 1, ++h->seq, err, sizeof(err)) != 0)
		fail_msg("host %s: fleet_renew: %s", h->f.host, err);
	if (!a->ok || a->share != 0 || strcmp(a->note, "left") != 0)
		fail_msg("host %s left: ok %d, share %u, \"%s\"", h->f.host, a->ok, a->share, a->note);
	h->applied = floor;
}

/* renew, which must be answered (not refused). */
static uint32_t share_of(struct host *h, uint32_t limit, uint32_t floor, uint32_t ceiling,
    uint32_t held, uint32_t want)
{
	const struct fleet_ask *a = renew(h, limit, floor, ceiling, held, want);

	if (!a->ok)
		fail_msg("host %s: refused: %s", h->f.host, a->note);
	if (a->share > ceiling)
		fail_msg("host %s: share %u above its ceiling %u", h->f.host, a->share, ceiling);
	return a->share;
}

/* What Redis holds of the fleet's hosts, read as `bulkshim fleet --status`
 * reads it: the worst each may have in use until its next call (for a
 * live lease the largest of its share, the limit it applied and what it
 * held; for a lease run out its floor too, since it keeps what it opened),
 * summed over all hosts and over all but one (but); the sum of the live
 * shares; the latest expiry. */
struct tally {
	const char *but;
	uint64_t now, worst, others, shares, expires;
	int hosts;
};

static void count_entry(const struct fleet_entry *e, void *arg)
{
	struct tally *t = arg;
	uint64_t w = e->share;

	t->expires = e->expires > t->expires ? e->expires : t->expires;
	w = e->applied > w ? e->applied : w;
	w = e->held > w ? e->held : w;
	if (e->expires > t->now)
		t->shares += e->share;
	else if (e->old)
		w = e->floor;
	else
		w = e->floor > w ? e->floor : w;
	if (e->reserved != w)
		fail_msg("host %s: fleet_entries says %llu reserved, but it may hold %llu", e->host,
		    (unsigned long long)e->reserved, (unsigned long long)w);
	t->worst += w;
	if (t->but == NULL || strcmp(e->host, t->but) != 0)
		t->others += w;
}

static struct tally tally_but(struct host *via, const char *but)
{
	struct tally t = { .but = but };

	t.hosts = fleet_entries(via->fc, fleet, COMP, &t.now, count_entry, &t, err, sizeof(err));
	if (t.hosts < 0)
		fail_msg("fleet_entries: %s", err);
	return t;
}

static struct tally tally(struct host *via)
{
	return tally_but(via, NULL);
}

/* After h's call: the share it was given fits beside the worst the other
 * hosts may hold and the floors held back for hosts not heard from
 * (reserve), or is nothing; and the live shares never pass the limit. */
static void check_call(struct host *h, uint32_t limit, uint32_t reserve)
{
	struct tally t = tally_but(h, h->f.host);

	if (h->a.share != 0 && h->a.share + t.others + reserve > limit)
		fail_msg("host %s was given %u beside %llu the others may hold (+%u held back): "
		    "above the fleet limit %u", h->f.host, h->a.share,
		    (unsigned long long)t.others, reserve, limit);
	if (t.shares + reserve > limit)
		fail_msg("the live shares add up to %llu (+%u held back), above the fleet limit %u",
		    (unsigned long long)t.shares, reserve, limit);
}

/* When every host is counted (each heard from, or its floor held back by
 * `hosts`), what all of them may hold never passes the limit. */
static void check_total(struct host *via, uint32_t limit, uint32_t reserve)
{
	struct tally t = tally(via);

	if (t.worst + reserve > limit)
		fail_msg("the hosts may hold %llu (+%u held back), above the fleet limit %u",
		    (unsigned long long)t.worst, reserve, limit);
}

/* The first call of a new fleet: its floor only, said to be quiet (leases
 * given before Redis lost its state may still run); then waits the quiet
 * time out. */
static void born(struct host *h, uint32_t limit, uint32_t floor, uint32_t ceiling, uint32_t want)
{
	const struct fleet_ask *a = renew(h, limit, floor, ceiling, 0, want);

	if (!a->ok || a->share != floor || strcmp(a->note, "quiet") != 0)
		fail_msg("a new fleet's first call: ok %d, share %u (\"%s\"), want the floor %u, "
		    "quiet", a->ok, a->share, a->note, floor);
	sleep_ms(h->f.lease_ms - h->f.lease_ms / 3 + 50);
}

/* ---- a new fleet ---- */

static void a_new_fleet_gives_floors_until_old_leases_have_run_out(void **state)
{
	struct host *a;
	const struct fleet_ask *r;

	(void)state;
	need_redis();
	a = add_host("a");
	r = renew(a, 24, 2, 20, 0, 20);
	assert_true(r->ok);
	assert_int_equal(r->share, 2);
	assert_string_equal(r->note, "quiet");
	assert_int_equal(r->live, 1);
	assert_int_equal(r->known, 1);
	r = renew(a, 24, 2, 20, 2, 20);
	assert_int_equal(r->share, 2);
	assert_string_equal(r->note, "quiet");
	sleep_ms(LEASE_MS - LEASE_MS / 3 + 50);
	r = renew(a, 24, 2, 20, 2, 20);
	assert_true(r->ok);
	assert_int_equal(r->share, 20);
	assert_string_equal(r->note, "");
	check_call(a, 24, 0);
}

/* ---- several hosts ---- */

/* Three hosts of a fleet of 24 that says `hosts = 3`, each wanting its
 * ceiling of 20 and holding all it may, floors of 2: whatever the order
 * of their calls, what they may hold with the floors held back for those
 * not heard from yet never passes 24, and they settle on the fair 8. */
static void several_hosts_settle_on_fair_shares_and_never_hold_more_than_the_limit(void **state)
{
	struct host *h[3];
	uint32_t s[3] = { 0 };

	(void)state;
	need_redis();
	for (int i = 0; i < 3; i++)
		h[i] = add_host_with(i == 0 ? "a" : i == 1 ? "b" : "c", LEASE_MS, 3);
	born(h[0], 24, 2, 20, 20);
	for (int round = 0; round < 8; round++) {
		for (int i = 0; i < 3; i++) {
			/* Those not heard from yet: their floors are held back. */
			uint32_t reserve = round == 0 ? (uint32_t)(2 - i) * 2 : 0;

			s[i] = share_of(h[i], 24, 2, 20, h[i]->applied, 20);
			check_call(h[i], 24, reserve);
			check_total(h[i], 24, reserve);
		}
	}
	for (int i = 0; i < 3; i++)
		if (s[i] != 8)
			fail_msg("settled shares %u %u %u, want 8 8 8", s[0], s[1], s[2]);
	assert_int_equal(h[2]->a.live, 3);
	assert_int_equal(h[2]->a.known, 3);
	assert_int_equal(tally(h[0]).shares, 24);
}

/* Without `hosts`, a host runs on its floor before Redis has heard of it:
 * what it then holds is not given out again, but it was not held back
 * either. Here c comes while a and b hold all 24: it is given nothing, and
 * until it has closed what it opened on its floor the fleet may hold 26. */
static void a_host_not_heard_of_runs_on_its_floor_outside_the_limit(void **state)
{
	struct host *a, *b, *c;

	(void)state;
	need_redis();
	a = add_host("a");
	b = add_host("b");
	c = add_host("c");
	born(a, 24, 2, 20, 20);
	assert_int_equal(share_of(a, 24, 2, 20, 2, 20), 20);
	assert_int_equal(share_of(b, 24, 2, 20, 2, 20), 4);
	check_total(a, 24, 0);
	assert_int_equal(share_of(c, 24, 2, 20, 2, 20), 0);
	check_call(c, 24, 0);
	assert_int_equal(tally(a).worst, 26);
	/* c holds nothing any more: the floor it had is in the limit again. */
	assert_int_equal(share_of(c, 24, 2, 20, 0, 20), 0);
	check_total(a, 24, 0);
}

/* A host whose lease is lowered keeps what it holds: the others get only
 * what it no longer may hold, once it says so. */
static void a_lowered_share_is_handed_on_once_the_host_holds_less(void **state)
{
	struct host *a, *b;

	(void)state;
	need_redis();
	a = add_host("a");
	b = add_host("b");
	born(a, 24, 2, 20, 20);
	assert_int_equal(share_of(a, 24, 2, 20, 2, 20), 20);
	/* b's fair share is 12, but a may hold 20. */
	assert_int_equal(share_of(b, 24, 2, 20, 0, 20), 4);
	check_call(b, 24, 0);
	/* a is lowered to 12 and still holds its 20. */
	assert_int_equal(share_of(a, 24, 2, 20, 20, 20), 12);
	check_call(a, 24, 0);
	assert_int_equal(share_of(b, 24, 2, 20, 4, 20), 4);
	check_call(b, 24, 0);
	check_total(a, 24, 0);
	/* a holds 12 and applies 12: b gets the rest. */
	assert_int_equal(share_of(a, 24, 2, 20, 12, 20), 12);
	assert_int_equal(share_of(b, 24, 2, 20, 4, 20), 12);
	check_call(b, 24, 0);
	check_total(a, 24, 0);
	assert_int_equal(tally(a).shares, 24);
}

/* ---- floors ---- */

/* Hosts that want nothing keep their floors while another wants it all. */
static void floors_are_kept_for_hosts_that_want_little(void **state)
{
	struct host *h[3];

	(void)state;
	need_redis();
	for (int i = 0; i < 3; i++)
		h[i] = add_host(i == 0 ? "a" : i == 1 ? "b" : "c");
	born(h[0], 10, 3, 10, 10);
	assert_int_equal(share_of(h[0], 10, 3, 10, 3, 10), 10);
	for (int round = 0; round < 6; round++) {
		for (int i = 0; i < 3; i++) {
			share_of(h[i], 10, 3, 10, i == 0 ? h[i]->applied : 0, i == 0 ? 10 : 0);
			check_call(h[i], 10, 0);
		}
	}
	check_total(h[0], 10, 0);
	assert_int_equal(h[0]->a.share, 4);
	assert_int_equal(h[1]->a.share, 3);
	assert_int_equal(h[2]->a.share, 3);
	assert_string_equal(h[2]->a.note, "");
}

/* Four floors of 2 in a fleet of 6: the floors are more than the limit.
 * A host that comes when the others hold it all gets nothing; every host
 * is told so, none is given more than its floor, and three floors fit. */
static void when_the_floors_pass_the_limit_a_host_gets_what_is_left(void **state)
{
	struct host *h[4];
	static const char *const names[] = { "a", "b", "c", "d" };
	uint32_t sum = 0, zero = 0;

	(void)state;
	need_redis();
	for (int i = 0; i < 4; i++)
		h[i] = add_host(names[i]);
	born(h[0], 6, 2, 6, 6);
	for (int round = 0; round < 6; round++) {
		for (int i = 0; i < 3; i++) {
			share_of(h[i], 6, 2, 6, h[i]->applied, 6);
			check_call(h[i], 6, 0);
		}
	}
	for (int i = 0; i < 3; i++)
		assert_int_equal(h[i]->a.share, 2);
	/* d comes to a budget held whole: nothing for it. */
	assert_int_equal(share_of(h[3], 6, 2, 6, 0, 6), 0);
	assert_string_equal(h[3]->a.note, "floors");
	assert_int_equal(h[3]->a.known, 4);
	check_call(h[3], 6, 0);
	for (int round = 0; round < 6; round++) {
		for (int i = 0; i < 4; i++) {
			share_of(h[i], 6, 2, 6, h[i]->applied, 6);
			check_call(h[i], 6, 0);
		}
	}
	check_total(h[0], 6, 0);
	for (int i = 0; i < 4; i++) {
		if (h[i]->a.share != 0 && h[i]->a.share != 2)
			fail_msg("host %s: share %u, want its floor 2 or nothing", names[i],
			    h[i]->a.share);
		if (strcmp(h[i]->a.note, "floors") != 0)
			fail_msg("host %s: note \"%s\", want \"floors\"", names[i], h[i]->a.note);
		sum += h[i]->a.share;
		zero += h[i]->a.share == 0;
	}
	assert_int_equal(sum, 6);
	assert_int_equal(zero, 1);
}

/* With `hosts = 4`, the floors of the hosts not heard from yet are held
 * back: a lone host gets 20 - 3 x 2 at most, and two settle on 8 each. */
static void max_hosts_holds_back_the_floors_of_hosts_not_heard_from(void **state)
{
	struct host *a, *b, *lone;

	(void)state;
	need_redis();
	a = add_host_with("a", LEASE_MS, 4);
	b = add_host_with("b", LEASE_MS, 4);
	born(a, 20, 2, 20, 20);
	assert_int_equal(share_of(a, 20, 2, 20, 2, 20), 14);
	check_call(a, 20, 6);
	check_total(a, 20, 6);
	for (int round = 0; round < 4; round++) {
		share_of(b, 20, 2, 20, b->applied, 20);
		check_call(b, 20, 4);
		check_total(a, 20, 4);
		share_of(a, 20, 2, 20, a->applied, 20);
		check_call(a, 20, 4);
		check_total(a, 20, 4);
	}
	assert_int_equal(a->a.share, 8);
	assert_int_equal(b->a.share, 8);
	/* The same host in a fleet without `hosts`: all of it. */
	new_fleet();
	lone = add_host("a");
	born(lone, 20, 2, 20, 20);
	assert_int_equal(share_of(lone, 20, 2, 20, 2, 20), 20);
}

/* ---- ceilings ---- */

/* A host is never given more than its ceiling, whatever it wants; what it
 * cannot take goes to the others. */
static void a_ceiling_caps_a_share_and_the_rest_goes_to_the_others(void **state)
{
	struct host *a, *b;

	(void)state;
	need_redis();
	a = add_host("a");
	b = add_host("b");
	born(a, 40, 1, 5, 50);
	for (int round = 0; round < 3; round++) {
		assert_int_equal(share_of(a, 40, 1, 5, a->applied, 50), 5);
		check_call(a, 40, 0);
		share_of(b, 40, 1, 50, b->applied, 50);
		check_call(b, 40, 0);
	}
	check_total(a, 40, 0);
	assert_int_equal(b->a.share, 35);
}

/* ---- leases that run out ---- */

/* A host that stops calling is on its floor once its lease runs out, but
 * keeps what it opened under its share (a pool, keep-alive): Redis keeps
 * counting all it may hold, and hands it on only once the host reports it
 * gone. */
static void an_expired_lease_keeps_what_the_host_may_hold_until_it_reports(void **state)
{
	struct host *a, *b;
	struct tally t;

	(void)state;
	need_redis();
	a = add_host("a");
	b = add_host("b");
	born(a, 24, 2, 20, 20);
	assert_int_equal(share_of(a, 24, 2, 20, 2, 20), 20);
	assert_int_equal(share_of(b, 24, 2, 20, 0, 20), 4);
	/* a holds 20 (its share is lowered to 12 for b) and its agent stops
	 * calling. */
	assert_int_equal(share_of(a, 24, 2, 20, 20, 20), 12);
	sleep_ms(LEASE_MS + 100);
	assert_int_equal(share_of(b, 24, 2, 20, 4, 20), 4);
	assert_int_equal(b->a.live, 1);
	assert_int_equal(b->a.known, 2);
	t = tally(b);
	assert_int_equal(t.hosts, 2);
	assert_int_equal(t.worst, 24);
	check_call(b, 24, 0);
	check_total(b, 24, 0);
	/* a's agent is back: a holds 3 now, and b may have the rest. a is
	 * given 4: b's ceiling leaves one over, the spare. */
	a->applied = 2;
	assert_int_equal(share_of(a, 24, 2, 20, 3, 3), 4);
	check_call(a, 24, 0);
	assert_int_equal(share_of(b, 24, 2, 20, 4, 20), 20);
	check_call(b, 24, 0);
	check_total(b, 24, 0);
}

/* An agent that stops says what its host holds on its floor: that, not
 * the share it had, is what Redis counts for it from then on. */
static void a_stopping_agent_reports_what_its_host_keeps(void **state)
{
	struct host *a, *b;
	struct tally t;

	(void)state;
	need_redis();
	a = add_host("a");
	b = add_host("b");
	born(a, 24, 2, 20, 20);
	assert_int_equal(share_of(a, 24, 2, 20, 2, 20), 20);
	assert_int_equal(share_of(b, 24, 2, 20, 0, 20), 4);
	leave(a, 24, 2, 20, 5);
	t = tally(b);
	assert_int_equal(t.hosts, 2);
	assert_int_equal(t.worst, 5 + 4);
	assert_int_equal(share_of(b, 24, 2, 20, 4, 20), 19);
	check_call(b, 24, 0);
	check_total(b, 24, 0);
	/* Its floor, when it holds less. */
	leave(a, 24, 2, 20, 1);
	assert_int_equal(share_of(b, 24, 2, 20, 4, 20), 20);
	check_total(b, 24, 0);
	assert_int_equal(tally(b).worst, 2 + 20);
}

/* A host silent for forget_s is taken for gone: what it may have held and
 * its floor come back, and the one left may have all of a limit no larger
 * than its ceiling. Until then, none of it is given away. */
static void a_host_silent_for_forget_s_is_forgotten(void **state)
{
	const uint32_t lease = 300;
	struct host *a, *b;

	(void)state;
	need_redis();
	a = add_host_with("a", lease, 0);
	b = add_host_with("b", lease, 0);
	born(a, 24, 2, 24, 24);
	assert_int_equal(share_of(a, 24, 2, 24, 2, 24), 24);
	assert_int_equal(share_of(b, 24, 2, 24, 0, 24), 0);
	/* b renews every 200 ms (at most 30 times, 6 s): a's lease runs out,
	 * then, forget_s (3 s) after a's last call, a is forgotten. */
	for (int i = 0; i < 30; i++) {
		sleep_ms(200);
		share_of(b, 24, 2, 24, b->applied, 24);
		check_call(b, 24, 0);
		check_total(b, 24, 0);
		if (b->a.known == 1)
			break;
		/* Known, live or run out: all a may hold is kept from b. */
		assert_int_equal(b->a.share, 0);
	}
	assert_int_equal(b->a.known, 1);
	assert_int_equal(b->a.share, 24);
	assert_int_equal(tally(b).hosts, 1);
}

/* The case of an agent killed while its host keeps long-lived
 * connections, with three hosts: the others ask for more all the time,
 * and what all may hold stays within the limit. */
static void a_silent_host_holding_connections_is_never_given_away(void **state)
{
	struct host *h[3];
	static const char *const names[] = { "a", "b", "c" };

	(void)state;
	need_redis();
	for (int i = 0; i < 3; i++)
		h[i] = add_host(names[i]);
	born(h[0], 10, 1, 10, 10);
	for (int round = 0; round < 4; round++)
		for (int i = 0; i < 3; i++)
			share_of(h[i], 10, 1, 10, h[i]->applied, 10);
	/* a's agent dies holding its share; b and c want everything, for
	 * longer than a lease. */
	sleep_ms(LEASE_MS / 2);
	for (int round = 0; round < 8; round++) {
		for (int i = 1; i < 3; i++) {
			share_of(h[i], 10, 1, 10, h[i]->applied, 10);
			check_call(h[i], 10, 0);
			check_total(h[i], 10, 0);
		}
		sleep_ms(LEASE_MS / 4);
	}
	assert_int_equal(h[1]->a.live, 2);
	assert_int_equal(h[1]->a.known, 3);
}

/* ---- renewals ---- */

/* Each call moves the lease on; a call numbered no higher than one already
 * answered (one that waited in a frozen server) is refused and changes
 * nothing. */
static void a_renewal_moves_the_lease_on_and_a_stale_call_is_refused(void **state)
{
	struct host *a;
	struct tally t1, t2;
	const struct fleet_ask *r;

	(void)state;
	need_redis();
	a = add_host("a");
	born(a, 24, 2, 20, 20);
	assert_int_equal(share_of(a, 24, 2, 20, 2, 20), 20);
	t1 = tally(a);
	assert_true(t1.expires >= t1.now + LEASE_MS - 100);
	sleep_ms(100);
	assert_int_equal(share_of(a, 24, 2, 20, 20, 20), 20);
	t2 = tally(a);
	if (t2.expires < t1.expires + 100)
		fail_msg("a renewal 100 ms later moved the lease from %llu to %llu",
		    (unsigned long long)t1.expires, (unsigned long long)t2.expires);
	assert_int_equal(t2.shares, 20);
	r = renew_seq(a, a->seq, 24, 2, 20, 5, 5);
	assert_false(r->ok);
	assert_true(r->refused);
	if (strstr(r->note, "stale call") == NULL)
		fail_msg("a stale call: \"%s\"", r->note);
	/* The entry is as the last answered call left it. */
	t1 = tally(a);
	assert_int_equal(t1.expires, t2.expires);
	assert_int_equal(t1.shares, 20);
	assert_int_equal(t1.worst, 20);
}

/* ---- identities ---- */

/* A second agent that claims a host name another agent holds with a live
 * lease (another segment: another token) is refused, with a message naming
 * both; the first keeps its share, and what the second holds on its floor
 * is counted. Once the first's lease has run out, the name is the second's,
 * and what the first may still hold stays counted. */
static void a_second_agent_with_a_name_another_live_agent_holds_is_refused(void **state)
{
	struct host *a, *b;
	const struct fleet_ask *r;
	struct tally t;

	(void)state;
	need_redis();
	a = add_agent("web1", "shop", LEASE_MS, 0);
	b = add_agent("web1", "cart", LEASE_MS, 0);
	born(a, 24, 2, 20, 20);
	assert_int_equal(share_of(a, 24, 2, 20, 2, 20), 20);
	r = renew(b, 24, 2, 20, 2, 20);
	assert_false(r->ok);
	assert_true(r->refused);
	if (strstr(r->note, "held by another live agent") == NULL ||
	    strstr(r->note, a->me.agent) == NULL || strstr(r->note, b->me.agent) == NULL)
		fail_msg("a second agent of one name: \"%s\"", r->note);
	assert_int_equal(b->applied, 2);
	/* a may hold 20 beside b's floor of 2. */
	assert_int_equal(share_of(a, 24, 2, 20, 20, 20), 20);
	check_call(a, 24, 0);
	a->applied = 20;
	t = tally(a);
	assert_int_equal(t.hosts, 2);
	assert_int_equal(t.shares, 20);
	assert_int_equal(t.worst, 22);
	/* a falls silent: once its lease has run out, b has the name. */
	sleep_ms(LEASE_MS + 100);
	r = renew(b, 24, 2, 20, 2, 20);
	assert_true(r->ok);
	assert_int_equal(r->share, 4);
	check_call(b, 24, 0);
	check_total(b, 24, 0);
}

/* An agent restarted for the same segment (same token) takes its entry
 * back at once, its lease still running. */
static void a_restarted_agent_of_the_same_segment_takes_its_name_back(void **state)
{
	struct host *a, *again;
	struct tally t;

	(void)state;
	need_redis();
	a = add_agent("web1", "shop", LEASE_MS, 0);
	again = add_agent("web1", "shop", LEASE_MS, 0);
	born(a, 24, 2, 20, 20);
	assert_int_equal(share_of(a, 24, 2, 20, 5, 20), 20);
	/* Its calls are numbered from the wall clock: above the old agent's. */
	again->seq = a->seq + 1000;
	again->applied = 20;
	assert_int_equal(share_of(again, 24, 2, 20, 5, 20), 20);
	t = tally(again);
	assert_int_equal(t.hosts, 1);
	assert_int_equal(t.worst, 20);
}

/* An entry an agent older than tokens left ("h:<host>", no token) is
 * counted as that agent counted it: once its lease has run out, its floor
 * only, so that an upgraded fleet does not hold back its own old entries. */
static void an_entry_of_an_agent_without_a_token_counts_its_floor_once_run_out(void **state)
{
	struct host *a;
	redisContext *rc;
	redisReply *r;
	char key[BS_NAME_MAX * 2 + 32], val[128];
	unsigned long long now;

	(void)state;
	need_redis();
	a = add_host("a");
	born(a, 24, 2, 24, 24);
	rc = redisConnectUnix(sock);
	assert_true(rc != NULL && rc->err == 0);
	r = redisCommand(rc, "TIME");
	assert_true(r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2);
	now = strtoull(r->element[0]->str, NULL, 10) * 1000 +
	    strtoull(r->element[1]->str, NULL, 10) / 1000;
	freeReplyObject(r);
	/* Share 10, held 10, its lease run out a moment ago. */
	snprintf(val, sizeof(val), "10 10 10 10 2 24 %llu %llu 1 24", now - 1, now - 1);
	fleet_key(fleet, COMP, key, sizeof(key));
	r = redisCommand(rc, "HSET %s h:old %s", key, val);
	assert_true(r != NULL && r->type == REDIS_REPLY_INTEGER);
	freeReplyObject(r);
	redisFree(rc);
	assert_int_equal(share_of(a, 24, 2, 24, 2, 24), 22);
	check_total(a, 24, 0);
}

/* ---- fleet_limit ---- */

/* Hosts with different fleet_limit: the lowest of the live hosts' is in
 * force, whichever called first; every host is told which, and what all
 * may hold settles within it. */
static void the_lowest_fleet_limit_of_the_live_hosts_is_in_force(void **state)
{
	struct host *a, *b;
	const struct fleet_ask *r;

	(void)state;
	need_redis();
	a = add_host("a");
	b = add_host("b");
	born(a, 12, 2, 20, 20);
	assert_int_equal(share_of(a, 12, 2, 20, 2, 20), 12);
	/* b says 6: a's 12 is too much now, and b gets nothing beside it. */
	r = renew(b, 6, 2, 20, 0, 20);
	assert_true(r->ok);
	assert_int_equal(r->in_force, 6);
	assert_string_equal(r->lowest, "b");
	assert_int_equal(r->share, 0);
	/* a was given its 12 under the old limit: b's nothing fits beside it. */
	check_call(b, 12, 0);
	for (int round = 0; round < 6; round++) {
		r = renew(a, 12, 2, 20, a->applied, 20);
		assert_true(r->ok);
		assert_int_equal(r->in_force, 6);
		assert_string_equal(r->lowest, "b");
		check_call(a, 6, 0);
		share_of(b, 6, 2, 20, b->applied, 20);
		check_call(b, 6, 0);
	}
	check_total(a, 6, 0);
	assert_int_equal(a->a.share, 3);
	assert_int_equal(b->a.share, 3);
}

/* A raised fleet_limit, taken host by host: the fleet keeps the old one
 * until every live host has the new one, and no host is put on its floor
 * meanwhile; then the new one is in force. */
static void a_rolling_change_of_fleet_limit_keeps_the_shares(void **state)
{
	struct host *h[3];
	static const char *const names[] = { "a", "b", "c" };

	(void)state;
	need_redis();
	for (int i = 0; i < 3; i++)
		h[i] = add_host(names[i]);
	born(h[0], 24, 2, 20, 20);
	for (int round = 0; round < 4; round++)
		for (int i = 0; i < 3; i++)
			share_of(h[i], 24, 2, 20, h[i]->applied, 20);
	for (int i = 0; i < 3; i++)
		assert_int_equal(h[i]->a.share, 8);
	/* One host after the other says 30. */
	for (int changed = 1; changed <= 3; changed++) {
		for (int round = 0; round < 3; round++) {
			for (int i = 0; i < 3; i++) {
				uint32_t lim = i < changed ? 30 : 24;
				uint32_t in_force = changed == 3 ? 30 : 24;
				const struct fleet_ask *r = renew(h[i], lim, 2, 20, h[i]->applied, 20);

				assert_true(r->ok);
				if (changed < 3 || round > 0)
					assert_int_equal(r->in_force, in_force);
				if (r->share < 8)
					fail_msg("%d hosts changed: host %s put on %u", changed, names[i],
					    r->share);
				check_call(h[i], r->in_force, 0);
				check_total(h[i], r->in_force, 0);
			}
		}
	}
	for (int i = 0; i < 3; i++)
		assert_int_equal(h[i]->a.share, 10);
}

/* ---- shares that settle ---- */

/* What no host wants, the spare, is handed out evenly: idle hosts hold the
 * whole budget between them, and give it back as soon as one wants more,
 * which is told to come back sooner for the rest. */
static void the_spare_is_handed_out_and_the_shares_add_up_to_the_limit(void **state)
{
	const char *names[3] = { "a", "b", "c" };
	struct host *h[3];

	(void)state;
	need_redis();
	for (int i = 0; i < 3; i++)
		h[i] = add_host_with(names[i], LEASE_MS, 3);
	born(h[0], 30, 1, 30, 1);
	for (int round = 0; round < 4; round++) {
		for (int i = 0; i < 3; i++) {
			uint32_t reserve = round == 0 ? (uint32_t)(2 - i) : 0;

			share_of(h[i], 30, 1, 30, 0, 1);
			check_call(h[i], 30, reserve);
			check_total(h[i], 30, reserve);
		}
	}
	for (int i = 0; i < 3; i++)
		assert_int_equal(h[i]->a.share, 10);
	assert_int_equal(tally(h[0]).shares, 30);
	/* a wants all it can have: the others' spare is on its way. */
	assert_int_equal(share_of(h[0], 30, 1, 30, 10, 30), 10);
	assert_true(h[0]->a.soon);
	check_call(h[0], 30, 0);
	/* b and c are lowered, and say so at their next calls (which their
	 * agents make sooner). */
	for (int i = 1; i < 3; i++) {
		assert_int_equal(share_of(h[i], 30, 1, 30, 0, 1), 1);
		assert_int_equal(share_of(h[i], 30, 1, 30, 0, 1), 1);
	}
	assert_int_equal(share_of(h[0], 30, 1, 30, 10, 30), 28);
	assert_false(h[0]->a.soon);
	check_call(h[0], 30, 0);
	check_total(h[0], 30, 0);
}

/* A host whose share went down still holds what it opened under the old
 * one: the host waiting for that room is told to come back soon until the
 * connections are gone, not only until the share is lowered, and gets each
 * one as the holder reports it closed. */
static void a_host_waits_soon_for_connections_that_drain(void **state)
{
	struct host *a, *b;

	(void)state;
	need_redis();
	a = add_host_with("a", LEASE_MS, 2);
	b = add_host_with("b", LEASE_MS, 2);
	born(a, 30, 1, 30, 1);
	/* a busy, b idle: a holds 29 of the budget, b its floor. */
	for (int round = 0; round < 3; round++) {
		share_of(a, 30, 1, 30, 29, 30);
		share_of(b, 30, 1, 30, 0, 1);
	}
	assert_int_equal(a->a.share, 29);
	/* b gets busy: short, and told to come back soon. */
	assert_int_equal(share_of(b, 30, 1, 30, 0, 30), 1);
	assert_true(b->a.soon);
	/* a's share comes down, and a applies it at once... */
	assert_int_equal(share_of(a, 30, 1, 30, 29, 30), 15);
	assert_int_equal(share_of(a, 30, 1, 30, 29, 30), 15);
	/* ... but still holds 29, then 20: b is short as long, and is told. */
	assert_int_equal(share_of(b, 30, 1, 30, 1, 30), 1);
	assert_true(b->a.soon);
	assert_int_equal(share_of(a, 30, 1, 30, 20, 30), 15);
	assert_int_equal(share_of(b, 30, 1, 30, 1, 30), 10);
	assert_true(b->a.soon);
	/* a's connections are down to its share: b has the rest, done. */
	assert_int_equal(share_of(a, 30, 1, 30, 15, 30), 15);
	assert_int_equal(share_of(b, 30, 1, 30, 10, 30), 15);
	assert_false(b->a.soon);
	check_call(b, 30, 0);
	check_total(b, 30, 0);
}

/* The churn Redis keeps for host name, as fleet --status reads it. */
static void churn_entry(const struct fleet_entry *e, void *arg)
{
	double *churn = arg;

	if (strcmp(e->host, "a") == 0)
		*churn = e->churn;
}

static double churn_of_a(struct host *via)
{
	uint64_t now;
	double churn = -1;

	if (fleet_entries(via->fc, fleet, COMP, &now, churn_entry, &churn, err, sizeof(err)) < 0)
		fail_msg("fleet_entries: %s", err);
	return churn;
}

/* A share moves only when that matters: a demand that changes by a little
 * leaves it alone, in both directions; another host that wants more than it
 * is given takes it at once. Each change counts in the host's churn. */
static void a_share_keeps_still_through_small_changes_but_not_when_another_needs_it(void **state)
{
	struct host *a, *b;
	double before;

	(void)state;
	need_redis();
	a = add_host_with("a", LEASE_MS, 2);
	b = add_host_with("b", LEASE_MS, 2);
	born(a, 30, 1, 30, 10);
	for (int round = 0; round < 3; round++) {
		share_of(a, 30, 1, 30, 5, 10);
		share_of(b, 30, 1, 30, 5, 10);
	}
	/* 1 + 9 wanted + 5 of the spare each. */
	assert_int_equal(a->a.share, 15);
	assert_int_equal(b->a.share, 15);
	before = churn_of_a(b);
	/* a wants a little more, b a little less: nothing moves. */
	assert_int_equal(share_of(a, 30, 1, 30, 5, 12), 15);
	assert_int_equal(share_of(b, 30, 1, 30, 5, 8), 15);
	assert_int_equal(share_of(a, 30, 1, 30, 5, 12), 15);
	assert_true(churn_of_a(b) <= before + 0.01);
	/* b wants all it can have: a gives back at once, down to what it wants. */
	assert_int_equal(share_of(b, 30, 1, 30, 15, 30), 15);
	assert_true(b->a.soon);
	assert_int_equal(share_of(a, 30, 1, 30, 5, 12), 12);
	assert_int_equal(share_of(a, 30, 1, 30, 5, 12), 12);
	assert_int_equal(share_of(b, 30, 1, 30, 15, 30), 18);
	check_call(b, 30, 0);
	check_total(b, 30, 0);
	if (churn_of_a(b) < before + 0.9 || churn_of_a(b) > before + 1.1)
		fail_msg("a's churn went from %.2f to %.2f after one change", before, churn_of_a(b));
}

/* A share kept through the band must not keep another host below its
 * target: b wants its ceiling and was granted 18 of a target of 20 because
 * a, gone quiet, kept 4 where its target is its floor of 2 (a change within
 * the band). a gives back at once, and b gets its 20. */
static void a_share_kept_through_the_band_is_given_back_to_a_host_granted_less(void **state)
{
	struct host *a, *b, *c;

	(void)state;
	need_redis();
	a = add_host_with("a", LEASE_MS, 3);
	b = add_host_with("b", LEASE_MS, 3);
	c = add_host_with("c", LEASE_MS, 3);
	born(a, 24, 2, 20, 4);
	/* a wants 4, b all it can have, c its floor: 4 + 18 + 2. */
	for (int round = 0; round < 3; round++) {
		share_of(c, 24, 2, 20, 0, 2);
		share_of(a, 24, 2, 20, 4, 4);
		share_of(b, 24, 2, 20, 16, 20);
	}
	assert_int_equal(a->a.share, 4);
	assert_int_equal(b->a.share, 18);
	/* a goes quiet: its target is its floor, 2 below what it has; b's
	 * target becomes 20, which it cannot have while a keeps 4. */
	assert_int_equal(share_of(b, 24, 2, 20, 18, 20), 18);
	assert_int_equal(share_of(a, 24, 2, 20, 0, 2), 2);
	assert_int_equal(share_of(b, 24, 2, 20, 18, 20), 20);
	check_call(b, 24, 0);
	check_total(b, 24, 0);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, begin, end)
	const struct CMUnitTest tests[] = {
		T(a_new_fleet_gives_floors_until_old_leases_have_run_out),
		T(several_hosts_settle_on_fair_shares_and_never_hold_more_than_the_limit),
		T(a_host_not_heard_of_runs_on_its_floor_outside_the_limit),
		T(a_lowered_share_is_handed_on_once_the_host_holds_less),
		T(floors_are_kept_for_hosts_that_want_little),
		T(when_the_floors_pass_the_limit_a_host_gets_what_is_left),
		T(max_hosts_holds_back_the_floors_of_hosts_not_heard_from),
		T(a_ceiling_caps_a_share_and_the_rest_goes_to_the_others),
		T(an_expired_lease_keeps_what_the_host_may_hold_until_it_reports),
		T(a_stopping_agent_reports_what_its_host_keeps),
		T(a_host_silent_for_forget_s_is_forgotten),
		T(a_silent_host_holding_connections_is_never_given_away),
		T(a_renewal_moves_the_lease_on_and_a_stale_call_is_refused),
		T(a_second_agent_with_a_name_another_live_agent_holds_is_refused),
		T(a_restarted_agent_of_the_same_segment_takes_its_name_back),
		T(an_entry_of_an_agent_without_a_token_counts_its_floor_once_run_out),
		T(the_lowest_fleet_limit_of_the_live_hosts_is_in_force),
		T(a_rolling_change_of_fleet_limit_keeps_the_shares),
		T(a_share_kept_through_the_band_is_given_back_to_a_host_granted_less),
		T(the_spare_is_handed_out_and_the_shares_add_up_to_the_limit),
		T(a_share_keeps_still_through_small_changes_but_not_when_another_needs_it),
		T(a_host_waits_soon_for_connections_that_drain),
	};
#undef T

	return cmocka_run_group_tests(tests, start_redis, end_redis);
}

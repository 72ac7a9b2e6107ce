/* cli_common.c - what the subcommands share: help, targets, opening segments, snapshots. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

/*
 * The usage text is the man page's SYNOPSIS, line for line (a test compares
 * them); each entry's `more` is what `bulkshim COMMAND --help` adds.
 */
static const struct {
	const char *name;
	const char *synopsis;
	const char *more;
} commands[] = {
	{ "run", "run [--kernel [--cgroup PATH]] [-c FILE] [--force] [--] COMMAND [ARG...]",
	  "Runs COMMAND with libbulkshim.so preloaded and BULKSHIM_CONFIG set to FILE.\n"
	  "  -c FILE    the configuration (default: $BULKSHIM_CONFIG, else " BS_DEFAULT_CONFIG ")\n"
	  "  --force    start a program the shim cannot see (static, Go, setuid, setgid, file\n"
	  "             capabilities) anyway, with a warning\n"
	  "  --kernel   no preload: a cgroup of its own (or --cgroup PATH) with the kernel\n"
	  "             engine attached, for Go, static, setuid and io_uring programs; root\n"
	  "Exit status 78 without starting COMMAND when the configuration is missing or not\n"
	  "valid, or the shim cannot see COMMAND's calls; else COMMAND's own.\n" },
	{ "attach", "attach [-c FILE] --cgroup PATH",
	  "Attaches the kernel engine (eBPF) for FILE's compartments to a cgroup v2: every\n"
	  "connect of every process in it is counted, whatever made it. Needs root or\n"
	  "CAP_BPF + CAP_NET_ADMIN, Linux 5.9 (5.18 to refuse with the config's errno).\n"
	  "  --cgroup PATH  absolute, or relative to the cgroup v2 mount\n" },
	{ "detach", "detach [-c FILE | -s SEGMENT] [--cgroup PATH]",
	  "Detaches the kernel engine from PATH (default: from every cgroup); unloads it\n"
	  "when no cgroup is left.\n" },
	{ "status", "status [-c FILE | -s SEGMENT] [--json]",
	  "Shows every compartment of a segment, HOT when at or above 80 % of a limit.\n"
	  "  -c FILE      the segment that FILE names\n"
	  "  -s SEGMENT   the segment /dev/shm/bulkshim.SEGMENT\n"
	  "  --json       one JSON object instead of the table\n" },
	{ "watch", "watch [-c FILE | -s SEGMENT] [-i SECONDS] [-n COUNT]",
	  "A live view: connections, requests in flight, waiters and rejections per second.\n"
	  "  -i SECONDS   refresh interval (default 1; fractions allowed)\n"
	  "  -n COUNT     stop after COUNT refreshes\n"
	  "  q quits. A pipe or TERM=dumb gets plain lines instead of escape codes.\n" },
	{ "metrics", "metrics [-c FILE | -s SEGMENT] [--no-histograms] [--compartment PATTERN]...",
	  "Prints the segment's counters in the Prometheus text exposition format.\n"
	  "  --no-histograms          leave the latency histograms out (most of the lines)\n"
	  "  --compartment PATTERN    only compartments matching the glob (repeatable)\n" },
	{ "serve", "serve [-c FILE | -s SEGMENT | --all]... [--listen ADDR:PORT]",
	  "Serves the live web page at /, /metrics (Prometheus) and /status.json over HTTP,\n"
	  "read-only, until SIGTERM or SIGINT. -c and -s may repeat to show several segments.\n"
	  "  --all                every segment in /dev/shm this user may read\n"
	  "  --listen ADDR:PORT   where to listen (default 127.0.0.1:9464; port 0 picks one)\n" },
	{ "check", "check [-q] FILE",
	  "Validates FILE exactly as the library does and prints the budget as bars.\n"
	  "  -q   print nothing but errors\n"
	  "Exit status: 0 valid, 1 not valid, 2 usage error.\n" },
	{ "set", "set [-c FILE | -s SEGMENT] {COMPARTMENT | --all} KEY VALUE",
	  "Changes a live setting for every attached process at once; shrinking revokes nothing.\n"
	  "KEY is max_connections, max_inflight, max_wait_ms, max_waiting, connect_timeout_ms,\n"
	  "io_timeout_ms, errno, enforce (on or off), adaptive (off pins the adaptive limit,\n"
	  "on resumes it), class.NAME (a class limit, 0 = none) or guaranteed (its share of\n"
	  "its pool); for a pool, COMPARTMENT is the pool's name and KEY is size or reserved.\n"
	  "KEY=VALUE works too.\n"
	  "  --all   every compartment of the segment (`set --all enforce off`: the kill switch)\n"
	  "errno EAGAIN is refused for a compartment with max_inflight (clients would spin).\n" },
	{ "reload", "reload -c FILE [-s SEGMENT] [--dry-run]",
	  "Applies an edited FILE to the live segment: limits at once, destinations at each\n"
	  "running process's next connect. New compartments or classes need a restart.\n"
	  "Prints every setting it changes, marking those that undo a live `bulkshim set`.\n"
	  "  --dry-run   print what would change; change nothing\n" },
	{ "reset", "reset [-c FILE | -s SEGMENT] [COMPARTMENT | POOL]",
	  "Zeroes the counters (admitted, rejected, histograms, rates, peaks), not the permits.\n"
	  "Without an argument, every compartment and every pool (its peak and pool_full\n"
	  "refusals); POOL, a pool's name no compartment has, resets that pool alone.\n" },
	{ "size", "size --rps R --latency L [--headroom H] [--retries K] [--json]",
	  "Little's law: permits = ceil(R x L x H x (1 + K)).\n"
	  "  --rps R        requests per second\n"
	  "  --latency L    latency: 0.25, 0.25s, 250ms or 250us\n"
	  "  --headroom H   default 2\n"
	  "  --retries K    retries per request, default 0\n" },
	{ "suggest", "suggest [-c FILE | -s SEGMENT] [--window SECONDS] [--json]",
	  "Sizes each compartment from what the shim recorded: peak admission rate, p50/p99\n"
	  "latency, Little's law with headroom 2, refusals, and a verdict.\n" },
	{ "list", "list [--json]",
	  "Lists the segments in /dev/shm: owner, size, live processes, compartments (the\n"
	  "names that fit on the row, then their number; --json names every one).\n" },
	{ "rm", "rm [--force] SEGMENT...",
	  "Removes segments. One that live processes hold permits in is kept unless --force;\n"
	  "a damaged one is removed (programs facing it would run without limits).\n" },
	{ "prune", "prune [--older-than AGE] [--dry-run] [PATTERN...]",
	  "Removes the segments (matching the globs) that no live process holds and that were\n"
	  "created more than AGE ago (90s, 15m, 2h, 7d; default 1h), damaged ones included.\n"
	  "  --dry-run   say what would be removed; remove nothing\n" },
	{ "fleet", "fleet [-c FILE] [-v] [--status [--json]]",
	  "Runs this host's fleet agent in the foreground: leases its share of each\n"
	  "compartment's fleet_limit from Redis and writes it into the segment as the live\n"
	  "limit. --status lists every host's share and demand as Redis sees them.\n"
	  "  -v   log every change of a share\n" },
};

int
cli_usage(FILE *f, int status)
{
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(f, "%s bulkshim %s\n", i == 0 ? "usage:" : "      ", commands[i].synopsis);
	fprintf(f, "       bulkshim --help | --version\n");
	return status;
}

int
cli_help(const char *cmd, FILE *f, int status)
{
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		if (strcmp(commands[i].name, cmd) != 0)
			continue;
		fprintf(f, "usage: bulkshim %s\n", commands[i].synopsis);
		/* A usage error gets the synopsis only; --help the rest too. */
		if (status == 0)
			fputs(commands[i].more, f);
		return status;
	}
	return cli_usage(f, status);
}

bool
cli_target_opt(struct cli_target *t, int opt, const char *arg)
{
	if (opt == 'c')
		t->config = arg;
	else if (opt == 's')
		t->segment = arg;
	else
		return false;
	return true;
}

static bool
valid_segment_name(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n >= BS_NAME_MAX)
		return false;
	for (; *s; s++) {
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
		    (*s >= '0' && *s <= '9') || *s == '_' || *s == '.' || *s == '-'))
			return false;
	}
	return true;
}

int
cli_segment_name(const struct cli_target *t, char *out, size_t len)
{
	struct bs_config cfg;
	char err[BS_ERRLEN];
	const char *config = t->config;

	if (t->segment != NULL) {
		if (!valid_segment_name(t->segment)) {
			fprintf(stderr, "bulkshim: \"%s\" is not a segment name ([A-Za-z0-9_.-], "
			    "at most %d characters)\n", t->segment, BS_NAME_MAX - 1);
			return -1;
		}
		snprintf(out, len, "%s", t->segment);
		return 0;
	}
	if (config == NULL) {
		config = getenv("BULKSHIM_CONFIG");
		if (config == NULL || *config == '\0')
			config = BS_DEFAULT_CONFIG;
	}
	/* Host names are not resolved: only the segment name is wanted. */
	if (cfg_load(config, &cfg, false, err, sizeof(err)) < 0) {
		fprintf(stderr, "bulkshim: %s\n", err);
		return -1;
	}
	snprintf(out, len, "%s", cfg.segment);
	cfg_free(&cfg);
	return 0;
}

/* The error for a segment this user may not write, with what it is. */
static void
permission_denied(const char *name)
{
	char path[BS_NAME_MAX + 32];
	struct stat st;

	snprintf(path, sizeof(path), "/dev/shm/bulkshim.%s", name);
	if (stat(path, &st) == 0)
		fprintf(stderr, "bulkshim: permission denied: you cannot change segment %s "
		    "(owner uid %u, mode %04o)\n", name, (unsigned)st.st_uid,
		    (unsigned)(st.st_mode & 07777));
	else
		fprintf(stderr, "bulkshim: permission denied: you cannot change segment %s\n", name);
}

int
cli_open(const struct cli_target *t, bool writable, struct seg **out)
{
	char name[BS_NAME_MAX], err[BS_ERRLEN];
	int r;

	*out = NULL;
	if (cli_segment_name(t, name, sizeof(name)) < 0)
		return -1;
	r = seg_open(name, true, out, err, sizeof(err));
	if (r == -EACCES || r == -EPERM || r == -EROFS) {
		if (writable) {
			permission_denied(name);
			return -1;
		}
		r = seg_open(name, false, out, err, sizeof(err));
	} else if (r == 0) {
		/* The figures are only true once the permits of processes
		 * that died holding them are back. */
		proc_reclaim(*out, false);
		/* And of sockets that live processes closed unseen. */
		reconcile_run(*out, NULL);
	}
	if (r < 0) {
		fprintf(stderr, "bulkshim: %s%s\n", err, r == -ENOENT ?
		    " (no program has run with this configuration yet?)" : "");
		return -1;
	}
	return 0;
}

static bool
near_limit(uint64_t used, uint32_t limit)
{
	return limit != UINT32_MAX && used * 100 >= (uint64_t)limit * CLI_HOT_PERCENT;
}

void
cli_read_comp(const struct seg *s, uint32_t i, struct cli_comp *c)
{
	const struct seg_header *h = seg_header(s);
	struct seg_comp *sc = seg_comp(s, i);

	memset(c, 0, sizeof(*c));
	c->index = i;
	memcpy(c->name, sc->name, sizeof(c->name));
	c->name[sizeof(c->name) - 1] = '\0';
	c->limit = atomic_load(&sc->limit);
	c->over = atomic_load(&sc->over);
	/* Observe mode lets connections past the limit without a permit:
	 * in_use counts every connection, permits and the rest. */
	c->in_use = atomic_load(&sc->in_use) + c->over;
	c->peak = atomic_load(&sc->peak);
	c->waiting = atomic_load(&sc->waiting);
	c->inflight_limit = atomic_load(&sc->inflight_limit);
	c->inflight_over = atomic_load(&sc->inflight_over);
	c->inflight = atomic_load(&sc->inflight) + c->inflight_over;
	c->inflight_peak = atomic_load(&sc->inflight_peak);
	c->max_wait_ms = atomic_load(&sc->max_wait_ms);
	c->max_waiting = atomic_load(&sc->max_waiting);
	c->connect_timeout_ms = atomic_load(&sc->connect_timeout_ms);
	c->io_timeout_ms = atomic_load(&sc->io_timeout_ms);
	c->reject_errno = atomic_load(&sc->reject_errno);
	c->enforce = atomic_load(&sc->enforce) != 0;
	c->admitted = atomic_load(&sc->admitted);
	c->rejected = atomic_load(&sc->rejected);
	c->last_rejection_ms = atomic_load(&sc->last_rejection_ms);
	c->reclaimed = atomic_load(&sc->reclaimed);
	c->reconciled = atomic_load(&sc->reconciled);
	c->inflight_admitted = atomic_load(&sc->inflight_admitted);
	c->connect_timeouts = atomic_load(&sc->connect_timeouts);
	c->io_timeouts = atomic_load(&sc->io_timeouts);
	c->peak_rate = atomic_load(&sc->peak_rate);
	cli_read_adaptive(sc, &c->ad);
	for (int r = 0; r < REASON_MAX; r++) {
		c->rejected_by[r] = atomic_load(stat_reason_count(sc, (enum bs_reason)r, false));
		c->would_reject[r] = atomic_load(stat_reason_count(sc, (enum bs_reason)r, true));
	}
	for (uint32_t k = 0; k < h->nclass && k < BS_MAX_CLASSES; k++) {
		struct cli_class *cc = &c->cls[c->nclass];
		uint32_t lim = atomic_load(&sc->cls[k].limit);

		if (lim == 0)
			continue;
		memcpy(cc->name, h->class_name[k], sizeof(cc->name));
		cc->name[sizeof(cc->name) - 1] = '\0';
		cc->limit = lim;
		cc->in_use = atomic_load(&sc->cls[k].in_use);
		cc->peak = atomic_load(&sc->cls[k].peak);
		cc->admitted = atomic_load(&sc->cls[k].admitted);
		cc->rejected = atomic_load(&sc->cls[k].rejected);
		cc->index = k;
		cc->shares = atomic_load(&sc->cls_shares) != 0;
		cc->guaranteed = cc->shares ? atomic_load(&sc->cls_guaranteed[k]) : 0;
		cc->borrowed = cc->shares && cc->in_use > cc->guaranteed ? cc->in_use - cc->guaranteed : 0;
		c->nclass++;
	}
	cli_kernel_merge(s, c);
	cli_read_fleet(sc, c);
	/* What admission enforces now: an adaptive connection limit may be lower. */
	if (c->ad.mode == AD_ON && c->ad.kind == P_CONN && c->ad.limit < c->live_limit)
		c->live_limit = c->ad.limit;
	c->hot = near_limit(c->in_use, c->live_limit) ||
	    near_limit(c->inflight, cli_inflight_limit_now(c));
	cli_read_comp_pool(s, c);
}

void
cli_read_hist(const struct seg_hist *h, struct cli_hist *out)
{
	out->total = 0;
	for (int i = 0; i < BS_HIST_BUCKETS; i++) {
		out->bucket[i] = atomic_load(&h->bucket[i]);
		out->total += out->bucket[i];
	}
	/* The count is bumped after the bucket: the buckets' total is the
	 * count that matches them. */
	out->sum_us = atomic_load(&h->sum_us);
}

uint64_t
cli_hist_quantile_us(const struct cli_hist *h, unsigned permille)
{
	uint64_t rank, seen = 0;

	if (h->total == 0)
		return 0;
	/* The smallest rank with at least permille/1000 of the values at or
	 * below it: ceil(total * permille / 1000), in integers. */
	rank = (h->total * permille + 999) / 1000;
	if (rank == 0)
		rank = 1;
	for (int i = 0; i < BS_HIST_BUCKETS; i++) {
		seen += h->bucket[i];
		if (seen >= rank)
			return 1ULL << i;
	}
	return 1ULL << (BS_HIST_BUCKETS - 1);
}

uint32_t
cli_live_processes(const struct seg *s)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < s->nprocs; i++) {
		struct seg_proc *p = seg_proc(s, i);

		if (atomic_load(&p->state) == PROC_LIVE &&
		    sys_pid_alive(atomic_load(&p->pid), atomic_load(&p->start)))
			n++;
	}
	return n;
}

void
cli_json_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch < 0x20 || ch == 0x7f)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
	fputc('"', f);
}

void
cli_bar(char *buf, size_t width, uint64_t used, uint64_t limit, char ch)
{
	size_t n = 0;

	if (limit != 0 && limit != UINT32_MAX) {
		n = (size_t)((used * width + limit / 2) / limit);
		/* A compartment with anything in use shows at least one mark. */
		if (n == 0 && used > 0)
			n = 1;
	}
	if (n > width)
		n = width;
	memset(buf, ch, n);
	memset(buf + n, '.', width - n);
	buf[width] = '\0';
}

const char *
cli_limit_text(uint32_t limit, char *buf, size_t len)
{
	if (limit == UINT32_MAX)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%u", limit);
	return buf;
}

void
cli_format_ago(uint64_t when_ms, char *buf, size_t len)
{
	uint64_t now = now_real_ms();

	if (when_ms == 0)
		snprintf(buf, len, "-");
	else if (when_ms > now)
		snprintf(buf, len, "just now");
	else if (now - when_ms < 10000)
		snprintf(buf, len, "%.1fs ago", (double)(now - when_ms) / 1000);
	else
		snprintf(buf, len, "%llus ago", (unsigned long long)((now - when_ms) / 1000));
}

bool
cli_parse_u64(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;

	if (s == NULL || *s < '0' || *s > '9')
		return false;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0 || *end != '\0')
		return false;
	*out = v;
	return true;
}

int
cli_parse_view(int argc, char **argv, const char *name, struct cli_target *t, bool *json)
{
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+c:s:h", longopts, NULL)) != -1) {
		if (cli_target_opt(t, c, optarg))
			continue;
		if (c == 'j')
			*json = true;
		else if (c == 'h')
			return cli_help(name, stdout, 0);
		else
			return cli_help(name, stderr, 2);
	}
	if (optind != argc || (t->config != NULL && t->segment != NULL))
		return cli_help(name, stderr, 2);
	return -1;
}

/* cmd_metrics.c - `bulkshim metrics`: a snapshot of a segment in the Prometheus text format. */
#include <fnmatch.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "fleet.h"

/* ---- the exposition ---- */

/* Writes a label value with the escapes the text format wants. */
static void
label_value(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			fprintf(f, "\\%c", *s);
		else if (*s == '\n')
			fputs("\\n", f);
		else
			fputc(*s, f);
	}
}

static void
labels(FILE *f, const char *seg, const char *comp, const char *key, const char *value)
{
	fputs("{segment=\"", f);
	label_value(f, seg);
	fputc('"', f);
	if (comp != NULL) {
		fputs(",compartment=\"", f);
		label_value(f, comp);
		fputc('"', f);
	}
	if (key != NULL)
		fprintf(f, ",%s=\"%s\"", key, value);
	fputc('}', f);
}

static void
family(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A limit of UINT32_MAX (none) is +Inf: nothing is ever at it. */
static void
limit_value(FILE *f, uint32_t v)
{
	if (v == UINT32_MAX)
		fputs(" +Inf\n", f);
	else
		fprintf(f, " %u\n", v);
}

/* Which per-compartment value a gauge or counter family shows. */
enum field {
	F_LIMIT, F_IN_USE, F_PEAK, F_INFLIGHT, F_INFLIGHT_LIMIT, F_INFLIGHT_PEAK, F_WAITING,
	F_OVER, F_ENFORCE, F_ADMITTED, F_RECLAIMED, F_PEAK_RATE, F_KERNEL,
	F_INFLIGHT_LIVE_LIMIT, F_HOT, F_LIVE_LIMIT,
	/* The fleet's last: a compartment outside a fleet has none of them. */
	F_FLEET_LIMIT, F_FLEET_SHARE, F_FLEET_LEASE, F_FLEET_LEASE_AGE, F_FLEET_REDIS,
};

/* Each family with the field of enum cli_field its value is (CF_FIELDS:
 * none that can be damaged): a compartment whose value is damaged has no
 * sample in the family. */
static const struct {
	const char *name, *type, *help;
	enum field field;
	enum cli_field damage;
} simple[] = {
	{ "bulkshim_compartment_limit", "gauge", "Connections a compartment admits at once "
	  "(max_connections; +Inf when it has none).", F_LIMIT, CF_LIMIT },
	{ "bulkshim_compartment_in_use", "gauge", "Connections open now, including those let "
	  "past a full limit in observe mode.", F_IN_USE, CF_IN_USE },
	{ "bulkshim_compartment_peak", "gauge", "Most connections open at once since the last "
	  "reset.", F_PEAK, CF_PEAK },
	{ "bulkshim_compartment_over", "gauge", "Connections open now that observe mode let past "
	  "a full limit.", F_OVER, CF_OVER },
	{ "bulkshim_compartment_inflight", "gauge", "Requests in flight now (sent, reply not yet "
	  "begun).", F_INFLIGHT, CF_INFLIGHT },
	{ "bulkshim_compartment_inflight_limit", "gauge", "Requests a compartment lets be in "
	  "flight at once (max_inflight; +Inf when it has none).", F_INFLIGHT_LIMIT, CF_INFLIGHT_LIMIT },
	{ "bulkshim_compartment_inflight_peak", "gauge", "Most requests in flight at once since "
	  "the last reset.", F_INFLIGHT_PEAK, CF_INFLIGHT_PEAK },
	{ "bulkshim_compartment_waiting", "gauge", "Callers waiting for a permit now.", F_WAITING, CF_WAITING },
	{ "bulkshim_compartment_enforce", "gauge", "1 when the compartment refuses calls, 0 in "
	  "observe mode.", F_ENFORCE, CF_FIELDS },
	{ "bulkshim_compartment_peak_rate", "gauge", "Most admissions seen in one second.",
	  F_PEAK_RATE, CF_PEAK_RATE },
	{ "bulkshim_admitted_total", "counter", "Connections admitted.", F_ADMITTED, CF_ADMITTED },
	{ "bulkshim_reclaimed_total", "counter", "Permits taken back from processes that died "
	  "holding them.", F_RECLAIMED, CF_RECLAIMED },
	{ "bulkshim_compartment_live_limit", "gauge", "Connections admitted at once now: the "
	  "lowest of max_connections, the fleet share (or floor without a lease), the adaptive "
	  "limit, what the pool can still lend plus what is held, the same for the busiest "
	  "class (+Inf when none).", F_LIVE_LIMIT, CF_LIVE_LIMIT },
	{ "bulkshim_compartment_inflight_live_limit", "gauge", "Requests in flight admitted at "
	  "once now: max_inflight, or the adaptive limit when lower (+Inf when none).",
	  F_INFLIGHT_LIVE_LIMIT, CF_INFLIGHT_LIVE_LIMIT },
	{ "bulkshim_compartment_hot", "gauge", "1 when the next connect of the busiest class "
	  "would be refused or wait: at or above 80 % of a live limit, the pool has no room left "
	  "for it, or its busiest class is at its class limit (the HOT of status).", F_HOT, CF_FIELDS },
	{ "bulkshim_fleet_limit", "gauge", "The compartment's fleet_limit across all hosts "
	  "(compartments in a fleet only).", F_FLEET_LIMIT, CF_FIELDS },
	{ "bulkshim_fleet_share", "gauge", "This host's share of the fleet limit, as last "
	  "leased.", F_FLEET_SHARE, CF_FIELDS },
	{ "bulkshim_fleet_lease_valid", "gauge", "1 while this host's fleet lease lasts, 0 on "
	  "the floor.", F_FLEET_LEASE, CF_FIELDS },
	{ "bulkshim_fleet_lease_age_seconds", "gauge", "Time since the fleet agent last renewed "
	  "the lease (-1: never).", F_FLEET_LEASE_AGE, CF_FIELDS },
	{ "bulkshim_fleet_redis_up", "gauge", "1 when the fleet agent's last round trip to Redis "
	  "succeeded.", F_FLEET_REDIS, CF_FIELDS },
	{ "bulkshim_compartment_kernel", "gauge", "1 when the kernel engine counts the "
	  "compartment too (its figures include the engine's), 0 otherwise.", F_KERNEL, CF_FIELDS },
};

static void
simple_value(FILE *f, const struct cli_comp *c, enum field field)
{
	switch (field) {
	case F_LIMIT: limit_value(f, c->limit); break;
	case F_IN_USE: fprintf(f, " %u\n", c->in_use); break;
	case F_PEAK: fprintf(f, " %u\n", c->peak); break;
	case F_OVER: fprintf(f, " %u\n", c->over); break;
	case F_INFLIGHT: fprintf(f, " %u\n", c->inflight); break;
	case F_INFLIGHT_LIMIT: limit_value(f, c->inflight_limit); break;
	case F_INFLIGHT_PEAK: fprintf(f, " %u\n", c->inflight_peak); break;
	case F_WAITING: fprintf(f, " %u\n", c->waiting); break;
	case F_ENFORCE: fprintf(f, " %d\n", c->enforce ? 1 : 0); break;
	case F_PEAK_RATE: fprintf(f, " %llu\n", (unsigned long long)c->peak_rate); break;
	case F_ADMITTED: fprintf(f, " %llu\n", (unsigned long long)c->admitted); break;
	case F_RECLAIMED: fprintf(f, " %llu\n", (unsigned long long)c->reclaimed); break;
	case F_LIVE_LIMIT: limit_value(f, c->live_limit); break;
	case F_INFLIGHT_LIVE_LIMIT: limit_value(f, c->inflight_limit_now); break;
	case F_HOT: fprintf(f, " %d\n", c->hot ? 1 : 0); break;
	case F_FLEET_LIMIT: fprintf(f, " %u\n", c->fleet_limit); break;
	case F_FLEET_SHARE: fprintf(f, " %u\n", c->fleet_share); break;
	case F_FLEET_LEASE: fprintf(f, " %d\n", c->fleet_lease ? 1 : 0); break;
	case F_FLEET_LEASE_AGE:
		if (c->fleet_lease_age_ms == UINT64_MAX)
			fputs(" -1\n", f);
		else
			fprintf(f, " %.3f\n", (double)c->fleet_lease_age_ms / 1000);
		break;
	case F_FLEET_REDIS: fprintf(f, " %d\n", c->fleet_state == FLEET_OK ? 1 : 0); break;
	case F_KERNEL: fprintf(f, " %d\n", c->kernel ? 1 : 0); break;
	}
}

/* A level's name as a label value: limit_by_name's, a space made '_'
 * ("fleet_floor"), as label values of the other families are words. */
static const char *
by_label(enum limit_by by)
{
	static const char *const names[LIMIT_BY_MAX] = {
		[LIMIT_BY_NONE] = "none", [LIMIT_BY_STATIC] = "static",
		[LIMIT_BY_FLEET_SHARE] = "fleet_share", [LIMIT_BY_FLEET_FLOOR] = "fleet_floor",
		[LIMIT_BY_ADAPTIVE] = "adaptive", [LIMIT_BY_POOL] = "pool",
		[LIMIT_BY_CLASS] = "class",
	};

	return (unsigned)by < LIMIT_BY_MAX ? names[by] : "none";
}

/* What binds each live limit, as state sets: every compartment has one
 * series per level, always the same ones, 1 for the level that binds now
 * and 0 for the others, so that a change of level creates no series. A
 * damaged limit has none. */
static void
live_by(FILE *f, const char *seg, const struct cli_comp *all, uint32_t n)
{
	static const enum limit_by inflight[] = {
		LIMIT_BY_NONE, LIMIT_BY_STATIC, LIMIT_BY_ADAPTIVE,
	};

	family(f, "bulkshim_compartment_live_limit_by", "gauge", "Which level binds the live "
	    "limit of connections: 1 for it, 0 for the others (none, static, fleet_share, "
	    "fleet_floor, adaptive, pool, class).");
	for (uint32_t i = 0; i < n; i++) {
		if (CLI_DAMAGED(all[i].damaged, CF_LIVE_LIMIT))
			continue;
		for (int b = LIMIT_BY_NONE; b < LIMIT_BY_MAX; b++) {
			fputs("bulkshim_compartment_live_limit_by", f);
			labels(f, seg, all[i].name, "by", by_label((enum limit_by)b));
			fprintf(f, " %d\n", all[i].live_by == (enum limit_by)b ? 1 : 0);
		}
	}
	family(f, "bulkshim_compartment_inflight_live_limit_by", "gauge", "Which level binds the "
	    "live limit of requests in flight: 1 for it, 0 for the others (none, static, "
	    "adaptive).");
	for (uint32_t i = 0; i < n; i++) {
		if (CLI_DAMAGED(all[i].damaged, CF_INFLIGHT_LIVE_LIMIT))
			continue;
		for (size_t b = 0; b < sizeof(inflight) / sizeof(inflight[0]); b++) {
			fputs("bulkshim_compartment_inflight_live_limit_by", f);
			labels(f, seg, all[i].name, "by", by_label(inflight[b]));
			fprintf(f, " %d\n", all[i].inflight_live_by == inflight[b] ? 1 : 0);
		}
	}
}

/* 2^i microseconds in seconds, exactly: at most six decimals. */
static void
bound_seconds(char *buf, size_t len, uint64_t us)
{
	size_t n;

	snprintf(buf, len, "%llu.%06llu", (unsigned long long)(us / 1000000),
	    (unsigned long long)(us % 1000000));
	n = strlen(buf);
	while (n > 0 && buf[n - 1] == '0')
		buf[--n] = '\0';
	if (n > 0 && buf[n - 1] == '.')
		buf[--n] = '\0';
}

enum hist_kind { H_CONNECT, H_REPLY, H_WAIT };

static void
histogram(FILE *f, const char *seg, const struct cli_comp *all, uint32_t n,
    enum hist_kind kind)
{
	static const char *const names[] = {
		"bulkshim_connect_seconds", "bulkshim_reply_seconds", "bulkshim_wait_seconds",
	};
	static const char *const helps[] = {
		"How long connect() took.",
		"From a request's first send to the first byte of its reply.",
		"How long callers waited for a permit.",
	};
	char le[32];

	family(f, names[kind], "histogram", helps[kind]);
	for (uint32_t i = 0; i < n; i++) {
		const struct cli_hist *h = kind == H_CONNECT ? &all[i].h_connect :
		    kind == H_REPLY ? &all[i].h_reply : &all[i].h_wait;
		uint64_t cum = 0;

		if (CLI_DAMAGED(all[i].damaged, kind == H_CONNECT ? CF_H_CONNECT :
		    kind == H_REPLY ? CF_H_REPLY : CF_H_WAIT))
			continue;

		/* Bucket i holds values below 2^i us; the last one holds
		 * everything above and is +Inf. */
		for (int b = 0; b < BS_HIST_BUCKETS - 1; b++) {
			cum += h->bucket[b];
			bound_seconds(le, sizeof(le), 1ULL << b);
			fprintf(f, "%s_bucket", names[kind]);
			labels(f, seg, all[i].name, "le", le);
			fprintf(f, " %llu\n", (unsigned long long)cum);
		}
		fprintf(f, "%s_bucket", names[kind]);
		labels(f, seg, all[i].name, "le", "+Inf");
		fprintf(f, " %llu\n", (unsigned long long)h->total);
		fprintf(f, "%s_sum", names[kind]);
		labels(f, seg, all[i].name, NULL, NULL);
		fprintf(f, " %llu.%06llu\n", (unsigned long long)(h->sum_us / 1000000),
		    (unsigned long long)(h->sum_us % 1000000));
		fprintf(f, "%s_count", names[kind]);
		labels(f, seg, all[i].name, NULL, NULL);
		fprintf(f, " %llu\n", (unsigned long long)h->total);
	}
}

static void
by_reason(FILE *f, const char *name, const char *help, const char *seg,
    const struct cli_comp *all, uint32_t n, bool would)
{
	family(f, name, "counter", help);
	for (uint32_t i = 0; i < n; i++) {
		if (CLI_DAMAGED(all[i].damaged, would ? CF_WOULD_REJECT : CF_REJECTED_BY))
			continue;
		for (int r = 0; r < REASON_MAX; r++) {
			fputs(name, f);
			labels(f, seg, all[i].name, "reason", stat_reason_name((enum bs_reason)r));
			fprintf(f, " %llu\n", (unsigned long long)(would ? all[i].would_reject[r] :
			    all[i].rejected_by[r]));
		}
	}
}

/* bulkshim_segment_damaged and bulkshim_compartment_damaged: how many values
 * that cannot be true the segment holds, and each compartment (its classes'
 * included), whose samples are left out of the other families. */
static void
damage(FILE *f, const struct cli_snap *snap, const struct cli_comp *all, uint32_t n)
{
	family(f, "bulkshim_segment_damaged", "gauge", "Values read from the segment that cannot "
	    "be true (0 when it is sound); their samples are left out. bulkshim status names "
	    "them.");
	fputs("bulkshim_segment_damaged", f);
	labels(f, snap->name, NULL, NULL, NULL);
	fprintf(f, " %u\n", snap->ndamaged);
	family(f, "bulkshim_compartment_damaged", "gauge", "Values of the compartment and its "
	    "classes that cannot be true.");
	for (uint32_t i = 0; i < n; i++) {
		fputs("bulkshim_compartment_damaged", f);
		labels(f, snap->name, all[i].name, NULL, NULL);
		fprintf(f, " %u\n", all[i].ndamaged);
	}
}

void
cli_write_metrics(FILE *f, const struct cli_snap *snap, bool histograms)
{
	const struct cli_comp *all = snap->comp;
	const char *seg = snap->name;
	uint32_t n = snap->ncomp;

	family(f, "bulkshim_processes", "gauge", "Live processes attached to the segment.");
	fputs("bulkshim_processes", f);
	labels(f, seg, NULL, NULL, NULL);
	fprintf(f, " %u\n", snap->processes);
	/* A kernel-only segment has no process attached and is still guarded. */
	family(f, "bulkshim_kernel_attached", "gauge", "1 while the kernel engine of the segment "
	    "is attached to a cgroup (bulkshim attach, run --kernel), 0 otherwise.");
	fputs("bulkshim_kernel_attached", f);
	labels(f, seg, NULL, NULL, NULL);
	fprintf(f, " %d\n", cli_kernel_cgroups(seg) > 0 ? 1 : 0);
	damage(f, snap, all, n);
	/* What `status` says on its first line, for alerts: processes that
	 * attached, and those that meant to and ran without limits. */
	family(f, "bulkshim_attaches_total", "counter",
	    "Processes that attached to the segment since it was created.");
	if (!CLI_DAMAGED(snap->damaged, CF_ATTACHED)) {
		fputs("bulkshim_attaches_total", f);
		labels(f, seg, NULL, NULL, NULL);
		fprintf(f, " %llu\n", (unsigned long long)snap->attaches);
	}
	family(f, "bulkshim_unprotected_processes_total", "counter",
	    "Processes that meant to attach to the segment and ran without limits.");
	if (!CLI_DAMAGED(snap->damaged, CF_UNPROTECTED)) {
		fputs("bulkshim_unprotected_processes_total", f);
		labels(f, seg, NULL, NULL, NULL);
		fprintf(f, " %llu\n", (unsigned long long)snap->unprotected);
	}
	for (size_t k = 0; k < sizeof(simple) / sizeof(simple[0]); k++) {
		family(f, simple[k].name, simple[k].type, simple[k].help);
		for (uint32_t i = 0; i < n; i++) {
			/* A compartment outside a fleet has no fleet series. */
			if ((simple[k].field >= F_FLEET_LIMIT && all[i].fleet_limit == 0) ||
			    CLI_DAMAGED(all[i].damaged, simple[k].damage))
				continue;
			fputs(simple[k].name, f);
			labels(f, seg, all[i].name, NULL, NULL);
			simple_value(f, &all[i], simple[k].field);
		}
	}
	live_by(f, seg, all, n);
	by_reason(f, "bulkshim_rejections_total", "Calls refused, by reason.", seg, all,
	    n, false);
	by_reason(f, "bulkshim_would_reject_total", "Calls observe mode let through that "
	    "enforcing would have refused, by reason.", seg, all, n, true);
	cli_metrics_pools(f, snap, all, n);
	family(f, "bulkshim_timeouts_total", "counter", "Calls that gave up with ETIMEDOUT "
	    "(connect_timeout_ms, io_timeout_ms).");
	for (uint32_t i = 0; i < n; i++) {
		if (!CLI_DAMAGED(all[i].damaged, CF_CONNECT_TIMEOUTS)) {
			fputs("bulkshim_timeouts_total", f);
			labels(f, seg, all[i].name, "kind", "connect");
			fprintf(f, " %llu\n", (unsigned long long)all[i].connect_timeouts);
		}
		if (!CLI_DAMAGED(all[i].damaged, CF_IO_TIMEOUTS)) {
			fputs("bulkshim_timeouts_total", f);
			labels(f, seg, all[i].name, "kind", "io");
			fprintf(f, " %llu\n", (unsigned long long)all[i].io_timeouts);
		}
	}
	if (histograms) {
		histogram(f, seg, all, n, H_CONNECT);
		histogram(f, seg, all, n, H_REPLY);
		histogram(f, seg, all, n, H_WAIT);
	}
	cli_adaptive_metrics(f, seg, all, n, labels);
	cli_drill_metrics(f, seg, all, n, labels);
}

/* `metrics --compartment PATTERN...`: what a scrape of 1,000 compartments
 * can leave out (`serve` writes everything). Keeps in snap the compartments
 * whose names match one of the patterns (all of them without a pattern),
 * in their order; the pools stay whole. */
static void
keep_wanted(struct cli_snap *snap, char **patterns, size_t npatterns)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < snap->ncomp; i++) {
		bool want = npatterns == 0;

		for (size_t k = 0; k < npatterns && !want; k++)
			want = fnmatch(patterns[k], snap->comp[i].name, 0) == 0;
		if (want && n != i)
			snap->comp[n] = snap->comp[i];
		n += want;
	}
	snap->ncomp = n;
}

int
cmd_metrics(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ "no-histograms", no_argument, NULL, 'H' },
		{ "compartment", required_argument, NULL, 'C' },
		{ NULL, 0, NULL, 0 },
	};
	struct cli_target t = { NULL, NULL };
	struct cli_snap snap;
	bool histograms = true;
	size_t npatterns = 0;
	char **patterns;
	struct seg *s;
	int c;

	optind = 1;
	patterns = calloc((size_t)argc, sizeof(*patterns));
	if (patterns == NULL)
		return 1;
	while ((c = getopt_long(argc, argv, "+c:s:h", longopts, NULL)) != -1) {
		if (cli_target_opt(&t, c, optarg))
			continue;
		if (c == 'H') {
			histograms = false;
			continue;
		}
		if (c == 'C') {
			patterns[npatterns++] = optarg;
			continue;
		}
		free(patterns);
		if (c == 'h')
			return cli_help("metrics", stdout, 0);
		return cli_help("metrics", stderr, 2);
	}
	if (optind != argc || (t.config != NULL && t.segment != NULL)) {
		free(patterns);
		return cli_help("metrics", stderr, 2);
	}
	if (cli_open(&t, false, &s) < 0) {
		free(patterns);
		return 1;
	}
	/* Out of memory, nothing is written. */
	if (cli_snap_read(s, &snap) == 0) {
		keep_wanted(&snap, patterns, npatterns);
		cli_write_metrics(stdout, &snap, histograms);
		cli_snap_free(&snap);
	}
	seg_close(s);
	free(patterns);
	return 0;
}

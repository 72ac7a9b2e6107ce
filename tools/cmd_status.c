/* cmd_status.c - `bulkshim status`: a snapshot of a segment as a table or one JSON object. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* ---- who attached, and who ran without limits ---- */

/* The keys "attached", "unprotected", "unprotected_last_ms",
 * "unprotected_last" and "config", each after ", ". */
static void
json_attach(FILE *f, const struct cli_snap *snap)
{
	cli_json_field(f, snap->damaged, CF_ATTACHED, snap->attaches);
	cli_json_field(f, snap->damaged, CF_UNPROTECTED, snap->unprotected);
	cli_json_field(f, snap->damaged, CF_UNPROTECTED_LAST_MS, snap->unprotected_ms);
	fputs(", \"unprotected_last\": ", f);
	cli_json_string(f, snap->unprotected_why);
	fputs(", \"config\": ", f);
	cli_json_string(f, snap->config_path);
}

/* A WARNING line when processes ran without limits; nothing otherwise. */
static void
text_unprotected(FILE *f, const struct cli_snap *snap)
{
	char ago[32];

	if (snap->unprotected == 0)
		return;
	if (CLI_DAMAGED(snap->damaged, CF_UNPROTECTED_LAST_MS))
		snprintf(ago, sizeof(ago), "%s", CLI_DAMAGED_TEXT);
	else
		cli_format_ago(snap->unprotected_ms, ago, sizeof(ago));
	fprintf(f, "WARNING: %llu process%s tried to attach and ran WITHOUT LIMITS; the last, %s: "
	    "%s\n", (unsigned long long)snap->unprotected, snap->unprotected == 1 ? "" : "es", ago,
	    snap->unprotected_why);
}

/* ---- the compartments ---- */

static void
json_reasons(FILE *f, const char *key, const uint64_t *n, bool bad)
{
	if (bad) {
		fprintf(f, ", \"%s\": null", key);
		return;
	}
	fprintf(f, ", \"%s\": {", key);
	for (int r = 0; r < REASON_MAX; r++)
		fprintf(f, "%s\"%s\": %llu", r ? ", " : "", stat_reason_name((enum bs_reason)r),
		    (unsigned long long)n[r]);
	fputc('}', f);
}

/* A JSON true or false, or null when bad. */
static const char *
json_bool(bool v, bool bad)
{
	return bad ? "null" : v ? "true" : "false";
}

/* A level's name, or null for none (no limit, or a damaged one). */
static void
json_by(FILE *f, const char *key, enum limit_by by, const char *text)
{
	fprintf(f, ", \"%s\": ", key);
	if (by == LIMIT_BY_NONE)
		fputs("null", f);
	else
		cli_json_string(f, text);
}

/* The live limits and what binds them (snapshot.c), and why c is hot;
 * "live_limit" itself is written with the fleet's keys. */
static void
json_live(FILE *f, const struct cli_comp *c)
{
	json_by(f, "live_limit_by", c->live_by, c->live_by_text);
	cli_json_value(f, "inflight_live_limit", c->inflight_limit_now,
	    c->inflight_limit_now == UINT32_MAX || CLI_DAMAGED(c->damaged, CF_INFLIGHT_LIVE_LIMIT));
	json_by(f, "inflight_live_limit_by", c->inflight_live_by,
	    limit_by_name(c->inflight_live_by));
	fprintf(f, ", \"pool_full\": %s, \"class_full\": %s", c->pool_full ? "true" : "false",
	    c->class_full ? "true" : "false");
}

static void
json_comp(FILE *f, const struct cli_comp *c)
{
	const uint64_t m = c->damaged;
	const char *en = cfg_errno_name(c->reject_errno);

	fputs("{\"name\": ", f);
	cli_json_string(f, c->name);
	/* The keys up to "errno" are the stable interface of the first
	 * release; the rest were added after them. A damaged value is null. */
	cli_json_field(f, m, CF_LIMIT, c->limit == UINT32_MAX ? 0 : c->limit);
	cli_json_field(f, m, CF_IN_USE, c->in_use);
	cli_json_field(f, m, CF_PEAK, c->peak);
	cli_json_field(f, m, CF_ADMITTED, c->admitted);
	cli_json_field(f, m, CF_REJECTED, c->rejected);
	cli_json_field(f, m, CF_WAITING, c->waiting);
	cli_json_field(f, m, CF_LAST_REJECTION_MS, c->last_rejection_ms);
	cli_json_field(f, m, CF_RECLAIMED, c->reclaimed);
	if (CLI_DAMAGED(m, CF_ERRNO))
		fputs(", \"errno\": null", f);
	else
		fprintf(f, ", \"errno\": \"%s\"", en != NULL ? en : "ECONNREFUSED");
	fprintf(f, ", \"unlimited\": %s", json_bool(c->limit == UINT32_MAX, CLI_DAMAGED(m, CF_LIMIT)));
	cli_json_field(f, m, CF_OVER, c->over);
	cli_json_field(f, m, CF_INFLIGHT, c->inflight);
	cli_json_field(f, m, CF_INFLIGHT_LIMIT,
	    c->inflight_limit == UINT32_MAX ? 0 : c->inflight_limit);
	fprintf(f, ", \"inflight_unlimited\": %s", json_bool(c->inflight_limit == UINT32_MAX,
	    CLI_DAMAGED(m, CF_INFLIGHT_LIMIT)));
	cli_json_field(f, m, CF_INFLIGHT_PEAK, c->inflight_peak);
	fprintf(f, ", \"enforce\": %s, \"hot\": %s", c->enforce ? "true" : "false",
	    c->hot ? "true" : "false");
	json_live(f, c);
	cli_json_field(f, m, CF_MAX_WAIT_MS, c->max_wait_ms);
	cli_json_field(f, m, CF_MAX_WAITING, c->max_waiting);
	cli_json_field(f, m, CF_CONNECT_TIMEOUT_MS, c->connect_timeout_ms);
	cli_json_field(f, m, CF_IO_TIMEOUT_MS, c->io_timeout_ms);
	cli_json_field(f, m, CF_CONNECT_TIMEOUTS, c->connect_timeouts);
	cli_json_field(f, m, CF_IO_TIMEOUTS, c->io_timeouts);
	cli_json_field(f, m, CF_RECONCILED, c->reconciled);
	cli_json_fleet(f, c);
	fprintf(f, ", \"kernel\": %s, \"kernel_in_use\": %u, \"kernel_joint\": %u",
	    c->kernel ? "true" : "false", c->kernel_in_use, c->kernel_joint);
	json_reasons(f, "rejected_by", c->rejected_by, CLI_DAMAGED(m, CF_REJECTED_BY));
	json_reasons(f, "would_reject", c->would_reject, CLI_DAMAGED(m, CF_WOULD_REJECT));
	cli_json_comp_pool(f, c);
	cli_adaptive_json(f, &c->ad);
	cli_json_drill(f, &c->drill);
	fputs(", \"classes\": [", f);
	for (size_t k = 0; k < c->nclass; k++) {
		const struct cli_class *cc = &c->cls[k];

		fputs(k ? ", {\"name\": " : "{\"name\": ", f);
		cli_json_string(f, cc->name);
		cli_json_field(f, cc->damaged, CF_LIMIT, cc->limit);
		cli_json_field(f, cc->damaged, CF_IN_USE, cc->in_use);
		cli_json_field(f, cc->damaged, CF_PEAK, cc->peak);
		cli_json_field(f, cc->damaged, CF_ADMITTED, cc->admitted);
		cli_json_field(f, cc->damaged, CF_REJECTED, cc->rejected);
		cli_json_class_share(f, cc);
		cli_json_damaged(f, cc->damaged);
		fputc('}', f);
	}
	fputc(']', f);
	cli_json_damaged(f, m);
	fputc('}', f);
}

static bool
any_reason(const uint64_t *n)
{
	for (int r = 0; r < REASON_MAX; r++) {
		if (n[r] != 0)
			return true;
	}
	return false;
}

static void
text_reasons(FILE *f, const char *name, const char *what, const uint64_t *n, bool bad)
{
	bool first = true;

	if (bad) {
		fprintf(f, "  %s %s %s\n", name, what, CLI_DAMAGED_TEXT);
		return;
	}
	if (!any_reason(n))
		return;
	fprintf(f, "  %s %s", name, what);
	for (int r = 0; r < REASON_MAX; r++) {
		if (n[r] == 0)
			continue;
		fprintf(f, "%s %s %llu", first ? "" : ",", stat_reason_name((enum bs_reason)r),
		    (unsigned long long)n[r]);
		first = false;
	}
	fputc('\n', f);
}

/* A table's cell: field of c, or "damaged". */
static const char *
cell(char *buf, size_t len, const struct cli_comp *c, enum cli_field field, uint64_t v)
{
	return cli_count_text(v, CLI_DAMAGED(c->damaged, field), buf, len);
}

/* A live limit's cell: "-" for none, the number when the static limit
 * binds, else the number and the level ("6 adaptive", "3 pool"), or
 * "damaged". */
static const char *
live_cell(char *buf, size_t len, const struct cli_comp *c, bool inflight)
{
	enum cli_field field = inflight ? CF_INFLIGHT_LIVE_LIMIT : CF_LIVE_LIMIT;
	enum limit_by by = inflight ? c->inflight_live_by : c->live_by;
	uint32_t v = inflight ? c->inflight_limit_now : c->live_limit;

	if (CLI_DAMAGED(c->damaged, field) || (!inflight && CLI_DAMAGED(c->damaged, CF_LIMIT)) ||
	    (inflight && CLI_DAMAGED(c->damaged, CF_INFLIGHT_LIMIT)))
		snprintf(buf, len, "%s", CLI_DAMAGED_TEXT);
	else if (by == LIMIT_BY_NONE || v == UINT32_MAX)
		snprintf(buf, len, "-");
	else if (by == LIMIT_BY_STATIC)
		snprintf(buf, len, "%u", v);
	else
		snprintf(buf, len, "%u %s", v, inflight ? limit_by_name(by) : c->live_by_text);
	return buf;
}

/* The width of a table's LIMIT column: 7, or the widest of its cells. */
static int
live_width(const struct cli_comp *all, uint32_t n, bool inflight)
{
	char buf[CLI_LIVE_TEXT];
	size_t w = 7;

	for (uint32_t i = 0; i < n; i++) {
		size_t k = strlen(live_cell(buf, sizeof(buf), &all[i], inflight));

		w = k > w ? k : w;
	}
	return (int)w;
}

/* The second table, for compartments that count requests in flight, wait
 * or time out; printed only when one does. */
static void
text_inflight(FILE *f, const struct cli_comp *all, uint32_t n)
{
	char lim[CLI_LIVE_TEXT], wait[16];
	bool any = false;
	int lw;

	for (uint32_t i = 0; i < n; i++)
		any = any || all[i].inflight_limit != UINT32_MAX || all[i].max_wait_ms != 0 ||
		    all[i].connect_timeout_ms != 0 || all[i].io_timeout_ms != 0 ||
		    all[i].inflight_admitted != 0;
	if (!any)
		return;
	lw = live_width(all, n, true);
	fprintf(f, "\n%-24s %9s %*s %7s %7s %8s %10s %10s\n", "COMPARTMENT", "IN FLIGHT", lw,
	    "LIMIT", "PEAK", "WAITING", "MAX WAIT", "CONNECT TO", "IO TO");
	for (uint32_t i = 0; i < n; i++) {
		const struct cli_comp *c = &all[i];
		char v[5][24];

		if (CLI_DAMAGED(c->damaged, CF_MAX_WAIT_MS))
			snprintf(wait, sizeof(wait), "%s", CLI_DAMAGED_TEXT);
		else if (c->max_wait_ms != 0)
			snprintf(wait, sizeof(wait), "%ums", c->max_wait_ms);
		else
			snprintf(wait, sizeof(wait), "-");
		fprintf(f, "%-24s %9s %*s %7s %7s %8s %10s %10s\n", c->name,
		    cell(v[0], sizeof(v[0]), c, CF_INFLIGHT, c->inflight), lw,
		    live_cell(lim, sizeof(lim), c, true),
		    cell(v[1], sizeof(v[1]), c, CF_INFLIGHT_PEAK, c->inflight_peak),
		    cell(v[2], sizeof(v[2]), c, CF_WAITING, c->waiting), wait,
		    cell(v[3], sizeof(v[3]), c, CF_CONNECT_TIMEOUTS, c->connect_timeouts),
		    cell(v[4], sizeof(v[4]), c, CF_IO_TIMEOUTS, c->io_timeouts));
	}
}

/* ---- status ---- */

void
cli_text_damaged(FILE *f, const struct cli_snap *snap, const char *eol)
{
	char list[1024], who[BS_NAME_MAX + BS_CLASS_NAME_MAX + 32];
	size_t n = 0;

	if (snap->ndamaged == 0)
		return;
	cli_damage_list(list, sizeof(list), &n, "", snap->damaged);
	for (uint32_t i = 0; i < snap->ncomp; i++) {
		const struct cli_comp *c = &snap->comp[i];

		snprintf(who, sizeof(who), "compartment %s: ", c->name);
		cli_damage_list(list, sizeof(list), &n, who, c->damaged);
		for (size_t k = 0; k < c->nclass; k++) {
			snprintf(who, sizeof(who), "compartment %s class %s: ", c->name,
			    c->cls[k].name);
			cli_damage_list(list, sizeof(list), &n, who, c->cls[k].damaged);
		}
	}
	for (uint32_t p = 0; p < snap->npools; p++) {
		snprintf(who, sizeof(who), "pool %s: ", snap->pool[p].name);
		cli_damage_list(list, sizeof(list), &n, who, snap->pool[p].damaged);
	}
	fprintf(f, "WARNING: segment %s (/dev/shm/bulkshim.%s) is damaged: %u value%s cannot be "
	    "true and %s shown as damaged: %s%s\n", snap->name, snap->name, snap->ndamaged,
	    snap->ndamaged == 1 ? "" : "s", snap->ndamaged == 1 ? "is" : "are", list, eol);
}

void
cli_status_json(FILE *f, const struct cli_snap *snap, bool hosts)
{
	fputs("{\"segment\": ", f);
	cli_json_string(f, snap->name);
	fprintf(f, ", \"processes\": %u, \"generation\": %u", snap->processes, snap->generation);
	json_attach(f, snap);
	if (hosts)
		cli_json_hosts(f, snap->config_path);
	fputs(", \"compartments\": [", f);
	for (uint32_t i = 0; i < snap->ncomp; i++) {
		if (i)
			fputs(", ", f);
		json_comp(f, &snap->comp[i]);
	}
	fputc(']', f);
	cli_json_pools(f, snap);
	/* Last, so that the keys before keep their places: what the header
	 * holds that cannot be true, and how many values of the whole
	 * segment cannot (those of the header, compartments, classes, pools). */
	cli_json_damaged(f, snap->damaged);
	fprintf(f, ", \"damaged_total\": %u}\n", snap->ndamaged);
}

void
cli_status_text(FILE *f, const struct cli_snap *snap)
{
	const struct cli_comp *all = snap->comp;
	uint32_t n = snap->ncomp, procs = snap->processes;
	char ago[32], lim[CLI_LIVE_TEXT], att[24];
	bool extra = false;
	int lw = live_width(all, n, false);

	fprintf(f, "segment %s (/dev/shm/bulkshim.%s), %u process%s holding permits now, "
	    "%s attached since it was created\n", snap->name, snap->name, procs,
	    procs == 1 ? "" : "es", cli_count_text(snap->attaches,
	    CLI_DAMAGED(snap->damaged, CF_ATTACHED), att, sizeof(att)));
	cli_text_damaged(f, snap, "");
	text_unprotected(f, snap);
	fprintf(f, "%-24s %7s %*s %7s %10s %10s %10s  %s\n", "COMPARTMENT", "IN USE", lw, "LIMIT",
	    "PEAK", "ADMITTED", "REJECTED", "RECLAIMED", "LAST REJECTION");
	for (uint32_t i = 0; i < n; i++) {
		const struct cli_comp *c = &all[i];
		char v[5][24];

		if (CLI_DAMAGED(c->damaged, CF_LAST_REJECTION_MS))
			snprintf(ago, sizeof(ago), "%s", CLI_DAMAGED_TEXT);
		else
			cli_format_ago(c->last_rejection_ms, ago, sizeof(ago));
		fprintf(f, "%-24s %7s %*s %7s %10s %10s %10s  %s%s%s%s%s\n", c->name,
		    cell(v[0], sizeof(v[0]), c, CF_IN_USE, c->in_use), lw,
		    live_cell(lim, sizeof(lim), c, false),
		    cell(v[1], sizeof(v[1]), c, CF_PEAK, c->peak),
		    cell(v[2], sizeof(v[2]), c, CF_ADMITTED, c->admitted),
		    cell(v[3], sizeof(v[3]), c, CF_REJECTED, c->rejected),
		    cell(v[4], sizeof(v[4]), c, CF_RECLAIMED, c->reclaimed), ago,
		    c->hot ? "  HOT" : "", c->enforce ? "" : "  OBSERVE", c->kernel ? "  KERNEL" : "",
		    c->drill.running ? "  DRILL" : "");
		extra = extra || any_reason(c->rejected_by) || any_reason(c->would_reject) ||
		    c->nclass > 0 || CLI_DAMAGED(c->damaged, CF_REJECTED_BY) ||
		    CLI_DAMAGED(c->damaged, CF_WOULD_REJECT);
	}
	text_inflight(f, all, n);
	cli_text_pools(f, snap, "", 0);
	cli_adaptive_text(f, all, n);
	cli_text_fleet(f, all, n);
	for (uint32_t i = 0; i < n; i++) {
		const struct cli_drill *d = &all[i].drill;
		char faults[64];

		if (!d->running)
			continue;
		fprintf(f, "\n  %s DRILL: %s, %.1fs left, %llu calls touched, %llu spared, "
		    "started by pid %d\n", all[i].name, cli_drill_faults(d->faults, faults,
		    sizeof(faults)), (double)d->remaining_ms / 1000, (unsigned long long)d->touched,
		    (unsigned long long)d->spared, (int)d->by_pid);
	}
	if (extra)
		fputc('\n', f);
	for (uint32_t i = 0; i < n; i++) {
		const struct cli_comp *c = &all[i];

		text_reasons(f, c->name, "rejected:", c->rejected_by,
		    CLI_DAMAGED(c->damaged, CF_REJECTED_BY));
		text_reasons(f, c->name, "would have rejected (observe mode):", c->would_reject,
		    CLI_DAMAGED(c->damaged, CF_WOULD_REJECT));
		for (size_t k = 0; k < c->nclass; k++) {
			const struct cli_class *cc = &c->cls[k];
			const uint64_t m = cc->damaged;
			char v[5][24];

			fprintf(f, "  %s class %s: %s/%s in use, peak %s, admitted %s, rejected %s",
			    c->name, cc->name,
			    cli_count_text(cc->in_use, CLI_DAMAGED(m, CF_IN_USE), v[0], sizeof(v[0])),
			    cli_count_text(cc->limit, CLI_DAMAGED(m, CF_LIMIT), v[1], sizeof(v[1])),
			    cli_count_text(cc->peak, CLI_DAMAGED(m, CF_PEAK), v[2], sizeof(v[2])),
			    cli_count_text(cc->admitted, CLI_DAMAGED(m, CF_ADMITTED), v[3], sizeof(v[3])),
			    cli_count_text(cc->rejected, CLI_DAMAGED(m, CF_REJECTED), v[4], sizeof(v[4])));
			cli_text_class_share(f, cc);
			fputc('\n', f);
		}
	}
}

int
cmd_status(int argc, char **argv)
{
	struct cli_target t = { NULL, NULL };
	struct cli_snap snap;
	struct seg *s;
	bool json = false;
	int r;

	if ((r = cli_parse_view(argc, argv, "status", &t, &json)) >= 0)
		return r;
	if (cli_open(&t, false, &s) < 0)
		return 1;
	r = cli_snap_read(s, &snap);
	seg_close(s);
	if (r < 0) {
		/* Said on stderr; the exit status stays 0. */
		fprintf(stderr, "bulkshim: out of memory\n");
		return 0;
	}
	cli_seg_access_warn(json ? stderr : stdout, &t, &snap);
	/* Only `status --json` waits for DNS: `serve`'s scrapes must not. */
	if (json)
		cli_status_json(stdout, &snap, true);
	else {
		cli_status_text(stdout, &snap);
		cli_text_hosts(stdout, snap.config_path);
	}
	cli_snap_free(&snap);
	return 0;
}

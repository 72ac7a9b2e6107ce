/* cmd_status.c - `bulkshim status`: a snapshot of a segment as a table or one JSON object. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* ---- who attached, and who ran without limits ---- */

/* The keys "attached", "unprotected", "unprotected_last_ms",
 * "unprotected_last" and "config" (no braces, no leading comma). */
static void
json_attach(FILE *f, const struct cli_snap *snap)
{
	fprintf(f, "\"attached\": %llu, \"unprotected\": %llu, \"unprotected_last_ms\": %llu, "
	    "\"unprotected_last\": ", (unsigned long long)snap->attaches,
	    (unsigned long long)snap->unprotected, (unsigned long long)snap->unprotected_ms);
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
	cli_format_ago(snap->unprotected_ms, ago, sizeof(ago));
	fprintf(f, "WARNING: %llu process%s tried to attach and ran WITHOUT LIMITS; the last, %s: "
	    "%s\n", (unsigned long long)snap->unprotected, snap->unprotected == 1 ? "" : "es", ago,
	    snap->unprotected_why);
}

/* ---- the compartments ---- */

static void
json_reasons(FILE *f, const char *key, const uint64_t *n)
{
	fprintf(f, ", \"%s\": {", key);
	for (int r = 0; r < REASON_MAX; r++)
		fprintf(f, "%s\"%s\": %llu", r ? ", " : "", stat_reason_name((enum bs_reason)r),
		    (unsigned long long)n[r]);
	fputc('}', f);
}

static void
json_comp(FILE *f, const struct cli_comp *c)
{
	const char *en = cfg_errno_name(c->reject_errno);

	fputs("{\"name\": ", f);
	cli_json_string(f, c->name);
	/* The keys up to "errno" are the stable interface of the first
	 * release; the rest were added after them. */
	fprintf(f, ", \"limit\": %u, \"in_use\": %u, \"peak\": %u, \"admitted\": %llu, "
	    "\"rejected\": %llu, \"waiting\": %u, \"last_rejection_ms\": %llu, "
	    "\"reclaimed\": %llu, \"errno\": \"%s\"",
	    c->limit == UINT32_MAX ? 0 : c->limit, c->in_use, c->peak,
	    (unsigned long long)c->admitted, (unsigned long long)c->rejected, c->waiting,
	    (unsigned long long)c->last_rejection_ms, (unsigned long long)c->reclaimed,
	    en != NULL ? en : "ECONNREFUSED");
	fprintf(f, ", \"unlimited\": %s, \"over\": %u, \"inflight\": %u, \"inflight_limit\": %u, "
	    "\"inflight_unlimited\": %s, \"inflight_peak\": %u, \"enforce\": %s, \"hot\": %s",
	    c->limit == UINT32_MAX ? "true" : "false", c->over, c->inflight,
	    c->inflight_limit == UINT32_MAX ? 0 : c->inflight_limit,
	    c->inflight_limit == UINT32_MAX ? "true" : "false", c->inflight_peak,
	    c->enforce ? "true" : "false", c->hot ? "true" : "false");
	fprintf(f, ", \"max_wait_ms\": %u, \"max_waiting\": %u, \"connect_timeout_ms\": %u, "
	    "\"io_timeout_ms\": %u, \"connect_timeouts\": %llu, \"io_timeouts\": %llu",
	    c->max_wait_ms, c->max_waiting, c->connect_timeout_ms, c->io_timeout_ms,
	    (unsigned long long)c->connect_timeouts, (unsigned long long)c->io_timeouts);
	fprintf(f, ", \"reconciled\": %llu", (unsigned long long)c->reconciled);
	cli_json_fleet(f, c);
	fprintf(f, ", \"kernel\": %s, \"kernel_in_use\": %u", c->kernel ? "true" : "false",
	    c->kernel_in_use);
	json_reasons(f, "rejected_by", c->rejected_by);
	json_reasons(f, "would_reject", c->would_reject);
	cli_json_comp_pool(f, c);
	cli_adaptive_json(f, &c->ad);
	fputs(", \"classes\": [", f);
	for (size_t k = 0; k < c->nclass; k++) {
		const struct cli_class *cc = &c->cls[k];

		fputs(k ? ", {\"name\": " : "{\"name\": ", f);
		cli_json_string(f, cc->name);
		fprintf(f, ", \"limit\": %u, \"in_use\": %u, \"peak\": %u, \"admitted\": %llu, "
		    "\"rejected\": %llu", cc->limit, cc->in_use, cc->peak,
		    (unsigned long long)cc->admitted, (unsigned long long)cc->rejected);
		cli_json_class_share(f, cc);
		fputc('}', f);
	}
	fputs("]}", f);
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
text_reasons(FILE *f, const char *name, const char *what, const uint64_t *n)
{
	bool first = true;

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

/* The second table, for compartments that count requests in flight, wait
 * or time out; printed only when one does. */
static void
text_inflight(FILE *f, const struct cli_comp *all, uint32_t n)
{
	char lim[16], wait[16];
	bool any = false;

	for (uint32_t i = 0; i < n; i++)
		any = any || all[i].inflight_limit != UINT32_MAX || all[i].max_wait_ms != 0 ||
		    all[i].connect_timeout_ms != 0 || all[i].io_timeout_ms != 0 ||
		    all[i].inflight_admitted != 0;
	if (!any)
		return;
	fprintf(f, "\n%-24s %9s %7s %7s %7s %8s %10s %10s\n", "COMPARTMENT", "IN FLIGHT", "LIMIT",
	    "PEAK", "WAITING", "MAX WAIT", "CONNECT TO", "IO TO");
	for (uint32_t i = 0; i < n; i++) {
		const struct cli_comp *c = &all[i];

		snprintf(wait, sizeof(wait), "%ums", c->max_wait_ms);
		fprintf(f, "%-24s %9u %7s %7u %7u %8s %10llu %10llu\n", c->name, c->inflight,
		    cli_limit_text(c->inflight_limit, lim, sizeof(lim)), c->inflight_peak,
		    c->waiting, c->max_wait_ms ? wait : "-",
		    (unsigned long long)c->connect_timeouts, (unsigned long long)c->io_timeouts);
	}
}

/* ---- status ---- */

void
cli_status_json(FILE *f, const struct cli_snap *snap, bool hosts)
{
	fputs("{\"segment\": ", f);
	cli_json_string(f, snap->name);
	fprintf(f, ", \"processes\": %u, \"generation\": %u, ", snap->processes, snap->generation);
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
	fputs("}\n", f);
}

void
cli_status_text(FILE *f, const struct cli_snap *snap)
{
	const struct cli_comp *all = snap->comp;
	uint32_t n = snap->ncomp, procs = snap->processes;
	char ago[32], lim[16];
	bool extra = false;

	fprintf(f, "segment %s (/dev/shm/bulkshim.%s), %u process%s holding permits now, "
	    "%llu attached since it was created\n", snap->name, snap->name, procs,
	    procs == 1 ? "" : "es", (unsigned long long)snap->attaches);
	text_unprotected(f, snap);
	fprintf(f, "%-24s %7s %7s %7s %10s %10s %10s  %s\n", "COMPARTMENT", "IN USE", "LIMIT",
	    "PEAK", "ADMITTED", "REJECTED", "RECLAIMED", "LAST REJECTION");
	for (uint32_t i = 0; i < n; i++) {
		const struct cli_comp *c = &all[i];

		cli_format_ago(c->last_rejection_ms, ago, sizeof(ago));
		fprintf(f, "%-24s %7u %7s %7u %10llu %10llu %10llu  %s%s%s%s\n", c->name, c->in_use,
		    cli_limit_text(c->limit, lim, sizeof(lim)), c->peak,
		    (unsigned long long)c->admitted, (unsigned long long)c->rejected,
		    (unsigned long long)c->reclaimed, ago, c->hot ? "  HOT" : "",
		    c->enforce ? "" : "  OBSERVE", c->kernel ? "  KERNEL" : "");
		extra = extra || any_reason(c->rejected_by) || any_reason(c->would_reject) ||
		    c->nclass > 0;
	}
	text_inflight(f, all, n);
	cli_text_pools(f, snap, "");
	cli_adaptive_text(f, all, n);
	cli_text_fleet(f, all, n);
	if (extra)
		fputc('\n', f);
	for (uint32_t i = 0; i < n; i++) {
		const struct cli_comp *c = &all[i];

		text_reasons(f, c->name, "rejected:", c->rejected_by);
		text_reasons(f, c->name, "would have rejected (observe mode):", c->would_reject);
		for (size_t k = 0; k < c->nclass; k++) {
			fprintf(f, "  %s class %s: %u/%u in use, peak %u, admitted %llu, "
			    "rejected %llu", c->name, c->cls[k].name, c->cls[k].in_use,
			    c->cls[k].limit, c->cls[k].peak, (unsigned long long)c->cls[k].admitted,
			    (unsigned long long)c->cls[k].rejected);
			cli_text_class_share(f, &c->cls[k]);
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
	else
		cli_status_text(stdout, &snap);
	cli_snap_free(&snap);
	return 0;
}

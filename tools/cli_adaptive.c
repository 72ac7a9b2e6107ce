/* cli_adaptive.c - the adaptive limit: read for the snapshot, shown by status, status --json, watch and metrics. */
#include <stdio.h>
#include <string.h>

#include "admit/ad_alg.h"
#include "cli.h"

void
cli_read_adaptive(const struct seg_comp *sc, struct cli_adaptive *a)
{
	const struct seg_adaptive *d = &sc->ad;
	struct ad_state st;

	memset(a, 0, sizeof(*a));
	a->mode = atomic_load(&d->mode);
	if (a->mode == AD_NONE)
		return;
	ad_unpack(atomic_load(&d->ctl), &st);
	a->kind = atomic_load(&d->kind);
	a->limit = st.limit16 / 16 > 0 ? st.limit16 / 16 : 1;
	a->algorithm = atomic_load(&d->algorithm);
	/* The latency the controller judges by (none during Envoy's minRTT
	 * window, whose latency field holds the limit it returns to). */
	a->baseline_us = ad_alg_latency_us(a->algorithm, atomic_load(&d->ctl));
	a->min = atomic_load(&d->min);
	a->max = atomic_load(&d->max);
	a->window_ms = atomic_load(&d->window_ms);
	a->tolerance_pct = atomic_load(&d->tolerance_pct);
	a->sample_us = atomic_load(&d->sample_us);
	a->sample_conc16 = atomic_load(&d->sample_conc16);
	a->windows = atomic_load(&d->windows);
	a->changes = atomic_load(&d->changes);
	a->last_change_ms = atomic_load(&d->last_change_ms);
	a->last_from = atomic_load(&d->last_from);
	a->last_to = atomic_load(&d->last_to);
	a->last_reason = atomic_load(&d->last_reason);
	a->knee = ad_knee(sc, &a->knee_sure);
	a->edge = ad_edge(sc, &a->edge_again);
}

const char *
cli_adaptive_applies(const struct cli_adaptive *a)
{
	return a->kind == P_CONN ? "connections" : "inflight";
}

void
cli_adaptive_json(FILE *f, const struct cli_adaptive *a)
{
	if (a->mode == AD_NONE) {
		fputs(", \"adaptive\": null", f);
		return;
	}
	fprintf(f, ", \"adaptive\": {\"mode\": \"%s\", \"algorithm\": \"%s\", \"applies_to\": \"%s\", "
	    "\"limit\": %u, "
	    "\"min\": %u, \"max\": %u, \"window_ms\": %u, \"tolerance_pct\": %u, "
	    "\"baseline_us\": %u, \"sample_us\": %llu, \"sample_concurrency\": %.2f, "
	    "\"windows\": %llu, \"changes\": %llu, \"last_change_ms\": %llu, "
	    "\"last_change_from\": %u, \"last_change_to\": %u, \"last_change_reason\": \"%s\", "
	    "\"knee\": %u, \"knee_sure\": %s, \"edge\": %u, \"edge_found_again\": %s}",
	    ad_mode_name(a->mode), ad_alg_name(a->algorithm), cli_adaptive_applies(a), a->limit,
	    a->min, a->max, a->window_ms,
	    a->tolerance_pct, a->baseline_us, (unsigned long long)a->sample_us,
	    a->sample_conc16 / 16.0, (unsigned long long)a->windows,
	    (unsigned long long)a->changes, (unsigned long long)a->last_change_ms, a->last_from,
	    a->last_to, ad_reason_name(a->last_reason), a->knee, a->knee_sure ? "true" : "false",
	    a->edge, a->edge_again ? "true" : "false");
}

/* Microseconds as "850us", "12.3ms" or "2.05s". */
static const char *
dur_text(uint64_t us, char *buf, size_t len)
{
	if (us < 1000)
		snprintf(buf, len, "%lluus", (unsigned long long)us);
	else if (us < 1000000)
		snprintf(buf, len, "%.1fms", us / 1000.0);
	else
		snprintf(buf, len, "%.2fs", us / 1e6);
	return buf;
}

void
cli_adaptive_text(FILE *f, const struct cli_comp *all, uint32_t n)
{
	char b1[16], b2[16], ago[32];
	bool any = false;

	for (uint32_t i = 0; i < n; i++)
		any = any || all[i].ad.mode != AD_NONE;
	if (!any)
		return;
	fprintf(f, "\n%-24s %-4s %-9s %-11s %7s %9s %9s %9s  %s\n", "ADAPTIVE", "MODE", "ALGORITHM",
	    "LIMITS", "LIMIT", "MIN..MAX", "BASELINE", "SAMPLE", "LAST CHANGE");
	for (uint32_t i = 0; i < n; i++) {
		const struct cli_adaptive *a = &all[i].ad;
		char range[24];

		if (a->mode == AD_NONE)
			continue;
		snprintf(range, sizeof(range), "%u..%u", a->min, a->max);
		cli_format_ago(a->last_change_ms, ago, sizeof(ago));
		fprintf(f, "%-24s %-4s %-9s %-11s %7u %9s %9s %9s  %u -> %u (%s) %s\n", all[i].name,
		    ad_mode_name(a->mode), ad_alg_name(a->algorithm), cli_adaptive_applies(a), a->limit,
		    range,
		    a->baseline_us ? dur_text(a->baseline_us, b1, sizeof(b1)) : "-",
		    a->windows ? dur_text(a->sample_us, b2, sizeof(b2)) : "-", a->last_from,
		    a->last_to, ad_reason_name(a->last_reason), ago);
		if (a->knee > 0 && a->knee_sure)
			fprintf(f, "%-24s knee at %u: one permit more cost latency past the tolerance "
			    "and served less than a quarter more (tried again every %d s)\n", "",
			    a->knee, AD_KNEE_RETRY_S);
		else if (a->knee > 0)
			fprintf(f, "%-24s knee at %u: one permit fewer served a quarter less; the "
			    "permit above it is under test\n", "", a->knee);
		if (a->edge > 0)
			fprintf(f, "%-24s edge at %u: replies waited at %u in flight; the limit "
			    "steps onto it every %d windows%s\n", "", a->edge, a->edge,
			    a->edge_again ? AD_PROBE_WINDOWS : AD_EDGE_WINDOWS,
			    a->edge_again ? " (found again)" : " (not yet found again)");
	}
}

void
cli_adaptive_watch(FILE *f, const struct cli_comp *c, bool ansi)
{
	const struct cli_adaptive *a = &c->ad;
	char b1[16], b2[16], knee[64] = "";
	int k = 0;

	if (a->mode == AD_NONE)
		return;
	if (a->knee > 0)
		k = snprintf(knee, sizeof(knee), ", knee %u%s", a->knee,
		    a->knee_sure ? "" : " (under test)");
	if (a->edge > 0 && k >= 0 && (size_t)k < sizeof(knee))
		snprintf(knee + k, sizeof(knee) - (size_t)k, ", edge %u", a->edge);
	fprintf(f, "  adaptive %s (%s): limit %u (%u..%u), baseline %s, sample %s, last %u -> %u "
	    "(%s)%s%s\n", ad_mode_name(a->mode), ad_alg_name(a->algorithm), a->limit, a->min, a->max,
	    a->baseline_us ? dur_text(a->baseline_us, b1, sizeof(b1)) : "-",
	    a->windows ? dur_text(a->sample_us, b2, sizeof(b2)) : "-", a->last_from, a->last_to,
	    ad_reason_name(a->last_reason), knee, ansi ? "\033[K" : "");
}

/* One gauge family over the adaptive compartments. */
static void
gauge(FILE *f, const char *seg, const struct cli_comp *all, uint32_t n, const char *name,
    const char *help, int which, void (*labels)(FILE *, const char *, const char *,
    const char *, const char *))
{
	fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
	for (uint32_t i = 0; i < n; i++) {
		const struct cli_adaptive *a = &all[i].ad;

		if (a->mode == AD_NONE)
			continue;
		fputs(name, f);
		switch (which) {
		case 0:
			labels(f, seg, all[i].name, NULL, NULL);
			fprintf(f, " %u\n", a->limit);
			break;
		case 1: labels(f, seg, all[i].name, NULL, NULL); fprintf(f, " %u\n", a->min); break;
		case 2: labels(f, seg, all[i].name, NULL, NULL); fprintf(f, " %u\n", a->max); break;
		case 3:
			labels(f, seg, all[i].name, NULL, NULL);
			fprintf(f, " %.6f\n", a->baseline_us / 1e6);
			break;
		case 4:
			labels(f, seg, all[i].name, NULL, NULL);
			fprintf(f, " %.6f\n", a->sample_us / 1e6);
			break;
		case 5:
			labels(f, seg, all[i].name, NULL, NULL);
			fprintf(f, " %.3f\n", a->last_change_ms / 1e3);
			break;
		case 6:
			labels(f, seg, all[i].name, NULL, NULL);
			fprintf(f, " %d\n", a->mode == AD_ON ? 1 : 0);
			break;
		case 7: labels(f, seg, all[i].name, NULL, NULL); fprintf(f, " %u\n", a->knee); break;
		case 8: labels(f, seg, all[i].name, NULL, NULL); fprintf(f, " %u\n", a->edge); break;
		}
	}
}

void
cli_adaptive_metrics(FILE *f, const char *seg, const struct cli_comp *all, uint32_t n,
    void (*labels)(FILE *, const char *, const char *, const char *, const char *))
{
	gauge(f, seg, all, n, "bulkshim_adaptive_limit", "The adaptive limit now.", 0, labels);
	gauge(f, seg, all, n, "bulkshim_adaptive_on", "1 while the adaptive limit moves, 0 "
	    "while `set` pins it.", 6, labels);
	gauge(f, seg, all, n, "bulkshim_adaptive_min", "The adaptive limit's floor.", 1, labels);
	gauge(f, seg, all, n, "bulkshim_adaptive_max", "The adaptive limit's ceiling.", 2, labels);
	gauge(f, seg, all, n, "bulkshim_adaptive_baseline_seconds", "Latency without a queue, "
	    "as the controller estimates it.", 3, labels);
	gauge(f, seg, all, n, "bulkshim_adaptive_sample_seconds", "Mean latency of the last "
	    "measurement window.", 4, labels);
	gauge(f, seg, all, n, "bulkshim_adaptive_last_change_timestamp_seconds", "When the "
	    "adaptive limit last changed.", 5, labels);
	gauge(f, seg, all, n, "bulkshim_adaptive_knee", "The knee the limit is held at (one "
	    "permit more cost latency and served less than a quarter more), 0 for none.", 7, labels);
	gauge(f, seg, all, n, "bulkshim_adaptive_edge", "The least limit whose replies showed a "
	    "queue (the limit holds one under it and steps onto it now and then), 0 for none.", 8,
	    labels);
	/* Why, as a state set: one series per reason, always all of them,
	 * so a change of reason creates no new series. */
	fputs("# HELP bulkshim_adaptive_last_change_reason Why the adaptive limit last changed: "
	    "1 for the reason, 0 for the others.\n"
	    "# TYPE bulkshim_adaptive_last_change_reason gauge\n", f);
	for (uint32_t i = 0; i < n; i++) {
		if (all[i].ad.mode == AD_NONE)
			continue;
		for (unsigned r = AD_R_NONE; r < AD_R_MAX; r++) {
			fputs("bulkshim_adaptive_last_change_reason", f);
			labels(f, seg, all[i].name, "reason", ad_reason_name(r));
			fprintf(f, " %d\n", all[i].ad.last_reason == r ? 1 : 0);
		}
	}
	fputs("# HELP bulkshim_adaptive_changes_total Windows that moved the adaptive limit.\n"
	    "# TYPE bulkshim_adaptive_changes_total counter\n", f);
	for (uint32_t i = 0; i < n; i++) {
		if (all[i].ad.mode == AD_NONE)
			continue;
		fputs("bulkshim_adaptive_changes_total", f);
		labels(f, seg, all[i].name, NULL, NULL);
		fprintf(f, " %llu\n", (unsigned long long)all[i].ad.changes);
	}
}

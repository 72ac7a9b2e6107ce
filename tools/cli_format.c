/* cli_format.c - the text helpers of every view: JSON strings, bars, limits, times ago, numbers. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Nothing here reads a segment or calls another file of the CLI: the
 * views, the commands and the fleet agent all call it. */

/* ---- damaged values ---- */

static const char *const field_names[CF_FIELDS] = {
	[CF_NAME] = "name", [CF_LIMIT] = "limit", [CF_LIVE_LIMIT] = "live_limit",
	[CF_IN_USE] = "in_use", [CF_OVER] = "over", [CF_PEAK] = "peak", [CF_WAITING] = "waiting",
	[CF_INFLIGHT] = "inflight", [CF_INFLIGHT_LIMIT] = "inflight_limit",
	[CF_INFLIGHT_PEAK] = "inflight_peak", [CF_MAX_WAIT_MS] = "max_wait_ms",
	[CF_MAX_WAITING] = "max_waiting", [CF_CONNECT_TIMEOUT_MS] = "connect_timeout_ms",
	[CF_IO_TIMEOUT_MS] = "io_timeout_ms", [CF_ERRNO] = "errno", [CF_ADMITTED] = "admitted",
	[CF_REJECTED] = "rejected", [CF_LAST_REJECTION_MS] = "last_rejection_ms",
	[CF_RECLAIMED] = "reclaimed", [CF_RECONCILED] = "reconciled",
	[CF_INFLIGHT_ADMITTED] = "inflight_admitted", [CF_CONNECT_TIMEOUTS] = "connect_timeouts",
	[CF_IO_TIMEOUTS] = "io_timeouts", [CF_PEAK_RATE] = "peak_rate",
	[CF_REJECTED_BY] = "rejected_by", [CF_WOULD_REJECT] = "would_reject",
	[CF_H_CONNECT] = "connect_seconds", [CF_H_REPLY] = "reply_seconds",
	[CF_H_WAIT] = "wait_seconds", [CF_GUARANTEED] = "guaranteed", [CF_BORROWED] = "borrowed",
	[CF_CLASS_LENT] = "class_lent", [CF_SIZE] = "size", [CF_RESERVED] = "reserved",
	[CF_SHARED] = "shared", [CF_LENT] = "lent", [CF_FREE] = "free",
	[CF_ADAPTIVE] = "adaptive", [CF_FLEET_LIMIT] = "fleet_limit", [CF_SEGMENT] = "segment",
	[CF_ATTACHED] = "attached", [CF_UNPROTECTED] = "unprotected",
	[CF_UNPROTECTED_LAST_MS] = "unprotected_last_ms", [CF_TRUNCATED] = "truncated",
	[CF_INFLIGHT_LIVE_LIMIT] = "inflight_live_limit",
};
_Static_assert(CF_FIELDS <= 64, "a damaged mask has a bit for every field");

/* ---- names read from a segment ---- */

const char *
cli_name(const char *field, size_t size)
{
	static char ring[4][BS_NAME_MAX];
	static unsigned next;
	char *out = ring[next++ % 4];

	log_name(out, sizeof(ring[0]), field, size);
	return out;
}

const char *
cli_field_name(enum cli_field f)
{
	return f < CF_FIELDS && field_names[f] != NULL ? field_names[f] : "?";
}

const char *
cli_count_text(uint64_t v, bool bad, char *buf, size_t len)
{
	if (bad)
		snprintf(buf, len, "%s", CLI_DAMAGED_TEXT);
	else
		snprintf(buf, len, "%llu", (unsigned long long)v);
	return buf;
}

void
cli_json_value(FILE *f, const char *key, uint64_t v, bool bad)
{
	if (bad)
		fprintf(f, ", \"%s\": null", key);
	else
		fprintf(f, ", \"%s\": %llu", key, (unsigned long long)v);
}

void
cli_json_field(FILE *f, uint64_t mask, enum cli_field field, uint64_t v)
{
	cli_json_value(f, cli_field_name(field), v, CLI_DAMAGED(mask, field));
}

void
cli_json_damaged(FILE *f, uint64_t mask)
{
	bool first = true;

	fputs(", \"damaged\": [", f);
	for (int k = 0; k < CF_FIELDS; k++) {
		if (!CLI_DAMAGED(mask, k))
			continue;
		fprintf(f, "%s\"%s\"", first ? "" : ", ", cli_field_name((enum cli_field)k));
		first = false;
	}
	fputc(']', f);
}

void
cli_damage_list(char *buf, size_t len, size_t *pos, const char *prefix, uint64_t mask)
{
	bool first = true;

	for (int k = 0; k < CF_FIELDS && *pos < len; k++) {
		const char *name = cli_field_name((enum cli_field)k);
		int n;

		if (!CLI_DAMAGED(mask, k))
			continue;
		if (first)
			n = snprintf(buf + *pos, len - *pos, "%s%s%s", *pos > 0 ? "; " : "", prefix, name);
		else
			n = snprintf(buf + *pos, len - *pos, ", %s", name);
		*pos += n > 0 ? (size_t)n : 0;
		first = false;
	}
	if (*pos >= len && len > 4) {
		memcpy(buf + len - 4, "...", 4);
		*pos = len - 1;
	}
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

/* Orders pointers to strings, for finding two equal ones. */
static int
by_text(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Whether the n texts (of stride bytes each) at first are all different. */
static bool
all_distinct(char *first, size_t n, size_t stride)
{
	char **p = malloc((n ? n : 1) * sizeof(*p));
	bool ok = true;

	if (p == NULL)
		return false;
	for (size_t i = 0; i < n; i++)
		p[i] = first + i * stride;
	qsort(p, n, sizeof(*p), by_text);
	for (size_t i = 1; i < n && ok; i++)
		ok = strcmp(p[i - 1], p[i]) != 0;
	free(p);
	return ok;
}

void
cli_abbrev(const char *const *names, size_t n, size_t width, char (*out)[CLI_ABBREV_MAX])
{
	if (width >= CLI_ABBREV_MAX)
		width = CLI_ABBREV_MAX - 1;
	if (width < 4)
		width = 4;
	/* The head and the tail of a long name, the tail as short as keeps
	 * every name apart: names that differ at their end (numbered
	 * replicas) keep it. */
	for (size_t tail = (width - 1) / 2; tail + 2 <= width; tail++) {
		for (size_t i = 0; i < n; i++) {
			size_t len = strlen(names[i]);

			if (len <= width)
				snprintf(out[i], CLI_ABBREV_MAX, "%s", names[i]);
			else
				snprintf(out[i], CLI_ABBREV_MAX, "%.*s~%s", (int)(width - 1 - tail),
				    names[i], names[i] + len - tail);
		}
		if (all_distinct(out[0], n, CLI_ABBREV_MAX))
			return;
	}
	/* Names that differ only in their middle: the head and the row's
	 * number. */
	for (size_t i = 0; i < n; i++) {
		char num[16];
		int k = snprintf(num, sizeof(num), "~%zu", i + 1);

		if (strlen(names[i]) > width && (size_t)k < width)
			snprintf(out[i], CLI_ABBREV_MAX, "%.*s%s", (int)(width - (size_t)k), names[i],
			    num);
	}
}

/* ---- histograms ---- */

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

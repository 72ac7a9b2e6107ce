/* cli_attach.c - who attached to a segment and who ran without limits, for status and list. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

/* The reason a process left, read with its bound: the segment is shared
 * and may hold anything. */
static void
last_why(const struct seg_header *h, char *buf, size_t len)
{
	size_t n = strnlen(h->unprotected_why, sizeof(h->unprotected_why));

	snprintf(buf, len, "%.*s", (int)n, h->unprotected_why);
}

void
cli_json_attach(FILE *f, const struct seg *s)
{
	const struct seg_header *h = seg_header(s);
	char why[sizeof(h->unprotected_why) + 1];

	last_why(h, why, sizeof(why));
	fprintf(f, "\"attached\": %llu, \"unprotected\": %llu, \"unprotected_last_ms\": %llu, "
	    "\"unprotected_last\": ", (unsigned long long)atomic_load(&h->attaches),
	    (unsigned long long)atomic_load(&h->unprotected),
	    (unsigned long long)atomic_load(&h->unprotected_ms));
	cli_json_string(f, why);
	fputs(", \"config\": ", f);
	cli_json_string(f, h->config_path);
}

void
cli_print_unprotected(FILE *f, const struct seg *s)
{
	const struct seg_header *h = seg_header(s);
	uint64_t n = atomic_load(&h->unprotected);
	char why[sizeof(h->unprotected_why) + 1], ago[32];

	if (n == 0)
		return;
	last_why(h, why, sizeof(why));
	cli_format_ago(atomic_load(&h->unprotected_ms), ago, sizeof(ago));
	fprintf(f, "WARNING: %llu process%s tried to attach and ran WITHOUT LIMITS; the last, %s: "
	    "%s\n", (unsigned long long)n, n == 1 ? "" : "es", ago, why);
}

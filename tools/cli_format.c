/* cli_format.c - the text helpers of every view: JSON strings, bars, limits, times ago, numbers. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Nothing here reads a segment or calls another file of the CLI: the
 * views, the commands and the fleet agent all call it. */

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

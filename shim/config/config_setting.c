/* config_setting.c - typed access to libconfig settings, with messages at FILE:LINE. */
#include "config/config_int.h"

#include <errno.h>
#include <limits.h>
#include <libconfig.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Writes "FILE:LINE: msg" (or "FILE: msg" when line is 0) at buf. */
static void vfail_line(char *buf, size_t len, const char *name, int line, const char *msg)
{
	size_t n = strlen(name);

	/* A path too long to leave room for the reason is shown by its
	 * end, which names the file; the reason is what must not be cut. */
	if (n > 200) {
		if (line > 0)
			snprintf(buf, len, "...%s:%d: %s", name + n - 200, line, msg);
		else
			snprintf(buf, len, "...%s: %s", name + n - 200, msg);
		return;
	}
	if (line > 0)
		snprintf(buf, len, "%s:%d: %s", name, line, msg);
	else
		snprintf(buf, len, "%s: %s", name, msg);
}

static void vfail(struct cfg_ctx *c, const char *file, int line, const char *fmt, va_list ap)
{
	char msg[BS_ERRLEN];
	size_t used = 0;

	if (c->err == NULL || c->errlen == 0)
		return;
	vsnprintf(msg, sizeof(msg), fmt, ap);
	/* cfg_load_all: each error on a line of its own after the others. */
	if (c->all && c->err[0] != '\0') {
		used = strlen(c->err);
		if (used + 2 >= c->errlen)
			return;
		c->err[used++] = '\n';
	}
	vfail_line(c->err + used, c->errlen - used, file ? file : c->path, line, msg);
}

/* See config_int.h. */
bool cfg_go_on(struct cfg_ctx *c, int rc)
{
	if (!c->all || rc == -ENOMEM)
		return false;
	if (c->first_rc == 0)
		c->first_rc = rc;
	return true;
}

/* Writes "FILE:LINE: message" (or "FILE: message" when line is 0) into the
 * caller's buffer and returns rc, so that errors read `return cfg_fail(...)`. */
int cfg_fail_at(struct cfg_ctx *c, const char *file, int line, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vfail(c, file, line, fmt, ap);
	va_end(ap);
	return rc;
}

void
cfg_place(const struct cfg_ctx *c, int line, const char **file, int *at)
{
	size_t lo = 0, hi = c->nspan;

	*file = NULL;
	*at = line;
	if (c->nspan == 0 || line < 1)
		return;
	/* The last span that starts at or before line. */
	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;

		if (c->span[mid].first <= line)
			lo = mid;
		else
			hi = mid;
	}
	if (c->span[lo].first > line)
		return;
	*file = c->span[lo].file;
	*at = c->span[lo].line + (line - c->span[lo].first);
}

/* See config_int.h. libconfig parses one text (cfg_read_file), so its lines are
 * lines of that text, placed in their files by the spans. */
void cfg_where(const struct cfg_ctx *c, const config_setting_t *s, const char **file, int *line)
{
	cfg_place(c, config_setting_source_line(s), file, line);
}

/* See config_int.h. */
int cfg_line_of(const struct cfg_ctx *c, const config_setting_t *s)
{
	const char *file;
	int line;

	cfg_where(c, s, &file, &line);
	return line;
}

/* The same at the file and line of setting s, or of the file when s is NULL;
 * returns rc. */
int cfg_fail(struct cfg_ctx *c, const config_setting_t *s, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	if (s != NULL) {
		const char *file;
		int line;

		cfg_where(c, s, &file, &line);
		vfail(c, file, line, fmt, ap);
	} else
		vfail(c, NULL, 0, fmt, ap);
	va_end(ap);
	return rc;
}

/* "an integer", "a string"... for a libconfig type, for messages; "nothing"
 * for a type it does not know. */
const char *cfg_type_name(int type)
{
	switch (type) {
	case CONFIG_TYPE_GROUP: return "a group";
	case CONFIG_TYPE_INT: return "an integer";
	case CONFIG_TYPE_INT64: return "an integer";
	case CONFIG_TYPE_FLOAT: return "a number with a fraction";
	case CONFIG_TYPE_STRING: return "a string";
	case CONFIG_TYPE_BOOL: return "a boolean";
	case CONFIG_TYPE_ARRAY: return "an array";
	case CONFIG_TYPE_LIST: return "a list";
	}
	return "nothing";
}

/* The name of setting s, or "element" for an element of a list or array,
 * which has none. */
const char *cfg_key_of(const config_setting_t *s)
{
	const char *name = config_setting_name(s);

	return name ? name : "element";
}

static char lower(char ch)
{
	return (ch >= 'A' && ch <= 'Z') ? (char)(ch - 'A' + 'a') : ch;
}

/* Edit distance with transpositions, ignoring case; long keys count as far. */
static size_t key_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b), d[33][33];

	if (la > 32 || lb > 32)
		return SIZE_MAX;
	for (size_t i = 0; i <= la; i++)
		d[i][0] = i;
	for (size_t j = 0; j <= lb; j++)
		d[0][j] = j;
	for (size_t i = 1; i <= la; i++) {
		for (size_t j = 1; j <= lb; j++) {
			size_t cost = lower(a[i - 1]) != lower(b[j - 1]);
			size_t v = d[i - 1][j] + 1;

			if (d[i][j - 1] + 1 < v)
				v = d[i][j - 1] + 1;
			if (d[i - 1][j - 1] + cost < v)
				v = d[i - 1][j - 1] + cost;
			if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) &&
			    lower(a[i - 2]) == lower(b[j - 1]) && d[i - 2][j - 2] + 1 < v)
				v = d[i - 2][j - 2] + 1;
			d[i][j] = v;
		}
	}
	return d[la][lb];
}

/* The word of the NULL-terminated list `known` that name looks like a typo
 * of, or NULL when none is close enough. */
const char *cfg_closest(const char *name, const char *const *known)
{
	const char *best = NULL;
	size_t best_d = SIZE_MAX;

	for (size_t i = 0; known[i] != NULL; i++) {
		size_t d = key_distance(name, known[i]);
		size_t limit = strlen(known[i]) >= 6 ? 2 : 1;

		if (d <= limit && d < best_d) {
			best = known[i];
			best_d = d;
		}
	}
	return best;
}

/* Reports setting s as an unknown key of the group described by `where`,
 * suggesting the closest known key when it looks like a typo of one.
 * Always returns -EINVAL. */
int cfg_unknown_key(struct cfg_ctx *c, const config_setting_t *s, const char *const *known,
		    const char *where)
{
	const char *name = cfg_key_of(s), *best = cfg_closest(name, known);

	if (best != NULL)
		return cfg_fail(c, s, -EINVAL, "unknown key \"%s\"%s (did you mean \"%s\"?)", name,
				where, best);
	return cfg_fail(c, s, -EINVAL, "unknown key \"%s\"%s", name, where);
}

/* True if name is in the NULL-terminated list `known`. */
bool cfg_is_known(const char *name, const char *const *known)
{
	for (size_t i = 0; known[i] != NULL; i++)
		if (strcmp(name, known[i]) == 0)
			return true;
	return false;
}

/* Parses the integer literal at p the way libconfig's scanner reads it
 * (decimal, or hex after 0x; an optional L suffix), but into 64 bits with
 * overflow detected. Returns 0, or -ERANGE, or -EINVAL if p is no literal. */
static int literal_value(const char *p, const char *end, long long *out)
{
	bool neg = false, hex = false;
	unsigned long long v = 0, max = (unsigned long long)LLONG_MAX;
	int digits = 0, d;

	if (p < end && (*p == '-' || *p == '+'))
		neg = *p++ == '-';
	if (end - p > 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
		hex = true;
		p += 2;
	}
	for (; p < end; p++, digits++) {
		if (*p >= '0' && *p <= '9')
			d = *p - '0';
		else if (hex && ((*p | 0x20) >= 'a' && (*p | 0x20) <= 'f'))
			d = (*p | 0x20) - 'a' + 10;
		else
			break;
		if (v > (max + neg - (unsigned long long)d) / (hex ? 16 : 10))
			return -ERANGE;
		v = v * (hex ? 16 : 10) + (unsigned long long)d;
	}
	if (digits == 0)
		return -EINVAL;
	*out = neg ? (long long)(0 - v) : (long long)v;
	return 0;
}

/*
 * libconfig keeps an integer written without an L suffix in 32 bits and
 * wraps it silently: 4294967297 arrives as 1. The value is read again from
 * the text parsed, at the setting's line (of that text, which holds what
 * the config includes too): the occurrence of "key =" whose 32-bit wrap is
 * what libconfig holds. Returns 0 with *out set (left alone when the text
 * does not tell), or -ERANGE when the literal does not fit in 64 bits.
 */
static int whole_value(struct cfg_ctx *c, const config_setting_t *s, long long *out)
{
	const char *name = config_setting_name(s);
	int line = config_setting_source_line(s);
	size_t klen, start, end;

	if (c->text == NULL || name == NULL || line < 1 || (size_t)line > c->nlines)
		return 0;
	klen = strlen(name);
	start = line > 1 ? c->line_end[line - 2] + 1 : 0;
	end = c->line_end[line - 1];
	for (size_t i = start; i + klen < end; i++) {
		const char *p = c->text + i, *e = c->text + end;
		long long v;
		int rc;

		if (memcmp(p, name, klen) != 0 || (i > start && cfg_name_char(p[-1])) ||
		    cfg_name_char(p[klen]))
			continue;
		for (p += klen; p < e && (*p == ' ' || *p == '\t'); p++)
			;
		if (p == e || (*p != '=' && *p != ':'))
			continue;
		for (p++; p < e && (*p == ' ' || *p == '\t'); p++)
			;
		rc = literal_value(p, e, &v);
		if (rc == -ERANGE)
			return rc;
		if (rc == 0 && (int32_t)(uint32_t)(unsigned long long)v == (int32_t)*out) {
			*out = v;
			return 0;
		}
	}
	return 0;
}

/* Reads integer setting s into *out, whole (see whole_value). Returns 0,
 * or -EINVAL with a message when s is not an integer or does not fit in
 * 64 bits. */
int cfg_get_int(struct cfg_ctx *c, const config_setting_t *s, long long *out)
{
	int type = config_setting_type(s);

	if (type != CONFIG_TYPE_INT && type != CONFIG_TYPE_INT64)
		return cfg_fail(c, s, -EINVAL, "\"%s\" must be an integer, not %s", cfg_key_of(s),
				cfg_type_name(type));
	*out = config_setting_get_int64(s);
	if (type == CONFIG_TYPE_INT && whole_value(c, s, out) < 0)
		return cfg_fail(c, s, -EINVAL, "\"%s\" is too large (more than 64 bits)",
				cfg_key_of(s));
	return 0;
}

/* The same, and lo <= *out <= hi, or -EINVAL with a message. */
int cfg_get_range(struct cfg_ctx *c, const config_setting_t *s, long long lo, long long hi,
		  long long *out)
{
	int rc = cfg_get_int(c, s, out);

	if (rc < 0)
		return rc;
	if (*out < lo || *out > hi)
		return cfg_fail(c, s, -EINVAL, "\"%s\" must be between %lld and %lld, not %lld",
				cfg_key_of(s), lo, hi, *out);
	return 0;
}

/* Reads boolean setting s into *out. Returns 0, or -EINVAL with a message
 * when s is not true or false. */
int cfg_get_bool(struct cfg_ctx *c, const config_setting_t *s, bool *out)
{
	int type = config_setting_type(s);

	if (type != CONFIG_TYPE_BOOL)
		return cfg_fail(c, s, -EINVAL, "\"%s\" must be true or false, not %s", cfg_key_of(s),
				cfg_type_name(type));
	*out = config_setting_get_bool(s);
	return 0;
}

/* Points *out at the text of string setting s, which libconfig owns. Returns
 * 0, or -EINVAL with a message when s is not a string. */
int cfg_get_string(struct cfg_ctx *c, const config_setting_t *s, const char **out)
{
	int type = config_setting_type(s);

	if (type != CONFIG_TYPE_STRING)
		return cfg_fail(c, s, -EINVAL, "\"%s\" must be a string, not %s", cfg_key_of(s),
				cfg_type_name(type));
	*out = config_setting_get_string(s);
	return 0;
}

/* True for the characters of a name: [A-Za-z0-9_.-]. */
bool cfg_name_char(char ch)
{
	return bs_name_char(ch);
}

/* Checks a compartment or segment name: 1..63 characters of [A-Za-z0-9_.-].
 * Returns 0, or -EINVAL with a message naming it as `what`. */
int cfg_check_name(struct cfg_ctx *c, const config_setting_t *s, const char *what,
		   const char *name)
{
	size_t n = strlen(name);

	if (n == 0)
		return cfg_fail(c, s, -EINVAL, "empty %s name", what);
	if (n >= BS_NAME_MAX)
		return cfg_fail(c, s, -EINVAL, "%s name \"%.20s...\" is %zu characters, more than %d",
				what, name, n, BS_NAME_MAX - 1);
	for (size_t i = 0; i < n; i++)
		if (!cfg_name_char(name[i]))
			return cfg_fail(c, s, -EINVAL,
					"%s name \"%s\" has a character outside [A-Za-z0-9_.-]",
					what, name);
	return 0;
}

/* The errno values a refusal may answer with (reject_errno). */
static const struct {
	const char *name;
	int value;
} errno_names[] = {
	{ "ECONNREFUSED", ECONNREFUSED },
	{ "EAGAIN", EAGAIN },
	{ "ETIMEDOUT", ETIMEDOUT },
	{ "EHOSTUNREACH", EHOSTUNREACH },
	{ "ENETUNREACH", ENETUNREACH },
};

/* The errno value of one of the allowed names (ECONNREFUSED, EAGAIN,
 * ETIMEDOUT, EHOSTUNREACH, ENETUNREACH), or -EINVAL for any other. */
int cfg_errno_value(const char *name)
{
	for (size_t i = 0; name != NULL && i < sizeof(errno_names) / sizeof(errno_names[0]); i++)
		if (strcmp(name, errno_names[i].name) == 0)
			return errno_names[i].value;
	return -EINVAL;
}

/* The name of an allowed errno value, or NULL for any other value. */
const char *cfg_errno_name(int value)
{
	for (size_t i = 0; i < sizeof(errno_names) / sizeof(errno_names[0]); i++)
		if (errno_names[i].value == value)
			return errno_names[i].name;
	return NULL;
}

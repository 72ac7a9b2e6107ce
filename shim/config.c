/* config.c - reads and validates the libconfig file into struct bs_config, at init only. */
#include "shim.h"

#include <errno.h>
#include <grp.h>
#include <libconfig.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Running out of memory must become an error message, not an exit(). */
#define HASH_NONFATAL_OOM 1
#include <uthash.h>

#define DEFAULT_MODE		0600
#define DEFAULT_PROCESSES	1024
#define DEFAULT_RESOLVE_MS	1000
#define MAX_RESOLVE_MS		60000
#define MIN_SOCKETS		256
#define MIN_SOCKETS_UNCAPPED	4096	/* when a compartment has no max_connections */
#define MAX_ID			4294967294LL	/* (uid_t)-1 means "no change" */

/* Where a parsed destination came from, for the duplicate message. The
 * strings belong to libconfig and are only read before config_destroy. */
struct rule_src {
	const char *text;
	const char *file;
};

struct cfg_ctx {
	const char *path;
	struct bs_config *cfg;
	char *err;
	size_t errlen;
	struct rule_src *src;	/* one per parsed rule */
	size_t cap;		/* room in cfg->rules and src */
	bool has_sockets;
	bool has_compartments;
	const config_setting_t *budget;
	char *text;		/* the file, to place string elements */
	size_t *line_end;	/* offset of the end of each line */
	size_t nlines;
};

static const char *const top_keys[] = {
	"segment", "budget", "strict", "mode", "owner", "group", "max_processes",
	"max_sockets", "resolve_timeout_ms", "enforce", "classes", "compartments", NULL,
};
static const char *const budget_keys[] = { "pool", "reserved", NULL };
static const char *const comp_keys[] = {
	"name", "destinations", "max_connections", "max_inflight", "max_wait_ms", "max_waiting",
	"connect_timeout_ms", "io_timeout_ms", "enforce", "class_limits", "errno", NULL,
};

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

static int fail_at(struct cfg_ctx *c, const char *file, int line, int rc, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
static int fail(struct cfg_ctx *c, const config_setting_t *s, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void vfail(struct cfg_ctx *c, const char *file, int line, const char *fmt, va_list ap)
{
	char msg[BS_ERRLEN];

	if (c->err == NULL || c->errlen == 0)
		return;
	vsnprintf(msg, sizeof(msg), fmt, ap);
	if (line > 0)
		snprintf(c->err, c->errlen, "%s:%d: %s", file ? file : c->path, line, msg);
	else
		snprintf(c->err, c->errlen, "%s: %s", file ? file : c->path, msg);
}

/* Writes "FILE:LINE: message" (or "FILE: message" when line is 0) into the
 * caller's buffer and returns rc, so that errors read `return fail(...)`. */
static int fail_at(struct cfg_ctx *c, const char *file, int line, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vfail(c, file, line, fmt, ap);
	va_end(ap);
	return rc;
}

/* The same at the file and line of setting s, or of the file when s is NULL. */
static int fail(struct cfg_ctx *c, const config_setting_t *s, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	if (s != NULL)
		vfail(c, config_setting_source_file(s), config_setting_source_line(s), fmt, ap);
	else
		vfail(c, NULL, 0, fmt, ap);
	va_end(ap);
	return rc;
}

static const char *type_name(int type)
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

static const char *key_of(const config_setting_t *s)
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
static const char *closest(const char *name, const char *const *known)
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
 * suggesting the closest known key when it looks like a typo of one. */
static int unknown_key(struct cfg_ctx *c, const config_setting_t *s, const char *const *known,
		       const char *where)
{
	const char *name = key_of(s), *best = closest(name, known);

	if (best != NULL)
		return fail(c, s, -EINVAL, "unknown key \"%s\"%s (did you mean \"%s\"?)", name,
			    where, best);
	return fail(c, s, -EINVAL, "unknown key \"%s\"%s", name, where);
}

static bool is_known(const char *name, const char *const *known)
{
	for (size_t i = 0; known[i] != NULL; i++)
		if (strcmp(name, known[i]) == 0)
			return true;
	return false;
}

static int get_int(struct cfg_ctx *c, const config_setting_t *s, long long *out)
{
	int type = config_setting_type(s);

	if (type != CONFIG_TYPE_INT && type != CONFIG_TYPE_INT64)
		return fail(c, s, -EINVAL, "\"%s\" must be an integer, not %s", key_of(s),
			    type_name(type));
	*out = config_setting_get_int64(s);
	return 0;
}

static int get_range(struct cfg_ctx *c, const config_setting_t *s, long long lo, long long hi,
		     long long *out)
{
	int rc = get_int(c, s, out);

	if (rc < 0)
		return rc;
	if (*out < lo || *out > hi)
		return fail(c, s, -EINVAL, "\"%s\" must be between %lld and %lld, not %lld",
			    key_of(s), lo, hi, *out);
	return 0;
}

static int get_bool(struct cfg_ctx *c, const config_setting_t *s, bool *out)
{
	int type = config_setting_type(s);

	if (type != CONFIG_TYPE_BOOL)
		return fail(c, s, -EINVAL, "\"%s\" must be true or false, not %s", key_of(s),
			    type_name(type));
	*out = config_setting_get_bool(s);
	return 0;
}

static int get_string(struct cfg_ctx *c, const config_setting_t *s, const char **out)
{
	int type = config_setting_type(s);

	if (type != CONFIG_TYPE_STRING)
		return fail(c, s, -EINVAL, "\"%s\" must be a string, not %s", key_of(s),
			    type_name(type));
	*out = config_setting_get_string(s);
	return 0;
}

static bool name_char(char ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
	       ch == '_' || ch == '.' || ch == '-';
}

/* Checks a compartment or segment name: 1..63 characters of [A-Za-z0-9_.-]. */
static int check_name(struct cfg_ctx *c, const config_setting_t *s, const char *what,
		      const char *name)
{
	size_t n = strlen(name);

	if (n == 0)
		return fail(c, s, -EINVAL, "empty %s name", what);
	if (n >= BS_NAME_MAX)
		return fail(c, s, -EINVAL, "%s name \"%.20s...\" is %zu characters, more than %d",
			    what, name, n, BS_NAME_MAX - 1);
	for (size_t i = 0; i < n; i++)
		if (!name_char(name[i]))
			return fail(c, s, -EINVAL,
				    "%s name \"%s\" has a character outside [A-Za-z0-9_.-]",
				    what, name);
	return 0;
}

static int parse_segment(struct cfg_ctx *c, const config_setting_t *s)
{
	const char *name = NULL;
	int rc = get_string(c, s, &name);

	if (rc == 0)
		rc = check_name(c, s, "segment", name);
	if (rc == 0)
		snprintf(c->cfg->segment, sizeof(c->cfg->segment), "%s", name);
	return rc;
}

static int parse_budget(struct cfg_ctx *c, const config_setting_t *s)
{
	const config_setting_t *pool, *reserved;
	long long vp = 0, vr = 0;
	int rc;

	if (!config_setting_is_group(s))
		return fail(c, s, -EINVAL,
			    "\"budget\" must be a group like { pool = 100; reserved = 10; }, not %s",
			    type_name(config_setting_type(s)));
	for (int i = 0; i < config_setting_length(s); i++) {
		const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);

		if (!is_known(key_of(e), budget_keys))
			return unknown_key(c, e, budget_keys, " in budget");
	}
	pool = config_setting_get_member(s, "pool");
	if (pool == NULL)
		return fail(c, s, -EINVAL, "budget has no \"pool\"");
	if ((rc = get_int(c, pool, &vp)) < 0)
		return rc;
	if (vp <= 0 || vp > UINT32_MAX)
		return fail(c, pool, -EINVAL, "budget pool must be between 1 and %u, not %lld",
			    UINT32_MAX, vp);
	reserved = config_setting_get_member(s, "reserved");
	if (reserved != NULL) {
		if ((rc = get_int(c, reserved, &vr)) < 0)
			return rc;
		if (vr < 0 || vr >= vp)
			return fail(c, reserved, -EINVAL,
				    "budget reserved must be between 0 and %lld (below the pool), not %lld",
				    vp - 1, vr);
	}
	c->cfg->has_budget = true;
	c->cfg->pool = (uint32_t)vp;
	c->cfg->reserved = (uint32_t)vr;
	c->budget = s;
	return 0;
}

/* A string is octal ("0660"); so is an integer, digit by digit (660 means
 * 0660), because libconfig reads 0660 as the decimal 660. Hex is refused:
 * 0x1b0 would silently mean something else than it says. */
static int parse_mode(struct cfg_ctx *c, const config_setting_t *s)
{
	int type = config_setting_type(s);
	unsigned long mode = 0;
	char text[32];
	size_t n;

	if (type == CONFIG_TYPE_STRING) {
		snprintf(text, sizeof(text), "%s", config_setting_get_string(s));
	} else if (type == CONFIG_TYPE_INT || type == CONFIG_TYPE_INT64) {
		if (config_setting_get_format(s) == CONFIG_FORMAT_HEX)
			return fail(c, s, -EINVAL, "bad mode: write it in octal, like \"0660\", not in hex");
		snprintf(text, sizeof(text), "%lld", config_setting_get_int64(s));
	} else {
		return fail(c, s, -EINVAL, "\"mode\" must be an octal string like \"0660\", not %s",
			    type_name(type));
	}
	n = strlen(text);
	if (n == 0 || n > 6)
		return fail(c, s, -EINVAL, "bad mode \"%s\": expected octal digits like \"0660\"", text);
	for (size_t i = 0; i < n; i++) {
		if (text[i] < '0' || text[i] > '7')
			return fail(c, s, -EINVAL, "bad mode \"%s\": modes are octal, digits 0 to 7",
				    text);
		mode = mode * 8 + (unsigned long)(text[i] - '0');
	}
	if (mode > 0777)
		return fail(c, s, -EINVAL, "bad mode \"%s\": only permission bits up to 0777", text);
	c->cfg->mode = (unsigned)mode;
	return 0;
}

/* Looks a user or group name up with the reentrant NSS calls, growing the
 * buffer on ERANGE. Returns 0, -ENOENT when there is no such name, or -errno. */
static int lookup_id(const char *name, bool group, unsigned long *id)
{
	long guess = sysconf(group ? _SC_GETGR_R_SIZE_MAX : _SC_GETPW_R_SIZE_MAX);
	size_t size = guess > 0 ? (size_t)guess : 16384;

	for (;;) {
		char *buf = malloc(size);
		bool found = false;
		int rc;

		if (buf == NULL)
			return -ENOMEM;
		if (group) {
			struct group gr, *res = NULL;

			rc = getgrnam_r(name, &gr, buf, size, &res);
			if (rc == 0 && res != NULL) {
				*id = res->gr_gid;
				found = true;
			}
		} else {
			struct passwd pw, *res = NULL;

			rc = getpwnam_r(name, &pw, buf, size, &res);
			if (rc == 0 && res != NULL) {
				*id = res->pw_uid;
				found = true;
			}
		}
		free(buf);
		if (rc == ERANGE && size < (1u << 20)) {
			size *= 2;
			continue;
		}
		if (rc == 0 || rc == ENOENT || rc == ESRCH)
			return found ? 0 : -ENOENT;
		return -rc;
	}
}

static int parse_id(struct cfg_ctx *c, const config_setting_t *s, bool group)
{
	const char *what = group ? "group" : "user";
	int type = config_setting_type(s);
	unsigned long id = 0;
	long long v;

	if (type == CONFIG_TYPE_INT || type == CONFIG_TYPE_INT64) {
		v = config_setting_get_int64(s);
		if (v < 0 || v > MAX_ID)
			return fail(c, s, -EINVAL, "bad %s id %lld", what, v);
		id = (unsigned long)v;
	} else if (type == CONFIG_TYPE_STRING) {
		const char *name = config_setting_get_string(s);
		size_t n = strspn(name, "0123456789");
		int rc;

		if (name[0] == '\0')
			return fail(c, s, -EINVAL, "empty %s name", what);
		if (name[n] == '\0') {
			if (n > 10 || (v = strtoll(name, NULL, 10)) > MAX_ID)
				return fail(c, s, -EINVAL, "bad %s id %s", what, name);
			id = (unsigned long)v;
		} else if ((rc = lookup_id(name, group, &id)) == -ENOENT) {
			return fail(c, s, -EINVAL, "unknown %s \"%s\"", what, name);
		} else if (rc < 0) {
			return fail(c, s, rc, "cannot look up %s \"%s\": %s", what, name, strerror(-rc));
		}
	} else {
		return fail(c, s, -EINVAL, "\"%s\" must be a %s name or id, not %s", key_of(s), what,
			    type_name(type));
	}
	if (group) {
		c->cfg->has_group = true;
		c->cfg->group = (gid_t)id;
	} else {
		c->cfg->has_owner = true;
		c->cfg->owner = (uid_t)id;
	}
	return 0;
}

/* Appends a rule, growing cfg->rules and src together. */
static int push_rule(struct cfg_ctx *c, const struct rule *r, const char *text, const char *file)
{
	struct bs_config *cfg = c->cfg;

	if (cfg->nrules == c->cap) {
		size_t cap = c->cap ? c->cap * 2 : 64;
		struct rule *rules = realloc(cfg->rules, cap * sizeof(*rules));
		struct rule_src *src;

		if (rules == NULL)
			return -ENOMEM;
		cfg->rules = rules;
		src = realloc(c->src, cap * sizeof(*src));
		if (src == NULL)
			return -ENOMEM;
		c->src = src;
		c->cap = cap;
	}
	cfg->rules[cfg->nrules] = *r;
	c->src[cfg->nrules] = (struct rule_src){ .text = text, .file = file };
	cfg->nrules++;
	return 0;
}

/* Keeps the file's text and where its lines end, for string_line(). */
static int read_text(struct cfg_ctx *c, FILE *f)
{
	size_t len = 0, cap = 4096, n;
	char *text = malloc(cap);

	while (text != NULL && (n = fread(text + len, 1, cap - len, f)) > 0) {
		len += n;
		if (len == cap) {
			char *bigger = realloc(text, cap *= 2);

			if (bigger == NULL)
				free(text);
			text = bigger;
		}
	}
	if (text == NULL || ferror(f)) {
		free(text);
		return -ENOMEM;
	}
	c->text = text;
	c->nlines = 1;
	for (size_t i = 0; i < len; i++)
		c->nlines += text[i] == '\n';
	c->line_end = malloc(c->nlines * sizeof(*c->line_end));
	if (c->line_end == NULL)
		return -ENOMEM;
	for (size_t i = 0, k = 0; i <= len; i++)
		if (i == len || text[i] == '\n')
			c->line_end[k++] = i;
	return 0;
}

/* The line of a string element of an array or list. libconfig records the
 * line of the token after the string, because it must look ahead to join
 * adjacent string literals; so the last destination before a "]" on a line
 * of its own would be placed on the "]" line. Look back a few lines for the
 * quoted text, and keep libconfig's line when it is not found (another
 * file, escapes, a string split in pieces). */
static int string_line(const struct cfg_ctx *c, const config_setting_t *e)
{
	int line = config_setting_source_line(e);
	const char *file = config_setting_source_file(e), *str = config_setting_get_string(e);
	size_t n = str ? strlen(str) : 0;

	if (c->text == NULL || str == NULL || file == NULL || strcmp(file, c->path) != 0)
		return line;
	for (int k = line; k > 0 && k > line - 8 && (size_t)k <= c->nlines; k--) {
		size_t start = k > 1 ? c->line_end[k - 2] + 1 : 0, end = c->line_end[k - 1];

		for (const char *p = c->text + start;
		     (p = memchr(p, '"', (size_t)(c->text + end - p))) != NULL; p++)
			if ((size_t)(c->text + end - p) >= n + 2 && memcmp(p + 1, str, n) == 0 &&
			    p[n + 1] == '"')
				return k;
	}
	return line;
}

/* Reads the patterns of one class. A list may hold anything, so each
 * element's type is checked; an array holds one type only. */
static int parse_patterns(struct cfg_ctx *c, const config_setting_t *s, struct cfg_class *cls)
{
	int n = config_setting_length(s);

	if (n > BS_MAX_PATTERNS)
		return fail(c, s, -EINVAL, "class \"%s\" has %d patterns, more than %d", cls->name,
			    n, BS_MAX_PATTERNS);
	for (int i = 0; i < n; i++) {
		const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
		const char *pat, *file = config_setting_source_file(e);
		size_t len;
		int line;

		if (config_setting_type(e) != CONFIG_TYPE_STRING)
			return fail(c, e, -EINVAL,
				    "pattern %d of class \"%s\" must be a string, not %s", i + 1,
				    cls->name, type_name(config_setting_type(e)));
		pat = config_setting_get_string(e);
		len = strlen(pat);
		line = string_line(c, e);
		if (len == 0)
			return fail_at(c, file, line, -EINVAL, "empty pattern in class \"%s\"",
				       cls->name);
		if (len >= BS_NAME_MAX)
			return fail_at(c, file, line, -EINVAL,
				       "pattern \"%.20s...\" of class \"%s\" is %zu characters, "
				       "more than %d", pat, cls->name, len, BS_NAME_MAX - 1);
		/* The pattern meets the program's name without its directory,
		 * so one with a slash could never match. */
		if (strchr(pat, '/') != NULL)
			return fail_at(c, file, line, -EINVAL,
				       "pattern \"%s\" of class \"%s\" has a '/': patterns match "
				       "the program's name without its directory", pat, cls->name);
		snprintf(cls->patterns[cls->npatterns++], BS_NAME_MAX, "%s", pat);
	}
	return 0;
}

/* Reads `classes = { batch = [ "pg_dump", "report-*" ]; ... };` into
 * cfg->classes[1..], after the implicit "default". Duplicate class names
 * never get here: libconfig refuses a group with two members of one name. */
static int parse_classes(struct cfg_ctx *c, const config_setting_t *s)
{
	struct bs_config *cfg = c->cfg;
	int n, rc;

	if (!config_setting_is_group(s))
		return fail(c, s, -EINVAL,
			    "\"classes\" must be a group like { batch = [ \"pg_dump\" ]; }, not %s",
			    type_name(config_setting_type(s)));
	n = config_setting_length(s);
	for (int i = 0; i < n; i++) {
		const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
		const char *name = key_of(e);
		struct cfg_class *cls;
		size_t len = strlen(name);

		if (cfg->nclass >= BS_MAX_CLASSES)
			return fail(c, e, -EINVAL, "class \"%s\" is one too many: at most %d classes "
				    "besides \"default\"", name, BS_MAX_CLASSES - 1);
		if (strcmp(name, "default") == 0)
			return fail(c, e, -EINVAL, "class name \"default\" is reserved for processes "
				    "without a class; give the class another name");
		if (len >= BS_CLASS_NAME_MAX)
			return fail(c, e, -EINVAL, "class name \"%.20s...\" is %zu characters, more "
				    "than %d", name, len, BS_CLASS_NAME_MAX - 1);
		/* libconfig also allows '*' in a name; a class name must be
		 * usable in BULKSHIM_CLASS and in status output as it is. */
		for (size_t k = 0; k < len; k++)
			if (!name_char(name[k]) || name[k] == '.')
				return fail(c, e, -EINVAL, "class name \"%s\" has a character outside "
					    "[A-Za-z0-9_-]", name);
		if (!config_setting_is_array(e) && !config_setting_is_list(e))
			return fail(c, e, -EINVAL, "class \"%s\" must be an array of program-name "
				    "patterns like [ \"pg_dump\", \"report-*\" ], not %s", name,
				    type_name(config_setting_type(e)));
		cls = &cfg->classes[cfg->nclass];
		memset(cls, 0, sizeof(*cls));
		snprintf(cls->name, sizeof(cls->name), "%s", name);
		cls->line = config_setting_source_line(e);
		if ((rc = parse_patterns(c, e, cls)) < 0)
			return rc;
		cfg->nclass++;
	}
	return 0;
}

static int parse_destinations(struct cfg_ctx *c, const config_setting_t *g, size_t idx)
{
	const char *name = c->cfg->comp[idx].name;
	const config_setting_t *s = config_setting_get_member(g, "destinations");
	char reason[BS_ERRLEN];
	int n, rc;

	if (s == NULL)
		return fail(c, g, -EINVAL, "compartment \"%s\" has no \"destinations\"", name);
	if (!config_setting_is_array(s) && !config_setting_is_list(s))
		return fail(c, s, -EINVAL, "\"destinations\" must be an array of strings, not %s",
			    type_name(config_setting_type(s)));
	n = config_setting_length(s);
	if (n == 0)
		return fail(c, s, -EINVAL, "compartment \"%s\" has no destinations", name);
	for (int i = 0; i < n; i++) {
		const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
		struct rule r = { .comp = (int)idx };
		const char *text, *file = config_setting_source_file(e);

		if (config_setting_type(e) != CONFIG_TYPE_STRING)
			return fail(c, e, -EINVAL,
				    "destination %d of compartment \"%s\" must be a string, not %s",
				    i + 1, name, type_name(config_setting_type(e)));
		text = config_setting_get_string(e);
		r.line = string_line(c, e);
		if (match_parse(text, &r, reason, sizeof(reason)) < 0)
			return fail_at(c, file, r.line, -EINVAL, "compartment \"%s\": %s", name,
				       reason);
		if (c->cfg->nrules >= BS_MAX_RULES)
			return fail_at(c, file, r.line, -EINVAL, "more than %d destinations in all",
				       BS_MAX_RULES);
		if ((rc = push_rule(c, &r, text, file)) < 0)
			return fail_at(c, file, r.line, rc, "out of memory");
	}
	return 0;
}

/* Reads one limit of compartment `name` (max_connections, max_inflight):
 * an integer from 1 to BS_MAX_LIMIT. */
static int get_limit(struct cfg_ctx *c, const config_setting_t *s, const char *name,
		     uint32_t *out)
{
	long long v = 0;
	int rc = get_int(c, s, &v);

	if (rc < 0)
		return rc;
	if (v <= 0)
		return fail(c, s, -EINVAL, "%s of \"%s\" must be at least 1, not %lld", key_of(s),
			    name, v);
	if (v > BS_MAX_LIMIT)
		return fail(c, s, -EINVAL, "%s of \"%s\" is %lld, which is absurd (the limit is %d)",
			    key_of(s), name, v, BS_MAX_LIMIT);
	*out = (uint32_t)v;
	return 0;
}

/* max_connections and max_inflight: either may be left out, not both. */
static int parse_limits(struct cfg_ctx *c, const config_setting_t *g,
			struct cfg_compartment *comp)
{
	const config_setting_t *s;
	int rc;

	s = config_setting_get_member(g, "max_connections");
	if (s != NULL && (rc = get_limit(c, s, comp->name, &comp->max_connections)) < 0)
		return rc;
	s = config_setting_get_member(g, "max_inflight");
	if (s != NULL && (rc = get_limit(c, s, comp->name, &comp->max_inflight)) < 0)
		return rc;
	if (comp->max_connections == 0 && comp->max_inflight == 0)
		return fail(c, g, -EINVAL,
			    "compartment \"%s\" sets neither max_connections nor max_inflight",
			    comp->name);
	return 0;
}

/* max_wait_ms, max_waiting and the two timeouts. */
static int parse_waiting(struct cfg_ctx *c, const config_setting_t *g,
			 struct cfg_compartment *comp)
{
	const config_setting_t *s, *waiting;
	long long v = 0;
	int rc;

	if ((s = config_setting_get_member(g, "max_wait_ms")) != NULL) {
		if ((rc = get_range(c, s, 0, BS_MAX_WAIT_MS, &v)) < 0)
			return rc;
		comp->max_wait_ms = (uint32_t)v;
	}
	if ((waiting = config_setting_get_member(g, "max_waiting")) != NULL) {
		if ((rc = get_range(c, waiting, 1, BS_MAX_LIMIT, &v)) < 0)
			return rc;
		/* Fail-fast callers never wait, so a bound on the waiters
		 * would be dead weight that hides a missing max_wait_ms. */
		if (comp->max_wait_ms == 0)
			return fail(c, waiting, -EINVAL, "max_waiting without max_wait_ms in "
				    "compartment \"%s\": nobody waits unless max_wait_ms is above 0",
				    comp->name);
		comp->max_waiting = (uint32_t)v;
	}
	if ((s = config_setting_get_member(g, "connect_timeout_ms")) != NULL) {
		if ((rc = get_range(c, s, 0, BS_MAX_TIMEOUT_MS, &v)) < 0)
			return rc;
		comp->connect_timeout_ms = (uint32_t)v;
	}
	if ((s = config_setting_get_member(g, "io_timeout_ms")) != NULL) {
		if ((rc = get_range(c, s, 0, BS_MAX_TIMEOUT_MS, &v)) < 0)
			return rc;
		comp->io_timeout_ms = (uint32_t)v;
	}
	return 0;
}

/* Reads `class_limits = { batch = 4; };`: each key a declared class (or
 * "default"), each value a cap on that class's connection permits. */
static int parse_class_limits(struct cfg_ctx *c, const config_setting_t *s,
			      struct cfg_compartment *comp)
{
	const struct bs_config *cfg = c->cfg;
	const char *names[BS_MAX_CLASSES + 1] = { NULL };

	if (!config_setting_is_group(s))
		return fail(c, s, -EINVAL,
			    "\"class_limits\" must be a group like { batch = 4; }, not %s",
			    type_name(config_setting_type(s)));
	for (size_t k = 0; k < cfg->nclass; k++)
		names[k] = cfg->classes[k].name;
	for (int i = 0; i < config_setting_length(s); i++) {
		const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
		const char *cls = key_of(e), *best;
		int type = config_setting_type(e);
		size_t k = 0;
		long long v;

		while (k < cfg->nclass && strcmp(cls, names[k]) != 0)
			k++;
		if (k == cfg->nclass) {
			if ((best = closest(cls, names)) != NULL)
				return fail(c, e, -EINVAL, "unknown class \"%s\" in class_limits of "
					    "\"%s\" (did you mean \"%s\"?)", cls, comp->name, best);
			return fail(c, e, -EINVAL, "unknown class \"%s\" in class_limits of \"%s\" "
				    "(declare it in the top-level \"classes\")", cls, comp->name);
		}
		if (type != CONFIG_TYPE_INT && type != CONFIG_TYPE_INT64)
			return fail(c, e, -EINVAL, "class limit %s of \"%s\" must be an integer, "
				    "not %s", cls, comp->name, type_name(type));
		v = config_setting_get_int64(e);
		if (v <= 0 || v > BS_MAX_LIMIT)
			return fail(c, e, -EINVAL, "class limit %s of \"%s\" must be between 1 and "
				    "%d, not %lld", cls, comp->name, BS_MAX_LIMIT, v);
		if (comp->max_connections != 0 && v > comp->max_connections)
			return fail(c, e, -EINVAL, "class limit %s = %lld is above max_connections "
				    "%u of \"%s\"", cls, v, comp->max_connections, comp->name);
		comp->class_limit[k] = (uint32_t)v;
	}
	return 0;
}

static int parse_compartment(struct cfg_ctx *c, const config_setting_t *g, size_t idx)
{
	struct cfg_compartment *comp = &c->cfg->comp[idx];
	const config_setting_t *s;
	const char *name = NULL;
	char where[BS_NAME_MAX + 40];
	int rc;

	if (!config_setting_is_group(g))
		return fail(c, g, -EINVAL, "compartment %zu must be a group { name = ...; }, not %s",
			    idx + 1, type_name(config_setting_type(g)));
	comp->line = config_setting_source_line(g);
	comp->reject_errno = ECONNREFUSED;
	comp->enforce = c->cfg->enforce;
	s = config_setting_get_member(g, "name");
	if (s != NULL && config_setting_type(s) == CONFIG_TYPE_STRING)
		name = config_setting_get_string(s);
	if (name != NULL && name[0] != '\0' && strlen(name) < BS_NAME_MAX)
		snprintf(where, sizeof(where), " in compartment \"%s\"", name);
	else
		snprintf(where, sizeof(where), " in compartment %zu", idx + 1);
	for (int i = 0; i < config_setting_length(g); i++) {
		const config_setting_t *e = config_setting_get_elem(g, (unsigned)i);

		if (!is_known(key_of(e), comp_keys))
			return unknown_key(c, e, comp_keys, where);
	}

	if (s == NULL)
		return fail(c, g, -EINVAL, "compartment %zu has no \"name\"", idx + 1);
	if ((rc = get_string(c, s, &name)) < 0 || (rc = check_name(c, s, "compartment", name)) < 0)
		return rc;
	for (size_t i = 0; i < idx; i++)
		if (strcmp(c->cfg->comp[i].name, name) == 0)
			return fail(c, s, -EINVAL,
				    "duplicate compartment name \"%s\" (also on line %d)", name,
				    c->cfg->comp[i].line);
	snprintf(comp->name, sizeof(comp->name), "%s", name);

	if ((rc = parse_destinations(c, g, idx)) < 0)
		return rc;

	if ((rc = parse_limits(c, g, comp)) < 0 || (rc = parse_waiting(c, g, comp)) < 0)
		return rc;
	if ((s = config_setting_get_member(g, "enforce")) != NULL &&
	    (rc = get_bool(c, s, &comp->enforce)) < 0)
		return rc;
	s = config_setting_get_member(g, "class_limits");
	if (s != NULL && (rc = parse_class_limits(c, s, comp)) < 0)
		return rc;

	s = config_setting_get_member(g, "errno");
	if (s != NULL) {
		const char *word = NULL;

		if ((rc = get_string(c, s, &word)) < 0)
			return rc;
		if ((comp->reject_errno = cfg_errno_value(word)) < 0)
			return fail(c, s, -EINVAL,
				    "unknown errno \"%s\" (use ECONNREFUSED, EAGAIN, ETIMEDOUT, "
				    "EHOSTUNREACH or ENETUNREACH)", word);
	}
	return 0;
}

static int parse_compartments(struct cfg_ctx *c, const config_setting_t *s)
{
	int type = config_setting_type(s), n = config_setting_length(s);

	c->has_compartments = true;
	if ((type == CONFIG_TYPE_LIST || type == CONFIG_TYPE_ARRAY) && n == 0)
		return fail(c, s, -EINVAL, "\"compartments\" is empty");
	if (type != CONFIG_TYPE_LIST)
		return fail(c, s, -EINVAL, "\"compartments\" must be a list ( { ... }, ... ), not %s",
			    type_name(type));
	if (n > BS_MAX_COMPARTMENTS)
		return fail(c, s, -EINVAL, "%d compartments, more than the limit of %d", n,
			    BS_MAX_COMPARTMENTS);
	c->cfg->comp = calloc((size_t)n, sizeof(*c->cfg->comp));
	if (c->cfg->comp == NULL)
		return fail(c, s, -ENOMEM, "out of memory");
	for (int i = 0; i < n; i++) {
		int rc = parse_compartment(c, config_setting_get_elem(s, (unsigned)i), (size_t)i);

		if (rc < 0)
			return rc;
		c->cfg->ncomp++;
	}
	return 0;
}

static int parse_root(struct cfg_ctx *c, const config_setting_t *root)
{
	const config_setting_t *s;
	long long v = 0;
	int rc = 0;

	/* Compartments inherit enforce and name classes, so these two are read
	 * first, wherever they are in the file. */
	if ((s = config_setting_get_member(root, "enforce")) != NULL)
		rc = get_bool(c, s, &c->cfg->enforce);
	if (rc == 0 && (s = config_setting_get_member(root, "classes")) != NULL)
		rc = parse_classes(c, s);

	for (int i = 0; i < config_setting_length(root) && rc == 0; i++) {
		const char *key;

		s = config_setting_get_elem(root, (unsigned)i);
		key = key_of(s);
		if (strcmp(key, "enforce") == 0 || strcmp(key, "classes") == 0) {
			continue;	/* read above */
		} else if (strcmp(key, "segment") == 0) {
			rc = parse_segment(c, s);
		} else if (strcmp(key, "budget") == 0) {
			rc = parse_budget(c, s);
		} else if (strcmp(key, "strict") == 0) {
			rc = get_bool(c, s, &c->cfg->strict);
		} else if (strcmp(key, "mode") == 0) {
			rc = parse_mode(c, s);
		} else if (strcmp(key, "owner") == 0 || strcmp(key, "group") == 0) {
			rc = parse_id(c, s, key[0] == 'g');
		} else if (strcmp(key, "max_processes") == 0) {
			if ((rc = get_range(c, s, 1, BS_MAX_PROCESSES, &v)) == 0)
				c->cfg->max_processes = (uint32_t)v;
		} else if (strcmp(key, "max_sockets") == 0) {
			if ((rc = get_range(c, s, 1, BS_MAX_SOCKETS, &v)) == 0) {
				c->cfg->max_sockets = (uint32_t)v;
				c->has_sockets = true;
			}
		} else if (strcmp(key, "resolve_timeout_ms") == 0) {
			if ((rc = get_range(c, s, 0, MAX_RESOLVE_MS, &v)) == 0)
				c->cfg->resolve_timeout_ms = (unsigned)v;
		} else if (strcmp(key, "compartments") == 0) {
			rc = parse_compartments(c, s);
		} else {
			rc = unknown_key(c, s, top_keys, "");
		}
	}
	if (rc == 0 && !c->has_compartments)
		rc = fail(c, NULL, -EINVAL, "no \"compartments\" list: nothing to limit");
	return rc;
}

/* Compares the destinations of two rules: site, then port range. */
static int dest_cmp(const struct rule *x, const struct rule *y)
{
	int k;

	if (x->kind != y->kind)
		return x->kind < y->kind ? -1 : 1;
	if (x->kind == RULE_IP) {
		if (x->prefix != y->prefix)
			return x->prefix < y->prefix ? -1 : 1;
		k = memcmp(x->addr, y->addr, 16);
	} else {
		k = strcmp(x->kind == RULE_UNIX ? x->path : x->host,
			   y->kind == RULE_UNIX ? y->path : y->host);
	}
	if (k != 0)
		return k;
	if (x->port_lo != y->port_lo)
		return x->port_lo < y->port_lo ? -1 : 1;
	if (x->port_hi != y->port_hi)
		return x->port_hi < y->port_hi ? -1 : 1;
	return 0;
}

/* Destination, then position, so the first of equal rules comes first. */
static int dup_cmp(const void *a, const void *b)
{
	const struct rule *x = *(const struct rule *const *)a;
	const struct rule *y = *(const struct rule *const *)b;
	int k = dest_cmp(x, y);

	if (k != 0)
		return k;
	return x < y ? -1 : (x > y);
}

/* Finds the same destination in two compartments before match_build does,
 * to name both compartments; of several, the one seen first in the file is
 * reported. A destination repeated inside one compartment is harmless. */
static int check_duplicates(struct cfg_ctx *c)
{
	const struct bs_config *cfg = c->cfg;
	const struct rule **order;
	size_t n = cfg->nrules, later = SIZE_MAX, first = 0;

	if (n < 2)
		return 0;
	order = malloc(n * sizeof(*order));
	if (order == NULL)
		return fail(c, NULL, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		order[i] = &cfg->rules[i];
	qsort(order, n, sizeof(*order), dup_cmp);
	for (size_t i = 0, j; i < n; i = j) {
		const struct rule *x = order[i];

		for (j = i + 1; j < n && dest_cmp(x, order[j]) == 0; j++) {
			const struct rule *y = order[j];

			if (y->comp != x->comp && (size_t)(y - cfg->rules) < later) {
				later = (size_t)(y - cfg->rules);
				first = (size_t)(x - cfg->rules);
			}
		}
	}
	free(order);
	if (later == SIZE_MAX)
		return 0;
	return fail_at(c, c->src[later].file, cfg->rules[later].line, -EINVAL,
		       "duplicate destination \"%s\" in compartment \"%s\" (already in compartment "
		       "\"%s\" on line %d)", c->src[later].text, cfg->comp[cfg->rules[later].comp].name,
		       cfg->comp[cfg->rules[first].comp].name, cfg->rules[first].line);
}

static int check_budget(struct cfg_ctx *c)
{
	const struct bs_config *cfg = c->cfg;
	uint64_t sum = 0;
	char tail[64], *list;
	size_t len = 0, cap, room;

	size_t ncounted = 0;

	/* A compartment with only max_inflight holds no connection permits,
	 * so it takes nothing from the pool. */
	for (size_t i = 0; i < cfg->ncomp; i++) {
		sum += cfg->comp[i].max_connections;
		ncounted += cfg->comp[i].max_connections != 0;
	}
	if (!cfg->has_budget || sum <= (uint64_t)cfg->pool - cfg->reserved)
		return 0;
	if (cfg->reserved != 0)
		snprintf(tail, sizeof(tail), "%u - %u reserved", cfg->pool, cfg->reserved);
	else
		snprintf(tail, sizeof(tail), "%u", cfg->pool);
	/* Each allocation in config order, unless that cannot fit one message. */
	cap = cfg->ncomp * 12 + 1;
	list = malloc(cap);
	if (list == NULL)
		return fail(c, c->budget, -ENOMEM, "out of memory");
	list[0] = '\0';
	for (size_t i = 0; i < cfg->ncomp; i++)
		if (cfg->comp[i].max_connections != 0)
			len += (size_t)snprintf(list + len, cap - len, "%s%u", len ? " + " : "",
						cfg->comp[i].max_connections);
	room = c->errlen < BS_ERRLEN ? c->errlen : BS_ERRLEN;
	if (len + strlen(tail) + strlen(c->path) + 64 < room)
		fail(c, c->budget, -EINVAL, "budget exceeded: %s = %llu > %s", list,
		     (unsigned long long)sum, tail);
	else
		fail(c, c->budget, -EINVAL,
		     "budget exceeded: the %zu compartments' max_connections sum to %llu > %s",
		     ncounted, (unsigned long long)sum, tail);
	free(list);
	return -EINVAL;
}

/* An address, port range pair already among the /128 rules. */
struct seen {
	UT_hash_handle hh;
	struct {
		uint8_t addr[16];
		uint16_t lo, hi;
	} key;
};

/* One distinct host name being resolved. */
struct query {
	UT_hash_handle hh;
	struct gaicb cb;
	struct addrinfo hints;
	struct addrinfo *res;
	char name[BS_HOST_MAX];
};

static bool seen_add(struct seen **set, const uint8_t addr[16], uint16_t lo, uint16_t hi,
		     int *rc)
{
	struct seen probe, *e;

	memset(&probe, 0, sizeof(probe));
	memcpy(probe.key.addr, addr, 16);
	probe.key.lo = lo;
	probe.key.hi = hi;
	HASH_FIND(hh, *set, &probe.key, sizeof(probe.key), e);
	if (e != NULL)
		return false;
	e = malloc(sizeof(*e));
	if (e == NULL) {
		*rc = -ENOMEM;
		return false;
	}
	*e = probe;
	HASH_ADD(hh, *set, key, sizeof(e->key), e);
	if (e->hh.tbl == NULL) {
		free(e);
		*rc = -ENOMEM;
		return false;
	}
	return true;
}

/* Waits for the queries with one deadline for all of them. */
static void wait_queries(struct gaicb **list, size_t n, unsigned timeout_ms)
{
	struct gaicb **wait = malloc(n * sizeof(*wait));
	struct timespec end, now, left;

	if (wait == NULL)
		return;
	memcpy(wait, list, n * sizeof(*wait));
	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += timeout_ms / 1000;
	end.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (end.tv_nsec >= 1000000000L) {
		end.tv_sec++;
		end.tv_nsec -= 1000000000L;
	}
	for (;;) {
		size_t pending = 0;

		/* gai_suspend returns at once while a finished request is
		 * still in the list, so finished ones are taken out. */
		for (size_t i = 0; i < n; i++) {
			if (wait[i] != NULL && gai_error(wait[i]) != EAI_INPROGRESS)
				wait[i] = NULL;
			pending += wait[i] != NULL;
		}
		if (pending == 0)
			break;
		clock_gettime(CLOCK_MONOTONIC, &now);
		left.tv_sec = end.tv_sec - now.tv_sec;
		left.tv_nsec = end.tv_nsec - now.tv_nsec;
		if (left.tv_nsec < 0) {
			left.tv_sec--;
			left.tv_nsec += 1000000000L;
		}
		if (left.tv_sec < 0 || (left.tv_sec == 0 && left.tv_nsec == 0))
			break;
		gai_suspend((const struct gaicb *const *)wait, (int)n, &left);
	}
	free(wait);
}

/* Resolves every host named by a RULE_HOST rule at once with getaddrinfo_a
 * and appends each address as a RULE_IP /128 rule with the host rule's
 * ports, compartment and line. A host that fails or is late is skipped: the
 * shim also learns addresses from the program's own lookups. An address
 * already among the /128 rules with the same ports is skipped too, in any
 * compartment: the rule written first wins, so two names of one address
 * cannot turn into a duplicate-destination error that depends on DNS. */
static int resolve_hosts(struct cfg_ctx *c)
{
	struct bs_config *cfg = c->cfg;
	size_t nparsed = cfg->nrules, nq = 0;
	struct query *byname = NULL, *q, **qs = NULL;
	struct gaicb **list = NULL;
	struct seen *set = NULL, *e, *tmp;
	int rc = 0;

	for (size_t i = 0; i < nparsed && rc == 0; i++) {
		if (cfg->rules[i].kind != RULE_HOST)
			continue;
		HASH_FIND_STR(byname, cfg->rules[i].host, q);
		if (q != NULL)
			continue;
		if ((q = calloc(1, sizeof(*q))) == NULL) {
			rc = -ENOMEM;
			break;
		}
		snprintf(q->name, sizeof(q->name), "%s", cfg->rules[i].host);
		HASH_ADD_STR(byname, name, q);
		if (q->hh.tbl == NULL) {
			free(q);
			rc = -ENOMEM;
			break;
		}
		nq++;
	}
	if (rc < 0 || nq == 0)
		goto done;
	qs = calloc(nq, sizeof(*qs));
	list = calloc(nq, sizeof(*list));
	if (qs == NULL || list == NULL) {
		rc = -ENOMEM;
		goto done;
	}
	nq = 0;
	for (q = byname; q != NULL; q = q->hh.next) {
		q->hints.ai_family = AF_UNSPEC;
		q->hints.ai_socktype = SOCK_STREAM;
		q->cb.ar_name = q->name;
		q->cb.ar_request = &q->hints;
		qs[nq] = q;
		list[nq++] = &q->cb;
	}
	/* When this fails part way, the requests not queued look finished
	 * with no result, and the queued ones are waited for as usual. */
	getaddrinfo_a(GAI_NOWAIT, list, (int)nq, NULL);
	wait_queries(list, nq, cfg->resolve_timeout_ms);
	for (size_t i = 0; i < nq; i++) {
		int st = gai_error(&qs[i]->cb);

		if (st == EAI_INPROGRESS) {
			st = gai_cancel(&qs[i]->cb);
			if (st == EAI_NOTCANCELED) {
				/* A resolver thread still owns this request
				 * and will write into it: leave it be. */
				HASH_DEL(byname, qs[i]);
				qs[i] = NULL;
				continue;
			}
			st = st == EAI_ALLDONE ? gai_error(&qs[i]->cb) : st;
		}
		if (st == 0)
			qs[i]->res = qs[i]->cb.ar_result;
	}

	for (size_t i = 0; i < nparsed && rc == 0; i++) {
		if (cfg->rules[i].kind == RULE_IP && cfg->rules[i].prefix == 128)
			seen_add(&set, cfg->rules[i].addr, cfg->rules[i].port_lo,
				 cfg->rules[i].port_hi, &rc);
	}
	for (size_t i = 0; i < nparsed && rc == 0; i++) {
		struct rule host = cfg->rules[i];

		if (host.kind != RULE_HOST)
			continue;
		HASH_FIND_STR(byname, host.host, q);
		for (const struct addrinfo *ai = q ? q->res : NULL; ai && rc == 0; ai = ai->ai_next) {
			struct rule r = { .kind = RULE_IP, .prefix = 128, .port_lo = host.port_lo,
					  .port_hi = host.port_hi, .comp = host.comp,
					  .line = host.line };

			if (ai->ai_family == AF_INET && ai->ai_addrlen >= sizeof(struct sockaddr_in)) {
				const struct sockaddr_in *in = (const struct sockaddr_in *)ai->ai_addr;

				r.addr[10] = r.addr[11] = 0xff;
				memcpy(r.addr + 12, &in->sin_addr, 4);
			} else if (ai->ai_family == AF_INET6 &&
				   ai->ai_addrlen >= sizeof(struct sockaddr_in6)) {
				const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ai->ai_addr;

				memcpy(r.addr, &in6->sin6_addr, 16);
			} else {
				continue;
			}
			if (seen_add(&set, r.addr, r.port_lo, r.port_hi, &rc))
				rc = push_rule(c, &r, NULL, NULL);
		}
	}
done:
	HASH_ITER(hh, set, e, tmp) {
		HASH_DEL(set, e);
		free(e);
	}
	while (byname != NULL) {
		q = byname;
		HASH_DEL(byname, q);
		if (q->res != NULL)
			freeaddrinfo(q->res);
		free(q);
	}
	free(qs);
	free(list);
	if (rc < 0)
		return fail(c, NULL, rc, "out of memory resolving host names");
	return 0;
}

/* The socket table a config gets when it sets no max_sockets: twice the
 * connection permits, at least MIN_SOCKETS. A compartment with no
 * max_connections still counts its sockets, unbounded, so then at least
 * MIN_SOCKETS_UNCAPPED. */
static uint32_t default_sockets(const struct bs_config *cfg)
{
	uint64_t sum = 0, floor = MIN_SOCKETS;

	for (size_t i = 0; i < cfg->ncomp; i++) {
		sum += cfg->comp[i].max_connections;
		if (cfg->comp[i].max_connections == 0)
			floor = MIN_SOCKETS_UNCAPPED;
	}
	sum = sum * 2 < floor ? floor : sum * 2;
	return (uint32_t)(sum > BS_MAX_SOCKETS ? BS_MAX_SOCKETS : sum);
}

/* The key a "duplicate setting name" error is about, read from the text of
 * the line libconfig names (the line of the second occurrence): the first
 * name set twice in one group on that line, or else the only name set on
 * it. libconfig stops at the duplicate without saying which key it is.
 * Returns false when the line does not tell. */
static bool duplicate_key(const struct cfg_ctx *c, int line, char *out, size_t outlen)
{
	struct {
		const char *p;
		size_t n;
		int group;
	} seen[32];
	const char *t = c->text;
	size_t start, end, nseen = 0;
	int groups[16] = { 0 }, depth = 0, next = 1;

	if (t == NULL || line < 1 || (size_t)line > c->nlines)
		return false;
	start = line > 1 ? c->line_end[line - 2] + 1 : 0;
	end = c->line_end[line - 1];
	for (size_t i = start; i < end; i++) {
		size_t j = i, k;

		if (t[i] == '"') {
			for (i++; i < end && t[i] != '"'; i++)
				i += t[i] == '\\';
			continue;
		}
		if (t[i] == '#' || (t[i] == '/' && i + 1 < end && t[i + 1] == '/'))
			break;
		if (t[i] == '/' && i + 1 < end && t[i + 1] == '*') {
			for (i += 2; i + 1 < end && !(t[i] == '*' && t[i + 1] == '/'); i++)
				;
			i++;
			continue;
		}
		if (t[i] == '{' && depth < 15)
			groups[++depth] = next++;
		else if (t[i] == '}' && depth > 0)
			depth--;
		if (!((t[i] >= 'A' && t[i] <= 'Z') || (t[i] >= 'a' && t[i] <= 'z') || t[i] == '*'))
			continue;
		while (j < end && (name_char(t[j]) || t[j] == '*'))
			j++;
		for (k = j; k < end && (t[k] == ' ' || t[k] == '\t'); k++)
			;
		if (k < end && (t[k] == '=' || t[k] == ':') && nseen < sizeof(seen) / sizeof(seen[0])) {
			for (size_t m = 0; m < nseen; m++) {
				if (seen[m].group == groups[depth] && seen[m].n == j - i &&
				    memcmp(seen[m].p, t + i, j - i) == 0) {
					snprintf(out, outlen, "%.*s", (int)(j - i), t + i);
					return true;
				}
			}
			seen[nseen].p = t + i;
			seen[nseen].n = j - i;
			seen[nseen++].group = groups[depth];
		}
		i = j - 1;
	}
	if (nseen != 1)
		return false;
	snprintf(out, outlen, "%.*s", (int)seen[0].n, seen[0].p);
	return true;
}

/* Reports what config_read_file found wrong. libconfig's own words are kept
 * except for a duplicate key, which it reports without naming it. */
static int syntax_error(struct cfg_ctx *c, const config_t *lc)
{
	const char *file = config_error_file(lc), *text = config_error_text(lc);
	int line = config_error_line(lc);
	char key[64];

	if (text == NULL || strcmp(text, "duplicate setting name") != 0)
		return fail_at(c, file, line, -EINVAL, "%s", text ? text : "syntax error");
	if ((file == NULL || strcmp(file, c->path) == 0) && duplicate_key(c, line, key, sizeof(key)))
		return fail_at(c, file, line, -EINVAL, "duplicate key \"%s\": each key may appear "
			       "once in its group, and so may each class in \"classes\" and "
			       "\"class_limits\"", key);
	return fail_at(c, file, line, -EINVAL, "duplicate key: each key may appear once in its "
		       "group, and so may each class in \"classes\" and \"class_limits\"");
}

/* Loads and validates path into *cfg (see shim.h for the format). Returns
 * 0; -ENOENT when the file does not exist; -EINVAL (or -EACCES, -EISDIR,
 * -ENOMEM...) with one message "FILE:LINE: what is wrong" in err, after
 * which *cfg is zeroed with nothing to free. */
int cfg_load(const char *path, struct bs_config *cfg, bool resolve, char *err, size_t errlen)
{
	struct cfg_ctx c = { .path = path, .cfg = cfg, .err = err, .errlen = errlen };
	char msg[BS_ERRLEN];
	struct matcher *m;
	struct stat st;
	config_t lc;
	FILE *f;
	int rc;

	memset(cfg, 0, sizeof(*cfg));
	if (err != NULL && errlen > 0)
		err[0] = '\0';
	if (path == NULL || path[0] == '\0') {
		c.path = "(none)";
		return fail(&c, NULL, -EINVAL, "no config file given");
	}
	if (strlen(path) >= sizeof(cfg->path))
		return fail(&c, NULL, -ENAMETOOLONG, "path is too long");
	if (stat(path, &st) < 0) {
		rc = -errno;
		if (rc == -ENOENT)
			return fail(&c, NULL, rc, "no such file");
		return fail(&c, NULL, rc, "%s", strerror(-rc));
	}
	if (S_ISDIR(st.st_mode))
		return fail(&c, NULL, -EISDIR, "is a directory");
	/* libconfig says only "file I/O error"; find out why first. */
	if ((f = fopen(path, "r")) == NULL) {
		rc = -errno;
		return fail(&c, NULL, rc, "cannot read: %s", strerror(-rc));
	}
	rc = read_text(&c, f);
	fclose(f);
	if (rc < 0) {
		free(c.text);
		free(c.line_end);
		return fail(&c, NULL, rc, "cannot read: %s", strerror(-rc));
	}

	config_init(&lc);
	/* @include names a file next to this one, not in the program's cwd. */
	const char *slash = strrchr(path, '/');
	if (slash != NULL) {
		snprintf(msg, sizeof(msg), "%.*s", (int)(slash - path) + 1, path);
		config_set_include_dir(&lc, msg);
	}
	if (!config_read_file(&lc, path)) {
		if (config_error_type(&lc) == CONFIG_ERR_FILE_IO)
			rc = fail(&c, NULL, -EIO, "cannot read the file");
		else
			rc = syntax_error(&c, &lc);
		config_destroy(&lc);
		goto done;
	}
	snprintf(cfg->path, sizeof(cfg->path), "%s", path);
	cfg_default_segment(path, cfg->segment, sizeof(cfg->segment));
	cfg->mode = DEFAULT_MODE;
	cfg->max_processes = DEFAULT_PROCESSES;
	cfg->resolve_timeout_ms = DEFAULT_RESOLVE_MS;
	cfg->enforce = true;
	cfg->nclass = 1;
	snprintf(cfg->classes[0].name, sizeof(cfg->classes[0].name), "%s", "default");

	rc = parse_root(&c, config_root_setting(&lc));
	if (rc == 0)
		rc = check_duplicates(&c);
	if (rc == 0)
		rc = check_budget(&c);
	config_destroy(&lc);
	if (rc == 0 && !c.has_sockets)
		cfg->max_sockets = default_sockets(cfg);
	if (rc == 0 && resolve)
		rc = resolve_hosts(&c);
	if (rc == 0) {
		/* The shim builds its own matcher later; this one only proves
		 * that it can be built. */
		m = match_build(cfg->rules, cfg->nrules, msg, sizeof(msg));
		if (m == NULL)
			rc = fail(&c, NULL, -EINVAL, "%s", msg);
		match_free(m);
	}
done:
	free(c.src);
	free(c.text);
	free(c.line_end);
	if (rc < 0)
		cfg_free(cfg);
	return rc;
}

/* True if path parses as libconfig and its top level says strict = true,
 * whatever else is wrong in it, so that a broken config can still ask the
 * shim to stop. False on any doubt: no file, a syntax error, no "strict" or
 * one that is not a boolean. */
bool cfg_wants_strict(const char *path)
{
	const config_setting_t *s;
	bool strict = false;
	config_t lc;

	if (path == NULL || path[0] == '\0')
		return false;
	config_init(&lc);
	if (config_read_file(&lc, path)) {
		s = config_setting_get_member(config_root_setting(&lc), "strict");
		strict = s != NULL && config_setting_type(s) == CONFIG_TYPE_BOOL &&
			 config_setting_get_bool(s);
	}
	config_destroy(&lc);
	return strict;
}

/* Writes the base name of path without its extension into out, with each
 * character outside [A-Za-z0-9_.-] replaced by '_', cut to 63 characters
 * and to outlen. It cannot fail: a NULL or empty path, or one with nothing
 * left, gives "default", and a NULL or empty out is left alone. */
void cfg_default_segment(const char *path, char *out, size_t outlen)
{
	const char *base, *dot;
	size_t n, i;

	if (out == NULL || outlen == 0)
		return;
	base = path ? strrchr(path, '/') : NULL;
	base = base ? base + 1 : (path ? path : "");
	dot = strrchr(base, '.');
	n = dot ? (size_t)(dot - base) : strlen(base);
	if (n > BS_NAME_MAX - 1)
		n = BS_NAME_MAX - 1;
	if (n > outlen - 1)
		n = outlen - 1;
	if (n == 0) {
		snprintf(out, outlen, "%s", "default");
		return;
	}
	for (i = 0; i < n; i++)
		out[i] = name_char(base[i]) ? base[i] : '_';
	out[i] = '\0';
}

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

/* Frees what cfg_load allocated and zeroes cfg; a zeroed or NULL cfg is
 * fine, and nothing can fail. */
void cfg_free(struct bs_config *cfg)
{
	if (cfg == NULL)
		return;
	free(cfg->comp);
	free(cfg->rules);
	memset(cfg, 0, sizeof(*cfg));
}

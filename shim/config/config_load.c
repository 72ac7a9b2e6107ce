/* config_load.c - loads and validates the libconfig file into struct bs_config, at init only. */
#include "config/config_int.h"
#include "log.h"

#include <errno.h>
#include <grp.h>
#include <libconfig.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_MODE		0600
/* A prefork server of a thousand workers, twice over: records of the dead
 * are taken back only when the table is full. */
#define DEFAULT_PROCESSES	2048
#define DEFAULT_RESOLVE_MS	1000
#define MAX_RESOLVE_MS		60000
/* As many sockets as processes, twice: a worker each of a server that size,
 * in observe mode or over budget, and the pending entries of its forks. */
#define MIN_SOCKETS		4096
#define MIN_SOCKETS_UNCAPPED	8192	/* when nothing bounds a compartment's connections */
#define MAX_ID			4294967294LL	/* (uid_t)-1 means "no change" */

static int load_file(const char *path, struct bs_config *cfg, bool resolve, bool all, char *err,
		size_t errlen);

static const char *const top_keys[] = {
	"segment", "budget", "strict", "mode", "owner", "group", "max_processes",
	"max_sockets", "resolve_timeout_ms", "enforce", "classes", "compartments", "pools",
	"fleet", "log_format", "drills", NULL,
};
static const char *const budget_keys[] = { "pool", "reserved", NULL };


static int parse_segment(struct cfg_ctx *c, const config_setting_t *s)
{
	const char *name = NULL;
	int rc = cfg_get_string(c, s, &name);

	if (rc == 0)
		rc = cfg_check_name(c, s, "segment", name);
	if (rc == 0)
		snprintf(c->cfg->segment, sizeof(c->cfg->segment), "%s", name);
	return rc;
}

static int parse_log_format(struct cfg_ctx *c, const config_setting_t *s)
{
	const char *word = NULL;
	int rc = cfg_get_string(c, s, &word);

	if (rc == 0 && strcmp(word, "json") != 0 && strcmp(word, "text") != 0)
		rc = cfg_fail(c, s, -EINVAL, "\"log_format\" is \"text\" or \"json\", not \"%s\"",
		    word);
	if (rc == 0)
		c->cfg->log_json = strcmp(word, "json") == 0;
	return rc;
}

static int parse_budget(struct cfg_ctx *c, const config_setting_t *s)
{
	const config_setting_t *pool, *reserved;
	long long vp = 0, vr = 0;
	int rc;

	if (!config_setting_is_group(s))
		return cfg_fail(c, s, -EINVAL,
				"\"budget\" must be a group like { pool = 100; reserved = 10; }, not %s",
				cfg_type_name(config_setting_type(s)));
	for (int i = 0; i < config_setting_length(s); i++) {
		const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);

		if (!cfg_is_known(cfg_key_of(e), budget_keys))
			return cfg_unknown_key(c, e, budget_keys, " in budget");
	}
	pool = config_setting_get_member(s, "pool");
	if (pool == NULL)
		return cfg_fail(c, s, -EINVAL, "budget has no \"pool\"");
	if ((rc = cfg_get_int(c, pool, &vp)) < 0)
		return rc;
	if (vp <= 0 || vp > UINT32_MAX)
		return cfg_fail(c, pool, -EINVAL, "budget pool must be between 1 and %u, not %lld",
				UINT32_MAX, vp);
	reserved = config_setting_get_member(s, "reserved");
	if (reserved != NULL) {
		if ((rc = cfg_get_int(c, reserved, &vr)) < 0)
			return rc;
		if (vr < 0 || vr >= vp)
			return cfg_fail(c, reserved, -EINVAL,
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
			return cfg_fail(c, s, -EINVAL, "bad mode: write it in octal, like \"0660\", not in hex");
		snprintf(text, sizeof(text), "%lld", config_setting_get_int64(s));
	} else {
		return cfg_fail(c, s, -EINVAL, "\"mode\" must be an octal string like \"0660\", not %s",
				cfg_type_name(type));
	}
	n = strlen(text);
	if (n == 0 || n > 6)
		return cfg_fail(c, s, -EINVAL, "bad mode \"%s\": expected octal digits like \"0660\"", text);
	for (size_t i = 0; i < n; i++) {
		if (text[i] < '0' || text[i] > '7')
			return cfg_fail(c, s, -EINVAL, "bad mode \"%s\": modes are octal, digits 0 to 7",
					text);
		mode = mode * 8 + (unsigned long)(text[i] - '0');
	}
	if (mode > 0777)
		return cfg_fail(c, s, -EINVAL, "bad mode \"%s\": only permission bits up to 0777", text);
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
		int rc = cfg_get_int(c, s, &v);

		if (rc < 0)
			return rc;
		if (v < 0 || v > MAX_ID)
			return cfg_fail(c, s, -EINVAL, "bad %s id %lld", what, v);
		id = (unsigned long)v;
	} else if (type == CONFIG_TYPE_STRING) {
		const char *name = config_setting_get_string(s);
		size_t n = strspn(name, "0123456789");
		int rc;

		if (name[0] == '\0')
			return cfg_fail(c, s, -EINVAL, "empty %s name", what);
		if (name[n] == '\0') {
			if (n > 10 || (v = strtoll(name, NULL, 10)) > MAX_ID)
				return cfg_fail(c, s, -EINVAL, "bad %s id %s", what, name);
			id = (unsigned long)v;
		} else if ((rc = lookup_id(name, group, &id)) == -ENOENT) {
			return cfg_fail(c, s, -EINVAL, "unknown %s \"%s\"", what, name);
		} else if (rc < 0) {
			return cfg_fail(c, s, rc, "cannot look up %s \"%s\": %s", what, name, strerror(-rc));
		}
	} else {
		return cfg_fail(c, s, -EINVAL, "\"%s\" must be a %s name or id, not %s", cfg_key_of(s), what,
				cfg_type_name(type));
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

static int parse_root(struct cfg_ctx *c, const config_setting_t *root)
{
	const config_setting_t *s;
	long long v = 0;
	int rc = 0;

	/* Compartments inherit enforce and drills and name classes, so these
	 * are read first, wherever they are in the file. */
	if ((s = config_setting_get_member(root, "enforce")) != NULL)
		rc = cfg_get_bool(c, s, &c->cfg->enforce);
	if (rc < 0 && cfg_go_on(c, rc))
		rc = 0;
	if (rc == 0 && (s = config_setting_get_member(root, "drills")) != NULL)
		rc = cfg_get_bool(c, s, &c->cfg->drills);
	if (rc < 0 && cfg_go_on(c, rc))
		rc = 0;
	if (rc == 0 && (s = config_setting_get_member(root, "classes")) != NULL)
		rc = cfg_parse_classes(c, s);
	if (rc < 0 && cfg_go_on(c, rc))
		rc = 0;
	/* Compartments name their pool. */
	if (rc == 0 && (s = config_setting_get_member(root, "pools")) != NULL)
		rc = cfg_parse_pools(c, s);
	if (rc < 0 && cfg_go_on(c, rc))
		rc = 0;

	for (int i = 0; i < config_setting_length(root) && rc == 0; i++) {
		const char *key;

		s = config_setting_get_elem(root, (unsigned)i);
		key = cfg_key_of(s);
		if (strcmp(key, "enforce") == 0 || strcmp(key, "drills") == 0 ||
		    strcmp(key, "classes") == 0 ||
		    strcmp(key, "pools") == 0) {
			continue;	/* read above */
		} else if (strcmp(key, "segment") == 0) {
			rc = parse_segment(c, s);
		} else if (strcmp(key, "budget") == 0) {
			rc = parse_budget(c, s);
		} else if (strcmp(key, "strict") == 0) {
			rc = cfg_get_bool(c, s, &c->cfg->strict);
		} else if (strcmp(key, "mode") == 0) {
			rc = parse_mode(c, s);
		} else if (strcmp(key, "owner") == 0 || strcmp(key, "group") == 0) {
			rc = parse_id(c, s, key[0] == 'g');
		} else if (strcmp(key, "max_processes") == 0) {
			if ((rc = cfg_get_range(c, s, 1, BS_MAX_PROCESSES, &v)) == 0)
				c->cfg->max_processes = (uint32_t)v;
		} else if (strcmp(key, "max_sockets") == 0) {
			if ((rc = cfg_get_range(c, s, 1, BS_MAX_SOCKETS, &v)) == 0) {
				c->cfg->max_sockets = (uint32_t)v;
				c->has_sockets = true;
				c->sockets = s;
			}
		} else if (strcmp(key, "resolve_timeout_ms") == 0) {
			if ((rc = cfg_get_range(c, s, 0, MAX_RESOLVE_MS, &v)) == 0)
				c->cfg->resolve_timeout_ms = (unsigned)v;
		} else if (strcmp(key, "compartments") == 0) {
			rc = cfg_parse_compartments(c, s);
		} else if (strcmp(key, "fleet") == 0) {
			rc = cfg_parse_fleet(c, s);
		} else if (strcmp(key, "log_format") == 0) {
			rc = parse_log_format(c, s);
		} else {
			rc = cfg_unknown_key(c, s, top_keys, "");
		}
		if (rc < 0 && cfg_go_on(c, rc))
			rc = 0;
	}
	if (rc == 0 && !c->has_compartments)
		rc = cfg_fail(c, NULL, -EINVAL, "no \"compartments\" list: nothing to limit");
	return rc;
}

/* The socket table a config gets when it sets no max_sockets: twice the
 * connection permits, at least MIN_SOCKETS. A compartment with no
 * max_connections, or in observe mode, still counts its sockets,
 * unbounded, so then at least MIN_SOCKETS_UNCAPPED. */
static uint32_t default_sockets(const struct bs_config *cfg)
{
	uint64_t sum = 0, floor = MIN_SOCKETS;

	for (size_t i = 0; i < cfg->ncomp; i++) {
		sum += cfg->comp[i].max_connections;
		if (cfg->comp[i].max_connections == 0 || !cfg->comp[i].enforce)
			floor = MIN_SOCKETS_UNCAPPED;
	}
	sum = sum * 2 < floor ? floor : sum * 2;
	return (uint32_t)(sum > BS_MAX_SOCKETS ? BS_MAX_SOCKETS : sum);
}

/* A max_sockets below the connections the limits allow refuses connects
 * the limits would admit (no_slot): an error, with the number to write. */
static int check_sockets(struct cfg_ctx *c)
{
	const struct bs_config *cfg = c->cfg;
	uint64_t sum = 0;

	if (!c->has_sockets)
		return 0;
	for (size_t i = 0; i < cfg->ncomp; i++)
		sum += cfg->comp[i].max_connections;
	if (sum <= cfg->max_sockets)
		return 0;
	return cfg_fail(c, c->sockets, -EINVAL, "max_sockets = %u is below the %llu connections "
			"the compartments' max_connections allow: connects past %u would be refused "
			"as no_slot; write at least %llu, or leave it out (twice the sum)",
			cfg->max_sockets, (unsigned long long)sum, cfg->max_sockets,
			(unsigned long long)sum);
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
		while (j < end && (cfg_name_char(t[j]) || t[j] == '*'))
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

/* One token of the file, for syntax_hint(): its first character and line. */
struct tok {
	char kind;	/* 'a' a name, '0' a number, '"' a string, else the punctuation */
	int line;
};

/* Splits the file's text into tokens up to the end of line `upto`;
 * returns how many fit in t. Comments are skipped, strings are one token. */
static size_t tokens(const struct cfg_ctx *c, int upto, struct tok *t, size_t max)
{
	const char *p = c->text, *end;
	size_t n = 0;
	int line = 1;

	if (p == NULL || upto < 1 || (size_t)upto > c->nlines)
		return 0;
	end = p + c->line_end[upto - 1];
	while (p < end && n < max) {
		char ch = *p;

		if (ch == '\n') {
			line++;
			p++;
		} else if (ch == ' ' || ch == '\t' || ch == '\r') {
			p++;
		} else if (ch == '#' || (ch == '/' && p + 1 < end && p[1] == '/')) {
			while (p < end && *p != '\n')
				p++;
		} else if (ch == '/' && p + 1 < end && p[1] == '*') {
			for (p += 2; p + 1 < end && !(p[0] == '*' && p[1] == '/'); p++)
				line += *p == '\n';
			p += 2;
		} else if (ch == '"') {
			t[n++] = (struct tok){ '"', line };
			for (p++; p < end && *p != '"'; p++) {
				line += *p == '\n';
				p += *p == '\\';
			}
			p++;
		} else if ((ch >= '0' && ch <= '9') || ch == '-' || ch == '+' || ch == '.') {
			t[n++] = (struct tok){ '0', line };
			while (p < end && (cfg_name_char(*p) || *p == '+'))
				p++;
		} else if (cfg_name_char(ch) || ch == '*') {
			t[n++] = (struct tok){ 'a', line };
			while (p < end && (cfg_name_char(*p) || *p == '*'))
				p++;
		} else {
			t[n++] = (struct tok){ ch, line };
			p++;
		}
	}
	return n;
}

/* A hint for libconfig's bare "syntax error" at line, when the cause is a
 * common one; NULL when the tokens do not show it. */
static const char *syntax_hint(const struct cfg_ctx *c, int line, char *buf, size_t len)
{
	struct tok *t = malloc(65536 * sizeof(*t)), open[64];
	size_t n = t ? tokens(c, line, t, 65536) : 0, depth = 0;
	const char *hint = NULL;

	for (size_t i = 1; i < n && hint == NULL; i++) {
		char a = t[i - 1].kind, b = t[i].kind;

		if (t[i].line != line)
			continue;
		if (a == ',' && (b == ')' || b == ']')) {
			snprintf(buf, len, "a comma before \"%c\": the last element of a list or array "
				 "takes none", b);
			hint = buf;
		} else if (a == '}' && b == '{') {
			hint = "a missing comma between two groups of a list: write \"}, {\"";
		} else if (a == 'a' && (b == '0' || b == '"' || b == '[' || b == '(' || b == '{') &&
			   (i < 2 || (t[i - 2].kind != '=' && t[i - 2].kind != ':'))) {
			hint = "a missing \"=\" between a key and its value";
		} else if ((a == '0' || a == '"') && (b == '0' || (a == '0' && b == '"'))) {
			hint = "a missing semicolon between two settings (or comma between two elements)";
		}
	}
	for (size_t i = 0; i < n && hint == NULL; i++) {
		char k = t[i].kind;

		if ((k == '(' || k == '[' || k == '{') && depth < 64)
			open[depth++] = t[i];
		else if ((k == ')' || k == ']' || k == '}') && depth > 0)
			depth--;
	}
	if (hint == NULL && depth > 0 && (size_t)line >= c->nlines) {
		const char *file;
		int at;

		cfg_place(c, open[depth - 1].line, &file, &at);
		snprintf(buf, len, "\"%c\" opened on line %d%s%s is never closed",
			 open[depth - 1].kind, at, file != NULL ? " of " : "", file ? file : "");
		hint = buf;
	}
	free(t);
	return hint;
}

/* Reports what config_read_string found wrong, at the file and line the
 * line of the text parsed comes from. libconfig's own words are kept, with
 * a hint when the cause is a common one, except for a duplicate key, which
 * it reports without naming it. */
static int syntax_error(struct cfg_ctx *c, const config_t *lc)
{
	const char *text = config_error_text(lc), *hint = NULL, *file;
	int line = config_error_line(lc), at;
	char key[64], buf[160];

	cfg_place(c, line, &file, &at);
	if (text != NULL && strcmp(text, "syntax error") == 0)
		hint = syntax_hint(c, line, buf, sizeof(buf));
	if (hint != NULL)
		return cfg_fail_at(c, file, at, -EINVAL, "syntax error: %s?", hint);
	if (text == NULL || strcmp(text, "duplicate setting name") != 0)
		return cfg_fail_at(c, file, at, -EINVAL, "%s", text ? text : "syntax error");
	if (duplicate_key(c, line, key, sizeof(key)))
		return cfg_fail_at(c, file, at, -EINVAL, "duplicate key \"%s\": each key may appear "
				   "once in its group, and so may each class in \"classes\" and "
				   "\"class_limits\"", key);
	return cfg_fail_at(c, file, at, -EINVAL, "duplicate key: each key may appear once in its "
			   "group, and so may each class in \"classes\" and \"class_limits\"");
}

/* Loads and validates path into *cfg (see config.h for the format). Returns
 * 0; -ENOENT when the file does not exist; -EINVAL (or -EACCES, -EISDIR,
 * -ENOMEM...) with one message "FILE:LINE: what is wrong" in err, after
 * which *cfg is zeroed with nothing to free. */
int cfg_load(const char *path, struct bs_config *cfg, bool resolve, char *err, size_t errlen)
{
	return load_file(path, cfg, resolve, false, err, errlen);
}

/* See config.h. */
int cfg_load_all(const char *path, struct bs_config *cfg, bool resolve, char *err, size_t errlen)
{
	return load_file(path, cfg, resolve, true, err, errlen);
}

/* The directory of path with its slash ("/etc/bulkshim/"), where its
 * @include names are found, not in the program's working directory; ""
 * for a path without one. */
static void include_dir(const char *path, char *dir, size_t size)
{
	const char *slash = strrchr(path, '/');

	if (slash == NULL || snprintf(dir, size, "%.*s", (int)(slash - path) + 1, path) >= (int)size)
		dir[0] = '\0';
}

/* Reads c->path (cfg_read_file: once, and only regular files, with what it
 * includes found next to it) and parses that text into lc. Returns 0 with
 * lc to config_destroy; 1 when libconfig refused the text, lc to destroy
 * holding its error; or the read's -errno (message in c), lc untouched.
 * c's text is the caller's to free (cfg_text_free) either way. */
static int read_parse(struct cfg_ctx *c, config_t *lc)
{
	char dir[PATH_MAX];
	int rc;

	include_dir(c->path, dir, sizeof(dir));
	if ((rc = cfg_read_file(c, dir[0] != '\0' ? dir : NULL)) < 0)
		return rc;
	config_init(lc);
	/* The text has no @include left for libconfig to open; should its
	 * scanner find one after all, it looks under a directory that
	 * cannot exist, so that it never opens, or waits on, a file. */
	config_set_include_dir(lc, "/dev/null/");
	return config_read_string(lc, c->text) ? 0 : 1;
}

static int load_file(const char *path, struct bs_config *cfg, bool resolve, bool all, char *err,
		size_t errlen)
{
	struct cfg_ctx c = { .path = path, .cfg = cfg, .err = err, .errlen = errlen, .all = all };
	char msg[BS_ERRLEN];
	struct matcher *m;
	config_t lc;
	int rc;

	memset(cfg, 0, sizeof(*cfg));
	if (err != NULL && errlen > 0)
		err[0] = '\0';
	if (path == NULL || path[0] == '\0') {
		c.path = "(none)";
		return cfg_fail(&c, NULL, -EINVAL, "no config file given");
	}
	if (strlen(path) >= sizeof(cfg->path))
		return cfg_fail(&c, NULL, -ENAMETOOLONG, "path is too long");
	rc = read_parse(&c, &lc);
	if (rc < 0)
		goto done;
	if (rc > 0) {
		if (config_error_type(&lc) == CONFIG_ERR_FILE_IO)
			rc = cfg_fail(&c, NULL, -EIO, "cannot read the file");
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
	/* In cfg_load_all mode the checks across compartments run even
	 * after an error, to report theirs too. */
	if (rc == 0 || cfg_go_on(&c, rc))
		rc = cfg_check_duplicates(&c);
	if (rc == 0 || cfg_go_on(&c, rc))
		rc = cfg_check_budget(&c);
	if (rc == 0 || cfg_go_on(&c, rc))
		rc = cfg_check_pools(&c);
	if (rc == 0 || cfg_go_on(&c, rc))
		rc = cfg_check_fleet(&c);
	if (rc == 0 || cfg_go_on(&c, rc))
		rc = check_sockets(&c);
	if (rc == 0 && c.first_rc != 0)
		rc = c.first_rc;
	config_destroy(&lc);
	if (rc == 0 && !c.has_sockets)
		cfg->max_sockets = default_sockets(cfg);
	if (rc == 0 && resolve)
		rc = cfg_resolve_hosts(&c);
	if (rc == 0) {
		/* The shim builds its own matcher later; this one only proves
		 * that it can be built. */
		m = match_build(cfg->rules, cfg->nrules, msg, sizeof(msg));
		if (m == NULL)
			rc = cfg_fail(&c, NULL, -EINVAL, "%s", msg);
		match_free(m);
	}
done:
	free(c.src);
	cfg_text_free(&c);
	if (rc < 0)
		cfg_free(cfg);
	return rc;
}

/* See config.h. The same checks as load_file's, with no libconfig setting
 * to place them: messages name the file, or the pool's line. */
int cfg_check_sums(struct bs_config *cfg, unsigned which, char *err, size_t errlen)
{
	struct cfg_ctx c = { .path = cfg->path, .cfg = cfg, .err = err, .errlen = errlen };
	int rc = 0;

	if (err != NULL && errlen > 0)
		err[0] = '\0';
	if (which & CFG_SUM_BUDGET)
		rc = cfg_check_budget(&c);
	if (rc == 0 && (which & CFG_SUM_POOLS))
		rc = cfg_check_pools(&c);
	return rc;
}

/* Parses path into lc without checking what it says, read as cfg_load
 * reads it (so a FIFO is refused, not waited on), for what a config that
 * cfg_load refused can still tell. False if it cannot be read or parsed;
 * true with lc for the caller to config_destroy. */
static bool parse_only(const char *path, config_t *lc)
{
	struct cfg_ctx c = { .path = path };
	int rc;

	if (path == NULL || path[0] == '\0')
		return false;
	rc = read_parse(&c, lc);
	if (rc > 0)
		config_destroy(lc);
	cfg_text_free(&c);
	return rc == 0;
}

/* True if path parses as libconfig and its top level says strict = true,
 * whatever else is wrong in it, so that a broken config can still ask the
 * shim to stop. False on any doubt: no file, one that cfg_load refuses to
 * read (a FIFO...), a syntax error, no "strict" or one that is not a
 * boolean. */
bool cfg_wants_strict(const char *path)
{
	const config_setting_t *s;
	bool strict = false;
	config_t lc;

	if (parse_only(path, &lc)) {
		s = config_setting_get_member(config_root_setting(&lc), "strict");
		strict = s != NULL && config_setting_type(s) == CONFIG_TYPE_BOOL &&
			 config_setting_get_bool(s);
		config_destroy(&lc);
	}
	return strict;
}

/* See config.h. A string "segment" that is a valid name wins; anything else
 * (no file, a syntax error, a bad name) gives the default from the path. */
void cfg_segment_of(const char *path, char *out, size_t outlen)
{
	const config_setting_t *s;
	const char *name;
	config_t lc;

	cfg_default_segment(path, out, outlen);
	if (!parse_only(path, &lc))
		return;
	if ((s = config_setting_get_member(config_root_setting(&lc), "segment")) != NULL &&
	    (name = config_setting_get_string(s)) != NULL && name[0] != '\0' &&
	    strlen(name) < BS_NAME_MAX && strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	    "abcdefghijklmnopqrstuvwxyz0123456789_.-") == strlen(name))
		snprintf(out, outlen, "%s", name);
	config_destroy(&lc);
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
		out[i] = cfg_name_char(base[i]) ? base[i] : '_';
	out[i] = '\0';
}

/* Frees what cfg_load allocated and zeroes cfg; a zeroed or NULL cfg is
 * fine, and nothing can fail. */
void cfg_free(struct bs_config *cfg)
{
	if (cfg == NULL)
		return;
	free(cfg->comp);
	free(cfg->rules);
	free(cfg->unresolved);
	memset(cfg, 0, sizeof(*cfg));
}

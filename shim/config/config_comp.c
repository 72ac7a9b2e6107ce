/* config_comp.c - the classes and compartments of a config, their duplicates and budget. */
#include "config/config_int.h"

#include <errno.h>
#include <libconfig.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char cfg_eagain_spin[] = "errno EAGAIN cannot go with max_inflight: a refused send "
	"would answer EAGAIN, which clients on a blocking socket retry at once, a busy loop; "
	"use ECONNREFUSED (the default) or ETIMEDOUT";

static const char *const comp_keys[] = {
	"name", "destinations", "max_connections", "max_inflight", "max_wait_ms", "max_waiting",
	"connect_timeout_ms", "io_timeout_ms", "enforce", "class_limits", "errno", "pool", "guaranteed", "class_guaranteed",
	"adaptive", "fleet_limit", "fleet_floor", "drills", NULL,
};

/* Appends a rule, growing cfg->rules and src together. Returns 0, or -ENOMEM
 * with cfg->rules and src left as they were. */
int cfg_push_rule(struct cfg_ctx *c, const struct rule *r, const char *text, const char *file)
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

/* The file and line of a string element of an array or list. libconfig
 * records the line of the token after the string, because it must look
 * ahead to join adjacent string literals; so the last destination before a
 * "]" on a line of its own would be placed on the "]" line. Look back a few
 * lines of the text parsed for the quoted text, and keep libconfig's line
 * when it is not found (escapes, a string split in pieces). */
static void string_at(struct cfg_ctx *c, const config_setting_t *e, const char **file,
		      int *at)
{
	int line = config_setting_source_line(e), found = 0;
	const char *str = config_setting_get_string(e);
	size_t n = str ? strlen(str) : 0;

	for (int k = line; c->text != NULL && str != NULL && k > 0 && k > line - 8 &&
	     (size_t)k <= c->nlines && found == 0; k--) {
		size_t start = k > 1 ? c->line_end[k - 2] + 1 : 0, end = c->line_end[k - 1];

		/* Strings come in file order: on a line already searched,
		 * go on from the last match, or 10,000 destinations on one
		 * line cost 10,000 scans of that line. */
		if (k == c->scan_line && c->scan_off > start && c->scan_off <= end)
			start = c->scan_off;
		for (const char *p = c->text + start;
		     (p = memchr(p, '"', (size_t)(c->text + end - p))) != NULL; p++)
			if ((size_t)(c->text + end - p) >= n + 2 && memcmp(p + 1, str, n) == 0 &&
			    p[n + 1] == '"') {
				c->scan_line = k;
				c->scan_off = (size_t)(p - c->text) + n + 2;
				found = k;
				break;
			}
	}
	cfg_place(c, found != 0 ? found : line, file, at);
}

/* Reads the patterns of one class. A list may hold anything, so each
 * element's type is checked; an array holds one type only. */
static int parse_patterns(struct cfg_ctx *c, const config_setting_t *s, struct cfg_class *cls)
{
	int n = config_setting_length(s);

	if (n > BS_MAX_PATTERNS)
		return cfg_fail(c, s, -EINVAL, "class \"%s\" has %d patterns, more than %d", cls->name,
				n, BS_MAX_PATTERNS);
	for (int i = 0; i < n; i++) {
		const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
		const char *pat, *file;
		size_t len;
		int line;

		if (config_setting_type(e) != CONFIG_TYPE_STRING)
			return cfg_fail(c, e, -EINVAL,
					"pattern %d of class \"%s\" must be a string, not %s", i + 1,
					cls->name, cfg_type_name(config_setting_type(e)));
		pat = config_setting_get_string(e);
		len = strlen(pat);
		string_at(c, e, &file, &line);
		if (len == 0)
			return cfg_fail_at(c, file, line, -EINVAL, "empty pattern in class \"%s\"",
					   cls->name);
		if (len >= BS_NAME_MAX)
			return cfg_fail_at(c, file, line, -EINVAL,
					   "pattern \"%.20s...\" of class \"%s\" is %zu characters, "
					   "more than %d", pat, cls->name, len, BS_NAME_MAX - 1);
		/* The pattern meets the program's name without its directory,
		 * so one with a slash could never match. */
		if (strchr(pat, '/') != NULL)
			return cfg_fail_at(c, file, line, -EINVAL,
					   "pattern \"%s\" of class \"%s\" has a '/': patterns match "
					   "the program's name without its directory", pat, cls->name);
		snprintf(cls->patterns[cls->npatterns++], BS_NAME_MAX, "%s", pat);
	}
	return 0;
}

/* Reads `classes = { batch = [ "pg_dump", "report-*" ]; ... };` into
 * cfg->classes[1..], after the implicit "default". Duplicate class names
 * never get here: libconfig refuses a group with two members of one name.
 * Returns 0, or -EINVAL with a message. */
int cfg_parse_classes(struct cfg_ctx *c, const config_setting_t *s)
{
	struct bs_config *cfg = c->cfg;
	int n, rc;

	if (!config_setting_is_group(s))
		return cfg_fail(c, s, -EINVAL,
				"\"classes\" must be a group like { batch = [ \"pg_dump\" ]; }, not %s",
				cfg_type_name(config_setting_type(s)));
	n = config_setting_length(s);
	for (int i = 0; i < n; i++) {
		const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
		const char *name = cfg_key_of(e);
		struct cfg_class *cls;
		size_t len = strlen(name);

		if (cfg->nclass >= BS_MAX_CLASSES)
			return cfg_fail(c, e, -EINVAL, "class \"%s\" is one too many: at most %d classes "
					"besides \"default\"", name, BS_MAX_CLASSES - 1);
		if (strcmp(name, "default") == 0)
			return cfg_fail(c, e, -EINVAL, "class name \"default\" is reserved for processes "
					"without a class; give the class another name");
		if (len >= BS_CLASS_NAME_MAX)
			return cfg_fail(c, e, -EINVAL, "class name \"%.20s...\" is %zu characters, more "
					"than %d", name, len, BS_CLASS_NAME_MAX - 1);
		/* libconfig also allows '*' in a name; a class name must be
		 * usable in BULKSHIM_CLASS and in status output as it is. */
		for (size_t k = 0; k < len; k++)
			if (!cfg_name_char(name[k]) || name[k] == '.')
				return cfg_fail(c, e, -EINVAL, "class name \"%s\" has a character outside "
						"[A-Za-z0-9_-]", name);
		if (!config_setting_is_array(e) && !config_setting_is_list(e))
			return cfg_fail(c, e, -EINVAL, "class \"%s\" must be an array of program-name "
					"patterns like [ \"pg_dump\", \"report-*\" ], not %s", name,
					cfg_type_name(config_setting_type(e)));
		cls = &cfg->classes[cfg->nclass];
		memset(cls, 0, sizeof(*cls));
		snprintf(cls->name, sizeof(cls->name), "%s", name);
		cls->line = cfg_line_of(c, e);
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
		return cfg_fail(c, g, -EINVAL, "compartment \"%s\" has no \"destinations\"", name);
	if (!config_setting_is_array(s) && !config_setting_is_list(s))
		return cfg_fail(c, s, -EINVAL, "\"destinations\" must be an array of strings, not %s",
				cfg_type_name(config_setting_type(s)));
	n = config_setting_length(s);
	if (n == 0)
		return cfg_fail(c, s, -EINVAL, "compartment \"%s\" has no destinations", name);
	for (int i = 0; i < n; i++) {
		const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
		struct rule r = { .comp = (int)idx };
		const char *text, *file;

		if (config_setting_type(e) != CONFIG_TYPE_STRING)
			return cfg_fail(c, e, -EINVAL,
					"destination %d of compartment \"%s\" must be a string, not %s",
					i + 1, name, cfg_type_name(config_setting_type(e)));
		text = config_setting_get_string(e);
		string_at(c, e, &file, &r.line);
		if (match_parse(text, &r, reason, sizeof(reason)) < 0)
			return cfg_fail_at(c, file, r.line, -EINVAL, "compartment \"%s\": %s", name,
					   reason);
		if (c->cfg->nrules >= BS_MAX_RULES)
			return cfg_fail_at(c, file, r.line, -EINVAL, "more than %d destinations in all",
					   BS_MAX_RULES);
		if ((rc = cfg_push_rule(c, &r, text, file)) < 0)
			return cfg_fail_at(c, file, r.line, rc, "out of memory");
	}
	return 0;
}

/* Reads one limit of compartment `name` (max_connections, max_inflight):
 * an integer from 1 to BS_MAX_LIMIT. */
static int get_limit(struct cfg_ctx *c, const config_setting_t *s, const char *name,
		     uint32_t *out)
{
	long long v = 0;
	int rc = cfg_get_int(c, s, &v);

	if (rc < 0)
		return rc;
	if (v <= 0)
		return cfg_fail(c, s, -EINVAL, "%s of \"%s\" must be at least 1, not %lld", cfg_key_of(s),
				name, v);
	if (v > BS_MAX_LIMIT)
		return cfg_fail(c, s, -EINVAL, "%s of \"%s\" is %lld, which is absurd (the limit is %d)",
				cfg_key_of(s), name, v, BS_MAX_LIMIT);
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
		return cfg_fail(c, g, -EINVAL,
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
		if ((rc = cfg_get_range(c, s, 0, BS_MAX_WAIT_MS, &v)) < 0)
			return rc;
		comp->max_wait_ms = (uint32_t)v;
	}
	if ((waiting = config_setting_get_member(g, "max_waiting")) != NULL) {
		if ((rc = cfg_get_range(c, waiting, 1, BS_MAX_LIMIT, &v)) < 0)
			return rc;
		/* Fail-fast callers never wait, so a bound on the waiters
		 * would be dead weight that hides a missing max_wait_ms. */
		if (comp->max_wait_ms == 0)
			return cfg_fail(c, waiting, -EINVAL, "max_waiting without max_wait_ms in "
					"compartment \"%s\": nobody waits unless max_wait_ms is above 0",
					comp->name);
		comp->max_waiting = (uint32_t)v;
	}
	if ((s = config_setting_get_member(g, "connect_timeout_ms")) != NULL) {
		if ((rc = cfg_get_range(c, s, 0, BS_MAX_TIMEOUT_MS, &v)) < 0)
			return rc;
		comp->connect_timeout_ms = (uint32_t)v;
	}
	if ((s = config_setting_get_member(g, "io_timeout_ms")) != NULL) {
		if ((rc = cfg_get_range(c, s, 0, BS_MAX_TIMEOUT_MS, &v)) < 0)
			return rc;
		comp->io_timeout_ms = (uint32_t)v;
	}
	return 0;
}

/* Reads `class_limits = { batch = 4; };` (what "limit"), or
 * `class_guaranteed = { web = 20; }` (what "guarantee", 0 allowed): each key
 * a declared class (or "default"), each value that class's cap on its
 * connection permits, or its guaranteed share of them, into out. */
static int parse_class_values(struct cfg_ctx *c, const config_setting_t *s,
			      struct cfg_compartment *comp, const char *what, uint32_t *out)
{
	const struct bs_config *cfg = c->cfg;
	const char *names[BS_MAX_CLASSES + 1] = { NULL };
	const char *key = config_setting_name(s);
	long long lo = strcmp(what, "limit") == 0;

	if (!config_setting_is_group(s))
		return cfg_fail(c, s, -EINVAL,
				"\"%s\" must be a group like { batch = 4; }, not %s", key,
				cfg_type_name(config_setting_type(s)));
	for (size_t k = 0; k < cfg->nclass; k++)
		names[k] = cfg->classes[k].name;
	for (int i = 0; i < config_setting_length(s); i++) {
		const config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
		const char *cls = cfg_key_of(e), *best;
		int type = config_setting_type(e);
		size_t k = 0;
		long long v;
		int rc;

		while (k < cfg->nclass && strcmp(cls, names[k]) != 0)
			k++;
		if (k == cfg->nclass) {
			if ((best = cfg_closest(cls, names)) != NULL)
				return cfg_fail(c, e, -EINVAL, "unknown class \"%s\" in %s of "
						"\"%s\" (did you mean \"%s\"?)", cls, key, comp->name, best);
			return cfg_fail(c, e, -EINVAL, "unknown class \"%s\" in %s of \"%s\" "
					"(declare it in the top-level \"classes\")", cls, key, comp->name);
		}
		if (type != CONFIG_TYPE_INT && type != CONFIG_TYPE_INT64)
			return cfg_fail(c, e, -EINVAL, "class %s %s of \"%s\" must be an integer, "
					"not %s", what, cls, comp->name, cfg_type_name(type));
		if ((rc = cfg_get_int(c, e, &v)) < 0)
			return rc;
		if (v < lo || v > BS_MAX_LIMIT)
			return cfg_fail(c, e, -EINVAL, "class %s %s of \"%s\" must be between %lld and "
					"%d, not %lld", what, cls, comp->name, lo, BS_MAX_LIMIT, v);
		if (comp->max_connections != 0 && v > comp->max_connections)
			return cfg_fail(c, e, -EINVAL, "class %s %s = %lld is above max_connections "
					"%u of \"%s\"", what, cls, v, comp->max_connections, comp->name);
		out[k] = (uint32_t)v;
	}
	return 0;
}

/*
 * The start-up assertion of a compartment whose classes split it: each
 * guarantee within its class's ceiling, their sum within max_connections
 * (with every term listed). Every class gets a ceiling: its class limit,
 * or max_connections. Returns 0, or -EINVAL with a message.
 */
static int check_class_shares(struct cfg_ctx *c, const config_setting_t *s,
			      struct cfg_compartment *comp)
{
	const struct bs_config *cfg = c->cfg;
	uint64_t sum = 0;
	char list[BS_MAX_CLASSES * (BS_CLASS_NAME_MAX + 16)];
	size_t len = 0;

	if (comp->max_connections == 0)
		return cfg_fail(c, s, -EINVAL, "class_guaranteed of \"%s\" needs max_connections: "
				"the classes share it", comp->name);
	for (size_t k = 0; k < cfg->nclass; k++) {
		uint32_t ceil = comp->class_limit[k] ? comp->class_limit[k] : comp->max_connections;

		if (comp->class_guaranteed[k] > ceil)
			return cfg_fail(c, s, -EINVAL, "class guarantee %s = %u of \"%s\" is above its "
					"ceiling, class limit %u", cfg->classes[k].name,
					comp->class_guaranteed[k], comp->name, ceil);
		sum += comp->class_guaranteed[k];
		if (comp->class_guaranteed[k] > 0)
			len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%u (%s)",
						len ? " + " : "", comp->class_guaranteed[k],
						cfg->classes[k].name);
	}
	if (sum > comp->max_connections)
		return cfg_fail(c, s, -EINVAL, "classes of \"%s\": guarantees exceed its room: %s = "
				"%llu > max_connections %u", comp->name, list,
				(unsigned long long)sum, comp->max_connections);
	for (size_t k = 0; k < cfg->nclass; k++)
		if (comp->class_limit[k] == 0)
			comp->class_limit[k] = comp->max_connections;
	comp->class_shares = true;
	comp->class_line = cfg_line_of(c, s);
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
		return cfg_fail(c, g, -EINVAL, "compartment %zu must be a group { name = ...; }, not %s",
				idx + 1, cfg_type_name(config_setting_type(g)));
	comp->line = cfg_line_of(c, g);
	comp->reject_errno = ECONNREFUSED;
	comp->enforce = c->cfg->enforce;
	comp->drills = c->cfg->drills;
	s = config_setting_get_member(g, "name");
	if (s != NULL && config_setting_type(s) == CONFIG_TYPE_STRING)
		name = config_setting_get_string(s);
	if (name != NULL && name[0] != '\0' && strlen(name) < BS_NAME_MAX)
		snprintf(where, sizeof(where), " in compartment \"%s\"", name);
	else
		snprintf(where, sizeof(where), " in compartment %zu", idx + 1);
	for (int i = 0; i < config_setting_length(g); i++) {
		const config_setting_t *e = config_setting_get_elem(g, (unsigned)i);

		if (!cfg_is_known(cfg_key_of(e), comp_keys) &&
		    !cfg_go_on(c, rc = cfg_unknown_key(c, e, comp_keys, where)))
			return rc;
	}

	if (s == NULL)
		return cfg_fail(c, g, -EINVAL, "compartment %zu has no \"name\"", idx + 1);
	if ((rc = cfg_get_string(c, s, &name)) < 0 || (rc = cfg_check_name(c, s, "compartment", name)) < 0)
		return rc;
	for (size_t i = 0; i < idx; i++)
		if (strcmp(c->cfg->comp[i].name, name) == 0)
			return cfg_fail(c, s, -EINVAL,
					"duplicate compartment name \"%s\" (also on line %d)", name,
					c->cfg->comp[i].line);
	snprintf(comp->name, sizeof(comp->name), "%s", name);

	/* Each step below that fails ends the compartment, or in
	 * cfg_load_all mode lets the next step find its own errors. */
	if ((rc = parse_destinations(c, g, idx)) < 0 && !cfg_go_on(c, rc))
		return rc;
	if ((rc = cfg_parse_comp_pool(c, g, comp)) < 0 && !cfg_go_on(c, rc))
		return rc;
	if ((rc = parse_limits(c, g, comp)) < 0 && !cfg_go_on(c, rc))
		return rc;
	if ((rc = parse_waiting(c, g, comp)) < 0 && !cfg_go_on(c, rc))
		return rc;
	if ((rc = cfg_parse_comp_fleet(c, g, comp)) < 0 && !cfg_go_on(c, rc))
		return rc;
	if ((s = config_setting_get_member(g, "enforce")) != NULL &&
	    (rc = cfg_get_bool(c, s, &comp->enforce)) < 0 && !cfg_go_on(c, rc))
		return rc;
	if ((s = config_setting_get_member(g, "drills")) != NULL &&
	    (rc = cfg_get_bool(c, s, &comp->drills)) < 0 && !cfg_go_on(c, rc))
		return rc;
	s = config_setting_get_member(g, "class_limits");
	if (s != NULL && (rc = parse_class_values(c, s, comp, "limit", comp->class_limit)) < 0 &&
	    !cfg_go_on(c, rc))
		return rc;
	s = config_setting_get_member(g, "class_guaranteed");
	if (s != NULL && ((rc = parse_class_values(c, s, comp, "guarantee",
	    comp->class_guaranteed)) < 0 || (rc = check_class_shares(c, s, comp)) < 0) &&
	    !cfg_go_on(c, rc))
		return rc;
	s = config_setting_get_member(g, "adaptive");
	if (s != NULL && (rc = cfg_parse_adaptive(c, s, comp)) < 0 && !cfg_go_on(c, rc))
		return rc;

	s = config_setting_get_member(g, "errno");
	if (s != NULL) {
		const char *word = NULL;

		if ((rc = cfg_get_string(c, s, &word)) < 0)
			return rc;
		if ((comp->reject_errno = cfg_errno_value(word)) < 0)
			return cfg_fail(c, s, -EINVAL,
					"unknown errno \"%s\" (use ECONNREFUSED, EAGAIN, ETIMEDOUT, "
					"EHOSTUNREACH or ENETUNREACH)", word);
		if (comp->reject_errno == EAGAIN && comp->max_inflight != 0)
			return cfg_fail(c, s, -EINVAL, "%s", cfg_eagain_spin);
	}
	return 0;
}

/* Reads the `compartments` list into cfg->comp, and their destinations into
 * cfg->rules. Returns 0, or -EINVAL (-ENOMEM) with a message. */
int cfg_parse_compartments(struct cfg_ctx *c, const config_setting_t *s)
{
	int type = config_setting_type(s), n = config_setting_length(s);

	c->has_compartments = true;
	if ((type == CONFIG_TYPE_LIST || type == CONFIG_TYPE_ARRAY) && n == 0)
		return cfg_fail(c, s, -EINVAL, "\"compartments\" is empty");
	if (type != CONFIG_TYPE_LIST)
		return cfg_fail(c, s, -EINVAL, "\"compartments\" must be a list ( { ... }, ... ), not %s",
				cfg_type_name(type));
	if (n > BS_MAX_COMPARTMENTS)
		return cfg_fail(c, s, -EINVAL, "%d compartments, more than the limit of %d", n,
				BS_MAX_COMPARTMENTS);
	c->cfg->comp = calloc((size_t)n, sizeof(*c->cfg->comp));
	if (c->cfg->comp == NULL)
		return cfg_fail(c, s, -ENOMEM, "out of memory");
	for (int i = 0; i < n; i++) {
		int rc = parse_compartment(c, config_setting_get_elem(s, (unsigned)i), (size_t)i);

		if (rc < 0 && !cfg_go_on(c, rc))
			return rc;
		c->cfg->ncomp++;
	}
	return 0;
}

/* Finds the same destination in two compartments before match_build does,
 * to name both compartments; of several, the one seen first in the file is
 * reported. A destination repeated inside one compartment is harmless.
 * Returns 0, or -EINVAL (-ENOMEM) with a message. */
int cfg_check_duplicates(struct cfg_ctx *c)
{
	const struct bs_config *cfg = c->cfg;
	const struct rule **order;
	size_t n = cfg->nrules, later = SIZE_MAX, first = 0;

	if (n < 2)
		return 0;
	order = malloc(n * sizeof(*order));
	if (order == NULL)
		return cfg_fail(c, NULL, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		order[i] = &cfg->rules[i];
	qsort(order, n, sizeof(*order), match_rule_order);
	for (size_t i = 0, j; i < n; i = j) {
		const struct rule *x = order[i];

		for (j = i + 1; j < n && match_rule_cmp(x, order[j]) == 0; j++) {
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
	return cfg_fail_at(c, c->src[later].file, cfg->rules[later].line, -EINVAL,
			   "duplicate destination \"%s\" in compartment \"%s\" (already in compartment "
			   "\"%s\" on line %d)", c->src[later].text, cfg->comp[cfg->rules[later].comp].name,
			   cfg->comp[cfg->rules[first].comp].name, cfg->rules[first].line);
}

/* See config.h. */
uint64_t cfg_pool_most(const struct bs_config *cfg, size_t p)
{
	uint64_t ceil = 0, room = (uint64_t)cfg->pools[p].size - cfg->pools[p].reserved;

	for (size_t i = 0; i < cfg->ncomp; i++)
		if (cfg->comp[i].pool == (int)p)
			ceil += cfg->comp[i].max_connections;
	return ceil < room ? ceil : room;
}

/* Checks that the compartments' max_connections fit in the budget's pool
 * less its reserve; a pool of compartments counts once, as the most it
 * can have in use (its members' ceilings overlap by design). Returns 0,
 * or -EINVAL (-ENOMEM) with a message. */
int cfg_check_budget(struct cfg_ctx *c)
{
	const struct bs_config *cfg = c->cfg;
	uint64_t sum = 0;
	char tail[64], *list;
	size_t len = 0, cap, room;

	size_t ncounted = 0;

	/* A compartment with only max_inflight holds no connection permits,
	 * so it takes nothing from the pool. */
	for (size_t i = 0; i < cfg->ncomp; i++) {
		if (cfg->comp[i].pool != BS_NO_POOL)
			continue;
		sum += cfg->comp[i].max_connections;
		ncounted += cfg->comp[i].max_connections != 0;
	}
	for (size_t p = 0; p < cfg->npools; p++) {
		sum += cfg_pool_most(cfg, p);
		ncounted++;
	}
	if (!cfg->has_budget || sum <= (uint64_t)cfg->pool - cfg->reserved)
		return 0;
	if (cfg->reserved != 0)
		snprintf(tail, sizeof(tail), "%u - %u reserved", cfg->pool, cfg->reserved);
	else
		snprintf(tail, sizeof(tail), "%u", cfg->pool);
	/* Each allocation in config order, unless that cannot fit one message. */
	cap = cfg->ncomp * 12 + cfg->npools * (BS_NAME_MAX + 20) + 1;
	list = malloc(cap);
	if (list == NULL)
		return cfg_fail(c, c->budget, -ENOMEM, "out of memory");
	list[0] = '\0';
	for (size_t i = 0; i < cfg->ncomp; i++)
		if (cfg->comp[i].max_connections != 0 && cfg->comp[i].pool == BS_NO_POOL)
			len += (size_t)snprintf(list + len, cap - len, "%s%u", len ? " + " : "",
						cfg->comp[i].max_connections);
	for (size_t p = 0; p < cfg->npools; p++)
		len += (size_t)snprintf(list + len, cap - len, "%s%llu (pool %s)", len ? " + " : "",
					(unsigned long long)cfg_pool_most(cfg, p), cfg->pools[p].name);
	room = c->errlen < BS_ERRLEN ? c->errlen : BS_ERRLEN;
	if (len + strlen(tail) + strlen(c->path) + 64 < room)
		cfg_fail(c, c->budget, -EINVAL, "budget exceeded: %s = %llu > %s", list,
			 (unsigned long long)sum, tail);
	else
		cfg_fail(c, c->budget, -EINVAL,
			 "budget exceeded: the %zu compartments' max_connections sum to %llu > %s",
			 ncounted, (unsigned long long)sum, tail);
	free(list);
	return -EINVAL;
}

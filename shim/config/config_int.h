/* config_int.h - private to config*.c: the state of one cfg_load and its pieces. */
#ifndef BULKSHIM_CONFIG_INT_H
#define BULKSHIM_CONFIG_INT_H

#include "config/config.h"

struct config_setting_t;	/* libconfig's config_setting_t */

/* Where a parsed destination came from, for the duplicate message. The
 * strings belong to libconfig and are only read before config_destroy. */
struct rule_src {
	const char *text;
	const char *file;
};

/* A stretch of a config's text as parsed (cfg_read_file): its lines from
 * `first` on are those of `file` (NULL: the config itself) from `line` on. */
struct cfg_span {
	int first, line;
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
	const struct config_setting_t *budget;
	const struct config_setting_t *sockets;	/* max_sockets, when set */
	char *text;		/* the text parsed, to place string elements */
	size_t *line_end;	/* offset of the end of each line */
	size_t nlines;
	struct cfg_span *span;	/* where each line of text comes from */
	size_t nspan, spancap;
	char **files;		/* the included files' names, for the spans */
	size_t nfiles;
	bool all;		/* report every error, not only the first (cfg_load_all) */
	int first_rc;		/* the first error's code, when all */
	int scan_line;		/* string_at(): where the last string found ends, */
	size_t scan_off;	/* so a line of many strings is scanned once */
};

/* config_file.c: a config's text, read so that no file can stall the reader. */
#define BS_CONFIG_MAX	(16u << 20)	/* bytes of a config and all it includes */
/* Reads the file c->path into c->text (NUL-terminated) and c->line_end,
 * each @include line replaced by the text of the file it names (a relative
 * name found after dir, when not NULL), ten deep at most, and c->span: the
 * config and each file it includes must be a regular file, read without
 * blocking, BS_CONFIG_MAX bytes in all, with no NUL byte. Returns 0, or
 * -errno (-ENOENT, -EISDIR, -EINVAL, -EFBIG...) with the message in c's
 * error buffer; the caller calls cfg_text_free either way. */
int cfg_read_file(struct cfg_ctx *c, const char *dir);
void cfg_text_free(struct cfg_ctx *c);

/* config_setting.c: typed access to settings, with messages at FILE:LINE. */
/* The file (NULL: the config itself) and line of line `line` of c->text. */
void cfg_place(const struct cfg_ctx *c, int line, const char **file, int *at);
int cfg_fail_at(struct cfg_ctx *c, const char *file, int line, int rc, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
/* The file (NULL: the config itself) and line where setting s is written. */
void cfg_where(const struct cfg_ctx *c, const struct config_setting_t *s, const char **file,
    int *line);
int cfg_line_of(const struct cfg_ctx *c, const struct config_setting_t *s);
int cfg_fail(struct cfg_ctx *c, const struct config_setting_t *s, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* After a failed step: in cfg_load_all mode keeps rc as the result and
 * returns true (go on to find the next error); else returns false. */
bool cfg_go_on(struct cfg_ctx *c, int rc);
const char *cfg_type_name(int type);
const char *cfg_key_of(const struct config_setting_t *s);
int cfg_unknown_key(struct cfg_ctx *c, const struct config_setting_t *s, const char *const *known,
		    const char *where);
bool cfg_is_known(const char *name, const char *const *known);
int cfg_get_int(struct cfg_ctx *c, const struct config_setting_t *s, long long *out);
int cfg_get_range(struct cfg_ctx *c, const struct config_setting_t *s, long long lo, long long hi,
		  long long *out);
int cfg_get_bool(struct cfg_ctx *c, const struct config_setting_t *s, bool *out);
int cfg_get_string(struct cfg_ctx *c, const struct config_setting_t *s, const char **out);
int cfg_check_name(struct cfg_ctx *c, const struct config_setting_t *s, const char *what,
		   const char *name);
/* config_comp.c: classes, compartments and their destinations, then checks across them. */
int cfg_push_rule(struct cfg_ctx *c, const struct rule *r, const char *text, const char *file);
int cfg_parse_classes(struct cfg_ctx *c, const struct config_setting_t *s);
int cfg_parse_compartments(struct cfg_ctx *c, const struct config_setting_t *s);
int cfg_check_duplicates(struct cfg_ctx *c);
int cfg_check_budget(struct cfg_ctx *c);
/* config_pool.c: pools, a compartment's `pool` and `guaranteed`, and the
 * pools' start-up assertion (sum of guarantees within size - reserved). */
int cfg_parse_pools(struct cfg_ctx *c, const struct config_setting_t *s);
int cfg_parse_comp_pool(struct cfg_ctx *c, const struct config_setting_t *g,
    struct cfg_compartment *comp);
int cfg_check_pools(struct cfg_ctx *c);
/* config_fleet.c: the fleet block and the fleet keys of a compartment. */
int cfg_parse_fleet(struct cfg_ctx *c, const struct config_setting_t *s);
int cfg_parse_comp_fleet(struct cfg_ctx *c, const struct config_setting_t *g,
    struct cfg_compartment *comp);
int cfg_check_fleet(struct cfg_ctx *c);
/* config_resolve.c: host-name destinations, resolved at load with a bounded wait. */
int cfg_resolve_hosts(struct cfg_ctx *c);
/* config_adaptive.c: the `adaptive = { ... }` group of a compartment. */
int cfg_parse_adaptive(struct cfg_ctx *c, const struct config_setting_t *s,
    struct cfg_compartment *comp);

#endif

/* live_diff.c - what `bulkshim reload` changes, setting by setting, which live `set` it undoes, and whether a `set` keeps the budget. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

enum kind { K_LIMIT, K_NUM, K_BOOL, K_ALLOW, K_ERRNO, K_CLASS, K_ADMODE, K_ADKIND, K_ADALG };

/* One setting of a compartment, as the segment holds it. */
struct setting {
	char key[BS_CLASS_NAME_MAX + 8];
	enum kind kind;
	uint32_t v;
};

#define NADAPTIVE 8	/* the adaptive limit's settings */
#define NSETTINGS (9 + NADAPTIVE + BS_MAX_CLASSES)

/* The adaptive limit of c in whole permits, on or pinned (ad_current's
 * reading of the controller's word). */
static uint32_t
ad_limit_now(const struct seg_comp *c)
{
	uint32_t l = AD_CTL_LIMIT(atomic_load(&c->ad.ctl)) / 16;

	return l > 0 ? l : 1;
}

/* The settings of c, in a fixed order; returns how many. */
static size_t
settings_of(const struct seg_comp *c, const struct seg_header *h, struct setting *out)
{
	const struct {
		const char *key;
		enum kind kind;
		uint32_t v;
	} plain[] = {
		{ "max_connections", K_LIMIT, atomic_load(&c->limit) },
		{ "max_inflight", K_LIMIT, atomic_load(&c->inflight_limit) },
		{ "enforce", K_BOOL, atomic_load(&c->enforce) },
		{ "drills", K_ALLOW, atomic_load(&c->drill.allowed) },
		{ "errno", K_ERRNO, (uint32_t)atomic_load(&c->reject_errno) },
		{ "max_wait_ms", K_NUM, atomic_load(&c->max_wait_ms) },
		{ "max_waiting", K_NUM, atomic_load(&c->max_waiting) },
		{ "connect_timeout_ms", K_NUM, atomic_load(&c->connect_timeout_ms) },
		{ "io_timeout_ms", K_NUM, atomic_load(&c->io_timeout_ms) },
	};
	/* The adaptive limit's settings, and the limit itself (a reload
	 * keeps it within the new bounds: live_diff works out where). A
	 * compartment that is not adaptive has none of them, whatever its
	 * words kept from an earlier config. */
	bool ad = atomic_load(&c->ad.mode) != AD_NONE;
	const struct {
		const char *key;
		enum kind kind;
		uint32_t v;
	} adaptive[NADAPTIVE] = {
		{ "adaptive", K_ADMODE, atomic_load(&c->ad.mode) },
		{ "adaptive.applies_to", K_ADKIND, ad ? atomic_load(&c->ad.kind) : 0 },
		{ "adaptive.algorithm", K_ADALG, ad ? atomic_load(&c->ad.algorithm) : 0 },
		{ "adaptive.min", K_NUM, ad ? atomic_load(&c->ad.min) : 0 },
		{ "adaptive.max", K_NUM, ad ? atomic_load(&c->ad.max) : 0 },
		{ "adaptive.window_ms", K_NUM, ad ? atomic_load(&c->ad.window_ms) : 0 },
		{ "adaptive.tolerance_pct", K_NUM, ad ? atomic_load(&c->ad.tolerance_pct) : 0 },
		{ "adaptive.limit", K_NUM, ad ? ad_limit_now(c) : 0 },
	};
	size_t n = 0;

	for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++, n++) {
		snprintf(out[n].key, sizeof(out[n].key), "%s", plain[i].key);
		out[n].kind = plain[i].kind;
		out[n].v = plain[i].v;
	}
	for (size_t i = 0; i < NADAPTIVE; i++, n++) {
		snprintf(out[n].key, sizeof(out[n].key), "%s", adaptive[i].key);
		out[n].kind = adaptive[i].kind;
		out[n].v = adaptive[i].v;
	}
	for (uint32_t k = 1; k < h->nclass && k < BS_MAX_CLASSES; k++, n++) {
		snprintf(out[n].key, sizeof(out[n].key), "class.%.*s", BS_CLASS_NAME_MAX - 1,
		    h->class_name[k]);
		out[n].kind = K_CLASS;
		out[n].v = atomic_load(&c->cls[k].limit);
	}
	return n;
}

static const char *
text_of(const struct setting *s, uint32_t v, char *buf, size_t len)
{
	const char *e;

	switch (s->kind) {
	case K_LIMIT:
		return cli_limit_text(v, buf, len);
	case K_BOOL:
		return v ? "on" : "off (observe)";
	case K_ALLOW:
		return v ? "allowed" : "not allowed";
	case K_ERRNO:
		e = cfg_errno_name((int)v);
		return e != NULL ? e : "?";
	case K_CLASS:
		if (v == 0)
			return "none";
		break;
	case K_ADMODE:
		return v == AD_OFF ? "off (pinned)" : ad_mode_name(v);
	case K_ADKIND:
		return v == P_CONN ? "connections" : v == P_INFLIGHT ? "inflight" : "-";
	case K_ADALG:
		return ad_alg_name(v);
	case K_NUM:
		break;
	}
	snprintf(buf, len, "%u", v);
	return buf;
}

/* The settings config compartment cc would give a segment compartment
 * (seg_apply_limits into a scratch copy, classes renumbered by kmap). */
static void
wanted(const struct bs_config *cfg, size_t i, const int *kmap, struct seg_comp *scratch)
{
	struct cfg_compartment cc = cfg->comp[i];

	memset(cc.class_limit, 0, sizeof(cc.class_limit));
	memset(cc.class_guaranteed, 0, sizeof(cc.class_guaranteed));
	for (size_t k = 0; k < cfg->nclass && k < BS_MAX_CLASSES; k++)
		if (kmap[k] >= 0) {
			cc.class_limit[kmap[k]] = cfg->comp[i].class_limit[k];
			cc.class_guaranteed[kmap[k]] = cfg->comp[i].class_guaranteed[k];
		}
	seg_apply_limits(scratch, &cc);
}

/* The class map of cfg onto h, -1 for a class the segment lacks. */
static void
class_map(const struct seg_header *h, const struct bs_config *cfg, int *kmap)
{
	for (size_t k = 0; k < BS_MAX_CLASSES; k++) {
		kmap[k] = -1;
		for (uint32_t j = 0; k < cfg->nclass && j < h->nclass && j < BS_MAX_CLASSES; j++)
			if (strncmp(h->class_name[j], cfg->classes[k].name, BS_CLASS_NAME_MAX) == 0)
				kmap[k] = (int)j;
	}
}

/* True if `bulkshim set` changed key of comp since the last reload: the
 * segment's log of live changes has the line "COMP KEY". */
bool
live_was_set(const struct seg_header *h, const char *comp, const char *key)
{
	size_t n = strnlen(h->live_set, sizeof(h->live_set)), lc = strlen(comp), lk = strlen(key);

	for (const char *p = h->live_set, *end = p + n; p < end;) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);

		if (len == lc + 1 + lk && memcmp(p, comp, lc) == 0 && p[lc] == ' ' &&
		    memcmp(p + lc + 1, key, lk) == 0)
			return true;
		p += len + 1;
	}
	return false;
}

void
live_note_set(struct seg_header *h, const char *comp, const char *key)
{
	size_t n = strnlen(h->live_set, sizeof(h->live_set));
	int w;

	if (live_was_set(h, comp, key))
		return;
	w = snprintf(h->live_set + n, sizeof(h->live_set) - n, "%s %s\n", comp, key);
	if (w < 0 || (size_t)w >= sizeof(h->live_set) - n)
		h->live_set[n] = '\0';	/* full: that change goes unnoted */
}

size_t
live_diff(const struct seg *s, const struct bs_config *cfg, const int *cmap)
{
	const struct seg_header *h = seg_header(s);
	struct seg_comp *want = calloc(1, sizeof(*want));
	struct setting now[NSETTINGS], to[NSETTINGS];
	int kmap[BS_MAX_CLASSES];
	char a[24], b[24];
	size_t changes = 0;

	if (want == NULL) {
		fprintf(stderr, "bulkshim: out of memory\n");
		return 0;
	}
	class_map(h, cfg, kmap);
	for (size_t i = 0; i < cfg->ncomp; i++) {
		const struct seg_comp *live = seg_comp(s, (uint32_t)cmap[i]);
		size_t n = settings_of(live, h, now);

		memset(want, 0, sizeof(*want));
		wanted(cfg, i, kmap, want);
		settings_of(want, h, to);
		for (size_t k = 0; k < n; k++) {
			/* A reload keeps the limit an adaptive compartment
			 * learned (or was pinned at), within the new bounds
			 * (ad_apply); a newly adaptive one starts at `initial`. */
			if (strcmp(now[k].key, "adaptive.limit") == 0 &&
			    atomic_load(&live->ad.mode) != AD_NONE && to[k].v != 0) {
				uint32_t lo = atomic_load(&want->ad.min), hi = atomic_load(&want->ad.max);

				to[k].v = now[k].v < lo ? lo : now[k].v > hi ? hi : now[k].v;
			}
			if (now[k].v == to[k].v)
				continue;
			changes++;
			printf("  %s %s %s -> %s%s\n", CLI_SEGNAME(live->name), now[k].key,
			    text_of(&now[k], now[k].v, a, sizeof(a)),
			    text_of(&to[k], to[k].v, b, sizeof(b)),
			    live_was_set(h, live->name, now[k].key) ?
			    "   (reverts a live `bulkshim set`)" : "");
		}
	}
	free(want);
	return changes;
}

/* ---- the sums a `set` must keep ---- */

static int
comp_index(const struct seg *s, const char *name)
{
	for (uint32_t j = 0; j < s->ncomp; j++)
		if (strncmp(seg_comp(s, j)->name, name, BS_NAME_MAX) == 0)
			return (int)j;
	return -1;
}

/* Puts into cfg the limits, guarantees and pool sizes the segment has
 * now, for the compartments and pools both know. */
static void
live_values(const struct seg *s, struct bs_config *cfg)
{
	const struct seg_header *h = seg_header(s);

	for (size_t i = 0; i < cfg->ncomp; i++) {
		int j = comp_index(s, cfg->comp[i].name);
		uint32_t lim;

		if (j < 0)
			continue;
		lim = atomic_load(&seg_comp(s, (uint32_t)j)->limit);
		cfg->comp[i].max_connections = lim == UINT32_MAX ? 0 : lim;
		if (cfg->comp[i].pool != BS_NO_POOL)
			cfg->comp[i].guaranteed = atomic_load(&seg_comp(s, (uint32_t)j)->guaranteed);
	}
	for (size_t p = 0; p < cfg->npools; p++) {
		int q = cli_find_pool(s, cfg->pools[p].name);

		if (q < 0)
			continue;
		cfg->pools[p].size = atomic_load(&h->pools[q].size);
		cfg->pools[p].reserved = atomic_load(&h->pools[q].reserved);
	}
}

/* Puts the change into cfg. Returns 1 if it may break a sum, 0 if it
 * cannot (it only lowers limits or guarantees, so every sum only falls;
 * a ceiling below its guarantee is the setter's own check), -1 if it
 * names nothing cfg has (a compartment or pool the file lacks). A pool's
 * size or reserve moves two sums in opposite directions: always 1. */
static int
put_change(struct bs_config *cfg, const char *name, const char *key, uint32_t v)
{
	int r = -1;

	if (strcmp(key, "size") == 0 || strcmp(key, "reserved") == 0) {
		for (size_t p = 0; p < cfg->npools; p++) {
			if (strcmp(cfg->pools[p].name, name) != 0)
				continue;
			if (key[0] == 's')
				cfg->pools[p].size = v;
			else
				cfg->pools[p].reserved = v;
			r = 1;
		}
		return r;
	}
	for (size_t i = 0; i < cfg->ncomp; i++) {
		uint32_t *word = key[0] == 'm' ? &cfg->comp[i].max_connections :
		    &cfg->comp[i].guaranteed;

		if (name != NULL && strcmp(cfg->comp[i].name, name) != 0)
			continue;
		if (r < 0)
			r = 0;
		/* A max_connections of 0 (none) counts nothing in the budget. */
		if (v > *word || (key[0] == 'm' && *word == 0))
			r = 1;
		*word = v;
	}
	return r;
}

bool
live_sums_ok(const struct seg *s, const char *config, const char *name, const char *key,
    const char *value, bool force)
{
	static const char *const keys[] = { "max_connections", "guaranteed", "size", "reserved" };
	const struct seg_header *h = seg_header(s);
	char path[sizeof(h->config_path)], err[BS_ERRLEN];
	struct bs_config cfg;
	bool known = false;
	uint64_t v;
	int r;

	for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++)
		known = known || strcmp(key, keys[k]) == 0;
	/* A value that is no number is refused by the setter itself. */
	if (!known || !cli_parse_u64(value, &v) || v > UINT32_MAX)
		return true;
	snprintf(path, sizeof(path), "%s", config != NULL ? config : h->config_path);
	/* The segment's own record, written by whoever created or reloaded
	 * it, counts only as an absolute path: a relative one was relative
	 * to that process's directory. */
	if (path[0] == '\0' || (config == NULL && path[0] != '/')) {
		fprintf(stderr, "bulkshim: note: the budget is not checked: segment %s records no "
		    "config file by absolute path (-c FILE names one)\n", CLI_SEGNAME(h->name));
		return true;
	}
	if (cfg_load(path, &cfg, false, err, sizeof(err)) < 0) {
		fprintf(stderr, "bulkshim: note: the budget is not checked: %s\n", err);
		return true;
	}
	if (strncmp(cfg.segment, h->name, sizeof(cfg.segment)) != 0) {
		fprintf(stderr, "bulkshim: note: the budget is not checked: %s is now the config of "
		    "segment %s, not %s\n", path, cfg.segment, CLI_SEGNAME(h->name));
		cfg_free(&cfg);
		return true;
	}
	live_values(s, &cfg);
	if (put_change(&cfg, name, key, (uint32_t)v) <= 0) {
		cfg_free(&cfg);
		return true;
	}
	/* A pool's guarantees beyond its room, or above a ceiling, are
	 * refused by the setter itself with the same sums, and no --force
	 * makes the pool lend what it has not: left to it. */
	r = cfg_check_sums(&cfg, CFG_SUM_POOLS, err, sizeof(err));
	if (r == 0)
		r = cfg_check_sums(&cfg, CFG_SUM_BUDGET, err, sizeof(err));
	else if (r != -ENOMEM)
		r = 0;
	cfg_free(&cfg);
	if (r == 0)
		return true;
	if (r == -ENOMEM) {
		fprintf(stderr, "bulkshim: out of memory\n");
		return false;
	}
	fprintf(stderr, "bulkshim: %s %s %s %s with the segment's other limits: %s; `check` and "
	    "`reload` refuse this%s\n", force ? "--force: setting" : "not set:",
	    name != NULL ? name : "--all", key, value, err,
	    force ? "" : " (--force sets it anyway)");
	return force;
}

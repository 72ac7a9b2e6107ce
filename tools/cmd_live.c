/* cmd_live.c - changing a live segment: `bulkshim set`, `reload` and `reset`. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/*
 * Everything here writes the shared segment with atomic stores, so every
 * attached process sees a change at its next admission. Nothing is revoked:
 * a limit lowered below what is in use lets the count drain through the
 * normal releases, exactly as seg_apply_limits does for a reload.
 */

/* Wakes every caller waiting on a counter word, so that a raised limit is
 * seen now rather than at the waiter's next 100 ms poll. */
static void
wake_all(_Atomic uint32_t *word)
{
	sys_futex_wake(word, INT_MAX);
}

static int
find_class(const struct seg *s, const char *name)
{
	const struct seg_header *h = seg_header(s);

	for (uint32_t k = 0; k < h->nclass && k < BS_MAX_CLASSES; k++) {
		if (strncmp(h->class_name[k], name, BS_CLASS_NAME_MAX) == 0)
			return (int)k;
	}
	return -1;
}

/* "no compartment "x" in segment s (did you mean "y"?)": the closest name
 * when one is close, the whole list only when it is short. */
static void
no_such_comp(const struct seg *s, const char *name)
{
	const struct seg_header *h = seg_header(s);
	const char **names = calloc(s->ncomp + 1, sizeof(*names));
	const char *best = NULL;

	for (uint32_t i = 0; names != NULL && i < s->ncomp; i++)
		names[i] = seg_comp(s, i)->name;
	if (names != NULL)
		best = cfg_closest(name, names);
	free(names);
	fprintf(stderr, "bulkshim: no compartment \"%s\" in segment %s", name,
	    CLI_SEGNAME(h->name));
	if (best != NULL) {
		fprintf(stderr, " (did you mean \"%s\"?)\n", best);
	} else if (s->ncomp <= 8) {
		fprintf(stderr, " (it has");
		for (uint32_t i = 0; i < s->ncomp; i++)
			fprintf(stderr, "%s %s", i ? "," : "", CLI_SEGNAME(seg_comp(s, i)->name));
		fprintf(stderr, ")\n");
	} else {
		fprintf(stderr, " (it has %u; `bulkshim list %s` names them)\n", s->ncomp,
		    CLI_SEGNAME(h->name));
	}
}

/* ---- set ---- */

static int
parse_range(const char *key, const char *value, uint64_t lo, uint64_t hi, uint32_t *out)
{
	uint64_t v;

	if (!cli_parse_u64(value, &v)) {
		fprintf(stderr, "bulkshim: %s must be a whole number, not \"%s\"\n", key, value);
		return -1;
	}
	if (v < lo || v > hi) {
		fprintf(stderr, "bulkshim: %s must be between %llu and %llu, not %llu\n", key,
		    (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)v);
		return -1;
	}
	*out = (uint32_t)v;
	return 0;
}

static int
parse_switch(const char *value, uint32_t *out)
{
	static const char *const on[] = { "on", "true", "1", "yes", NULL };
	static const char *const off[] = { "off", "false", "0", "no", NULL };

	for (int i = 0; on[i] != NULL; i++) {
		if (strcmp(value, on[i]) == 0) {
			*out = 1;
			return 0;
		}
		if (strcmp(value, off[i]) == 0) {
			*out = 0;
			return 0;
		}
	}
	fprintf(stderr, "bulkshim: enforce must be on or off (true/false, 1/0), not \"%s\"\n",
	    value);
	return -1;
}

/* The word KEY names in c, its range, and how to show it. */
struct live_key {
	const char *key;
	size_t off;		/* offsetof(struct seg_comp, ...) */
	uint64_t lo, hi;
	bool is_limit;		/* UINT32_MAX means none; raising it wakes waiters */
};

static const struct live_key keys[] = {
	{ "max_connections", offsetof(struct seg_comp, limit), 1, BS_MAX_LIMIT, true },
	{ "max_inflight", offsetof(struct seg_comp, inflight_limit), 1, BS_MAX_LIMIT, true },
	{ "max_wait_ms", offsetof(struct seg_comp, max_wait_ms), 0, BS_MAX_WAIT_MS, false },
	{ "max_waiting", offsetof(struct seg_comp, max_waiting), 1, BS_MAX_LIMIT, false },
	{ "connect_timeout_ms", offsetof(struct seg_comp, connect_timeout_ms), 0,
	  BS_MAX_TIMEOUT_MS, false },
	{ "io_timeout_ms", offsetof(struct seg_comp, io_timeout_ms), 0, BS_MAX_TIMEOUT_MS, false },
};

static int
set_class(struct seg *s, struct seg_comp *c, const char *cls, const char *value)
{
	int k = find_class(s, cls);
	uint32_t v, old, lim = atomic_load(&c->limit);

	if (k < 0) {
		const struct seg_header *h = seg_header(s);

		fprintf(stderr, "bulkshim: no class \"%s\" in segment %s (it has", cls,
		    CLI_SEGNAME(h->name));
		for (uint32_t i = 0; i < h->nclass && i < BS_MAX_CLASSES; i++)
			fprintf(stderr, "%s %s", i ? "," : "", h->class_name[i]);
		fprintf(stderr, ")\n");
		return 1;
	}
	if (parse_range("a class limit", value, 0, BS_MAX_LIMIT, &v) < 0)
		return 1;
	if (v != 0 && lim != UINT32_MAX && v > lim) {
		fprintf(stderr, "bulkshim: class limit %s = %u is above max_connections %u of \"%s\"\n",
		    cls, v, lim, CLI_SEGNAME(c->name));
		return 1;
	}
	old = atomic_exchange(&c->cls[k].limit, v);
	printf("%s: %s class.%s %u -> %u%s\n", CLI_SEGNAME(seg_header(s)->name),
	    CLI_SEGNAME(c->name), cls, old, v,
	    v == 0 ? " (no cap)" : "");
	return 0;
}

/* `set NAME adaptive off` pins the adaptive limit where it is (into the
 * static limit word); `on` resumes it from there. */
static int
set_adaptive(struct seg *s, struct seg_comp *c, const char *value)
{
	_Atomic uint32_t *word = atomic_load(&c->ad.kind) == P_CONN ? &c->limit : &c->inflight_limit;
	uint32_t v, was = atomic_load(&c->ad.mode);

	if (parse_switch(value, &v) < 0)
		return 1;
	if (ad_set_mode(c, v != 0) < 0) {
		fprintf(stderr, "bulkshim: \"%s\" has no adaptive limit (add adaptive = { min = ...; "
		    "max = ...; } to its config and reload)\n", CLI_SEGNAME(c->name));
		return 1;
	}
	if (v)
		printf("%s: %s adaptive %s -> on (resumes from %u; static limit %u is the ceiling "
		    "again)\n", CLI_SEGNAME(seg_header(s)->name), CLI_SEGNAME(c->name),
		    ad_mode_name(was),
		    ad_current(c), atomic_load(word));
	else
		printf("%s: %s adaptive %s -> off (pinned at %u)\n",
		    CLI_SEGNAME(seg_header(s)->name), CLI_SEGNAME(c->name),
		    ad_mode_name(was), atomic_load(word));
	wake_all(atomic_load(&c->ad.kind) == P_CONN ? &c->in_use : &c->inflight);
	return 0;
}

static int
apply_set(struct seg *s, struct seg_comp *c, const char *key, const char *value)
{
	char seg[BS_NAME_MAX];
	uint32_t v, old;

	log_name(seg, sizeof(seg), seg_header(s)->name, sizeof(seg_header(s)->name));

	if (strncmp(key, "class.", 6) == 0)
		return set_class(s, c, key + 6, value);
	if (strncmp(key, "guaranteed.", 11) == 0) {
		int k = find_class(s, key + 11);

		/* An unknown class: set_class says which there are. */
		if (k < 0)
			return set_class(s, c, key + 11, value);
		if (parse_range("a class guarantee", value, 0, BS_MAX_LIMIT, &v) < 0)
			return 1;
		return cli_set_class_guaranteed(s, (uint32_t)(c - seg_comp(s, 0)), (uint32_t)k, v);
	}
	if (strcmp(key, "guaranteed") == 0) {
		if (parse_range(key, value, 0, BS_MAX_LIMIT, &v) < 0)
			return 1;
		return cli_set_guaranteed(s, (uint32_t)(c - seg_comp(s, 0)), v);
	}
	if (strcmp(key, "enforce") == 0) {
		if (parse_switch(value, &v) < 0)
			return 1;
		old = atomic_exchange(&c->enforce, v);
		printf("%s: %s enforce %s -> %s%s\n", seg, CLI_SEGNAME(c->name),
		    old ? "on" : "off",
		    v ? "on" : "off", v ? "" : " (observe mode: count, refuse nothing)");
		return 0;
	}
	if (strcmp(key, "adaptive") == 0)
		return set_adaptive(s, c, value);
	if (strcmp(key, "errno") == 0) {
		int e = cfg_errno_value(value);

		if (e < 0) {
			fprintf(stderr, "bulkshim: unknown errno \"%s\" (use ECONNREFUSED, EAGAIN, "
			    "ETIMEDOUT, EHOSTUNREACH or ENETUNREACH)\n", value);
			return 1;
		}
		if (e == EAGAIN && atomic_load(&c->inflight_limit) != UINT32_MAX) {
			fprintf(stderr, "bulkshim: %s: %s\n", CLI_SEGNAME(c->name),
			    cfg_eagain_spin);
			return 1;
		}
		old = (uint32_t)atomic_exchange(&c->reject_errno, e);
		printf("%s: %s errno %s -> %s\n", seg, CLI_SEGNAME(c->name),
		    cfg_errno_name((int)old) ? cfg_errno_name((int)old) : "?", value);
		return 0;
	}
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		_Atomic uint32_t *word;
		char was[16];
		bool pinned;

		if (strcmp(key, keys[i].key) != 0)
			continue;
		if (parse_range(key, value, keys[i].lo, keys[i].hi, &v) < 0)
			return 1;
		if (strcmp(key, "max_inflight") == 0 && atomic_load(&c->reject_errno) == EAGAIN) {
			fprintf(stderr, "bulkshim: %s: %s\n", CLI_SEGNAME(c->name),
			    cfg_eagain_spin);
			return 1;
		}
		word = (_Atomic uint32_t *)(void *)((char *)c + keys[i].off);
		if (word == &c->limit && !cli_ceiling_ok(s, (uint32_t)(c - seg_comp(s, 0)), v))
			return 1;
		/* A number set for the limit the adaptive one moves pins it
		 * there, and a pinned one again where it is set now. */
		pinned = keys[i].is_limit && atomic_load(&c->ad.mode) != AD_NONE &&
		    word == (atomic_load(&c->ad.kind) == P_CONN ? &c->limit : &c->inflight_limit);
		old = atomic_exchange(word, v);
		if (pinned)
			ad_pin(c, v);
		if (keys[i].is_limit)
			cli_limit_text(old, was, sizeof(was));
		else
			snprintf(was, sizeof(was), "%u", old);
		printf("%s: %s %s %s -> %u", seg, CLI_SEGNAME(c->name), key, was, v);
		if (keys[i].is_limit) {
			_Atomic uint32_t *count = word == &c->limit ? &c->in_use : &c->inflight;
			uint32_t now = atomic_load(count);

			if (now > v)
				printf(" (%u in use: nothing is revoked; new admissions wait for it "
				    "to fall below %u)", now, v);
			wake_all(count);
		}
		if (strcmp(key, "max_waiting") == 0 && atomic_load(&c->max_wait_ms) == 0)
			printf(" (max_wait_ms is 0: nobody waits until it is raised)");
		if (pinned)
			printf(" (adaptive limit off: pinned at %u; `adaptive on` resumes)", v);
		putchar('\n');
		return 0;
	}
	fprintf(stderr, "bulkshim: unknown key \"%s\" (use max_connections, max_inflight, "
	    "max_wait_ms, max_waiting, connect_timeout_ms, io_timeout_ms, errno, enforce, "
	    "adaptive, guaranteed, class.NAME or guaranteed.NAME; size or reserved of a pool)\n",
	    key);
	return 1;
}

/* Sets KEY on one compartment, or with --all on every one: the kill
 * switch (`set --all enforce off`) when the bulkheads themselves are
 * suspected. Each change is noted for `reload` to name. */
int
cmd_set(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ "all", no_argument, NULL, 'a' },
		{ "force", no_argument, NULL, 'f' },
		{ NULL, 0, NULL, 0 },
	};
	struct cli_target t = { NULL, NULL };
	char *key = NULL, *value = NULL, *eq;
	const char *config;
	bool all = false, force = false;
	struct seg *s;
	int c, i, r = 0;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+c:s:fh", longopts, NULL)) != -1) {
		if (cli_target_opt(&t, c, optarg))
			continue;
		if (c == 'a') {
			all = true;
			continue;
		}
		if (c == 'f') {
			force = true;
			continue;
		}
		if (c == 'h')
			return cli_help("set", stdout, 0);
		return cli_help("set", stderr, 2);
	}
	/* `set NAME KEY VALUE`, or `set NAME KEY=VALUE`; NAME is left out with --all. */
	if (argc - optind == (all ? 1 : 2) && (eq = strchr(argv[argc - 1], '=')) != NULL) {
		*eq = '\0';
		key = argv[argc - 1];
		value = eq + 1;
	} else if (argc - optind == (all ? 2 : 3)) {
		key = argv[argc - 2];
		value = argv[argc - 1];
	}
	if (key == NULL || (t.config != NULL && t.segment != NULL))
		return cli_help("set", stderr, 2);
	if (cli_open(&t, true, &s) < 0)
		return 1;
	/* The budget is the config file's: -c FILE's, the default one when
	 * neither -c nor -s is given, else the one the segment records. */
	config = t.segment != NULL ? NULL : cli_config_path(&t);
	if (!live_sums_ok(s, config, all ? NULL : argv[optind], key, value, force)) {
		seg_close(s);
		return 1;
	}
	if (all) {
		for (uint32_t k = 0; k < s->ncomp && r == 0; k++) {
			r = apply_set(s, seg_comp(s, k), key, value);
			if (r == 0)
				live_note_set(seg_header(s), seg_comp(s, k)->name, key);
		}
		cli_kernel_sync(s);
		seg_settings_changed(s);
		seg_close(s);
		return r;
	}
	i = seg_comp_find(s, argv[optind]);
	if (i < 0 && cli_pool_key(key)) {
		uint32_t v;

		r = parse_range(key, value, 1, BS_MAX_LIMIT, &v) < 0 ? 1 :
		    cli_set_pool(s, argv[optind], key, v);
		seg_close(s);
		return r;
	}
	if (i < 0) {
		no_such_comp(s, argv[optind]);
		seg_close(s);
		return 1;
	}
	r = apply_set(s, seg_comp(s, (uint32_t)i), key, value);
	if (r == 0)
		live_note_set(seg_header(s), argv[optind], key);
	if (r == 0)
		cli_kernel_sync(s);
	seg_settings_changed(s);
	seg_close(s);
	return r;
}

/* ---- reload ---- */

/* Maps the file's classes to the segment's; prints what is missing. */
static int
map_classes(const struct seg *s, const struct bs_config *cfg, int *map)
{
	int missing = 0;

	for (size_t k = 0; k < cfg->nclass && k < BS_MAX_CLASSES; k++) {
		map[k] = find_class(s, cfg->classes[k].name);
		if (map[k] < 0) {
			fprintf(stderr, "bulkshim: class \"%s\" of %s is not in segment %s\n",
			    cfg->classes[k].name, cfg->path, CLI_SEGNAME(seg_header(s)->name));
			missing++;
		}
	}
	return missing;
}

static int
map_comps(const struct seg *s, const struct bs_config *cfg, int *map)
{
	int missing = 0;

	for (size_t i = 0; i < cfg->ncomp; i++) {
		map[i] = seg_comp_find(s, cfg->comp[i].name);
		if (map[i] < 0) {
			fprintf(stderr, "bulkshim: compartment \"%s\" of %s is not in segment %s\n",
			    cfg->comp[i].name, cfg->path, CLI_SEGNAME(seg_header(s)->name));
			missing++;
		}
	}
	return missing;
}

/* A class guarantee changed by a reload, as `set COMP guaranteed.CLASS`
 * does: permits lent to the class move onto a raised guarantee, those
 * within a lowered one become lent (share.c), so that no guarantee is
 * exceeded and none is left unused while the class borrows. */
static void
move_class_shares(struct seg *s, uint32_t i, const uint32_t *was)
{
	struct seg_comp *c = seg_comp(s, i);

	if (!atomic_load(&c->cls_shares))
		return;
	for (uint32_t k = 0; k < BS_MAX_CLASSES; k++)
		share_guarantee_changed(s, c, k, SHARE_CLASS, was[k], atomic_load(&c->cls_guaranteed[k]));
}

/* Writes the file's settings into the segment (live_diff said what changes). */
static void
apply_reload(struct seg *s, const struct bs_config *cfg, const int *cmap, const int *kmap)
{
	for (size_t i = 0; i < cfg->ncomp; i++) {
		struct seg_comp *c = seg_comp(s, (uint32_t)cmap[i]);
		struct cfg_compartment cc = cfg->comp[i];
		uint32_t was[BS_MAX_CLASSES];

		/* The file numbers its classes in its own order; the segment
		 * keeps the order it was created with. */
		memset(cc.class_limit, 0, sizeof(cc.class_limit));
		memset(cc.class_guaranteed, 0, sizeof(cc.class_guaranteed));
		for (size_t k = 0; k < cfg->nclass && k < BS_MAX_CLASSES; k++) {
			cc.class_limit[kmap[k]] = cfg->comp[i].class_limit[k];
			cc.class_guaranteed[kmap[k]] = cfg->comp[i].class_guaranteed[k];
		}
		for (int k = 0; k < BS_MAX_CLASSES; k++)
			was[k] = atomic_load(&c->cls_guaranteed[k]);
		seg_apply_limits(c, &cc);
		move_class_shares(s, (uint32_t)cmap[i], was);
		wake_all(&c->in_use);
		wake_all(&c->inflight);
	}
	seg_settings_changed(s);
}

/* The segment's compartments the file does not name. */
static void
print_unnamed(const struct seg *s, const struct bs_config *cfg, const int *cmap)
{
	for (uint32_t j = 0; j < s->ncomp; j++) {
		bool named = false;

		for (size_t i = 0; i < cfg->ncomp; i++)
			named = named || cmap[i] == (int)j;
		if (!named)
			printf("  %s is not in the file: it counts nothing from the next connect "
			    "on; its limits stay\n", CLI_SEGNAME(seg_comp(s, j)->name));
	}
}

int
cmd_reload(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ "dry-run", no_argument, NULL, 'n' },
		{ NULL, 0, NULL, 0 },
	};
	struct cli_target t = { NULL, NULL };
	int kmap[BS_MAX_CLASSES], *cmap = NULL, c, r = 1;
	bool dry = false;
	size_t n;
	char abs[PATH_MAX], err[BS_ERRLEN];
	struct seg_header *h;
	struct bs_config cfg;
	struct seg *s = NULL;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+c:s:h", longopts, NULL)) != -1) {
		if (cli_target_opt(&t, c, optarg))
			continue;
		if (c == 'n') {
			dry = true;
			continue;
		}
		if (c == 'h')
			return cli_help("reload", stdout, 0);
		return cli_help("reload", stderr, 2);
	}
	if (optind != argc || t.config == NULL)
		return cli_help("reload", stderr, 2);
	/* The running processes read the file again themselves; it must be
	 * named by a path that does not depend on their directory. */
	if (realpath(t.config, abs) == NULL) {
		fprintf(stderr, "bulkshim: %s: %s\n", t.config, strerror(errno));
		return 1;
	}
	if (strlen(abs) >= sizeof(h->config_path)) {
		fprintf(stderr, "bulkshim: %s: path too long\n", abs);
		return 1;
	}
	if (cfg_load(abs, &cfg, true, err, sizeof(err)) < 0) {
		fprintf(stderr, "bulkshim: %s\n", err);
		return 1;
	}
	if (t.segment == NULL)
		t.segment = cfg.segment;
	if (cli_open(&t, true, &s) < 0)
		goto done;
	h = seg_header(s);
	cmap = calloc(cfg.ncomp ? cfg.ncomp : 1, sizeof(*cmap));
	if (cmap == NULL) {
		fprintf(stderr, "bulkshim: out of memory\n");
		goto done;
	}
	if (map_comps(s, &cfg, cmap) + map_classes(s, &cfg, kmap) > 0) {
		fprintf(stderr, "bulkshim: nothing reloaded: adding compartments or classes needs a "
		    "restart of every process attached to segment %s\n", CLI_SEGNAME(h->name));
		goto done;
	}
	if (pool_mismatch(s, &cfg, cmap) != NULL) {
		fprintf(stderr, "bulkshim: nothing reloaded: %s has %s than segment %s, and "
		    "changing which compartment is in which pool needs a restart of every "
		    "process attached to it\n", abs, pool_mismatch(s, &cfg, cmap),
		    CLI_SEGNAME(h->name));
		goto done;
	}
	printf("%s %s into segment %s\n", dry ? "would reload (dry run)" : "reloading", abs,
	    CLI_SEGNAME(h->name));
	n = live_diff(s, &cfg, cmap);
	if (n == 0)
		printf("  no setting changes\n");
	print_unnamed(s, &cfg, cmap);
	if (dry) {
		printf("dry run: nothing changed; without --dry-run, %zu setting%s change%s\n", n,
		    n == 1 ? "" : "s", n == 1 ? "s" : "");
		r = 0;
		goto done;
	}
	apply_reload(s, &cfg, cmap, kmap);
	memset(h->live_set, 0, sizeof(h->live_set));
	cli_reload_pools(s, &cfg, cmap);
	/* The path goes in before the generation moves: a process that sees
	 * the new generation reads this path. */
	memset(h->config_path, 0, sizeof(h->config_path));
	memcpy(h->config_path, abs, strlen(abs));
	seg_note_config(h, abs);
	atomic_thread_fence(memory_order_release);
	printf("generation %u: running processes rebuild their destinations at their next "
	    "connect\n", atomic_fetch_add(&h->generation, 1) + 1);
	r = cli_kernel_reload(&cfg) < 0 ? 1 : 0;
done:
	free(cmap);
	seg_close(s);
	cfg_free(&cfg);
	return r;
}

/* ---- reset ---- */

/* Zeroes the statistics of one compartment or pool, or of all of them
 * (stat_reset, pool_reset_counters); never a permit, a count in use
 * or a limit. */
int
cmd_reset(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct cli_target t = { NULL, NULL };
	struct seg *s;
	uint32_t n, np;
	int c, i = -1, p = -1;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+c:s:h", longopts, NULL)) != -1) {
		if (cli_target_opt(&t, c, optarg))
			continue;
		if (c == 'h')
			return cli_help("reset", stdout, 0);
		return cli_help("reset", stderr, 2);
	}
	if (argc - optind > 1 || (t.config != NULL && t.segment != NULL))
		return cli_help("reset", stderr, 2);
	if (cli_open(&t, true, &s) < 0)
		return 1;
	n = s->ncomp;
	np = seg_header(s)->npools < BS_MAX_POOLS ? seg_header(s)->npools : BS_MAX_POOLS;
	if (optind < argc) {
		/* A compartment's name wins, as before a pool could be named
		 * here: a pool called like a compartment is reset with all. */
		i = seg_comp_find(s, argv[optind]);
		if (i < 0)
			p = cli_find_pool(s, argv[optind]);
		if (i < 0 && p < 0) {
			no_such_comp(s, argv[optind]);
			seg_close(s);
			return 1;
		}
		if (i >= 0) {
			stat_reset(seg_comp(s, (uint32_t)i));
			printf("%s: reset the counters of %s\n", CLI_SEGNAME(seg_header(s)->name),
			    argv[optind]);
		} else {
			pool_reset_counters(s, (uint32_t)p);
			printf("%s: reset the counters of pool %s\n",
			    CLI_SEGNAME(seg_header(s)->name),
			    argv[optind]);
		}
	} else {
		for (uint32_t k = 0; k < n; k++)
			stat_reset(seg_comp(s, k));
		for (uint32_t k = 0; k < np; k++)
			pool_reset_counters(s, k);
		/* Without pools the line is the one scripts already read. */
		printf("%s: reset the counters of %u compartment%s",
		    CLI_SEGNAME(seg_header(s)->name), n,
		    n == 1 ? "" : "s");
		if (np > 0)
			printf(" and %u pool%s", np, np == 1 ? "" : "s");
		putchar('\n');
	}
	/* The kernel engine has compartments only. */
	if (p < 0)
		cli_kernel_reset(s, optind < argc ? argv[optind] : NULL);
	seg_close(s);
	return 0;
}

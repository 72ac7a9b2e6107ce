/* cmd_live.c - changing a live segment: `bulkshim set`, `reload` and `reset`. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
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
	syscall(SYS_futex, (uint32_t *)(uintptr_t)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static int
find_comp(const struct seg *s, const char *name)
{
	const struct seg_header *h = seg_header(s);

	for (uint32_t i = 0; i < h->ncomp; i++) {
		if (strncmp(seg_comp(s, i)->name, name, BS_NAME_MAX) == 0)
			return (int)i;
	}
	return -1;
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

/* "no compartment "x" in segment s (it has a, b, c)" */
static void
no_such_comp(const struct seg *s, const char *name)
{
	const struct seg_header *h = seg_header(s);

	fprintf(stderr, "bulkshim: no compartment \"%s\" in segment %s (it has", name, h->name);
	for (uint32_t i = 0; i < h->ncomp; i++)
		fprintf(stderr, "%s %s", i ? "," : "", seg_comp(s, i)->name);
	fprintf(stderr, ")\n");
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

		fprintf(stderr, "bulkshim: no class \"%s\" in segment %s (it has", cls, h->name);
		for (uint32_t i = 0; i < h->nclass && i < BS_MAX_CLASSES; i++)
			fprintf(stderr, "%s %s", i ? "," : "", h->class_name[i]);
		fprintf(stderr, ")\n");
		return 1;
	}
	if (parse_range("a class limit", value, 0, BS_MAX_LIMIT, &v) < 0)
		return 1;
	if (v != 0 && lim != UINT32_MAX && v > lim) {
		fprintf(stderr, "bulkshim: class limit %s = %u is above max_connections %u of \"%s\"\n",
		    cls, v, lim, c->name);
		return 1;
	}
	old = atomic_exchange(&c->cls[k].limit, v);
	printf("%s: %s class.%s %u -> %u%s\n", seg_header(s)->name, c->name, cls, old, v,
	    v == 0 ? " (no cap)" : "");
	return 0;
}

static int
apply_set(struct seg *s, struct seg_comp *c, const char *key, const char *value)
{
	const char *seg = seg_header(s)->name;
	uint32_t v, old;

	if (strncmp(key, "class.", 6) == 0)
		return set_class(s, c, key + 6, value);
	if (strcmp(key, "enforce") == 0) {
		if (parse_switch(value, &v) < 0)
			return 1;
		old = atomic_exchange(&c->enforce, v);
		printf("%s: %s enforce %s -> %s%s\n", seg, c->name, old ? "on" : "off",
		    v ? "on" : "off", v ? "" : " (observe mode: count, refuse nothing)");
		return 0;
	}
	if (strcmp(key, "errno") == 0) {
		int e = cfg_errno_value(value);

		if (e < 0) {
			fprintf(stderr, "bulkshim: unknown errno \"%s\" (use ECONNREFUSED, EAGAIN, "
			    "ETIMEDOUT, EHOSTUNREACH or ENETUNREACH)\n", value);
			return 1;
		}
		old = (uint32_t)atomic_exchange(&c->reject_errno, e);
		printf("%s: %s errno %s -> %s\n", seg, c->name,
		    cfg_errno_name((int)old) ? cfg_errno_name((int)old) : "?", value);
		return 0;
	}
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		_Atomic uint32_t *word;
		char was[16];

		if (strcmp(key, keys[i].key) != 0)
			continue;
		if (parse_range(key, value, keys[i].lo, keys[i].hi, &v) < 0)
			return 1;
		word = (_Atomic uint32_t *)(void *)((char *)c + keys[i].off);
		old = atomic_exchange(word, v);
		if (keys[i].is_limit)
			cli_limit_text(old, was, sizeof(was));
		else
			snprintf(was, sizeof(was), "%u", old);
		printf("%s: %s %s %s -> %u", seg, c->name, key, was, v);
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
		putchar('\n');
		return 0;
	}
	fprintf(stderr, "bulkshim: unknown key \"%s\" (use max_connections, max_inflight, "
	    "max_wait_ms, max_waiting, connect_timeout_ms, io_timeout_ms, errno, enforce or "
	    "class.NAME)\n", key);
	return 1;
}

int
cmd_set(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct cli_target t = { NULL, NULL };
	struct seg *s;
	int c, i, r;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+c:s:h", longopts, NULL)) != -1) {
		if (cli_target_opt(&t, c, optarg))
			continue;
		if (c == 'h')
			return cli_help("set", stdout, 0);
		return cli_help("set", stderr, 2);
	}
	if (argc - optind != 3 || (t.config != NULL && t.segment != NULL))
		return cli_help("set", stderr, 2);
	if (cli_open(&t, true, &s) < 0)
		return 1;
	i = find_comp(s, argv[optind]);
	if (i < 0) {
		no_such_comp(s, argv[optind]);
		seg_close(s);
		return 1;
	}
	r = apply_set(s, seg_comp(s, (uint32_t)i), argv[optind + 1], argv[optind + 2]);
	if (r == 0)
		cli_kernel_sync(s);
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
			    cfg->classes[k].name, cfg->path, seg_header(s)->name);
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
		map[i] = find_comp(s, cfg->comp[i].name);
		if (map[i] < 0) {
			fprintf(stderr, "bulkshim: compartment \"%s\" of %s is not in segment %s\n",
			    cfg->comp[i].name, cfg->path, seg_header(s)->name);
			missing++;
		}
	}
	return missing;
}

/* Writes the file's settings into the segment and says what changed. */
static void
apply_reload(struct seg *s, const struct bs_config *cfg, const int *cmap, const int *kmap)
{
	const struct seg_header *h = seg_header(s);
	char a[16], b[16];

	for (size_t i = 0; i < cfg->ncomp; i++) {
		struct seg_comp *c = seg_comp(s, (uint32_t)cmap[i]);
		struct cfg_compartment cc = cfg->comp[i];
		uint32_t lim = atomic_load(&c->limit), ilim = atomic_load(&c->inflight_limit);

		/* The file numbers its classes in its own order; the segment
		 * keeps the order it was created with. */
		memset(cc.class_limit, 0, sizeof(cc.class_limit));
		for (size_t k = 0; k < cfg->nclass && k < BS_MAX_CLASSES; k++)
			cc.class_limit[kmap[k]] = cfg->comp[i].class_limit[k];
		seg_apply_limits(c, &cc);
		if (atomic_load(&c->limit) != lim)
			printf("  %s max_connections %s -> %s\n", c->name,
			    cli_limit_text(lim, a, sizeof(a)),
			    cli_limit_text(atomic_load(&c->limit), b, sizeof(b)));
		if (atomic_load(&c->inflight_limit) != ilim)
			printf("  %s max_inflight %s -> %s\n", c->name,
			    cli_limit_text(ilim, a, sizeof(a)),
			    cli_limit_text(atomic_load(&c->inflight_limit), b, sizeof(b)));
		wake_all(&c->in_use);
		wake_all(&c->inflight);
	}
	for (uint32_t j = 0; j < h->ncomp; j++) {
		bool named = false;

		for (size_t i = 0; i < cfg->ncomp; i++)
			named = named || cmap[i] == (int)j;
		if (!named)
			printf("  %s is not in the file: it counts nothing from the next connect "
			    "on; its limits stay\n", seg_comp(s, j)->name);
	}
}

int
cmd_reload(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct cli_target t = { NULL, NULL };
	int kmap[BS_MAX_CLASSES], *cmap = NULL, c, r = 1;
	char abs[PATH_MAX], err[BS_ERRLEN];
	struct seg_header *h;
	struct bs_config cfg;
	struct seg *s = NULL;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+c:s:h", longopts, NULL)) != -1) {
		if (cli_target_opt(&t, c, optarg))
			continue;
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
		    "restart of every process attached to segment %s\n", h->name);
		goto done;
	}
	printf("reloading %s into segment %s\n", abs, h->name);
	apply_reload(s, &cfg, cmap, kmap);
	/* The path goes in before the generation moves: a process that sees
	 * the new generation reads this path. */
	memset(h->config_path, 0, sizeof(h->config_path));
	memcpy(h->config_path, abs, strlen(abs));
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

/* Zeroes the statistics of one compartment or all (seg_reset_counters);
 * never a permit, a count in use or a limit. */
int
cmd_reset(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct cli_target t = { NULL, NULL };
	struct seg *s;
	uint32_t n;
	int c, i = -1;

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
	n = seg_header(s)->ncomp;
	if (optind < argc) {
		i = find_comp(s, argv[optind]);
		if (i < 0) {
			no_such_comp(s, argv[optind]);
			seg_close(s);
			return 1;
		}
		seg_reset_counters(s, (uint32_t)i);
		printf("%s: reset the counters of %s\n", seg_header(s)->name, argv[optind]);
	} else {
		for (uint32_t k = 0; k < n; k++)
			seg_reset_counters(s, k);
		printf("%s: reset the counters of %u compartment%s\n", seg_header(s)->name, n,
		    n == 1 ? "" : "s");
	}
	cli_kernel_reset(s, optind < argc ? argv[optind] : NULL);
	seg_close(s);
	return 0;
}

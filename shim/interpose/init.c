/* init.c - start-up from the environment and the config, live reload, the class, exit. */
#include <errno.h>
#include <fnmatch.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

#include "interpose/interpose.h"

struct shim_state shim;

/* The destination rules of cfg, each pointing at the segment's compartment
 * of the same name, so the hot path needs no second lookup; rules of
 * compartments the segment lacks are left out. *n of them; NULL when out of
 * memory. */
static struct rule *
seg_rules(const struct bs_config *cfg, size_t *n)
{
	struct rule *rules = calloc(cfg->nrules ? cfg->nrules : 1, sizeof(*rules));

	*n = 0;
	if (rules == NULL)
		return NULL;
	for (size_t i = 0; i < cfg->nrules; i++) {
		const char *name = cfg->comp[cfg->rules[i].comp].name;

		for (uint32_t j = 0; j < shim.seg->ncomp; j++) {
			if (strncmp(seg_comp(shim.seg, j)->name, name, BS_NAME_MAX) == 0) {
				rules[*n] = cfg->rules[i];
				rules[(*n)++].comp = (int)j;
				break;
			}
		}
	}
	return rules;
}

/* The path or host name of a rule, "" for an address. */
static const char *
rule_name(const struct rule *r, size_t *len)
{
	if (r->kind == RULE_UNIX) {
		*len = strnlen(r->path, sizeof(r->path));
		return r->path;
	}
	if (r->kind == RULE_HOST) {
		*len = strnlen(r->host, sizeof(r->host));
		return r->host;
	}
	*len = 0;
	return "";
}

/*
 * The rules as written, in order, as one byte string: two configs with the
 * same string give the same answers (start-up's addresses for host names
 * are left out, as a reload resolves nothing and carries them). A reload
 * that changes only limits then keeps the current matcher rather than
 * building one more: an old matcher is never freed (another thread may be
 * reading it), so each rebuild stays allocated for the process's life.
 */
static char *
rules_key(const struct rule *r, size_t n, size_t *len)
{
	size_t size = 1, at = 0, nl;
	int f[5];
	char *key;

	for (size_t i = 0; i < n; i++) {
		rule_name(&r[i], &nl);
		size += sizeof(f) + 16 + nl + 1;
	}
	if ((key = malloc(size)) == NULL)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		const char *name = rule_name(&r[i], &nl);

		if (r[i].kind == RULE_IP && r[i].host[0] != '\0')
			continue;
		f[0] = r[i].kind;
		f[1] = r[i].comp;
		f[2] = r[i].prefix;
		f[3] = r[i].port_lo;
		f[4] = r[i].port_hi;
		memcpy(key + at, f, sizeof(f));
		at += sizeof(f);
		memcpy(key + at, r[i].addr, 16);
		at += 16;
		memcpy(key + at, name, nl);
		at += nl;
		key[at++] = '\0';
	}
	*len = at;
	return key;
}

/* The key of the rules of the current matcher (NULL: unknown, rebuild). */
static char *cur_key;
static size_t cur_key_len;

/*
 * Builds the matcher for cfg's rules (seg_rules) and puts their key in
 * *key (NULL when out of memory for it). When that key is cur_key, builds
 * nothing and sets *same: the current matcher answers alike. Otherwise
 * NULL with a reason in err on error.
 */
static struct matcher *
build_matcher(const struct bs_config *cfg, char **key, size_t *key_len, bool *same, char *err,
    size_t errlen)
{
	struct matcher *m = NULL;
	struct rule *rules;
	size_t n;

	*key = NULL;
	*same = false;
	if ((rules = seg_rules(cfg, &n)) == NULL) {
		bs_format(err, errlen, "out of memory");
		return NULL;
	}
	*key = rules_key(rules, n, key_len);
	if (*key != NULL && cur_key != NULL && *key_len == cur_key_len &&
	    memcmp(*key, cur_key, *key_len) == 0) {
		free(*key);
		*key = NULL;
		*same = true;
	} else {
		m = match_build(rules, n, err, errlen);
	}
	free(rules);
	return m;
}

/* The class of this process: BULKSHIM_CLASS, else the first class with a
 * pattern matching the program's name, else "default"; as an index into
 * the segment's class names. */
static uint32_t
find_class(const struct bs_config *cfg)
{
	const char *want = getenv("BULKSHIM_CLASS"), *prog = program_invocation_short_name;
	struct seg_header *h = seg_header(shim.seg);

	if (want != NULL && *want != '\0') {
		bool known = false;

		for (size_t k = 0; k < cfg->nclass; k++)
			known = known || strcmp(cfg->classes[k].name, want) == 0;
		if (!known) {
			bs_log(LOG_WARN, "BULKSHIM_CLASS=%s is not a class of %s; using default",
			    want, cfg->path);
			want = NULL;
		}
	} else {
		want = NULL;
		for (size_t k = 1; k < cfg->nclass && want == NULL; k++) {
			for (size_t i = 0; i < cfg->classes[k].npatterns; i++) {
				if (prog != NULL && fnmatch(cfg->classes[k].patterns[i], prog, 0) == 0) {
					want = cfg->classes[k].name;
					break;
				}
			}
		}
	}
	if (want == NULL)
		return 0;
	for (uint32_t k = 0; k < h->nclass && k < BS_MAX_CLASSES; k++) {
		if (strncmp(h->class_name[k], want, BS_CLASS_NAME_MAX) == 0)
			return k;
	}
	return 0;
}

/* Puts m in place of the current destination rules, with the addresses
 * this process knew for the host names that m still has: the ones resolved
 * at start-up and the ones its getaddrinfo calls found (a reload resolves
 * nothing itself), also those found while this runs (match_publish). The
 * old matcher is left allocated: another thread may be reading it. */
static void
carry(struct matcher *m)
{
	if (match_publish(&shim.m, &shim.m_next, m) == -ENOSPC)
		bs_log(LOG_WARN, "reload: too many addresses of host names to keep; "
		    "some are not counted until the program looks its names up again");
}

/* Raised while a thread of this process reloads. A fork's child starts
 * with it lowered: the thread that raised it is not in the child, which
 * would otherwise never reload again. Nor will that thread put the rules
 * it was building in place there, so lookups stop learning into them. */
static _Atomic int reloading;

static void
reload_forked(void)
{
	atomic_store(&shim.m_next, NULL);
	atomic_store(&reloading, 0);
}

/*
 * `bulkshim reload` bumps the segment's generation after it applied a new
 * config's limits; each process rebuilds its destination rules from that
 * file at its next connect. Host names are not resolved here (that could
 * stall a connect): carry() keeps what the process knew of them, and the
 * program's getaddrinfo adds to it.
 * This runs on whichever thread of the program connects, whose stack may
 * be small: the config (43 KB) and the path are on the heap.
 */
static __attribute__((noinline)) void
reload(struct seg_header *h, uint32_t g)
{
	struct {
		struct bs_config cfg;
		char path[PATH_MAX], err[BS_ERRLEN];
	} *r;
	struct matcher *m;

	if (atomic_exchange(&reloading, 1) != 0)
		return;
	if (g == atomic_load(&shim.gen)) {
		atomic_store(&reloading, 0);
		return;
	}
	if ((r = malloc(sizeof(*r))) == NULL) {
		bs_log(LOG_ERROR, "reload: out of memory; keeping the old destinations");
	} else {
		memcpy(r->path, h->config_path, sizeof(r->path));
		r->path[sizeof(r->path) - 1] = '\0';
		/* The path is the segment's, which another process may have
		 * written: cfg_load reads a regular file only, opened without
		 * blocking, so a FIFO or a device cannot stall this connect. */
		if (cfg_load(r->path, &r->cfg, false, r->err, sizeof(r->err)) < 0) {
			bs_log(LOG_ERROR, "reload: %s; keeping the old destinations", r->err);
		} else {
			size_t key_len = 0;
			bool same;
			char *key;

			m = build_matcher(&r->cfg, &key, &key_len, &same, r->err, sizeof(r->err));
			if (same) {
				bs_log(LOG_INFO, "reload: the destinations in %s are unchanged",
				    r->path);
			} else if (m == NULL) {
				free(key);
				bs_log(LOG_ERROR, "reload: %s: %s; keeping the old destinations",
				    r->path, r->err);
			} else {
				carry(m);
				free(cur_key);
				cur_key = key;
				cur_key_len = key_len;
				bs_log(LOG_INFO, "reloaded destinations from %s", r->path);
			}
			cfg_free(&r->cfg);
		}
		free(r);
	}
	atomic_store(&shim.gen, g);
	atomic_store(&reloading, 0);
}

void
shim_maybe_reload(void)
{
	struct seg_header *h = seg_header(shim.seg);
	uint32_t g = atomic_load(&h->generation);

	if (__builtin_expect(g != atomic_load(&shim.gen), 0))
		reload(h, g);
}

static bool
env_true(const char *v)
{
	return v != NULL && (strcmp(v, "1") == 0 || strcmp(v, "yes") == 0 ||
	    strcmp(v, "true") == 0 || strcmp(v, "on") == 0);
}

/* The shim cannot work: strict mode ends the process, the default leaves
 * the program running without limits. */
static void
give_up(bool strict, const char *why)
{
	if (strict) {
		bs_log(LOG_ERROR, "%s; exiting (strict mode)", why);
		_exit(BS_EX_CONFIG);
	}
	bs_log(LOG_ERROR, "%s; running without limits", why);
}

/* What admission may ask of this process: whether a descriptor blocks,
 * and its descriptor table (reconcile.c checks it against the kernel). */
static uint32_t
host_fd_slot(int fd)
{
	return fdt_get(fd);
}

static const struct seg_host host = {
	.blocking = shim_blocking,
	.fd_high = fdt_high,
	.fd_slot = host_fd_slot,
	.fd_forget = fdt_take_if,
};

__attribute__((constructor)) static void
shim_init(void)
{
	char err[BS_ERRLEN], msg[BS_ERRLEN + 64], cname[BS_CLASS_NAME_MAX];
	const char *path, *level, *format;
	struct matcher *m;
	size_t key_len = 0;
	bool strict, same;
	char *key;
	int r;

	real_bind();
	shim.pid = sys_getpid();
	shim_watch_forks();
	pthread_atfork(NULL, NULL, reload_forked);
	/* In secure execution the environment belongs to someone else. */
	if (getauxval(AT_SECURE) != 0)
		return;
	log_set_program(program_invocation_short_name);
	format = getenv("BULKSHIM_LOG_FORMAT");
	if (format != NULL && *format != '\0' && log_set_format(format) < 0)
		bs_log(LOG_WARN, "BULKSHIM_LOG_FORMAT=%s is not text or json; using text", format);
	level = getenv("BULKSHIM_LOG");
	if (level != NULL && log_set_level(level) < 0)
		bs_log(LOG_WARN, "BULKSHIM_LOG=%s is not off, error, warn, info or debug; using warn",
		    level);
	strict = env_true(getenv("BULKSHIM_STRICT"));
	path = getenv("BULKSHIM_CONFIG");
	if (path == NULL || *path == '\0')
		path = BS_DEFAULT_CONFIG;
	if (fdt_init() < 0) {
		give_up(strict, "cannot map the descriptor table");
		return;
	}
	r = cfg_load(path, &shim.cfg, true, err, sizeof(err));
	if (r == -ENOENT) {
		if (strict)
			give_up(true, err);
		/* Once per process tree: a wrapper script's every child
		 * would say it again. */
		bs_format(msg, sizeof(msg), "noconfig:%s", path);
		if (notice_once(msg))
			bs_log(LOG_WARN, "no config file %s (set BULKSHIM_CONFIG); running without "
			    "limits", path);
		return;
	}
	if (r < 0) {
		char seg[BS_NAME_MAX];

		cfg_segment_of(path, seg, sizeof(seg));
		notice_unprotected(seg, err);
		give_up(strict || cfg_wants_strict(path), err);
		return;
	}
	strict = strict || shim.cfg.strict;
	/* The environment, when it says, wins over the config for one run. */
	if (shim.cfg.log_json && (format == NULL || *format == '\0'))
		log_set_format("json");
	/* From the first mapping on, a segment that shrinks must not end
	 * the program (guard.c). */
	signal_guard_start();
	r = seg_attach(&shim.cfg, &shim.seg, err, sizeof(err));
	if (r < 0) {
		bs_format(msg, sizeof(msg), "%s: %s", shim.cfg.path, err);
		notice_unprotected(shim.cfg.segment, msg);
		/* Strict mode exits in give_up: the fix goes first then. */
		if (r == -EACCES && strict)
			notice_denied(&shim.cfg);
		give_up(strict, msg);
		if (r == -EACCES)
			notice_denied(&shim.cfg);
		return;
	}
	fdt_set_seq(&seg_header(shim.seg)->settings_seq);
	/* Every permit here is a descriptor in the table: one found missing
	 * may be a socket closed unseen (reconcile.c). */
	shim.seg->host = &host;
	/* cur_key is NULL here: every rule is new. */
	m = build_matcher(&shim.cfg, &key, &key_len, &same, err, sizeof(err));
	cur_key = key;
	cur_key_len = key_len;
	if (m == NULL) {
		notice_unprotected(shim.cfg.segment, err);
		give_up(strict, err);
		return;
	}
	notice_attached(&shim.cfg, shim.seg);
	notice_unresolved(&shim.cfg);
	atomic_store(&shim.m, m);
	atomic_store(&shim.gen, atomic_load(&seg_header(shim.seg)->generation));
	shim.cls = find_class(&shim.cfg);
	proc_adopt(shim.seg, shim_adopt_fd);
	atomic_store_explicit(&shim.ready, 1, memory_order_release);
	log_name(cname, sizeof(cname), seg_header(shim.seg)->class_name[shim.cls], sizeof(cname));
	bs_log(LOG_INFO, "%s: %u compartments in segment %s, class %s", shim.cfg.path,
	    (unsigned)shim.cfg.ncomp, shim.cfg.segment, cname);
}

/* A normal exit gives every permit of this process back, once the kernel
 * has closed its sockets (see proc_exit). */
__attribute__((destructor)) static void
shim_fini(void)
{
	if (shim_active() && !shim_foreign())
		proc_exit(shim.seg);
}

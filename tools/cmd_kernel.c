/* cmd_kernel.c - the kernel engine from the CLI: `attach`, `detach`, `run --kernel`, and its counts in every view. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "../kernel/engine.h"

/* ---- shared by attach and run --kernel ---- */

/* Loads the config that -c (or BULKSHIM_CONFIG, or the default) names,
 * host names resolved. Prints the error and returns -1 on failure. */
static int
load_config(const char *config, struct bs_config *cfg)
{
	char err[BS_ERRLEN];

	if (config == NULL) {
		config = getenv("BULKSHIM_CONFIG");
		if (config == NULL || *config == '\0')
			config = BS_DEFAULT_CONFIG;
	}
	if (cfg_load(config, cfg, true, err, sizeof(err)) < 0) {
		fprintf(stderr, "bulkshim: %s\n", err);
		return -1;
	}
	return 0;
}

/* What the kernel engine leaves to the preloaded library, said once. */
static void
tell_limits(const struct kern_env *env, const struct bs_config *cfg)
{
	size_t unix_rules = 0;

	for (size_t i = 0; i < cfg->nrules; i++)
		unix_rules += cfg->rules[i].kind == RULE_UNIX;
	if (unix_rules)
		fprintf(stderr, "bulkshim: note: %zu unix-socket destination%s of %s %s not seen "
		    "by the kernel engine (the preloaded library counts them)\n", unix_rules,
		    unix_rules == 1 ? "" : "s", cfg->path, unix_rules == 1 ? "is" : "are");
	for (size_t i = 0; i < cfg->ncomp; i++) {
		const struct cfg_compartment *c = &cfg->comp[i];

		if (c->max_inflight || c->max_wait_ms || c->connect_timeout_ms ||
		    c->io_timeout_ms)
			fprintf(stderr, "bulkshim: note: compartment \"%s\" sets requests in flight, "
			    "waits or timeouts: the kernel engine limits connections only, the "
			    "preloaded library does the rest\n", c->name);
	}
	if (!env->set_retval)
		fprintf(stderr, "bulkshim: note: Linux %d.%d has no bpf_set_retval (5.18): refused "
		    "connects fail with EPERM, not the config's errno\n", env->major, env->minor);
}

/*
 * The segment's compartments that the engine's map has count with it from
 * now on: their `kernel` words name the map, and the connections that
 * preloaded processes hold in them go into the joint count (kjoint.c).
 * Returns 0, or -1 after saying why.
 */
static int
adopt(const char *segment)
{
	char err[BS_ERRLEN];
	struct kern_view v;
	struct seg *s;
	uint32_t n;
	int r;

	if (seg_open(segment, true, &s, err, sizeof(err)) < 0) {
		fprintf(stderr, "bulkshim: %s\n", err);
		return -1;
	}
	if ((r = kern_view_open(segment, true, &v)) < 0 || v.id == 0) {
		fprintf(stderr, "bulkshim: cannot map the kernel engine's compartments of segment "
		    "%s: %s\n", segment, strerror(r < 0 ? -r : EINVAL));
		kern_view_close(&v);
		seg_close(s);
		return -1;
	}
	n = kjoint_adopt(s, v.comp, v.id);
	if (n > 0)
		printf("kernel engine of segment %s: %u connection%s of preloaded processes counted "
		    "in\n", segment, n, n == 1 ? "" : "s");
	kern_view_close(&v);
	seg_close(s);
	return 0;
}

/* Raises *w to at least v. */
static void
raise_to(_Atomic uint64_t *w, uint64_t v)
{
	uint64_t cur = atomic_load(w);

	while (v > cur && !atomic_compare_exchange_weak(w, &cur, v))
		;
}

/*
 * The engine's counts of an unloaded map (still mapped in v) go into the
 * segment's own, so that every view keeps showing what the engine
 * admitted and refused, and its peak, after it is gone. Each count is
 * taken out of the map as it is added (an exchange with 0), so two
 * commands that both saw the engine go add it once.
 */
static void
fold(struct seg *s, struct kern_view *v)
{
	for (uint32_t i = 0; i < s->ncomp; i++) {
		struct seg_comp *c = seg_comp(s, i);
		struct kern_comp *k = kern_view_find(v, c->name);
		uint64_t rej, would, last;
		uint32_t peak, p;

		if (k == NULL)
			continue;
		atomic_fetch_add(&c->admitted, __atomic_exchange_n(&k->admitted, 0,
		    __ATOMIC_RELAXED));
		rej = __atomic_exchange_n(&k->rejected, 0, __ATOMIC_RELAXED);
		atomic_fetch_add(&c->rejected, rej);
		atomic_fetch_add(&c->rejected_by[REASON_FULL], rej);
		would = __atomic_exchange_n(&k->would_reject, 0, __ATOMIC_RELAXED);
		atomic_fetch_add(&c->would_reject[REASON_FULL], would);
		last = kern_boot_to_real_ms(__atomic_exchange_n(&k->last_rejection_ns, 0,
		    __ATOMIC_RELAXED));
		raise_to(&c->last_rejection_ms, last);
		peak = __atomic_exchange_n(&k->peak, 0, __ATOMIC_RELAXED);
		p = atomic_load(&c->peak);
		while (peak > p && !atomic_compare_exchange_weak(&c->peak, &p, peak))
			;
	}
}

static bool
engine_loaded(const char *segment)
{
	char path[PATH_MAX];

	kern_pin_path(path, sizeof(path), segment, "connect4");
	return access(path, F_OK) == 0;
}

/* After a detach or a sweep: if the engine of segment (its map mapped in
 * v before, if it was loaded) is unloaded now, its counts go into the
 * segment (fold) and its compartments count alone again. */
static void
after_unload(const char *segment, struct kern_view *v)
{
	char err[BS_ERRLEN];
	struct seg *s;

	if (engine_loaded(segment) || seg_open(segment, true, &s, err, sizeof(err)) < 0)
		return;
	if (v->comp != NULL)
		fold(s, v);
	kjoint_forget(s);
	seg_close(s);
}

static void
say_out(void *arg, const char *line)
{
	(void)arg;
	printf("%s\n", line);
}

static void
say_err(void *arg, const char *line)
{
	(void)arg;
	fprintf(stderr, "bulkshim: %s\n", line);
}

/* Checks the machine, makes the segment (so that status and the rest see
 * the compartments), attaches the engine to cgroup and joins the counts of
 * both (adopt). */
static int
attach_to(const struct bs_config *cfg, const char *cgroup, struct kern_env *env)
{
	char err[BS_ERRLEN];
	struct seg *s;

	if (seg_attach(cfg, &s, err, sizeof(err)) < 0) {
		fprintf(stderr, "bulkshim: %s\n", err);
		return -1;
	}
	seg_close(s);
	if (kern_attach(env, cfg, cgroup, err, sizeof(err)) < 0 ||
	    kern_share(cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "bulkshim: %s\n", err);
		return -1;
	}
	return adopt(cfg->segment);
}

static int
check_env(struct kern_env *env)
{
	char err[BS_ERRLEN];

	if (kern_check(env, err, sizeof(err)) < 0) {
		fprintf(stderr, "bulkshim: %s\n", err);
		return -1;
	}
	return 0;
}

/* Parses -c FILE, --cgroup PATH (and, for run, --kernel). Returns -1 to go
 * on (optind at the first operand), or the exit status after --help (0) or
 * a usage error (2). */
static int
kernel_opts(int argc, char **argv, const char *name, const char **config, const char **cgroup)
{
	static const struct option longopts[] = {
		{ "kernel", no_argument, NULL, 'k' },
		{ "cgroup", required_argument, NULL, 'g' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+c:h", longopts, NULL)) != -1) {
		if (c == 'c')
			*config = optarg;
		else if (c == 'g')
			*cgroup = optarg;
		else if (c == 'h')
			return cli_help(name, stdout, 0);
		else if (c != 'k' || strcmp(name, "run") != 0)
			return cli_help(name, stderr, 2);
	}
	return -1;
}

/* ---- attach, detach ---- */

int
cmd_attach(int argc, char **argv)
{
	const char *config = NULL, *cgroup = NULL;
	char err[BS_ERRLEN], cg[PATH_MAX];
	struct kern_env env;
	struct bs_config cfg;
	int r = 1;

	if ((r = kernel_opts(argc, argv, "attach", &config, &cgroup)) >= 0)
		return r;
	r = 1;
	if (optind != argc || cgroup == NULL)
		return cli_help("attach", stderr, 2);
	if (check_env(&env) < 0)
		return 1;
	if (kern_cgroup_path(&env, cgroup, cg, sizeof(cg), err, sizeof(err)) < 0) {
		fprintf(stderr, "bulkshim: %s\n", err);
		return 1;
	}
	if (load_config(config, &cfg) < 0)
		return 1;
	if (attach_to(&cfg, cg, &env) == 0) {
		printf("attached the kernel engine of segment %s (%zu compartment%s) to %s\n",
		    cfg.segment, cfg.ncomp, cfg.ncomp == 1 ? "" : "s", cg);
		tell_limits(&env, &cfg);
		r = 0;
	}
	cfg_free(&cfg);
	return r;
}

int
cmd_detach(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "cgroup", required_argument, NULL, 'g' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct cli_target t = { NULL, NULL };
	const char *cgroup = NULL;
	char err[BS_ERRLEN], cg[PATH_MAX], name[BS_NAME_MAX];
	struct kern_env env;
	struct kern_view v;
	int c, n, swept;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+c:s:h", longopts, NULL)) != -1) {
		if (cli_target_opt(&t, c, optarg))
			continue;
		if (c == 'g')
			cgroup = optarg;
		else if (c == 'h')
			return cli_help("detach", stdout, 0);
		else
			return cli_help("detach", stderr, 2);
	}
	if (optind != argc || (t.config != NULL && t.segment != NULL))
		return cli_help("detach", stderr, 2);
	if (check_env(&env) < 0 || cli_segment_name(&t, name, sizeof(name)) < 0)
		return 1;
	if (cgroup != NULL &&
	    kern_cgroup_path(&env, cgroup, cg, sizeof(cg), err, sizeof(err)) < 0) {
		fprintf(stderr, "bulkshim: %s\n", err);
		return 1;
	}
	/* Mapped before anything goes: the counts outlive the pins. */
	kern_view_open(name, true, &v);
	swept = kern_sweep(&env, name, say_out, NULL);
	n = 0;
	if (engine_loaded(name) || swept == 0) {
		n = kern_detach(name, cgroup != NULL ? cg : NULL, err, sizeof(err));
		if (n < 0 && swept == 0) {
			fprintf(stderr, "bulkshim: %s\n", err);
			kern_view_close(&v);
			return 1;
		}
	}
	after_unload(name, &v);
	kern_view_close(&v);
	if (n > 0 || !engine_loaded(name))
		printf("detached the kernel engine of segment %s from %d cgroup%s%s\n", name,
		    n < 0 ? 0 : n, n == 1 ? "" : "s", engine_loaded(name) ? "" : "; it is unloaded");
	return 0;
}

/* ---- run --kernel ---- */

static volatile sig_atomic_t child_pid;

static void
forward(int sig)
{
	if (child_pid > 0)
		kill((pid_t)child_pid, sig);
}

static int
join_cgroup(const char *dir)
{
	char path[PATH_MAX + 16];
	FILE *f;
	int r;

	snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
	if ((f = fopen(path, "we")) == NULL)
		return -errno;
	r = fputs("0\n", f) < 0 ? -errno : 0;
	if (fclose(f) != 0 && r == 0)
		r = -errno;
	return r;
}

/* The child's exit status as the shell reports it. */
static int
exit_status(int st)
{
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	if (WIFSIGNALED(st))
		return 128 + WTERMSIG(st);
	return 1;
}

/* Forks the command into cgroup dir and waits for it. */
static int
run_in(const char *dir, char **cmd)
{
	struct sigaction sa;
	int st = 0;
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "bulkshim: fork: %s\n", strerror(errno));
		return -1;
	}
	if (pid == 0) {
		int r = join_cgroup(dir);

		if (r < 0) {
			fprintf(stderr, "bulkshim: cannot enter cgroup %s: %s\n", dir, strerror(-r));
			_exit(126);
		}
		execvp(cmd[0], cmd);
		fprintf(stderr, "bulkshim: cannot run %s: %s\n", cmd[0], strerror(errno));
		_exit(127);
	}
	child_pid = pid;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = forward;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return exit_status(st);
}

/* bulkshim run --kernel [-c FILE] [--cgroup PATH] [--] COMMAND [ARG...] */
int
cmd_run_kernel(int argc, char **argv)
{
	const char *config = NULL, *cgroup = NULL;
	char err[BS_ERRLEN], dir[PATH_MAX];
	struct kern_env env;
	struct kern_view v;
	struct bs_config cfg;
	bool made = false;
	int r;

	if ((r = kernel_opts(argc, argv, "run", &config, &cgroup)) >= 0)
		return r;
	r = 1;
	if (optind >= argc)
		return cli_help("run", stderr, 2);
	if (check_env(&env) < 0 || load_config(config, &cfg) < 0)
		return 1;
	if (cgroup != NULL) {
		if (kern_cgroup_path(&env, cgroup, dir, sizeof(dir), err, sizeof(err)) < 0) {
			fprintf(stderr, "bulkshim: %s\n", err);
			goto done;
		}
	} else {
		/* A cgroup of its own, so that the limits follow exactly this
		 * command and what it starts. */
		if ((size_t)snprintf(dir, sizeof(dir), "%s/bulkshim.%s.%d", env.cgroup2,
		    cfg.segment, (int)getpid()) >= sizeof(dir) || mkdir(dir, 0755) < 0) {
			fprintf(stderr, "bulkshim: cannot make cgroup %s: %s\n", dir, strerror(errno));
			goto done;
		}
		made = true;
	}
	/* What an earlier run of this segment, killed, left behind. */
	kern_view_open(cfg.segment, true, &v);
	if (kern_sweep(&env, cfg.segment, say_err, NULL) > 0)
		after_unload(cfg.segment, &v);
	kern_view_close(&v);
	if (attach_to(&cfg, dir, &env) < 0)
		goto done;
	tell_limits(&env, &cfg);
	r = run_in(dir, argv + optind);
	if (r < 0)
		r = 1;
	if (!kern_cgroup_empty(dir)) {
		fprintf(stderr, "bulkshim: processes started by %s are still running in %s: the "
		    "kernel engine stays attached there (bulkshim detach -c %s --cgroup %s)\n",
		    argv[optind], dir, cfg.path, dir);
		made = false;
	} else {
		kern_view_open(cfg.segment, true, &v);
		if (kern_detach(cfg.segment, dir, err, sizeof(err)) < 0)
			fprintf(stderr, "bulkshim: %s\n", err);
		else
			after_unload(cfg.segment, &v);
		kern_view_close(&v);
	}
done:
	if (made)
		rmdir(dir);
	cfg_free(&cfg);
	return r;
}

/* True if argv asks `run` for the kernel engine: --kernel before the command. */
bool
cli_run_wants_kernel(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--kernel") == 0)
			return true;
		if (strcmp(argv[i], "--") == 0 || argv[i][0] != '-')
			return false;
		if (strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--cgroup") == 0)
			i++;
	}
	return false;
}

int
cli_kernel_cgroups(const char *segment)
{
	return kern_links(segment, NULL, 0);
}

/* ---- the engine's counts in status, watch, metrics, serve; set and reload ---- */

/* Adds the engine's entry k to the compartment's figures: its connections
 * in use (and let past in observe mode), admissions and refusals. */
static void
merge_one(const struct kern_comp *k, struct cli_comp *c)
{
	uint32_t in_use = __atomic_load_n(&k->in_use, __ATOMIC_RELAXED);
	uint32_t over = __atomic_load_n(&k->over, __ATOMIC_RELAXED);
	uint32_t peak = __atomic_load_n(&k->peak, __ATOMIC_RELAXED);
	uint64_t rej = __atomic_load_n(&k->rejected, __ATOMIC_RELAXED);
	uint64_t would = __atomic_load_n(&k->would_reject, __ATOMIC_RELAXED);
	unsigned long long last;

	c->kernel = true;
	c->kernel_in_use = in_use + over;
	c->kernel_joint = __atomic_load_n(&k->joint, __ATOMIC_RELAXED);
	c->in_use += in_use + over;
	c->over += over;
	/* The engine's peak is noted by both engines at every admission:
	 * the joint count (every connection of the library's) and the
	 * program's sockets let past the limit, the most both held at once. */
	c->peak = peak > c->peak ? peak : c->peak;
	c->admitted += __atomic_load_n(&k->admitted, __ATOMIC_RELAXED);
	c->rejected += rej;
	c->rejected_by[REASON_FULL] += rej;
	c->would_reject[REASON_FULL] += would;
	last = kern_boot_to_real_ms(__atomic_load_n(&k->last_rejection_ns, __ATOMIC_RELAXED));
	if (last > c->last_rejection_ms)
		c->last_rejection_ms = last;
}

void
cli_kernel_merge(const struct seg *s, struct cli_comp *all, uint32_t n)
{
	static bool warned;
	struct kern_view v;
	int r;

	if (n == 0)
		return;
	r = kern_view_open(seg_header(s)->name, false, &v);
	if (r == -EACCES || r == -EPERM) {
		/* The figures would be short without saying so. */
		if (!warned)
			fprintf(stderr, "bulkshim: the kernel engine's counts of segment %s are not "
			    "readable by this user (root or CAP_BPF): they are left out\n",
			    seg_header(s)->name);
		warned = true;
	}
	if (r < 0)
		return;
	for (uint32_t i = 0; i < n; i++) {
		const struct kern_comp *k = kern_view_find(&v, all[i].name);

		if (k != NULL)
			merge_one(k, &all[i]);
	}
	kern_view_close(&v);
}

void
cli_kernel_sync(const struct seg *s)
{
	const struct seg_header *h = seg_header(s);
	struct kern_view v;

	if (kern_view_open(h->name, true, &v) < 0)
		return;
	for (uint32_t i = 0; i < s->ncomp; i++) {
		struct seg_comp *sc = seg_comp(s, i);
		struct kern_comp *k = kern_view_find(&v, sc->name);

		if (k == NULL)
			continue;
		__atomic_store_n(&k->limit, atomic_load(&sc->limit), __ATOMIC_RELAXED);
		__atomic_store_n(&k->enforce, atomic_load(&sc->enforce), __ATOMIC_RELAXED);
		__atomic_store_n(&k->reject_errno, atomic_load(&sc->reject_errno),
		    __ATOMIC_RELAXED);
	}
	kern_view_close(&v);
}

void
cli_kernel_reset(const struct seg *s, const char *name)
{
	struct kern_view v;

	if (kern_view_open(seg_header(s)->name, true, &v) < 0)
		return;
	for (size_t i = 0; i < KERN_MAX_COMPS && v.comp[i].name[0] != '\0'; i++) {
		struct kern_comp *k = &v.comp[i];

		if (name != NULL && strncmp(k->name, name, KERN_NAME_MAX) != 0)
			continue;
		__atomic_store_n(&k->admitted, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&k->rejected, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&k->would_reject, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&k->released, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&k->unmarked, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&k->last_rejection_ns, 0, __ATOMIC_RELAXED);
		/* What both engines hold now (kjoint.c's note_both). */
		__atomic_store_n(&k->peak, __atomic_load_n(&k->joint, __ATOMIC_RELAXED) +
		    __atomic_load_n(&k->over, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
	}
	kern_view_close(&v);
}

int
cli_kernel_reload(const struct bs_config *cfg)
{
	char err[BS_ERRLEN];
	struct kern_view v;

	if (kern_view_open(cfg->segment, false, &v) < 0)
		return 0;
	kern_view_close(&v);
	if (kern_apply_pinned(cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "bulkshim: kernel engine: %s\n", err);
		return -1;
	}
	printf("kernel engine of segment %s: destinations and limits reloaded\n", cfg->segment);
	if (kern_share(cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "bulkshim: kernel engine: %s\n", err);
		return -1;
	}
	return adopt(cfg->segment);
}

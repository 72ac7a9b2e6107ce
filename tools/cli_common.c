/* cli_common.c - what the subcommands share: help, targets, opening segments, reading compartments. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

/* The command table (bulkshim.c's), handed over by cli_commands() before
 * any command runs: help prints from it, and never calls a command. */
static const struct cli_command *commands;
static size_t ncommands;

void
cli_commands(const struct cli_command *table, size_t n)
{
	commands = table;
	ncommands = n;
}

int
cli_usage(FILE *f, int status)
{
	for (size_t i = 0; i < ncommands; i++)
		fprintf(f, "%s bulkshim %s\n", i == 0 ? "usage:" : "      ", commands[i].synopsis);
	fprintf(f, "       bulkshim --help | --version\n");
	return status;
}

int
cli_help(const char *cmd, FILE *f, int status)
{
	for (size_t i = 0; i < ncommands; i++) {
		if (strcmp(commands[i].name, cmd) != 0)
			continue;
		fprintf(f, "usage: bulkshim %s\n", commands[i].synopsis);
		/* A usage error gets the synopsis only; --help the rest too. */
		if (status == 0)
			fputs(commands[i].help, f);
		return status;
	}
	return cli_usage(f, status);
}

bool
cli_target_opt(struct cli_target *t, int opt, const char *arg)
{
	if (opt == 'c')
		t->config = arg;
	else if (opt == 's')
		t->segment = arg;
	else
		return false;
	return true;
}

static bool
valid_segment_name(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n >= BS_NAME_MAX)
		return false;
	for (; *s; s++) {
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
		    (*s >= '0' && *s <= '9') || *s == '_' || *s == '.' || *s == '-'))
			return false;
	}
	return true;
}

int
cli_segment_name(const struct cli_target *t, char *out, size_t len)
{
	struct bs_config cfg;
	char err[BS_ERRLEN];
	const char *config = t->config;

	if (t->segment != NULL) {
		if (!valid_segment_name(t->segment)) {
			fprintf(stderr, "bulkshim: \"%s\" is not a segment name ([A-Za-z0-9_.-], "
			    "at most %d characters)\n", t->segment, BS_NAME_MAX - 1);
			return -1;
		}
		snprintf(out, len, "%s", t->segment);
		return 0;
	}
	if (config == NULL) {
		config = getenv("BULKSHIM_CONFIG");
		if (config == NULL || *config == '\0')
			config = BS_DEFAULT_CONFIG;
	}
	/* Host names are not resolved: only the segment name is wanted. */
	if (cfg_load(config, &cfg, false, err, sizeof(err)) < 0) {
		fprintf(stderr, "bulkshim: %s\n", err);
		return -1;
	}
	snprintf(out, len, "%s", cfg.segment);
	cfg_free(&cfg);
	return 0;
}

/* The error for a segment this user may not write, with what it is. */
static void
permission_denied(const char *name)
{
	char path[BS_NAME_MAX + 32];
	struct stat st;

	snprintf(path, sizeof(path), "/dev/shm/bulkshim.%s", name);
	if (stat(path, &st) == 0)
		fprintf(stderr, "bulkshim: permission denied: you cannot change segment %s "
		    "(owner uid %u, mode %04o)\n", name, (unsigned)st.st_uid,
		    (unsigned)(st.st_mode & 07777));
	else
		fprintf(stderr, "bulkshim: permission denied: you cannot change segment %s\n", name);
}

int
cli_open(const struct cli_target *t, bool writable, struct seg **out)
{
	char name[BS_NAME_MAX], err[BS_ERRLEN];
	int r;

	*out = NULL;
	if (cli_segment_name(t, name, sizeof(name)) < 0)
		return -1;
	r = seg_open(name, true, out, err, sizeof(err));
	if (r == -EACCES || r == -EPERM || r == -EROFS) {
		if (writable) {
			permission_denied(name);
			return -1;
		}
		r = seg_open(name, false, out, err, sizeof(err));
	} else if (r == 0) {
		/* The figures are only true once the permits of processes
		 * that died holding them are back. */
		seg_reclaim(*out, false);
		/* And of sockets that live processes closed unseen. */
		seg_reconcile(*out, -1);
	}
	if (r < 0) {
		fprintf(stderr, "bulkshim: %s%s\n", err, r == -ENOENT ?
		    " (no program has run with this configuration yet?)" : "");
		return -1;
	}
	return 0;
}

static bool
near_limit(uint64_t used, uint32_t limit)
{
	return limit != UINT32_MAX && used * 100 >= (uint64_t)limit * CLI_HOT_PERCENT;
}

void
cli_read_comp(const struct seg *s, uint32_t i, struct cli_comp *c)
{
	const struct seg_header *h = seg_header(s);
	struct seg_comp *sc = seg_comp(s, i);

	memset(c, 0, sizeof(*c));
	c->index = i;
	memcpy(c->name, sc->name, sizeof(c->name));
	c->name[sizeof(c->name) - 1] = '\0';
	c->limit = atomic_load(&sc->limit);
	c->over = atomic_load(&sc->over);
	/* Observe mode lets connections past the limit without a permit:
	 * in_use counts every connection, permits and the rest. */
	c->in_use = atomic_load(&sc->in_use) + c->over;
	c->peak = atomic_load(&sc->peak);
	c->waiting = atomic_load(&sc->waiting);
	c->inflight_limit = atomic_load(&sc->inflight_limit);
	c->inflight_over = atomic_load(&sc->inflight_over);
	c->inflight = atomic_load(&sc->inflight) + c->inflight_over;
	c->inflight_peak = atomic_load(&sc->inflight_peak);
	c->max_wait_ms = atomic_load(&sc->max_wait_ms);
	c->max_waiting = atomic_load(&sc->max_waiting);
	c->connect_timeout_ms = atomic_load(&sc->connect_timeout_ms);
	c->io_timeout_ms = atomic_load(&sc->io_timeout_ms);
	c->reject_errno = atomic_load(&sc->reject_errno);
	c->enforce = atomic_load(&sc->enforce) != 0;
	c->admitted = atomic_load(&sc->admitted);
	c->rejected = atomic_load(&sc->rejected);
	c->last_rejection_ms = atomic_load(&sc->last_rejection_ms);
	c->reclaimed = atomic_load(&sc->reclaimed);
	c->reconciled = atomic_load(&sc->reconciled);
	c->inflight_admitted = atomic_load(&sc->inflight_admitted);
	c->connect_timeouts = atomic_load(&sc->connect_timeouts);
	c->io_timeouts = atomic_load(&sc->io_timeouts);
	c->peak_rate = atomic_load(&sc->peak_rate);
	cli_read_adaptive(sc, &c->ad);
	for (int r = 0; r < REASON_MAX; r++) {
		c->rejected_by[r] = atomic_load(seg_reason_count(sc, (enum bs_reason)r, false));
		c->would_reject[r] = atomic_load(seg_reason_count(sc, (enum bs_reason)r, true));
	}
	for (uint32_t k = 0; k < h->nclass && k < BS_MAX_CLASSES; k++) {
		struct cli_class *cc = &c->cls[c->nclass];
		uint32_t lim = atomic_load(&sc->cls[k].limit);

		if (lim == 0)
			continue;
		memcpy(cc->name, h->class_name[k], sizeof(cc->name));
		cc->name[sizeof(cc->name) - 1] = '\0';
		cc->limit = lim;
		cc->in_use = atomic_load(&sc->cls[k].in_use);
		cc->peak = atomic_load(&sc->cls[k].peak);
		cc->admitted = atomic_load(&sc->cls[k].admitted);
		cc->rejected = atomic_load(&sc->cls[k].rejected);
		cc->index = k;
		cc->shares = atomic_load(&sc->cls_shares) != 0;
		cc->guaranteed = cc->shares ? atomic_load(&sc->cls_guaranteed[k]) : 0;
		cc->borrowed = cc->shares && cc->in_use > cc->guaranteed ? cc->in_use - cc->guaranteed : 0;
		c->nclass++;
	}
	cli_kernel_merge(s, c);
	cli_read_fleet(sc, c);
	/* What admission enforces now: an adaptive connection limit may be lower. */
	if (c->ad.mode == AD_ON && c->ad.kind == P_CONN && c->ad.limit < c->live_limit)
		c->live_limit = c->ad.limit;
	c->hot = near_limit(c->in_use, c->live_limit) ||
	    near_limit(c->inflight, cli_inflight_limit_now(c));
	cli_read_comp_pool(s, c);
}

void
cli_read_hist(const struct seg_hist *h, struct cli_hist *out)
{
	out->total = 0;
	for (int i = 0; i < BS_HIST_BUCKETS; i++) {
		out->bucket[i] = atomic_load(&h->bucket[i]);
		out->total += out->bucket[i];
	}
	/* The count is bumped after the bucket: the buckets' total is the
	 * count that matches them. */
	out->sum_us = atomic_load(&h->sum_us);
}

uint64_t
cli_hist_quantile_us(const struct cli_hist *h, unsigned permille)
{
	uint64_t rank, seen = 0;

	if (h->total == 0)
		return 0;
	/* The smallest rank with at least permille/1000 of the values at or
	 * below it: ceil(total * permille / 1000), in integers. */
	rank = (h->total * permille + 999) / 1000;
	if (rank == 0)
		rank = 1;
	for (int i = 0; i < BS_HIST_BUCKETS; i++) {
		seen += h->bucket[i];
		if (seen >= rank)
			return 1ULL << i;
	}
	return 1ULL << (BS_HIST_BUCKETS - 1);
}

uint32_t
cli_live_processes(const struct seg *s)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < s->nprocs; i++) {
		struct seg_proc *p = seg_proc(s, i);

		if (atomic_load(&p->state) == PROC_LIVE &&
		    seg_pid_alive(atomic_load(&p->pid), atomic_load(&p->start)))
			n++;
	}
	return n;
}

int
cli_parse_view(int argc, char **argv, const char *name, struct cli_target *t, bool *json)
{
	static const struct option longopts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+c:s:h", longopts, NULL)) != -1) {
		if (cli_target_opt(t, c, optarg))
			continue;
		if (c == 'j')
			*json = true;
		else if (c == 'h')
			return cli_help(name, stdout, 0);
		else
			return cli_help(name, stderr, 2);
	}
	if (optind != argc || (t->config != NULL && t->segment != NULL))
		return cli_help(name, stderr, 2);
	return -1;
}

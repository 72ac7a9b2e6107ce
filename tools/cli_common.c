/* cli_common.c - what the subcommands share: help from the command table, targets, opening a segment. */
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

const char *
cli_config_path(const struct cli_target *t)
{
	const char *config = t != NULL ? t->config : NULL;

	if (config == NULL) {
		config = getenv("BULKSHIM_CONFIG");
		if (config == NULL || *config == '\0')
			config = BS_DEFAULT_CONFIG;
	}
	return config;
}

int
cli_segment_name(const struct cli_target *t, char *out, size_t len)
{
	struct bs_config cfg;
	char err[BS_ERRLEN];
	const char *config = cli_config_path(t);

	if (t->segment != NULL) {
		if (!valid_segment_name(t->segment)) {
			fprintf(stderr, "bulkshim: \"%s\" is not a segment name ([A-Za-z0-9_.-], "
			    "at most %d characters)\n", t->segment, BS_NAME_MAX - 1);
			return -1;
		}
		snprintf(out, len, "%s", t->segment);
		return 0;
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
		proc_reclaim(*out, false);
		/* And of sockets that live processes closed unseen. */
		reconcile_run(*out, NULL);
	}
	if (r < 0) {
		fprintf(stderr, "bulkshim: %s%s\n", err, r == -ENOENT ?
		    " (no program has run with this configuration yet?)" : "");
		return -1;
	}
	return 0;
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

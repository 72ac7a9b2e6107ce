/* bulkshim.c - the operator's CLI: the command table, dispatch and `run`; the other commands in cmd_*.c. */
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#ifndef BS_LIBDIR
#define BS_LIBDIR "/usr/local/lib/bulkshim"
#endif

/* ---- run ---- */

/* The library beside this binary (a build tree), else the installed one. */
static int
find_library(char *out, size_t len)
{
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

	if (n > 0) {
		self[n] = '\0';
		snprintf(out, len, "%s/libbulkshim.so", dirname(self));
		if (access(out, R_OK) == 0)
			return 0;
	}
	snprintf(out, len, "%s/libbulkshim.so", BS_LIBDIR);
	return access(out, R_OK) == 0 ? 0 : -ENOENT;
}

static int
cmd_run(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ "force", no_argument, NULL, 'f' },
		{ NULL, 0, NULL, 0 },
	};
	const char *config = NULL, *old;
	char lib[PATH_MAX], abs[PATH_MAX], *preload;
	bool force = false;
	int c;

	if (cli_run_wants_kernel(argc, argv))
		return cmd_run_kernel(argc, argv);
	optind = 1;
	while ((c = getopt_long(argc, argv, "+c:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'c':
			config = optarg;
			break;
		case 'f':
			force = true;
			break;
		case 'h':
			return cli_help("run", stdout, 0);
		default:
			return cli_help("run", stderr, 2);
		}
	}
	if (optind >= argc)
		return cli_help("run", stderr, 2);
	cli_log_init("bulkshim run", false);
	if (find_library(lib, sizeof(lib)) < 0) {
		cli_log(LOG_ERROR, "bulkshim: ", "cannot find libbulkshim.so beside the bulkshim "
		    "binary or in %s", BS_LIBDIR);
		return 127;
	}
	if (config != NULL) {
		/* The program may change directory; the shim reads the file
		 * at its start, so pass a path that does not depend on it. */
		if (realpath(config, abs) == NULL) {
			/* Not started, as for any config that cannot be used. */
			cli_log(LOG_ERROR, "bulkshim: ", "%s: %s; not started", config,
			    strerror(errno));
			return BS_EX_CONFIG;
		}
		setenv("BULKSHIM_CONFIG", abs, 1);
	}
	/* The library fails open; run is where a bad config is stopped. */
	config = getenv("BULKSHIM_CONFIG");
	if (run_check_config(config != NULL && *config != '\0' ? config : BS_DEFAULT_CONFIG) < 0)
		return BS_EX_CONFIG;
	if (run_check_program(argv[optind], force) < 0)
		return BS_EX_CONFIG;
	old = getenv("LD_PRELOAD");
	if (old != NULL && *old != '\0' && strstr(old, lib) == NULL) {
		/* Keep what was there first: a sanitizer runtime must stay
		 * ahead of everything. */
		if (asprintf(&preload, "%s %s", old, lib) < 0)
			return 1;
	} else if (old != NULL && *old != '\0') {
		preload = strdup(old);
	} else {
		preload = strdup(lib);
	}
	if (preload == NULL)
		return 1;
	setenv("LD_PRELOAD", preload, 1);
	execvp(argv[optind], argv + optind);
	cli_log(LOG_ERROR, "bulkshim: ", "cannot run %s: %s", argv[optind], strerror(errno));
	return 127;
}

/* ---- the commands ---- */

/*
 * Each command once: its name, its handler, its synopsis and what
 * `bulkshim NAME --help` adds. The synopses in this order are usage(), the
 * man page's SYNOPSIS line for line (a test compares them).
 */
static const struct cli_command commands[] = {
	{ "run", cmd_run,
	  "run [--kernel [--cgroup PATH]] [-c FILE] [--force] [--] COMMAND [ARG...]",
	  "Runs COMMAND with libbulkshim.so preloaded and BULKSHIM_CONFIG set to FILE.\n"
	  "  -c FILE    the configuration (default: $BULKSHIM_CONFIG, else " BS_DEFAULT_CONFIG ")\n"
	  "  --force    start a program the shim cannot see (static, Go, setuid, setgid, file\n"
	  "             capabilities) anyway, with a warning\n"
	  "  --kernel   no preload: a cgroup of its own (or --cgroup PATH) with the kernel\n"
	  "             engine attached, for Go, static, setuid and io_uring programs; root\n"
	  "Exit status 78 without starting COMMAND when the configuration is missing or not\n"
	  "valid, or the shim cannot see COMMAND's calls; else COMMAND's own. A host name that\n"
	  "resolves to nothing is a warning naming what starts unprotected (78 in strict mode).\n" },
	{ "attach", cmd_attach,
	  "attach [-c FILE] --cgroup PATH",
	  "Attaches the kernel engine (eBPF) for FILE's compartments to a cgroup v2: every\n"
	  "connect of every process in it is counted, whatever made it. Needs root or\n"
	  "CAP_BPF + CAP_NET_ADMIN, Linux 5.9 (5.18 to refuse with the config's errno).\n"
	  "  --cgroup PATH  absolute, or relative to the cgroup v2 mount\n" },
	{ "detach", cmd_detach,
	  "detach [-c FILE | -s SEGMENT] [--cgroup PATH]",
	  "Detaches the kernel engine from PATH (default: from every cgroup); unloads it\n"
	  "when no cgroup is left, its counts kept in the segment. Removes the empty\n"
	  "cgroups (and links) that a killed `run --kernel` left, and says so.\n" },
	{ "status", cmd_status,
	  "status [-c FILE | -s SEGMENT] [--json]",
	  "Shows every compartment of a segment, HOT when at or above 80 % of a limit.\n"
	  "  -c FILE      the segment that FILE names\n"
	  "  -s SEGMENT   the segment /dev/shm/bulkshim.SEGMENT\n"
	  "  --json       one JSON object instead of the table\n" },
	{ "watch", cmd_watch,
	  "watch [-c FILE | -s SEGMENT] [-i SECONDS] [-n COUNT]",
	  "A live view: connections, requests in flight, waiters and rejections per second.\n"
	  "  -i SECONDS   refresh interval (default 1; fractions allowed)\n"
	  "  -n COUNT     stop after COUNT refreshes\n"
	  "  q quits. A pipe or TERM=dumb gets plain lines instead of escape codes.\n" },
	{ "metrics", cmd_metrics,
	  "metrics [-c FILE | -s SEGMENT] [--no-histograms] [--compartment PATTERN]...",
	  "Prints the segment's counters in the Prometheus text exposition format.\n"
	  "  --no-histograms          leave the latency histograms out (most of the lines)\n"
	  "  --compartment PATTERN    only compartments matching the glob (repeatable)\n" },
	{ "serve", cmd_serve,
	  "serve [-c FILE | -s SEGMENT | --all]... [--listen ADDR:PORT]",
	  "Serves the live web page at /, /metrics (Prometheus) and /status.json over HTTP,\n"
	  "read-only, until SIGTERM or SIGINT. -c and -s may repeat to show several segments.\n"
	  "  --all                every segment in /dev/shm this user may read\n"
	  "  --listen ADDR:PORT   where to listen (default 127.0.0.1:9464; port 0 picks one)\n" },
	{ "check", cmd_check,
	  "check [-q] FILE",
	  "Validates FILE exactly as the library does: every error and warning first, then\n"
	  "the verdict and how each limit is made (pools, adaptive, fleet) against the budget.\n"
	  "A host name that resolves to nothing is an error.\n"
	  "  -q   print nothing but errors and warnings\n"
	  "Exit status: 0 valid, 1 not valid, 2 usage error.\n" },
	{ "set", cmd_set,
	  "set [-c FILE | -s SEGMENT] [--force] {COMPARTMENT | --all} KEY VALUE",
	  "Changes a live setting for every attached process at once; shrinking revokes nothing.\n"
	  "KEY is max_connections, max_inflight, max_wait_ms, max_waiting, connect_timeout_ms,\n"
	  "io_timeout_ms, errno, enforce (on or off), adaptive (off pins the adaptive limit,\n"
	  "on resumes it), class.NAME (a class limit, 0 = none) or guaranteed (its share of\n"
	  "its pool); for a pool, COMPARTMENT is the pool's name and KEY is size or reserved.\n"
	  "KEY=VALUE works too.\n"
	  "  --all   every compartment of the segment (`set --all enforce off`: the kill switch)\n"
	  "  --force set a max_connections, guaranteed, size or reserved that breaks the config's\n"
	  "          budget or pool sums (refused otherwise, as `check` and `reload` refuse it)\n"
	  "errno EAGAIN is refused for a compartment with max_inflight (clients would spin).\n" },
	{ "reload", cmd_reload,
	  "reload -c FILE [-s SEGMENT] [--dry-run]",
	  "Applies an edited FILE to the live segment: limits at once, destinations at each\n"
	  "running process's next connect. New compartments or classes need a restart.\n"
	  "Prints every setting it changes, marking those that undo a live `bulkshim set`.\n"
	  "  --dry-run   print what would change; change nothing\n" },
	{ "reset", cmd_reset,
	  "reset [-c FILE | -s SEGMENT] [COMPARTMENT | POOL]",
	  "Zeroes the counters (admitted, rejected, histograms, rates, peaks), not the permits.\n"
	  "Without an argument, every compartment and every pool (its peak and pool_full\n"
	  "refusals); POOL, a pool's name no compartment has, resets that pool alone.\n" },
	{ "size", cmd_size,
	  "size --rps R --latency L [--headroom H] [--retries K] [--json]",
	  "Little's law: permits = ceil(R x L x H x (1 + K)).\n"
	  "  --rps R        requests per second\n"
	  "  --latency L    latency: 0.25, 0.25s, 250ms or 250us\n"
	  "  --headroom H   default 2\n"
	  "  --retries K    retries per request, default 0\n" },
	{ "suggest", cmd_suggest,
	  "suggest [-c FILE | -s SEGMENT] [--window SECONDS] [--json]",
	  "Sizes each compartment from what the shim recorded: peak admission rate, p50/p99\n"
	  "latency, Little's law with headroom 2, refusals, and a verdict.\n" },
	{ "list", cmd_list,
	  "list [--json]",
	  "Lists the segments in /dev/shm: owner, size, live processes, compartments (the\n"
	  "names that fit on the row, then their number; --json names every one).\n" },
	{ "rm", cmd_rm,
	  "rm [--force] SEGMENT...",
	  "Removes segments. One that any live process has attached (holding permits or not)\n"
	  "or that a kernel engine uses is kept unless --force, which says what it breaks;\n"
	  "a damaged one nothing uses is removed (programs facing it run without limits).\n" },
	{ "prune", cmd_prune,
	  "prune [--older-than AGE] [--dry-run] [--force] [PATTERN...]",
	  "Removes the segments (matching the globs) that no live process holds permits in,\n"
	  "created more than AGE ago (90s, 15m, 2h, 7d; default 1h), damaged ones included.\n"
	  "One still attached by a live process or used by a kernel engine is kept and named.\n"
	  "  --dry-run   say what would be removed; remove nothing\n"
	  "  --force     remove those attached or used by an engine too, saying what it breaks\n" },
	{ "drill", cmd_drill,
	  "drill [-c FILE] COMPARTMENT (--delay D | --stall | --refuse | --reset | --connect-delay D)... "
	  "[--fraction F] [--for D] [--baseline D] [--after D] [--probe URL|CMD]... [--probe-rate N] "
	  "[--tolerance T] [--json] [--plot FILE] [--force]",
	  "Puts faults on COMPARTMENT's connections in every attached process, for D (--for,\n"
	  "default 30s, at most 10m, kept as a deadline in the segment), and judges whether the\n"
	  "bulkheads contained them: measures a baseline window, the drill and an after window.\n"
	  "The config must allow it (drills = true;). Durations: 500ms, 8s, 2m.\n"
	  "  --delay D          each reply of a matched connection comes D later\n"
	  "  --stall            replies never come until the drill ends\n"
	  "  --refuse           connects fail with ECONNREFUSED, as if the service were down\n"
	  "  --reset            established connections get ECONNRESET\n"
	  "  --connect-delay D  connects take D longer\n"
	  "  --fraction F       only this share of connections (0.25 or 25%; default all)\n"
	  "  --baseline D       the window before (default 5s); --after D the one after (5s)\n"
	  "  --probe URL|CMD    an http(s) URL fetched, or a shell command run (exit 0 is\n"
	  "                     success), --probe-rate N times a second (default 5); repeatable\n"
	  "  --tolerance T      success=PP,latency=FACTOR,slack=D (default success=5,latency=3,\n"
	  "                     slack=250ms): a probe may lose PP points of success and its p99\n"
	  "                     grow to max(FACTOR x baseline, baseline + slack)\n"
	  "  --json             one JSON object instead of the table\n"
	  "  --plot FILE        a PNG timeline drawn with gnuplot\n"
	  "  --force            run on a segment with no process attached\n"
	  "SIGINT or SIGTERM stops the drill and judges what was measured.\n"
	  "Exit status: 0 contained, 1 leaked, 2 usage error or refused, 3 not run.\n" },
	{ "drill stop", cmd_drill,
	  "drill stop [-c FILE] [COMPARTMENT]",
	  "Ends the running drill on COMPARTMENT (default: every one in the segment) at once.\n" },
	{ "fleet", cmd_fleet,
	  "fleet [-c FILE] [-v] [--wait SECONDS] [--status [--json]]",
	  "Runs this host's fleet agent in the foreground: leases its share of each\n"
	  "compartment's fleet_limit from Redis and writes it into the segment as the live\n"
	  "limit. It creates the segment only for the config's owner; without one it waits\n"
	  "for the service's programs to create it. --status lists every host's share,\n"
	  "demand and what Redis reserves for it, as Redis sees them.\n"
	  "  -v               log every change of a share\n"
	  "  --wait SECONDS   wait at most this long for the segment, then exit 75 (default 60)\n" },
};

int
main(int argc, char **argv)
{
	cli_commands(commands, sizeof(commands) / sizeof(commands[0]));
	cli_guard_start();
	if (argc < 2)
		return cli_usage(stderr, 2);
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)
		return cli_usage(stdout, 0);
	if (strcmp(argv[1], "help") == 0 && argc > 2) {
		argv[1] = argv[2];
		argv[2] = (char *)"--help";
		argc = 3;
	} else if (strcmp(argv[1], "help") == 0) {
		return cli_usage(stdout, 0);
	}
	if (strcmp(argv[1], "--version") == 0) {
		printf("bulkshim %s\n", BS_VERSION);
		return 0;
	}
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		if (strcmp(argv[1], commands[i].name) == 0) {
			char name[32];
			int r;

			/* getopt's messages then begin "bulkshim status: ...". */
			snprintf(name, sizeof(name), "bulkshim %s", commands[i].name);
			argv[1] = name;
			r = commands[i].run(argc - 1, argv + 1);

			if (fflush(stdout) != 0 && r == 0) {
				fprintf(stderr, "bulkshim: cannot write the output: %s\n",
				    strerror(errno));
				r = 1;
			}
			return r;
		}
	}
	fprintf(stderr, "bulkshim: unknown command \"%s\"\n", argv[1]);
	return cli_usage(stderr, 2);
}

/* cli.h - what the files of the bulkshim CLI share: targets, snapshots, help, output. */
#ifndef BULKSHIM_CLI_H
#define BULKSHIM_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "shim.h"

#define CLI_HOT_PERCENT	80	/* a compartment this full is flagged HOT */

/* Which segment a subcommand works on: -s SEGMENT, else the segment that
 * -c FILE (or BULKSHIM_CONFIG, or the default config) names. */
struct cli_target {
	const char *config;
	const char *segment;
};

/* One compartment's figures, read once with atomic loads so that a report
 * is consistent with itself. Limits are UINT32_MAX for "none". */
struct cli_class {
	char name[BS_CLASS_NAME_MAX];
	uint32_t limit, in_use, peak;
	uint64_t admitted, rejected;
};

struct cli_comp {
	uint32_t index;
	char name[BS_NAME_MAX];
	uint32_t limit, in_use, over, peak, waiting;
	uint32_t inflight_limit, inflight, inflight_over, inflight_peak;
	uint32_t max_wait_ms, max_waiting, connect_timeout_ms, io_timeout_ms;
	int reject_errno;
	bool enforce;
	bool hot;		/* at or above CLI_HOT_PERCENT of either limit */
	uint64_t admitted, rejected, last_rejection_ms, reclaimed, inflight_admitted;
	uint64_t connect_timeouts, io_timeouts, peak_rate;
	uint64_t rejected_by[REASON_MAX], would_reject[REASON_MAX];
	size_t nclass;		/* classes with a limit */
	struct cli_class cls[BS_MAX_CLASSES];
	bool kernel;		/* the kernel engine counts this compartment too */
	uint32_t kernel_in_use;	/* of in_use, the kernel engine's */
};

/* A histogram read once: buckets, their total, and the sum. */
struct cli_hist {
	uint64_t bucket[BS_HIST_BUCKETS];
	uint64_t total;
	uint64_t sum_us;
};

/* ---- cli_common.c ---- */

/* Prints a subcommand's synopsis and help to f and returns status; an
 * unknown name prints the whole usage. */
int cli_help(const char *cmd, FILE *f, int status);
/* The whole usage text (the man page's SYNOPSIS) to f; returns status. */
int cli_usage(FILE *f, int status);
/* Handles a -c or -s option of a subcommand; returns false for other options. */
bool cli_target_opt(struct cli_target *t, int opt, const char *arg);
/* Parses what the reporting subcommands take: [-c FILE | -s SEGMENT]
 * [--json] [--help]. Returns -1 to go on, or the exit status to return
 * (0 after --help, 2 on a usage error, with the help printed). */
int cli_parse_view(int argc, char **argv, const char *name, struct cli_target *t, bool *json);
/* The segment name a target means, into out. Prints the error and returns
 * -1 when the config cannot be read or the name is not valid. */
int cli_segment_name(const struct cli_target *t, char *out, size_t len);
/* Opens the target's segment. writable: for changes, with a clear error on
 * a segment this user may not write; otherwise read-write when allowed (to
 * reclaim the permits of dead processes first) and read-only else. Prints
 * the error and returns -1 on failure. */
int cli_open(const struct cli_target *t, bool writable, struct seg **out);
/* Reads compartment i (< ncomp) of s into *c; cannot fail. */
void cli_read_comp(const struct seg *s, uint32_t i, struct cli_comp *c);
/* Reads a histogram into *out; total is the sum of the buckets read, so
 * that the buckets and the total agree; cannot fail. */
void cli_read_hist(const struct seg_hist *h, struct cli_hist *out);
/* The upper bound in microseconds of the bucket holding the quantile
 * permille/1000 of h (500: p50, 990: p99); 0 when h is empty. Bucket i holds
 * values below 2^i us, so this is an upper bound of the true quantile. */
uint64_t cli_hist_quantile_us(const struct cli_hist *h, unsigned permille);
/* Processes in state PROC_LIVE whose PID is alive with its start time;
 * a record that cannot be checked counts as alive (see seg_pid_alive). */
uint32_t cli_live_processes(const struct seg *s);
/* Writes s as a JSON string literal; write errors are left to the stream. */
void cli_json_string(FILE *f, const char *s);
/* Writes "#####....." of `width` cells for used/limit into buf (width + 1
 * bytes); an unlimited limit gives all dots. */
void cli_bar(char *buf, size_t width, uint64_t used, uint64_t limit, char ch);
/* A limit as text: "-" for none. */
const char *cli_limit_text(uint32_t limit, char *buf, size_t len);
/* "1.5s ago", "42s ago" or "-" for a CLOCK_REALTIME time in ms. */
void cli_format_ago(uint64_t when_ms, char *buf, size_t len);
/* Parses a whole decimal number into *out; false on junk or overflow. */
bool cli_parse_u64(const char *s, uint64_t *out);

/* ---- bulkshim.c ---- */

/* Writes `status` of s to f: the table, or the JSON object when json. Out
 * of memory, it writes nothing and says so on stderr. */
void cli_print_status(FILE *f, const struct seg *s, bool json);

/* ---- the subcommands ----
 * Each takes its own argv (argv[0] is "bulkshim NAME", for getopt's messages)
 * and returns the exit status: 0, 1 on an error (said on stderr), 2 on a
 * usage error (the synopsis on stderr). --help prints the help on stdout. */

int cmd_check(int argc, char **argv);	/* cmd_check.c */
int cmd_list(int argc, char **argv);
int cmd_set(int argc, char **argv);	/* cmd_live.c */
int cmd_reload(int argc, char **argv);
int cmd_reset(int argc, char **argv);
int cmd_metrics(int argc, char **argv);	/* cmd_metrics.c */
int cmd_serve(int argc, char **argv);	/* cmd_serve.c */
/* Writes the Prometheus text exposition of s to f. Out of memory, it
 * writes nothing. */
void cli_write_metrics(FILE *f, const struct seg *s);
int cmd_watch(int argc, char **argv);	/* cmd_watch.c */
int cmd_size(int argc, char **argv);	/* cmd_size.c */
int cmd_suggest(int argc, char **argv);
int cmd_attach(int argc, char **argv);	/* cmd_kernel.c */
int cmd_detach(int argc, char **argv);
int cmd_run_kernel(int argc, char **argv);
/* True if `run`'s argv asks for the kernel engine (--kernel). */
bool cli_run_wants_kernel(int argc, char **argv);
/* Adds the kernel engine's counts of c's compartment (if it has any) to c. */
void cli_kernel_merge(const struct seg *s, struct cli_comp *c);
/* Copies each compartment's limit, enforce and errno from the segment into
 * the kernel engine's map, if one is loaded for the segment. */
void cli_kernel_sync(const struct seg *s);
/* Writes cfg's rules and limits into the kernel engine loaded for its
 * segment, if any. Returns 0, or -1 after printing the error. */
int cli_kernel_reload(const struct bs_config *cfg);
/* Zeroes the kernel engine's statistics of compartment name (NULL: all),
 * as seg_reset_counters does: never a count in use or a limit. */
void cli_kernel_reset(const struct seg *s, const char *name);

#endif

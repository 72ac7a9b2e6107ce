/* cli.h - what the files of the bulkshim CLI share: the snapshot of a segment, help, targets, output. */
#ifndef BULKSHIM_CLI_H
#define BULKSHIM_CLI_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "admit/admit.h"
#include "log.h"
#include "sys.h"

/*
 * The files call downward only: main and the command table (bulkshim.c)
 * call the commands (cmd_*.c, fleet.c). The views among them (status,
 * watch, metrics, serve, suggest) print a snapshot: snapshot.c reads the
 * figures they show, with the readers of the features below it
 * (cli_adaptive.c, cli_pool.c, fleet_view.c, cmd_kernel.c). Everything may
 * call help, targets and opening (cli_common.c) and the text helpers
 * (cli_format.c), which call nothing of the CLI.
 *
 * A function that writes to a FILE leaves write errors to the stream:
 * main checks stdout once, after the command.
 */

#define CLI_HOT_PERCENT	80	/* a compartment this full is flagged HOT */
#define CLI_LIVE_TEXT	(BS_CLASS_NAME_MAX + 24)	/* "64 class NAME" */

/* ---- cli_format.c: text helpers of every view ---- */

/*
 * The values of a snapshot that cannot be true (snapshot.c decides): one bit
 * per field in the `damaged` mask of a compartment, class, pool or of the
 * segment itself, each named as its key in `status --json`. A damaged value
 * is never printed as a number: the text views say "damaged", JSON has null
 * and a "damaged" list of the names, metrics leave its sample out.
 */
enum cli_field {
	CF_NAME, CF_LIMIT, CF_LIVE_LIMIT, CF_IN_USE, CF_OVER, CF_PEAK, CF_WAITING, CF_INFLIGHT,
	CF_INFLIGHT_LIMIT, CF_INFLIGHT_PEAK, CF_MAX_WAIT_MS, CF_MAX_WAITING,
	CF_CONNECT_TIMEOUT_MS, CF_IO_TIMEOUT_MS, CF_ERRNO, CF_ADMITTED, CF_REJECTED,
	CF_LAST_REJECTION_MS, CF_RECLAIMED, CF_RECONCILED, CF_INFLIGHT_ADMITTED,
	CF_CONNECT_TIMEOUTS, CF_IO_TIMEOUTS, CF_PEAK_RATE, CF_REJECTED_BY, CF_WOULD_REJECT,
	CF_H_CONNECT, CF_H_REPLY, CF_H_WAIT, CF_GUARANTEED, CF_BORROWED, CF_CLASS_LENT,
	CF_SIZE, CF_RESERVED, CF_SHARED, CF_LENT, CF_FREE, CF_ADAPTIVE, CF_FLEET_LIMIT,
	CF_SEGMENT, CF_ATTACHED, CF_UNPROTECTED, CF_UNPROTECTED_LAST_MS, CF_TRUNCATED, CF_INFLIGHT_LIVE_LIMIT,
	CF_FIELDS
};
#define CLI_DAMAGED(mask, field)	((((mask) >> (field)) & 1) != 0)
/* A name read from a segment (field of size bytes), as a config could
 * have written it (log_name): for printing. The text lives in one of four
 * buffers that later calls reuse: enough for the names of one line. */
const char *cli_name(const char *field, size_t size);
#define CLI_SEGNAME(x)	cli_name((x), sizeof(x))

#define CLI_DAMAGED_TEXT		"damaged"

/* Names shortened to width characters at most (a '~' where a part was
 * left out), all different where the names are: out[i] for names[i]. A
 * name that fits is kept whole. Cannot fail (short of memory, the names are
 * cut, head and tail). */
#define CLI_ABBREV_MAX	(BS_NAME_MAX + 16)
void cli_abbrev(const char *const *names, size_t n, size_t width, char (*out)[CLI_ABBREV_MAX]);
/* The key of field f in `status --json` ("in_use"); cannot fail. */
const char *cli_field_name(enum cli_field f);
/* v in decimal, or "damaged" when bad; returns buf (cut to len). */
const char *cli_count_text(uint64_t v, bool bad, char *buf, size_t len);
/* `, "KEY": v`, or `, "KEY": null` when bad; write errors are left to f. */
void cli_json_value(FILE *f, const char *key, uint64_t v, bool bad);
/* cli_json_value with the field's name for KEY, bad when mask has it. */
void cli_json_field(FILE *f, uint64_t mask, enum cli_field field, uint64_t v);
/* `, "damaged": [names of the fields of mask]`. */
void cli_json_damaged(FILE *f, uint64_t mask);
/* Appends to the text in buf (*pos bytes of len) prefix and the names of
 * mask's fields ("compartment web: in_use, peak"), after "; " unless it is
 * the first; cut with "..." at len; nothing for an empty mask. */
void cli_damage_list(char *buf, size_t len, size_t *pos, const char *prefix, uint64_t mask);

/* Writes s as a JSON string literal; write errors are left to the stream. */
void cli_json_string(FILE *f, const char *s);
/* Writes "#####....." of `width` cells for used/limit into buf (width + 1
 * bytes); an unlimited limit gives all dots. Cannot fail. */
void cli_bar(char *buf, size_t width, uint64_t used, uint64_t limit, char ch);
/* A limit as text: "-" for none; returns buf (cut to len, never overrun). */
const char *cli_limit_text(uint32_t limit, char *buf, size_t len);
/* "1.5s ago", "42s ago" or "-" for a CLOCK_REALTIME time in ms; cut to len. */
void cli_format_ago(uint64_t when_ms, char *buf, size_t len);
/* Parses a whole decimal number into *out; false on junk or overflow. */
bool cli_parse_u64(const char *s, uint64_t *out);

/* ---- cli_common.c: help, targets, opening a segment ---- */

/* One subcommand, as bulkshim.c's command table lists it: what dispatch
 * calls and what usage and help print. */
struct cli_command {
	const char *name;
	int (*run)(int argc, char **argv);	/* see "the subcommands" below */
	const char *synopsis;	/* its usage line, after "bulkshim " */
	const char *help;	/* what `bulkshim NAME --help` adds to it */
};
/* Hands usage and help the command table (n entries, in the order of the
 * man page's SYNOPSIS); main calls it first. Cannot fail. */
void cli_commands(const struct cli_command *table, size_t n);
/* Prints a subcommand's synopsis and help to f and returns status; an
 * unknown name prints the whole usage. */
int cli_help(const char *cmd, FILE *f, int status);
/* The whole usage text (the man page's SYNOPSIS) to f; returns status. */
int cli_usage(FILE *f, int status);

/* Which segment a subcommand works on: -s SEGMENT, else the segment that
 * -c FILE (or BULKSHIM_CONFIG, or the default config) names. */
struct cli_target {
	const char *config;
	const char *segment;
};
/* The config file a target (or NULL) means: -c FILE, else BULKSHIM_CONFIG,
 * else the default config. Cannot fail. */
const char *cli_config_path(const struct cli_target *t);
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

/* ---- snapshot.c: a segment read once, for the views to print ---- */

/* One class of a compartment, with a limit there. Limits are UINT32_MAX
 * for "none". */
struct cli_class {
	char name[BS_CLASS_NAME_MAX];
	uint32_t limit, in_use, peak;
	uint64_t admitted, rejected;
	/* When the classes split the compartment (shares): the class's
	 * guarantee, and how much of in_use is above it (borrowed, derived);
	 * its ceiling is limit. */
	bool shares;
	uint32_t guaranteed, borrowed;
	uint32_t index;		/* the class's index in the segment */
	uint64_t damaged;	/* bits 1 << enum cli_field */
};

/* The adaptive limit of a compartment (read by cli_adaptive.c). */
struct cli_adaptive {
	uint32_t mode, kind, limit, min, max, window_ms, tolerance_pct, baseline_us;
	uint32_t last_from, last_to, last_reason;
	uint32_t algorithm;	/* enum ad_algorithm: the controller that moves it */
	uint64_t sample_us, sample_conc16, windows, changes, last_change_ms;
	uint32_t knee;		/* ad_knee: 0 = none */
	bool knee_sure;
	uint32_t edge;		/* ad_edge: 0 = none */
	bool edge_again;
};

/* A histogram: its buckets, their total, the sum, and the histogram's own
 * count (bumped after its bucket, so it may lag the total). */
struct cli_hist {
	uint64_t bucket[BS_HIST_BUCKETS];
	uint64_t total;
	uint64_t sum_us;
	uint64_t count;
};

/* A compartment's drill (read by drill_seg.c). It runs while its faults
 * are set and its deadline is ahead; remaining_ms is 0 when it does not. */
struct cli_drill {
	bool allowed, running;
	uint32_t faults, delay_ms, connect_delay_ms, fraction_ppm;
	int32_t by_pid;
	uint64_t id, start_realtime_ms, remaining_ms, touched, spared;
};

/* One compartment's figures. Limits are UINT32_MAX for "none". */
struct cli_comp {
	uint32_t index;
	char name[BS_NAME_MAX];
	uint32_t limit, in_use, over, peak, waiting;
	uint32_t inflight_limit, inflight, inflight_over, inflight_peak;
	uint32_t inflight_limit_now;	/* what admission enforces now: the adaptive limit if lower */
	enum limit_by inflight_live_by;	/* which level inflight_limit_now comes from */
	uint32_t max_wait_ms, max_waiting, connect_timeout_ms, io_timeout_ms;
	int reject_errno;
	bool enforce;
	/* The next connect of its busiest class would be refused or wait:
	 * at or above CLI_HOT_PERCENT of either live limit, its pool has no
	 * room left for it, or its busiest class is at its class limit. */
	bool hot;
	bool pool_full;		/* in a pool that can lend it nothing more */
	bool class_full;	/* its busiest class is at its own limit */
	uint64_t admitted, rejected, last_rejection_ms, reclaimed, inflight_admitted;
	uint64_t connect_timeouts, io_timeouts, peak_rate;
	uint64_t recent_rate;	/* highest admissions/s in the last BS_RATE_SECONDS s */
	uint64_t rejected_by[REASON_MAX], would_reject[REASON_MAX];
	struct cli_hist h_connect, h_reply, h_wait;
	bool shares;		/* the classes split the compartment */
	size_t nclass;		/* classes with a limit */
	struct cli_class cls[BS_MAX_CLASSES];
	/* In a pool (pool >= 0): the guarantee, and how much of in_use is
	 * above it (borrowed, derived); the ceiling is limit. */
	int pool;
	char pool_name[BS_NAME_MAX];
	uint32_t guaranteed, borrowed;
	uint32_t class_lent;	/* permits lent to classes beyond their guarantees */
	struct cli_adaptive ad;
	uint64_t reconciled;	/* permits of sockets found closed unseen */
	/* A fleet budget (read by fleet_view.c); fleet_limit 0 = none. */
	/* The live limit of connections: the lowest of the static limit, the
	 * fleet share or floor, the adaptive limit (limit_why), what its pool
	 * can still lend it plus what it holds, and the same for its busiest
	 * class when that class has a limit; live_by names the level that binds, live_by_text says it
	 * ("adaptive", "class batch"). UINT32_MAX: none. */
	uint32_t live_limit;
	enum limit_by live_by;
	char live_by_text[BS_CLASS_NAME_MAX + 8];
	uint32_t fleet_limit, fleet_floor, fleet_share, fleet_hosts, fleet_state;
	uint32_t fleet_demand;		/* the agent's last demand */
	uint32_t fleet_churn_c;		/* share changes per minute, times 100 */
	int32_t fleet_agent_pid;
	uint32_t fleet_agent;	/* FLEET_AGENT_* (fleet.h) */
	bool fleet_lease;	/* the lease is valid now */
	uint64_t fleet_lease_left_ms;
	uint64_t fleet_lease_age_ms;	/* since the last renewal; UINT64_MAX: never */
	bool kernel;		/* the kernel engine counts this compartment too */
	uint32_t kernel_in_use;	/* of in_use, the kernel engine's */
	uint32_t kernel_joint;	/* the count shared with the engine: its own and the library's */
	struct cli_drill drill;
	/* Its values that cannot be true, bits 1 << enum cli_field (their
	 * numbers are 0, a limit none); classes have their own. */
	uint64_t damaged;
	uint32_t ndamaged;	/* damaged values of the compartment and its classes */
};

/* One pool's figures; in_use and borrowed are derived from its
 * compartments, free is what is neither in use nor reserved. */
struct cli_pool {
	char name[BS_NAME_MAX];
	uint32_t size, reserved, guaranteed, shared, lent, in_use, borrowed, free, peak, sleepers;
	uint64_t rejected;
	uint64_t damaged;	/* bits 1 << enum cli_field */
};

/* A whole segment: its header's figures, every compartment (the kernel
 * engine's counts merged in) and every pool. */
struct cli_snap {
	char name[BS_NAME_MAX];
	char config_path[PATH_MAX];	/* the config it was last set up from */
	uint32_t generation;
	uint32_t processes;		/* live processes holding permits */
	uint64_t attaches;		/* processes that attached since its creation */
	uint64_t unprotected;		/* processes that meant to and ran without limits */
	uint64_t unprotected_ms;	/* CLOCK_REALTIME of the last of them */
	char unprotected_why[sizeof(((struct seg_header *)0)->unprotected_why) + 1];
	uint32_t ncomp;
	struct cli_comp *comp;		/* ncomp of them, in the segment's order */
	uint32_t npools;
	struct cli_pool pool[BS_MAX_POOLS];
	uint64_t damaged;		/* the header's values that cannot be true */
	uint32_t ndamaged;		/* damaged values in all: header, compartments, classes, pools */
};

/* Reads every figure of s into *snap, at one pass. Every name is as
 * log_name makes it and every text as log_scrub does (a name that no config
 * can give counts as damaged), and every value that cannot be true is
 * flagged in its damaged mask instead of kept (see enum cli_field). Returns
 * 0, or -ENOMEM (with *snap empty, nothing to free). */
int cli_snap_read(const struct seg *s, struct cli_snap *snap);
/* Frees what cli_snap_read allocated; cannot fail. */
void cli_snap_free(struct cli_snap *snap);
/* Processes in state PROC_LIVE whose PID is alive with its start time;
 * a record that cannot be checked counts as alive (see sys_pid_alive).
 * Cannot fail. */
uint32_t cli_live_processes(const struct seg *s);
/* Requests in flight in compartment i (< ncomp) of s now, those observe
 * mode let past included: a snapshot's inflight, for sampling. Cannot fail. */
uint32_t cli_inflight_now(const struct seg *s, uint32_t i);
/* Connections open in compartment i (< ncomp) of s now, those observe mode
 * let past included: a snapshot's in_use, for sampling. Cannot fail. */
uint32_t cli_in_use_now(const struct seg *s, uint32_t i);
/* The upper bound in microseconds of the bucket holding the quantile
 * permille/1000 of h (500: p50, 990: p99); 0 when h is empty. Bucket i holds
 * values below 2^i us, so this is an upper bound of the true quantile
 * (cli_format.c: the drill's unit test reads it without the CLI). */
uint64_t cli_hist_quantile_us(const struct cli_hist *h, unsigned permille);

/* ---- cli_adaptive.c: the adaptive limit, read and shown ---- */

/* Reads the adaptive limit of sc into *a (mode AD_NONE: none); cannot fail. */
void cli_read_adaptive(const struct seg_comp *sc, struct cli_adaptive *a);
/* "inflight" or "connections": the limit the adaptive one moves. */
const char *cli_adaptive_applies(const struct cli_adaptive *a);
/* `, "adaptive": {...}` (null when the compartment is not adaptive). */
void cli_adaptive_json(FILE *f, const struct cli_adaptive *a);
/* The ADAPTIVE table of `status`, printed when a compartment is adaptive. */
void cli_adaptive_text(FILE *f, const struct cli_comp *all, uint32_t n);
/* One line under a compartment's row in `watch`, if it is adaptive. */
void cli_adaptive_watch(FILE *f, const struct cli_comp *c, bool ansi);
/* The bulkshim_adaptive_* families of `metrics`; labels() writes a label set. */
void cli_adaptive_metrics(FILE *f, const char *seg, const struct cli_comp *all, uint32_t n,
    void (*labels)(FILE *, const char *, const char *, const char *, const char *));

/* ---- cli_pool.c: pools and class shares, read, shown, set and checked ---- */

/* Reads pool p (< npools) of s into *out; cannot fail. */
void cli_read_pool(const struct seg *s, uint32_t p, struct cli_pool *out);
/* Fills the pool fields of c (compartment c->index of s); cannot fail. */
void cli_read_comp_pool(const struct seg *s, struct cli_comp *c);
/* Connection permits compartment sc may still take from its pool: what
 * is left of its guarantee and what the pool's shared part has not lent;
 * UINT32_MAX when it is in no pool. Cannot fail. */
uint32_t cli_pool_room(const struct seg *s, const struct seg_comp *sc);
/* `, "pools": [...]` for status --json. */
void cli_json_pools(FILE *f, const struct cli_snap *snap);
/* The pool keys of a compartment for status --json. */
void cli_json_comp_pool(FILE *f, const struct cli_comp *c);
/* The class-share and pool tables of status and watch, each line ended by
 * eol before its newline; nothing for a segment with neither. width 0:
 * the wide tables of status; a screen's width below theirs: narrower ones
 * with names abbreviated (watch). */
void cli_text_pools(FILE *f, const struct cli_snap *snap, const char *eol, int width);
/* The class-share and pool series of the metrics exposition, for the
 * compartments all[0..n) of snap and every pool. */
void cli_metrics_pools(FILE *f, const struct cli_snap *snap, const struct cli_comp *all,
    uint32_t n);
/* Adds a class's guaranteed share to its status line and JSON object. */
void cli_text_class_share(FILE *f, const struct cli_class *cc);
void cli_json_class_share(FILE *f, const struct cli_class *cc);
/* `suggest`: per class of a compartment its classes split, a proposed
 * guarantee and ceiling from the class's peak and refusals (text lines, or
 * the JSON key "classes"); nothing for other compartments. */
void cli_suggest_classes(FILE *f, const struct cli_comp *c, bool json);
/* `set COMP guaranteed.CLASS N`: 0, or 1 with a message. */
int cli_set_class_guaranteed(struct seg *s, uint32_t i, uint32_t k, uint32_t v);

/* The index of the pool called name in s, or -1 if it has none. */
int cli_find_pool(const struct seg *s, const char *name);
/* True for the keys of `set` that name a pool's setting (size, reserved). */
bool cli_pool_key(const char *key);
/* `bulkshim set POOL size|reserved N`: refused (1, said on stderr) when
 * the pool would leave less than its guarantees. */
int cli_set_pool(struct seg *s, const char *name, const char *key, uint32_t v);
/* `bulkshim set COMPARTMENT guaranteed N`: refused above the ceiling or
 * when the pool's guarantees would pass its size less its reserve. */
int cli_set_guaranteed(struct seg *s, uint32_t i, uint32_t v);
/* False (said on stderr) if v as compartment i's ceiling is below its guarantee. */
bool cli_ceiling_ok(const struct seg *s, uint32_t i, uint32_t v);
/* A reload's pools (the caller checked pool_mismatch): applies sizes,
 * reserves and guarantees and says what changed. */
void cli_reload_pools(struct seg *s, const struct bs_config *cfg, const int *cmap);

/* `bulkshim check`: each pool's size, reserve, guarantees and shared part. */
void cli_check_pools(const struct bs_config *cfg);

/* ---- fleet_view.c: a compartment's fleet budget, read and shown ---- */

/* Reads the fleet words of sc into c (live_limit too); cannot fail. */
void cli_read_fleet(const struct seg_comp *sc, struct cli_comp *c);
/* The fleet keys of a compartment's status --json object, each after ", ". */
void cli_json_fleet(FILE *f, const struct cli_comp *c);
/* The table of fleet compartments for `status`, if any has a fleet budget. */
void cli_text_fleet(FILE *f, const struct cli_comp *all, uint32_t n);
/* "postgres: fleet share 12 of 500 (floor 4), lease 1.2s left, ..." into
 * buf, the compartment called name (NULL: its own name). */
void cli_fleet_line(const struct cli_comp *c, const char *name, char *buf, size_t len);

/* ---- drill_seg.c: a compartment's drill, read and shown ---- */

/* Reads the drill words of sc into *d; cannot fail. */
void cli_read_drill(struct seg_comp *sc, struct cli_drill *d);
/* "delay,stall" for DRILL_* bits, into buf (cut to len); returns buf. */
const char *cli_drill_faults(uint32_t faults, char *buf, size_t len);
/* `, "drill": {...}` while a drill runs, `, "drill": null` otherwise. */
void cli_json_drill(FILE *f, const struct cli_drill *d);
/* The bulkshim_drill_* families of `metrics`; labels() writes a label set. */
void cli_drill_metrics(FILE *f, const char *seg, const struct cli_comp *all, uint32_t n,
    void (*labels)(FILE *, const char *, const char *, const char *, const char *));

/* ---- cmd_kernel.c: the kernel engine from the CLI ---- */

/* True if `run`'s argv asks for the kernel engine (--kernel). */
bool cli_run_wants_kernel(int argc, char **argv);
/* Adds the kernel engine's counts of s's compartments all[0..n) (those it
 * has) to them. When the engine's counts cannot be read for lack of
 * privilege it says so on stderr, once per process, and adds nothing. */
void cli_kernel_merge(const struct seg *s, struct cli_comp *all, uint32_t n);
/* Copies each compartment's limit, enforce and errno from the segment into
 * the kernel engine's map, if one is loaded for the segment. */
void cli_kernel_sync(const struct seg *s);
/* Writes cfg's rules and limits into the kernel engine loaded for its
 * segment, if any. Returns 0, or -1 after printing the error. */
int cli_kernel_reload(const struct bs_config *cfg);
/* Zeroes the kernel engine's statistics of compartment name (NULL: all),
 * as stat_reset does: never a count in use or a limit. */
void cli_kernel_reset(const struct seg *s, const char *name);
/* The cgroups the kernel engine of segment is attached to (0: none, or not
 * visible to this user). Cannot fail. */
int cli_kernel_cgroups(const char *segment);

/* ---- cmd_status.c: `status` ---- */

/* Writes `status` of snap to f as the table; write errors are left to f. */
void cli_status_text(FILE *f, const struct cli_snap *snap);
/* The one WARNING line naming the segment and each of its damaged values,
 * ended by eol before its newline; nothing when none is. */
void cli_text_damaged(FILE *f, const struct cli_snap *snap, const char *eol);
/* Writes `status --json` of snap to f: one object and a newline; hosts adds
 * what the config's host names resolve to now (blocking on DNS; a config
 * that cannot be read adds an empty list). Write errors are left to f. */
void cli_status_json(FILE *f, const struct cli_snap *snap, bool hosts);

/* ---- cmd_metrics.c: `metrics` ---- */

/* Writes the Prometheus text exposition of snap to f, the latency
 * histograms unless !histograms; write errors are left to the stream. */
void cli_write_metrics(FILE *f, const struct cli_snap *snap, bool histograms);

/* ---- cli_log.c: the lines of fleet, serve and run ---- */

/* Sets the format of cli_log's lines: JSON when BULKSHIM_LOG_FORMAT is
 * "json", or when it is unset and config_json (the config's log_format);
 * program is what JSON lines name ("bulkshim fleet"). Any other value of
 * the variable is said in a warning and ignored. Before it, lines are text. */
void cli_log_init(const char *program, bool config_json);
bool cli_log_json(void);
/* One line on stderr: prefix and the message as text, or the message as a
 * JSON object of the given level (LOG_ERROR, LOG_WARN, LOG_INFO), with the
 * fields of the library's lines (log_json_message). */
void cli_log(int level, const char *prefix, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* ---- run_check.c ---- */

/* Prints cfg_load_all's errors, one "bulkshim: FILE:LINE: ..." line each
 * (the text is cut at its newlines). */
void cli_print_errors(char *errs);

/* Loads path as the library would; prints every reason it would run the
 * program without limits and returns -1, else 0. A host name that gives
 * no address is a warning naming what runs unprotected, and -1 in strict
 * mode (the file's strict = true; or BULKSHIM_STRICT). */
int run_check_config(const char *path);
/* Returns -1, after saying why, when the shim cannot see prog's calls
 * (static, Go, setuid/setgid, file capabilities), unless force (then a
 * warning and 0). 0 for a program it can see or cannot find. */
int run_check_program(const char *prog, bool force);

/* ---- live_diff.c ---- */

/* Prints "  COMP KEY OLD -> NEW" for every setting that applying cfg (its
 * compartment i being the segment's cmap[i]) would change in s, marking
 * those a `bulkshim set` changed; returns how many. */
size_t live_diff(const struct seg *s, const struct bs_config *cfg, const int *cmap);
/* Notes in the segment that `bulkshim set` changed KEY of COMP. */
void live_note_set(struct seg_header *h, const char *comp, const char *key);
/* True if it did since the last reload. */
bool live_was_set(const struct seg_header *h, const char *comp, const char *key);
/* Whether `set NAME KEY VALUE` (NAME NULL: --all) keeps the budget that
 * `check` and `reload` hold a config to (cfg_check_sums), with every other
 * limit as the segment has it now; a pool's own sums are left to the
 * setters, which refuse them with or without --force. The config is the
 * file `config` names, else the one the segment records. False, said on
 * stderr with the arithmetic, when the change breaks the budget, unless
 * force (then said, and true). True, with a note, when there is no config
 * to check against; true for keys and changes that cannot break it. */
bool live_sums_ok(const struct seg *s, const char *config, const char *name, const char *key,
    const char *value, bool force);

/* ---- cli_hosts.c ---- */

#define CLI_HOST_ADDRS	16
/* A host-name destination and what it resolves to now. */
struct cli_host {
	const char *comp, *host;
	uint16_t port_lo, port_hi;
	int line;
	int error;		/* getaddrinfo's, EAI_NODATA for no address; 0 = resolved */
	size_t naddr;
	char addr[CLI_HOST_ADDRS][46];	/* INET6_ADDRSTRLEN */
};
/* Resolves every host-name destination of cfg (getaddrinfo, blocking) and
 * calls fn for each; returns how many resolve to nothing. */
size_t cli_resolve_hosts(const struct bs_config *cfg, void (*fn)(const struct cli_host *, void *),
    void *arg);
/* Why a host did not resolve, in words. */
const char *cli_host_error(const struct cli_host *h);
/* Writes ", \"hosts\": [...]" for the config at path (nothing in the array
 * when it is empty or cannot be read). */
void cli_json_hosts(FILE *f, const char *path);
/* Text status: a line for each host-name destination of the config at path
 * that gives no address now (its connections are not limited). */
void cli_text_hosts(FILE *f, const char *path);

/* ---- seg_access.c: who may use a segment ---- */

/* A segment's owner, group and permission bits, as it is (seg_perm_of) or
 * as a config would create it. */
struct seg_perm {
	uid_t uid;
	gid_t gid;
	unsigned mode;
};
/* A user as the segment's permissions see it: its uid, every group it is
 * in (its primary group first), and the two capabilities that matter. */
struct seg_user {
	uid_t uid;
	size_t ngids;
	gid_t *gids;
	bool dac_override;	/* may open any file (root) */
	bool chown;		/* may give a file to anyone (root, CAP_CHOWN) */
	char name[64];		/* its login name, or "uid N" */
};
/* Why a user cannot use a segment, or SEG_USABLE. */
enum seg_refusal { SEG_USABLE = 0, SEG_UNTRUSTED, SEG_UNWRITABLE };

/* The user uid from the user database, with its groups (just its uid when
 * it has no entry), as a process of that user would run. Returns 0, or
 * -ENOMEM with *u holding nothing to free. */
int seg_user_of(uid_t uid, struct seg_user *u);
/* This process: its effective uid, groups and capabilities. Returns 0, or
 * -ENOMEM with *u holding nothing to free. */
int seg_user_self(struct seg_user *u);
/* Frees what seg_user_of or seg_user_self allocated; cannot fail. */
void seg_user_free(struct seg_user *u);
/* True if u is in group gid. Pure. */
bool seg_user_in(const struct seg_user *u, gid_t gid);
/* Whether u may open a segment of perm p read-write: the permission bits
 * alone, as the kernel checks them. Pure. */
bool seg_user_can_open(const struct seg_perm *p, const struct seg_user *u);
/* Whether u can attach to a segment of perm p as seg_attach does: open it
 * read-write, and trust it (its own, root's, or the owner cfg names). Pure. */
enum seg_refusal seg_refusal_of(const struct seg_perm *p, const struct seg_user *u,
    const struct bs_config *cfg);
/* The owner, group and mode of /dev/shm/bulkshim.SEGMENT into *p, and its
 * size (0 while its creator sets it up) into *size if not NULL. Returns 0,
 * -ENOENT, or another -errno. */
int seg_perm_of(const char *segment, struct seg_perm *p, off_t *size);
/* "root:root, mode 0600" into buf (cut to len); returns buf. */
const char *seg_perm_text(const struct seg_perm *p, char *buf, size_t len);
/* A user's or group's name, or "uid N" / "gid N", into buf; returns buf. */
const char *seg_id_name(unsigned id, bool group, char *buf, size_t len);
/* For `status`: one WARNING line on f when the target's segment is owned so
 * that the programs meant to use it cannot (the config's owner cannot
 * write it; or, without an owner in the config, a segment no program ever
 * attached to that no other user can write). Says nothing otherwise, or
 * when the segment or the config cannot be read. */
void cli_seg_access_warn(FILE *f, const struct cli_target *t, const struct cli_snap *snap);

/* ---- the subcommands ----
 * Each takes its own argv (argv[0] is "bulkshim NAME", for getopt's messages)
 * and returns the exit status: 0, 1 on an error (said on stderr), 2 on a
 * usage error (the synopsis on stderr). --help prints the help on stdout. */

int cmd_status(int argc, char **argv);	/* cmd_status.c */
int cmd_check(int argc, char **argv);	/* cmd_check.c */
int cmd_list(int argc, char **argv);
int cmd_set(int argc, char **argv);	/* cmd_live.c */
int cmd_reload(int argc, char **argv);
int cmd_reset(int argc, char **argv);
int cmd_metrics(int argc, char **argv);	/* cmd_metrics.c */
int cmd_serve(int argc, char **argv);	/* cmd_serve.c */
int cmd_watch(int argc, char **argv);	/* cmd_watch.c */
int cmd_size(int argc, char **argv);	/* cmd_size.c */
int cmd_suggest(int argc, char **argv);
int cmd_rm(int argc, char **argv);	/* cmd_clean.c */
int cmd_prune(int argc, char **argv);
int cmd_fleet(int argc, char **argv);	/* fleet.c */
int cmd_attach(int argc, char **argv);	/* cmd_kernel.c */
int cmd_detach(int argc, char **argv);
int cmd_run_kernel(int argc, char **argv);
int cmd_drill(int argc, char **argv);	/* cmd_drill.c */

/* cli_guard.c: SIGBUS of a segment that shrinks while it is read. */
void cli_guard_start(void);

#endif

/* test_config.c - unit tests of config parsing, validation, messages and host resolution. */
#include "../../shim/config/config_load.c"

#include <arpa/inet.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

static char path[64];
static char err[BS_ERRLEN];

/* A compartment that is valid on its own, for configs testing something else. */
#define COMPS "compartments = ( { name = \"a\"; destinations = [ \"10.0.0.1:80\" ]; " \
	      "max_connections = 5; } );\n"

/* The head of a one-compartment config; the compartment's own keys follow
 * from line 3, and the config ends with " });\n". */
#define COMP_A "compartments = (\n{ name = \"a\"; destinations = [\"10.0.0.1\"];\n"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static void write_cfg(const char *text)
{
	size_t len = strlen(text), done = 0;
	int fd;

	snprintf(path, sizeof(path), "/tmp/bulkshim-test-XXXXXX.cfg");
	fd = mkstemps(path, 4);
	assert_true(fd >= 0);
	while (done < len) {
		ssize_t n = write(fd, text + done, len - done);

		assert_true(n > 0);
		done += (size_t)n;
	}
	assert_int_equal(close(fd), 0);
}

static int load(const char *text, struct bs_config *cfg, bool resolve)
{
	int rc;

	write_cfg(text);
	err[0] = '\0';
	rc = cfg_load(path, cfg, resolve, err, sizeof(err));
	unlink(path);
	return rc;
}

static void assert_zeroed(const struct bs_config *cfg)
{
	static const struct bs_config zero;

	assert_memory_equal(cfg, &zero, sizeof(zero));
}

/* Loads text, which must be valid; fails the test with the message if not. */
static void load_ok(const char *text, struct bs_config *cfg)
{
	if (load(text, cfg, false) != 0)
		fail_msg("%s", err);
}

/* A config that is refused, and the one line it is told: the line starts
 * with the file's name and tag (":7: ") and contains needle and needle2
 * (when not NULL); with exact, it is the file's name and exact; with
 * absent, it lacks absent. what says what is wrong, for a failure. */
struct error_case {
	const char *what, *text, *tag, *needle, *needle2, *exact, *absent;
};

/* Loads k->text, which must fail as k says and leave the config zeroed;
 * a failure begins with row. */
static void check_error(const char *row, const struct error_case *k)
{
	static const struct bs_config zero;
	struct bs_config cfg;
	char want[512];
	int rc;

	rc = load(k->text, &cfg, false);
	if (rc != -EINVAL)
		fail_msg("%s: cfg_load returned %d, not -EINVAL (\"%s\")", row, rc, err);
	snprintf(want, sizeof(want), "%s%s", path, k->tag);
	if (strncmp(err, want, strlen(want)) != 0)
		fail_msg("%s: message \"%s\" does not start with \"%s\"", row, err, want);
	if (strstr(err, k->needle) == NULL)
		fail_msg("%s: message \"%s\" lacks \"%s\"", row, err, k->needle);
	if (k->needle2 != NULL && strstr(err, k->needle2) == NULL)
		fail_msg("%s: message \"%s\" lacks \"%s\"", row, err, k->needle2);
	if (strchr(err, '\n') != NULL)
		fail_msg("%s: message \"%s\" is more than one line", row, err);
	if (memcmp(&cfg, &zero, sizeof(zero)) != 0)
		fail_msg("%s: the refused config was not left zeroed", row);
	snprintf(want, sizeof(want), "%s%s", path, k->exact ? k->exact : "");
	if (k->exact != NULL && strcmp(err, want) != 0)
		fail_msg("%s: message \"%s\", want \"%s\"", row, err, want);
	if (k->absent != NULL && strstr(err, k->absent) != NULL)
		fail_msg("%s: message \"%s\" has \"%s\"", row, err, k->absent);
}

/* check_error for each row of a table, named by its index and what. */
static void check_errors(const struct error_case *rows, size_t n)
{
	char row[160];

	for (size_t i = 0; i < n; i++) {
		snprintf(row, sizeof(row), "row %zu (%s)", i, rows[i].what);
		check_error(row, &rows[i]);
	}
}

/* Loads text, which must fail with one message that starts with the file
 * name and the tag (":7: "), contains each needle, and leaves cfg zeroed. */
static void expect_error(const char *text, const char *tag, const char *needle,
			 const char *needle2)
{
	const struct error_case k = { "", text, tag, needle, needle2, NULL, NULL };

	check_error("the config", &k);
}

static const char good[] =
	"segment = \"shop\";\n"							/* 1 */
	"budget  = { pool = 100; reserved = 10; };\n"				/* 2 */
	"strict = true;\n"							/* 3 */
	"mode = \"0660\";\n"							/* 4 */
	"owner = \"root\"; group = \"root\";\n"					/* 5 */
	"max_processes = 512;\n"						/* 6 */
	"max_sockets = 4096;\n"							/* 7 */
	"resolve_timeout_ms = 250;\n"						/* 8 */
	"compartments = (\n"							/* 9 */
	"  { name = \"payments\"; destinations = [ \"10.0.0.5:443\",\n"	/* 10 */
	"        \"payments.internal:443\" ];\n"				/* 11 */
	"    max_connections = 15; },\n"					/* 12 */
	"  { name = \"recommendations\";\n"					/* 13 */
	"    destinations = [ \"10.2.0.0/16:8080\", \"[::1]:9001\", \"unix:/run/recs.sock\" ];\n"
	"    max_connections = 10; errno = \"ETIMEDOUT\"; }\n"			/* 15 */
	");\n";

static void good_config_sets_every_field(void **state)
{
	struct bs_config cfg;

	(void)state;
	if (load(good, &cfg, false) != 0)
		fail_msg("%s", err);
	assert_string_equal(cfg.path, path);
	assert_string_equal(cfg.segment, "shop");
	assert_true(cfg.has_budget);
	assert_int_equal(cfg.pool, 100);
	assert_int_equal(cfg.reserved, 10);
	assert_true(cfg.strict);
	assert_int_equal(cfg.mode, 0660);
	assert_true(cfg.has_owner);
	assert_true(cfg.has_group);
	assert_int_equal(cfg.owner, 0);
	assert_int_equal(cfg.group, 0);
	assert_int_equal(cfg.max_processes, 512);
	assert_int_equal(cfg.max_sockets, 4096);
	assert_int_equal(cfg.resolve_timeout_ms, 250);
	assert_int_equal(cfg.ncomp, 2);
	assert_string_equal(cfg.comp[0].name, "payments");
	assert_int_equal(cfg.comp[0].line, 10);
	assert_int_equal(cfg.comp[0].max_connections, 15);
	assert_int_equal(cfg.comp[0].reject_errno, ECONNREFUSED);
	assert_string_equal(cfg.comp[1].name, "recommendations");
	assert_int_equal(cfg.comp[1].line, 13);
	assert_int_equal(cfg.comp[1].max_connections, 10);
	assert_int_equal(cfg.comp[1].reject_errno, ETIMEDOUT);
	assert_int_equal(cfg.nrules, 5);
	assert_int_equal(cfg.rules[0].kind, RULE_IP);
	assert_int_equal(cfg.rules[0].comp, 0);
	assert_int_equal(cfg.rules[0].line, 10);
	assert_int_equal(cfg.rules[1].kind, RULE_HOST);
	assert_string_equal(cfg.rules[1].host, "payments.internal");
	assert_int_equal(cfg.rules[1].line, 11);
	assert_int_equal(cfg.rules[2].prefix, 96 + 16);
	assert_int_equal(cfg.rules[2].comp, 1);
	assert_int_equal(cfg.rules[2].line, 14);
	assert_int_equal(cfg.rules[3].prefix, 128);
	assert_int_equal(cfg.rules[4].kind, RULE_UNIX);
	assert_string_equal(cfg.rules[4].path, "/run/recs.sock");
	cfg_free(&cfg);
}

static void absent_keys_get_their_defaults(void **state)
{
	struct bs_config cfg;
	char seg[BS_NAME_MAX];

	(void)state;
	assert_int_equal(load(COMPS, &cfg, false), 0);
	cfg_default_segment(path, seg, sizeof(seg));
	assert_string_equal(cfg.segment, seg);
	assert_non_null(strstr(seg, "bulkshim-test-"));
	assert_false(cfg.has_budget);
	assert_false(cfg.strict);
	assert_int_equal(cfg.mode, 0600);
	assert_false(cfg.has_owner);
	assert_false(cfg.has_group);
	assert_int_equal(cfg.max_processes, 2048);
	assert_int_equal(cfg.max_sockets, 4096);
	assert_int_equal(cfg.resolve_timeout_ms, 1000);
	assert_int_equal(cfg.comp[0].reject_errno, ECONNREFUSED);
	assert_true(cfg.enforce);
	assert_int_equal(cfg.nclass, 1);
	assert_string_equal(cfg.classes[0].name, "default");
	assert_int_equal(cfg.classes[0].npatterns, 0);
	assert_int_equal(cfg.comp[0].max_inflight, 0);
	assert_int_equal(cfg.comp[0].max_wait_ms, 0);
	assert_int_equal(cfg.comp[0].max_waiting, 0);
	assert_int_equal(cfg.comp[0].connect_timeout_ms, 0);
	assert_int_equal(cfg.comp[0].io_timeout_ms, 0);
	assert_true(cfg.comp[0].enforce);
	for (size_t i = 0; i < BS_MAX_CLASSES; i++)
		assert_int_equal(cfg.comp[0].class_limit[i], 0);
	cfg_free(&cfg);
}

/* A config that sets no max_sockets, and the one it gets: twice the sum
 * of the compartments' max_connections, at most BS_MAX_SOCKETS, at least
 * 4096, and at least 8192 when a compartment sets no max_connections or
 * only observes. */
struct sockets_case {
	const char *text;
	uint32_t max_sockets;
};

static const struct sockets_case sockets[] = {
	{ "compartments = (\n"
	  "{ name = \"a\"; destinations = [\"10.0.0.1\"]; max_connections = 3000; },\n"
	  "{ name = \"b\"; destinations = [\"10.0.0.2\"]; max_connections = 2000; });\n", 10000 },
	{ COMP_A " max_connections = 4; });\n", 4096 },
	{ COMP_A " max_connections = 4; enforce = false; });\n", 8192 },
	{ "compartments = (\n"
	  "{ name = \"a\"; destinations = [\"10.0.0.1\"]; max_connections = 1000000; });\n",
	  BS_MAX_SOCKETS },
	{ COMP_A " max_inflight = 3; });\n", 8192 },
	{ "compartments = (\n"
	  "{ name = \"a\"; destinations = [\"10.0.0.1\"]; max_inflight = 3; },\n"
	  "{ name = \"b\"; destinations = [\"10.0.0.2\"]; max_connections = 3000; });\n", 8192 },
	{ "compartments = (\n"
	  "{ name = \"a\"; destinations = [\"10.0.0.1\"]; max_inflight = 3; },\n"
	  "{ name = \"b\"; destinations = [\"10.0.0.2\"]; max_connections = 5000; });\n", 10000 },
	/* An explicit max_sockets still wins. */
	{ COMP_A " max_inflight = 3; });\nmax_sockets = 100;\n", 100 },
};

static void max_sockets_defaults_from_the_limits(void **state)
{
	struct bs_config cfg;

	(void)state;
	for (size_t i = 0; i < NELEM(sockets); i++) {
		load_ok(sockets[i].text, &cfg);
		if (cfg.max_sockets != sockets[i].max_sockets)
			fail_msg("row %zu: max_sockets %u, want %u", i, cfg.max_sockets,
			    sockets[i].max_sockets);
		cfg_free(&cfg);
	}
}

static void missing_file_is_enoent(void **state)
{
	struct bs_config cfg;

	(void)state;
	assert_int_equal(cfg_load("/nonexistent/bulkshim.cfg", &cfg, false, err, sizeof(err)),
			 -ENOENT);
	assert_string_equal(err, "/nonexistent/bulkshim.cfg: no such file");
	assert_zeroed(&cfg);
}

static void directory_or_bad_path_is_an_error(void **state)
{
	struct bs_config cfg;

	(void)state;
	assert_int_equal(cfg_load("/etc/passwd/x.cfg", &cfg, false, err, sizeof(err)), -ENOTDIR);
	assert_non_null(strstr(err, "/etc/passwd/x.cfg: "));
	assert_zeroed(&cfg);
	assert_int_equal(cfg_load("/tmp", &cfg, false, err, sizeof(err)), -EISDIR);
	assert_string_equal(err, "/tmp: is a directory");
	assert_zeroed(&cfg);
}

/* Loads path, which must be unreadable; returns 0 when it failed right. */
static int check_unreadable(void)
{
	struct bs_config cfg;

	if (cfg_load(path, &cfg, false, err, sizeof(err)) != -EACCES)
		return 1;
	return strstr(err, ": cannot read: ") == NULL || cfg.comp != NULL;
}

static void unreadable_file_is_an_error(void **state)
{
	int status;
	pid_t pid;

	(void)state;
	write_cfg(COMPS);
	assert_int_equal(chmod(path, 0), 0);
	if (geteuid() != 0) {
		status = check_unreadable();
		unlink(path);
		assert_int_equal(status, 0);
		return;
	}
	/* Root reads any file: check as nobody in a child instead. */
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (setgid(65534) != 0 || setuid(65534) != 0)
			_exit(2);
		_exit(check_unreadable());
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	unlink(path);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

/* A directory of its own under /tmp, for a config and what it includes. */
static void make_dir(char *dir, size_t size)
{
	snprintf(dir, size, "/tmp/bulkshim-inc-XXXXXX");
	assert_non_null(mkdtemp(dir));
}

static void put_file(const char *dir, const char *name, const char *text, size_t len)
{
	char p[256];
	int fd;

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, len), (ssize_t)len);
	assert_int_equal(close(fd), 0);
}

static void remove_dir(const char *dir)
{
	char cmd[300];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

/* A FIFO nobody writes would block the reader for ever, and a device
 * such as /dev/zero never end: each is refused at once (an alarm ends
 * the test if a read waits), by cfg_load and by the helpers that look
 * into a config cfg_load refused. */
static void a_fifo_or_a_device_is_refused_without_waiting(void **state)
{
	char dir[64], fifo[128], seg[BS_NAME_MAX];
	struct bs_config cfg;

	(void)state;
	make_dir(dir, sizeof(dir));
	snprintf(fifo, sizeof(fifo), "%s/svc.cfg", dir);
	assert_int_equal(mkfifo(fifo, 0600), 0);
	alarm(20);
	assert_int_equal(cfg_load(fifo, &cfg, false, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "/svc.cfg: is a FIFO, not a regular file"));
	assert_zeroed(&cfg);
	assert_false(cfg_wants_strict(fifo));
	cfg_segment_of(fifo, seg, sizeof(seg));
	assert_string_equal(seg, "svc");
	assert_int_equal(cfg_load("/dev/zero", &cfg, false, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "/dev/zero: is a character device, not a regular file");
	assert_false(cfg_wants_strict("/dev/zero"));
	alarm(0);
	remove_dir(dir);
}

/* A file of gigabytes would take the host program's memory: more than
 * BS_CONFIG_MAX is refused before it is read. */
static void a_config_of_more_than_16_mib_is_refused(void **state)
{
	struct bs_config cfg;
	int fd;

	(void)state;
	write_cfg(COMPS);
	fd = open(path, O_WRONLY);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)BS_CONFIG_MAX + 1), 0);
	assert_int_equal(close(fd), 0);
	assert_int_equal(cfg_load(path, &cfg, false, err, sizeof(err)), -EFBIG);
	assert_non_null(strstr(err, ": is too big: a config and what it includes may have 16 MiB"));
	assert_zeroed(&cfg);
	/* Exactly at the limit it is read (and fails as text, not for size:
	 * the padding is NUL bytes). */
	fd = open(path, O_WRONLY);
	assert_int_equal(ftruncate(fd, (off_t)BS_CONFIG_MAX), 0);
	assert_int_equal(close(fd), 0);
	assert_int_equal(cfg_load(path, &cfg, false, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, ":2: a NUL byte: a config file is text"));
	unlink(path);
}

/* libconfig would parse the text only up to a NUL byte, and what follows
 * it would silently not count. */
static void a_nul_byte_is_refused_at_its_line(void **state)
{
	static const char text[] = "segment = \"x\";\n" COMPS "max_sockets = 10;\0 junk\n";
	struct bs_config cfg;
	char dir[64], p[128];

	(void)state;
	make_dir(dir, sizeof(dir));
	put_file(dir, "svc.cfg", text, sizeof(text) - 1);
	snprintf(p, sizeof(p), "%s/svc.cfg", dir);
	assert_int_equal(cfg_load(p, &cfg, false, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "/svc.cfg:3: a NUL byte: a config file is text"));
	assert_zeroed(&cfg);
	remove_dir(dir);
}

/* @include names a file next to the config (not in the working
 * directory), read with the config, and its settings count. */
static void an_include_is_read_next_to_the_config(void **state)
{
	static const char main_text[] = "segment = \"x\";\n@include \"comps.cfg\"\n";
	struct bs_config cfg;
	char dir[64], p[128], q[256];

	(void)state;
	make_dir(dir, sizeof(dir));
	put_file(dir, "svc.cfg", main_text, sizeof(main_text) - 1);
	put_file(dir, "comps.cfg", COMPS, strlen(COMPS));
	snprintf(p, sizeof(p), "%s/svc.cfg", dir);
	assert_int_equal(cfg_load(p, &cfg, false, err, sizeof(err)), 0);
	assert_int_equal(cfg.ncomp, 1);
	assert_string_equal(cfg.comp[0].name, "a");
	assert_int_equal(cfg.comp[0].max_connections, 5);
	cfg_free(&cfg);
	/* One that is missing is named, with where it was looked for. */
	put_file(dir, "svc.cfg", "segment = \"x\";\n" COMPS "@include \"gone.cfg\"\n",
	    strlen("segment = \"x\";\n" COMPS "@include \"gone.cfg\"\n"));
	assert_int_equal(cfg_load(p, &cfg, false, err, sizeof(err)), -ENOENT);
	snprintf(q, sizeof(q), "%s/svc.cfg:3: @include \"gone.cfg\": cannot open %s/gone.cfg: "
	    "No such file or directory", dir, dir);
	assert_string_equal(err, q);
	remove_dir(dir);
}

/* An absolute name is read as it is (libconfig 1.5 would put the config's
 * directory before it and find nothing), and a relative one in an included
 * file is found next to the config, as libconfig finds it. */
static void an_include_by_an_absolute_name_is_read(void **state)
{
	struct bs_config cfg;
	char dir[64], sub[96], p[128], text[256];

	(void)state;
	make_dir(dir, sizeof(dir));
	snprintf(sub, sizeof(sub), "%s/conf.d", dir);
	assert_int_equal(mkdir(sub, 0700), 0);
	put_file(dir, "conf.d/comps.cfg", "@include \"limits.cfg\"\n" COMPS,
	    strlen("@include \"limits.cfg\"\n" COMPS));
	put_file(dir, "limits.cfg", "max_sockets = 77;\n", strlen("max_sockets = 77;\n"));
	snprintf(text, sizeof(text), "segment = \"x\";\n@include \"%s/comps.cfg\"\n", sub);
	put_file(dir, "svc.cfg", text, strlen(text));
	snprintf(p, sizeof(p), "%s/svc.cfg", dir);
	assert_int_equal(cfg_load(p, &cfg, false, err, sizeof(err)), 0);
	assert_int_equal(cfg.ncomp, 1);
	assert_int_equal(cfg.max_sockets, 77);
	cfg_free(&cfg);
	remove_dir(dir);
}

/* An error in an included file names that file and its own line; one in
 * the config after an include names the config's line, however long the
 * included text. */
static void an_error_is_placed_in_the_file_and_line_that_hold_it(void **state)
{
	static const char comps[] = "# the compartments\n"
	    "compartments = ( { name = \"a\";\n"
	    "  destinations = [ \"10.0.0.1:80\",\n"
	    "                   \"10.0.0.300\" ];\n"
	    "  max_connections = 5; } );\n";
	struct bs_config cfg;
	char dir[64], p[128], q[256];

	(void)state;
	make_dir(dir, sizeof(dir));
	snprintf(p, sizeof(p), "%s/svc.cfg", dir);
	put_file(dir, "comps.cfg", comps, sizeof(comps) - 1);
	put_file(dir, "svc.cfg", "segment = \"x\";\n@include \"comps.cfg\"\n",
	    strlen("segment = \"x\";\n@include \"comps.cfg\"\n"));
	/* A destination: the line of its string, in its file. */
	assert_int_equal(cfg_load(p, &cfg, false, err, sizeof(err)), -EINVAL);
	snprintf(q, sizeof(q), "%s/comps.cfg:4: compartment \"a\": ", dir);
	if (strncmp(err, q, strlen(q)) != 0)
		fail_msg("\"%s\" does not start with \"%s\"", err, q);
	/* A setting of the wrong type, there. */
	put_file(dir, "comps.cfg", "\n\n" COMPS "max_sockets = \"many\";\n",
	    strlen("\n\n" COMPS "max_sockets = \"many\";\n"));
	assert_int_equal(cfg_load(p, &cfg, false, err, sizeof(err)), -EINVAL);
	snprintf(q, sizeof(q), "%s/comps.cfg:4: ", dir);
	if (strncmp(err, q, strlen(q)) != 0)
		fail_msg("\"%s\" does not start with \"%s\"", err, q);
	/* A syntax error there: libconfig's words, placed. */
	put_file(dir, "comps.cfg", COMPS "max_sockets 10;\n", strlen(COMPS "max_sockets 10;\n"));
	assert_int_equal(cfg_load(p, &cfg, false, err, sizeof(err)), -EINVAL);
	snprintf(q, sizeof(q), "%s/comps.cfg:2: syntax error", dir);
	if (strncmp(err, q, strlen(q)) != 0)
		fail_msg("\"%s\" does not start with \"%s\"", err, q);
	/* In the config, after twelve included lines. */
	put_file(dir, "comps.cfg", "\n\n\n\n\n\n\n\n\n\n\n" COMPS,
	    strlen("\n\n\n\n\n\n\n\n\n\n\n" COMPS));
	put_file(dir, "svc.cfg", "segment = \"x\";\n@include \"comps.cfg\"  # the rest\n"
	    "max_sockets = -1;\n", strlen("segment = \"x\";\n@include \"comps.cfg\"  "
	    "# the rest\nmax_sockets = -1;\n"));
	assert_int_equal(cfg_load(p, &cfg, false, err, sizeof(err)), -EINVAL);
	snprintf(q, sizeof(q), "%s/svc.cfg:3: ", dir);
	if (strncmp(err, q, strlen(q)) != 0)
		fail_msg("\"%s\" does not start with \"%s\"", err, q);
	/* Two directives on one line: libconfig refuses the second. */
	put_file(dir, "svc.cfg", "segment = \"x\";\n@include \"comps.cfg\" @include \"comps.cfg\"\n",
	    strlen("segment = \"x\";\n@include \"comps.cfg\" @include \"comps.cfg\"\n"));
	assert_int_equal(cfg_load(p, &cfg, false, err, sizeof(err)), -EINVAL);
	snprintf(q, sizeof(q), "%s/svc.cfg:2: one @include per line", dir);
	assert_string_equal(err, q);
	remove_dir(dir);
}

/* Writes what lc holds into buf, in libconfig's own format. */
static void written(config_t *lc, char *buf, size_t size)
{
	FILE *f = fmemopen(buf, size, "w");

	assert_non_null(f);
	config_write(lc, f);
	assert_int_equal(fclose(f), 0);
}

/* A config (svc.cfg) and the two files it may include. */
struct inc_case {
	const char *main, *a, *b;
};

/* Writes the files of k into dir, and starts lc as libconfig reading
 * them itself would be started: its include directory is dir. */
static void put_case(const char *dir, const struct inc_case *k, config_t *lc)
{
	char inc[80];

	put_file(dir, "svc.cfg", k->main, strlen(k->main));
	put_file(dir, "a.cfg", k->a, strlen(k->a));
	put_file(dir, "b.cfg", k->b, strlen(k->b));
	snprintf(inc, sizeof(inc), "%s/", dir);
	config_init(lc);
	config_set_include_dir(lc, inc);
}

/* What the config with its includes put in place parses to is what
 * libconfig makes of the same files, reading the includes itself: a
 * directive counts outside comments and strings only, their state runs on
 * across files, what follows a directive on its line is read after the
 * included text, a file may end without a newline or in CR LF lines. */
static void includes_put_in_place_parse_as_libconfig_reads_them(void **state)
{
	static const struct inc_case cases[] = {
		{ "x = 1;\n@include \"a.cfg\"\ny = 2;\n", "z = 3;\n", "" },
		{ "/* a comment\n@include \"gone.cfg\"\n*/ x = 1;\n", "", "" },
		{ "s = \"two\n@include \\\"gone.cfg\\\"\nlines\";\n", "", "" },
		{ "s = \"a \\\\\";\n@include \"a.cfg\"\n", "t = \"b\";", "" },
		{ "  \t@include \"a.cfg\" // the a part\nw = 4;\n", "@include \"b.cfg\"\nv = 5;",
		  "u = 6;\n" },
		{ "x = 1; # @include \"gone.cfg\"\n@include \"a.cfg\"\r\ny = 2;\r\n",
		  "g = { h = 7; };\r\n", "" },
		{ "@include \"a.cfg\"\n*/ y = 2;\n", "x = 1; /* open\n", "" },
		{ "@include \"a.cfg\"\nm = 1;\n", "@include \"b.cfg\"\nn = 2;\n", "l = [1, 2];" },
	};
	/* And where a broken one breaks: the same file and line. */
	static const struct inc_case broken[] = {
		{ "x = 1;\n@include \"a.cfg\"\ny = ;\n", "\n\nz = 3;\n", "" },
		{ "x = 1;\n@include \"a.cfg\"\ny = 2;\n", "\n\nz = = 3;\n", "" },
		{ "@include \"a.cfg\"\n", "a = 1;\n@include \"b.cfg\"\nc = 3;\n", "\nb = [1,;\n" },
		{ "@include \"a.cfg\"\nq = 1;\nq = 2;\n", "p = 1;\n", "" },
	};
	char dir[64], p[128], mine[4096], theirs[4096];

	(void)state;
	make_dir(dir, sizeof(dir));
	snprintf(p, sizeof(p), "%s/svc.cfg", dir);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct cfg_ctx c = { .path = p, .err = err, .errlen = sizeof(err) };
		config_t lc;

		put_case(dir, &cases[i], &lc);
		if (config_read_file(&lc, p) == CONFIG_FALSE)
			fail_msg("case %zu: libconfig: %s at %d", i, config_error_text(&lc),
			    config_error_line(&lc));
		written(&lc, theirs, sizeof(theirs));
		config_destroy(&lc);
		if (read_parse(&c, &lc) != 0)
			fail_msg("case %zu: %s", i, err);
		written(&lc, mine, sizeof(mine));
		config_destroy(&lc);
		cfg_text_free(&c);
		if (strcmp(mine, theirs) != 0)
			fail_msg("case %zu:\n%s\nagainst libconfig's\n%s", i, mine, theirs);
	}
	for (size_t i = 0; i < sizeof(broken) / sizeof(broken[0]); i++) {
		struct cfg_ctx c = { .path = p, .err = err, .errlen = sizeof(err) };
		const char *file, *want;
		config_t lc;
		int line, at;

		put_case(dir, &broken[i], &lc);
		if (config_read_file(&lc, p) != CONFIG_FALSE)
			fail_msg("broken case %zu: libconfig takes it", i);
		/* libconfig names an included file as the directive does;
		 * bulkshim by where it found it. */
		want = config_error_file(&lc);
		if (want == NULL || strcmp(want, p) == 0)
			snprintf(theirs, sizeof(theirs), "%s:%d", p, config_error_line(&lc));
		else
			snprintf(theirs, sizeof(theirs), "%s/%s:%d", dir, want, config_error_line(&lc));
		config_destroy(&lc);
		assert_int_equal(read_parse(&c, &lc), 1);
		line = config_error_line(&lc);
		cfg_place(&c, line, &file, &at);
		snprintf(mine, sizeof(mine), "%s:%d", file != NULL ? file : p, at);
		config_destroy(&lc);
		cfg_text_free(&c);
		if (strcmp(mine, theirs) != 0)
			fail_msg("broken case %zu: at %s, libconfig says %s", i, mine, theirs);
	}
	remove_dir(dir);
}

/* An included FIFO, device or directory is refused at the line that
 * includes it, in the config or in a file it includes, and so is a file
 * that brings the whole past BS_CONFIG_MAX; a file that includes itself
 * ends at libconfig's depth limit. */
static void an_include_of_a_fifo_or_of_too_much_is_refused_at_its_line(void **state)
{
	static const char main_text[] = "segment = \"x\";\n" COMPS "@include \"more.cfg\"\n";
	static const char more[] = "# more\n  @include \"pipe\"\n";
	struct bs_config cfg;
	char dir[64], p[128], q[300];
	int fd;

	(void)state;
	make_dir(dir, sizeof(dir));
	put_file(dir, "svc.cfg", main_text, sizeof(main_text) - 1);
	put_file(dir, "more.cfg", more, sizeof(more) - 1);
	snprintf(p, sizeof(p), "%s/pipe", dir);
	assert_int_equal(mkfifo(p, 0600), 0);
	snprintf(p, sizeof(p), "%s/svc.cfg", dir);
	alarm(20);
	assert_int_equal(cfg_load(p, &cfg, false, err, sizeof(err)), -EINVAL);
	snprintf(q, sizeof(q), "%s/more.cfg:2: @include \"pipe\": %s/pipe is a FIFO, not a "
	    "regular file", dir, dir);
	assert_string_equal(err, q);
	assert_zeroed(&cfg);
	assert_false(cfg_wants_strict(p));
	alarm(0);
	/* Too much: a file of BS_CONFIG_MAX bytes beside the config. */
	snprintf(q, sizeof(q), "%s/more.cfg", dir);
	fd = open(q, O_WRONLY | O_TRUNC);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)BS_CONFIG_MAX), 0);
	assert_int_equal(close(fd), 0);
	assert_int_equal(cfg_load(p, &cfg, false, err, sizeof(err)), -EFBIG);
	snprintf(q, sizeof(q), "%s/svc.cfg:3: @include \"more.cfg\": %s/more.cfg is too big", dir,
	    dir);
	assert_non_null(strstr(err, q));
	/* A directory. */
	put_file(dir, "svc.cfg", "@include \".\"\n", strlen("@include \".\"\n"));
	assert_int_equal(cfg_load(p, &cfg, false, err, sizeof(err)), -EISDIR);
	assert_non_null(strstr(err, "/svc.cfg:1: @include \".\": "));
	assert_non_null(strstr(err, " is a directory"));
	/* Itself, for ever: bounded, at libconfig's depth. */
	put_file(dir, "svc.cfg", "@include \"svc.cfg\"\n@include \"svc.cfg\"\n",
	    strlen("@include \"svc.cfg\"\n@include \"svc.cfg\"\n"));
	alarm(20);
	assert_true(cfg_load(p, &cfg, false, err, sizeof(err)) < 0);
	assert_non_null(strstr(err, "/svc.cfg:1: @include \"svc.cfg\": included files nest more "
	    "than 10 deep"));
	alarm(0);
	remove_dir(dir);
}

/* An included file that opens but cannot be read to its end (here
 * /proc/self/mem, whose first page is not mapped: EIO) is refused at the
 * including line, not handed to libconfig's blocking fopen: a file whose
 * non-blocking read says EAGAIN would block there. */
static void an_include_that_opens_but_cannot_be_read_is_refused_at_its_line(void **state)
{
	struct bs_config cfg;
	char dir[64], p[128], q[128];

	(void)state;
	make_dir(dir, sizeof(dir));
	snprintf(q, sizeof(q), "%s/mem.cfg", dir);
	assert_int_equal(symlink("/proc/self/mem", q), 0);
	put_file(dir, "svc.cfg", "segment = \"x\";\n" COMPS "@include \"mem.cfg\"\n",
	    strlen("segment = \"x\";\n" COMPS "@include \"mem.cfg\"\n"));
	snprintf(p, sizeof(p), "%s/svc.cfg", dir);
	assert_int_equal(cfg_load(p, &cfg, false, err, sizeof(err)), -EIO);
	assert_non_null(strstr(err, "/svc.cfg:3: @include \"mem.cfg\": "));
	assert_non_null(strstr(err, "/mem.cfg cannot read: "));
	assert_zeroed(&cfg);
	remove_dir(dir);
}

struct deep_load {
	const char *path;
	int rc;
};

static void *load_in_thread(void *arg)
{
	struct deep_load *d = arg;
	struct bs_config *cfg = malloc(sizeof(*cfg));

	/* On the heap, as the shim's reload keeps it: 43 KB. */
	if (cfg == NULL)
		return NULL;
	d->rc = cfg_load(d->path, cfg, false, err, sizeof(err));
	cfg_free(cfg);
	free(cfg);
	return NULL;
}

/* A reload runs in whichever thread of the program connects, whose stack
 * may be small: includes ten deep load on a 64 KiB stack (two PATH_MAX
 * names per level on the stack would take 80 KiB). */
static void includes_ten_deep_load_on_a_small_thread_stack(void **state)
{
	struct deep_load d;
	pthread_attr_t attr;
	char dir[64], p[128], name[32], text[64];
	pthread_t t;

	(void)state;
	make_dir(dir, sizeof(dir));
	for (int i = 0; i < 9; i++) {
		snprintf(name, sizeof(name), "inc%d.cfg", i);
		snprintf(text, sizeof(text), "@include \"inc%d.cfg\"\n", i + 1);
		put_file(dir, name, text, strlen(text));
	}
	put_file(dir, "inc9.cfg", COMPS, strlen(COMPS));
	put_file(dir, "svc.cfg", "segment = \"x\";\n@include \"inc0.cfg\"\n",
	    strlen("segment = \"x\";\n@include \"inc0.cfg\"\n"));
	snprintf(p, sizeof(p), "%s/svc.cfg", dir);
	d.path = p;
	d.rc = 1;
	assert_int_equal(pthread_attr_init(&attr), 0);
	assert_int_equal(pthread_attr_setstacksize(&attr, 64 << 10), 0);
	assert_int_equal(pthread_create(&t, &attr, load_in_thread, &d), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	pthread_attr_destroy(&attr);
	assert_int_equal(d.rc, 0);
	remove_dir(dir);
}

static void long_compartment_name_is_an_error(void **state)
{
	char text[512];

	(void)state;
	snprintf(text, sizeof(text), "compartments = (\n{ name = \"%064d\"; "
		 "destinations = [\"10.0.0.1\"]; max_connections = 1; });\n", 0);
	expect_error(text, ":2: ", "is 64 characters, more than 63", NULL);
	/* 63 characters are fine. */
	snprintf(text, sizeof(text), "compartments = (\n{ name = \"%063d\"; "
		 "destinations = [\"10.0.0.1\"]; max_connections = 1; });\n", 0);
	struct bs_config cfg;
	assert_int_equal(load(text, &cfg, false), 0);
	cfg_free(&cfg);
}

static void destination_lines_are_where_the_strings_are(void **state)
{
	struct bs_config cfg;

	(void)state;
	/* libconfig itself would put the last one on the line of "]". */
	assert_int_equal(load("compartments = ( { name = \"a\"; max_connections = 1;\n"
			      "  destinations = [\n"
			      "    \"10.0.0.1\",\n"
			      "    \"10.0.0.2\"\n"
			      "  ]; } );\n", &cfg, false), 0);
	assert_int_equal(cfg.rules[0].line, 3);
	assert_int_equal(cfg.rules[1].line, 4);
	cfg_free(&cfg);
	expect_error("compartments = ( { name = \"a\"; max_connections = 1;\n"
		     "  destinations = [ \"10.0.0.1\"\n"
		     "    , \"10.0.0.1:0\"\n"
		     "\n"
		     "  ]; } );\n", ":3: ", "bad port \"0\"", NULL);
}

static void every_allowed_errno_is_accepted(void **state)
{
	static const char *const names[] = { "ECONNREFUSED", "EAGAIN", "ETIMEDOUT",
					     "EHOSTUNREACH", "ENETUNREACH" };
	static const int values[] = { ECONNREFUSED, EAGAIN, ETIMEDOUT, EHOSTUNREACH, ENETUNREACH };
	struct bs_config cfg;
	char text[256];

	(void)state;
	for (size_t i = 0; i < 5; i++) {
		snprintf(text, sizeof(text), "compartments = ({ name = \"a\"; destinations = "
			 "[\"10.0.0.1\"]; max_connections = 1; errno = \"%s\"; });\n", names[i]);
		assert_int_equal(load(text, &cfg, false), 0);
		assert_int_equal(cfg.comp[0].reject_errno, values[i]);
		cfg_free(&cfg);
		assert_int_equal(cfg_errno_value(names[i]), values[i]);
		assert_string_equal(cfg_errno_name(values[i]), names[i]);
	}
	assert_int_equal(cfg_errno_value("EPERM"), -EINVAL);
	assert_int_equal(cfg_errno_value(NULL), -EINVAL);
	assert_null(cfg_errno_name(EPERM));
}

/* A mode, as a string or an integer: both are read as octal digits. */
struct mode_case {
	const char *text;
	unsigned mode;
};

static const struct mode_case modes[] = {
	{ COMPS "mode = \"0660\";\n", 0660 },
	{ COMPS "mode = \"640\";\n", 0640 },
	{ COMPS "mode = 600;\n", 0600 },
	{ COMPS "mode = 0660;\n", 0660 },
};

static void modes_are_read_as_octal(void **state)
{
	struct bs_config cfg;

	(void)state;
	for (size_t i = 0; i < NELEM(modes); i++) {
		load_ok(modes[i].text, &cfg);
		if (cfg.mode != modes[i].mode)
			fail_msg("row %zu: mode %o, want %o", i, cfg.mode, modes[i].mode);
		cfg_free(&cfg);
	}
}

static void owner_and_group_take_names_or_ids(void **state)
{
	struct bs_config cfg;

	(void)state;
	assert_int_equal(load(COMPS "owner = \"root\";\ngroup = 65534;\n", &cfg, false), 0);
	assert_true(cfg.has_owner && cfg.has_group);
	assert_int_equal(cfg.owner, 0);
	assert_int_equal(cfg.group, 65534);
	cfg_free(&cfg);
	assert_int_equal(load(COMPS "owner = \"1234\";\ngroup = \"root\";\n", &cfg, false), 0);
	assert_int_equal(cfg.owner, 1234);
	assert_int_equal(cfg.group, 0);
	cfg_free(&cfg);
}

static const char overrun[] =
	"segment = \"s\";\n"
	"budget = { pool = 100; reserved = 20; };\n"
	"compartments = (\n"
	" { name = \"a\"; destinations = [\"10.0.0.1\"]; max_connections = 40; },\n"
	" { name = \"b\"; destinations = [\"10.0.0.2\"]; max_connections = 25; },\n"
	" { name = \"c\"; destinations = [\"10.0.0.3\"]; max_connections = 15; },\n"
	" { name = \"d\"; destinations = [\"10.0.0.4\"]; max_connections = 10; }\n"
	");\n";

static void budget_that_fits_exactly_is_accepted(void **state)
{
	struct bs_config cfg;
	char text[sizeof(overrun)];

	(void)state;
	snprintf(text, sizeof(text), "%s", overrun);
	memcpy(strstr(text, "reserved = 20"), "reserved = 10", 13);
	assert_int_equal(load(text, &cfg, false), 0);
	assert_int_equal(cfg.reserved, 10);
	cfg_free(&cfg);
}

static void budget_overrun_too_long_to_list_gives_the_sum(void **state)
{
	size_t cap = 200 * 100 + 128, len;
	char *text = malloc(cap);

	(void)state;
	assert_non_null(text);
	len = (size_t)snprintf(text, cap, "budget = { pool = 10; };\ncompartments = (\n");
	for (int i = 0; i < 200; i++)
		len += (size_t)snprintf(text + len, cap - len, "%s{ name = \"c%d\"; destinations = "
					"[\"10.1.0.%d\"]; max_connections = 1000; }\n",
					i ? "," : "", i, i);
	snprintf(text + len, cap - len, ");\n");
	expect_error(text, ":1: ", "budget exceeded: the 200 compartments' max_connections "
		     "sum to 200000 > 10", NULL);
	free(text);
}

static void too_many_compartments_is_an_error(void **state)
{
	size_t cap = (BS_MAX_COMPARTMENTS + 1) * 100 + 64, len;
	char *text = malloc(cap);

	(void)state;
	assert_non_null(text);
	len = (size_t)snprintf(text, cap, "segment = \"s\";\ncompartments = (\n");
	for (int i = 0; i <= BS_MAX_COMPARTMENTS; i++)
		len += (size_t)snprintf(text + len, cap - len, "%s{ name = \"c%d\"; destinations = "
					"[\"10.1.%d.%d\"]; max_connections = 1; }\n", i ? "," : "",
					i, i / 256, i % 256);
	snprintf(text + len, cap - len, ");\n");
	expect_error(text, ":2: ", "1025 compartments, more than the limit of 1024", NULL);
	free(text);
}

static void too_many_destinations_is_an_error(void **state)
{
	size_t cap = (size_t)(BS_MAX_RULES + 1) * 24 + 256, len;
	char *text = malloc(cap);

	(void)state;
	assert_non_null(text);
	len = (size_t)snprintf(text, cap, "compartments = ( { name = \"a\"; max_connections = 1; "
			       "destinations = [\n");
	for (int i = 0; i <= BS_MAX_RULES; i++)
		len += (size_t)snprintf(text + len, cap - len, "\"10.%d.%d.%d\"%s\n", i / 65536,
					(i / 256) % 256, i % 256, i < BS_MAX_RULES ? "," : "");
	snprintf(text + len, cap - len, "]; } );\n");
	/* The 100,001st destination is on line 100,002. */
	expect_error(text, ":100002: ", "more than 100000 destinations", NULL);
	free(text);
}

static void duplicate_destination_in_one_compartment_is_fine(void **state)
{
	struct bs_config cfg;

	(void)state;
	assert_int_equal(load("compartments = ({ name = \"a\"; max_connections = 1;\n"
			      " destinations = [\"10.0.0.5:443\", \"10.0.0.5:443\", \"h.example\","
			      " \"H.example.\"]; });\n", &cfg, false), 0);
	assert_int_equal(cfg.nrules, 4);
	cfg_free(&cfg);
}

/* A compartment's limits, wait and timeouts, and what is read of them:
 * what the compartment does not set is 0. */
struct comp_case {
	const char *text;
	uint32_t max_connections, max_inflight, max_wait_ms, max_waiting;
	uint32_t connect_timeout_ms, io_timeout_ms;
};

static const struct comp_case comp_numbers[] = {
	/* max_inflight alone is a valid limit. */
	{ COMP_A " max_inflight = 3; });\n", 0, 3, 0, 0, 0, 0 },
	{ COMP_A " max_connections = 10; max_inflight = 4; });\n", 10, 4, 0, 0, 0, 0 },
	{ COMP_A " max_connections = 5; max_wait_ms = 250; });\n", 5, 0, 250, 0, 0, 0 },
	{ COMP_A " max_connections = 5; max_wait_ms = 600000; });\n", 5, 0, 600000, 0, 0, 0 },
	/* Key order in the group does not matter. */
	{ COMP_A " max_waiting = 7; max_connections = 5; max_wait_ms = 100; });\n",
	  5, 0, 100, 7, 0, 0 },
	{ COMP_A " max_connections = 5; connect_timeout_ms = 2000;\n"
	  " io_timeout_ms = 3600000; });\n", 5, 0, 0, 0, 2000, 3600000 },
};

/* Fails naming row i when field what is got, not want. */
static void check_field(size_t i, const char *what, uint32_t got, uint32_t want)
{
	if (got != want)
		fail_msg("row %zu: %s is %u, want %u", i, what, got, want);
}

static void limits_waits_and_timeouts_are_read(void **state)
{
	struct bs_config cfg;

	(void)state;
	for (size_t i = 0; i < NELEM(comp_numbers); i++) {
		const struct comp_case *k = &comp_numbers[i];
		const struct cfg_compartment *c;

		load_ok(k->text, &cfg);
		c = &cfg.comp[0];
		check_field(i, "max_connections", c->max_connections, k->max_connections);
		check_field(i, "max_inflight", c->max_inflight, k->max_inflight);
		check_field(i, "max_wait_ms", c->max_wait_ms, k->max_wait_ms);
		check_field(i, "max_waiting", c->max_waiting, k->max_waiting);
		check_field(i, "connect_timeout_ms", c->connect_timeout_ms, k->connect_timeout_ms);
		check_field(i, "io_timeout_ms", c->io_timeout_ms, k->io_timeout_ms);
		cfg_free(&cfg);
	}
}

/* enforce: the config's (global) and each compartment's; a compartment
 * takes the global one unless it sets its own. comp1 is -1 when the config
 * has one compartment. */
struct enforce_case {
	const char *text;
	bool global, comp0;
	int comp1;
};

static const struct enforce_case enforces[] = {
	{ COMP_A " max_connections = 5; });\n", true, true, -1 },
	{ "enforce = false;\n"
	  "compartments = (\n"
	  "{ name = \"a\"; destinations = [\"10.0.0.1\"]; max_connections = 5; },\n"
	  "{ name = \"b\"; destinations = [\"10.0.0.2\"]; max_connections = 5; });\n",
	  false, false, false },
	/* Also when the global setting comes after the compartments. */
	{ COMP_A " max_connections = 5; });\nenforce = false;\n", false, false, -1 },
	{ "enforce = false;\n"
	  "compartments = (\n"
	  "{ name = \"a\"; destinations = [\"10.0.0.1\"]; max_connections = 5;\n"
	  "  enforce = true; },\n"
	  "{ name = \"b\"; destinations = [\"10.0.0.2\"]; max_connections = 5; });\n",
	  false, true, false },
	{ COMP_A " max_connections = 5; enforce = false; });\n", true, false, -1 },
};

static void enforce_is_inherited_unless_a_compartment_sets_it(void **state)
{
	struct bs_config cfg;

	(void)state;
	for (size_t i = 0; i < NELEM(enforces); i++) {
		const struct enforce_case *k = &enforces[i];

		load_ok(k->text, &cfg);
		check_field(i, "enforce", cfg.enforce, k->global);
		check_field(i, "enforce of compartment 0", cfg.comp[0].enforce, k->comp0);
		check_field(i, "compartments", (uint32_t)cfg.ncomp, k->comp1 < 0 ? 1 : 2);
		if (k->comp1 >= 0)
			check_field(i, "enforce of compartment 1", cfg.comp[1].enforce,
			    (uint32_t)k->comp1);
		cfg_free(&cfg);
	}
}

static void class_patterns_are_read_in_order(void **state)
{
	struct bs_config cfg;

	(void)state;
	load_ok(COMPS
		"classes = {\n"						/* 2 */
		"  batch = [ \"pg_dump\", \"report-*\" ];\n"		/* 3 */
		"  nightly = [ ];\n"					/* 4 */
		"  Interactive_2 = ( \"psql\" );\n"			/* 5 */
		"};\n", &cfg);
	assert_int_equal(cfg.nclass, 4);
	assert_string_equal(cfg.classes[0].name, "default");
	assert_int_equal(cfg.classes[0].npatterns, 0);
	assert_string_equal(cfg.classes[1].name, "batch");
	assert_int_equal(cfg.classes[1].line, 3);
	assert_int_equal(cfg.classes[1].npatterns, 2);
	assert_string_equal(cfg.classes[1].patterns[0], "pg_dump");
	assert_string_equal(cfg.classes[1].patterns[1], "report-*");
	assert_string_equal(cfg.classes[2].name, "nightly");
	assert_int_equal(cfg.classes[2].line, 4);
	assert_int_equal(cfg.classes[2].npatterns, 0);
	assert_string_equal(cfg.classes[3].name, "Interactive_2");
	assert_int_equal(cfg.classes[3].npatterns, 1);
	assert_string_equal(cfg.classes[3].patterns[0], "psql");
	cfg_free(&cfg);
}

static void reserved_or_bad_class_name_is_an_error(void **state)
{
	struct bs_config cfg;
	char text[256];

	(void)state;
	expect_error(COMPS "classes = {\n default = [ \"x\" ]; };\n", ":3: ",
		     "class name \"default\" is reserved", NULL);
	expect_error(COMPS "classes = {\n ba*ch = [ \"x\" ]; };\n", ":3: ",
		     "class name \"ba*ch\" has a character outside [A-Za-z0-9_-]", NULL);
	snprintf(text, sizeof(text), COMPS "classes = {\n b%031d = [ \"x\" ]; };\n", 0);
	expect_error(text, ":3: ", "is 32 characters, more than 31", NULL);
	/* 31 characters are fine. */
	snprintf(text, sizeof(text), COMPS "classes = {\n b%030d = [ \"x\" ]; };\n", 0);
	load_ok(text, &cfg);
	assert_int_equal(strlen(cfg.classes[1].name), 31);
	cfg_free(&cfg);
}

static void too_many_patterns_or_classes_is_an_error(void **state)
{
	char text[4096];
	size_t len;

	(void)state;
	len = (size_t)snprintf(text, sizeof(text), COMPS "classes = {\n batch = [");
	for (int i = 0; i <= BS_MAX_PATTERNS; i++)
		len += (size_t)snprintf(text + len, sizeof(text) - len, "%s\"p%d\"", i ? ", " : "",
					i);
	snprintf(text + len, sizeof(text) - len, "]; };\n");
	expect_error(text, ":3: ", "class \"batch\" has 65 patterns, more than 64", NULL);

	len = (size_t)snprintf(text, sizeof(text), COMPS "classes = {\n");
	for (int i = 0; i < BS_MAX_CLASSES; i++)
		len += (size_t)snprintf(text + len, sizeof(text) - len, " c%d = [ ];\n", i);
	snprintf(text + len, sizeof(text) - len, "};\n");
	/* The eighth declared class is on line 10. */
	expect_error(text, ":10: ", "class \"c7\" is one too many", "at most 7 classes");
}

static void class_limits_are_stored_by_class_index(void **state)
{
	struct bs_config cfg;

	(void)state;
	/* classes may come after the compartments that use them. */
	load_ok(COMP_A " max_connections = 20;\n"
		" class_limits = { nightly = 2; batch = 4; default = 20; }; });\n"
		"classes = { batch = [ \"pg_dump\" ]; nightly = [ ]; };\n", &cfg);
	assert_int_equal(cfg.comp[0].class_limit[0], 20);
	assert_int_equal(cfg.comp[0].class_limit[1], 4);
	assert_int_equal(cfg.comp[0].class_limit[2], 2);
	for (size_t i = 3; i < BS_MAX_CLASSES; i++)
		assert_int_equal(cfg.comp[0].class_limit[i], 0);
	cfg_free(&cfg);
	/* Without max_connections any class limit is allowed. */
	load_ok(COMP_A " max_inflight = 2; class_limits = { batch = 50; }; });\n"
		"classes = { batch = [ ]; };\n", &cfg);
	assert_int_equal(cfg.comp[0].class_limit[1], 50);
	cfg_free(&cfg);
}

static void budget_ignores_inflight_only_compartments(void **state)
{
	struct bs_config cfg;
	char want[256];

	(void)state;
	load_ok("budget = { pool = 10; };\n"
		"compartments = (\n"
		"{ name = \"a\"; destinations = [\"10.0.0.1\"]; max_connections = 10; },\n"
		"{ name = \"b\"; destinations = [\"10.0.0.2\"]; max_inflight = 50; });\n", &cfg);
	cfg_free(&cfg);
	expect_error("budget = { pool = 10; };\n"
		     "compartments = (\n"
		     "{ name = \"a\"; destinations = [\"10.0.0.1\"]; max_inflight = 50; },\n"
		     "{ name = \"b\"; destinations = [\"10.0.0.2\"]; max_connections = 6; },\n"
		     "{ name = \"c\"; destinations = [\"10.0.0.3\"]; max_connections = 6; });\n",
		     ":1: ", "budget exceeded", NULL);
	snprintf(want, sizeof(want), "%s:1: budget exceeded: 6 + 6 = 12 > 10", path);
	assert_string_equal(err, want);
}

static const char full[] =
	"enforce = false;\n"							/* 1 */
	"classes = { batch = [ \"pg_dump\", \"report-*\" ]; };\n"		/* 2 */
	"compartments = (\n"							/* 3 */
	"  { name = \"postgres\"; destinations = [ \"unix:/run/pg.sock\" ];\n"	/* 4 */
	"    max_connections = 20; max_inflight = 12;\n"			/* 5 */
	"    max_wait_ms = 500; max_waiting = 30;\n"				/* 6 */
	"    connect_timeout_ms = 2000; io_timeout_ms = 30000;\n"		/* 7 */
	"    enforce = true; class_limits = { batch = 4; }; }\n"		/* 8 */
	");\n";

static void every_new_key_is_read(void **state)
{
	struct bs_config cfg;

	(void)state;
	load_ok(full, &cfg);
	assert_false(cfg.enforce);
	assert_int_equal(cfg.nclass, 2);
	assert_string_equal(cfg.classes[1].name, "batch");
	assert_int_equal(cfg.comp[0].max_connections, 20);
	assert_int_equal(cfg.comp[0].max_inflight, 12);
	assert_int_equal(cfg.comp[0].max_wait_ms, 500);
	assert_int_equal(cfg.comp[0].max_waiting, 30);
	assert_int_equal(cfg.comp[0].connect_timeout_ms, 2000);
	assert_int_equal(cfg.comp[0].io_timeout_ms, 30000);
	assert_true(cfg.comp[0].enforce);
	assert_int_equal(cfg.comp[0].class_limit[1], 4);
	assert_int_equal(cfg.comp[0].class_limit[0], 0);
	cfg_free(&cfg);
}

static bool has_rule(const struct bs_config *cfg, const char *ip, uint16_t port, int comp)
{
	uint8_t want[16] = { 0 };
	struct in_addr in;

	if (inet_pton(AF_INET, ip, &in) == 1) {
		want[10] = want[11] = 0xff;
		memcpy(want + 12, &in, 4);
	} else {
		assert_int_equal(inet_pton(AF_INET6, ip, want), 1);
	}
	for (size_t i = 0; i < cfg->nrules; i++) {
		const struct rule *r = &cfg->rules[i];

		if (r->kind == RULE_IP && r->prefix == 128 && memcmp(r->addr, want, 16) == 0 &&
		    r->port_lo == port && r->port_hi == port && r->comp == comp)
			return true;
	}
	return false;
}

static bool hosts_file_has(const char *addr, const char *name)
{
	FILE *f = fopen("/etc/hosts", "r");
	char line[512];
	bool found = false;

	if (f == NULL)
		return false;
	while (!found && fgets(line, sizeof(line), f) != NULL)
		found = strncmp(line, addr, strlen(addr)) == 0 && strstr(line, name) != NULL &&
			(line[strlen(addr)] == ' ' || line[strlen(addr)] == '\t');
	fclose(f);
	return found;
}

static void resolving_localhost_adds_ip_rules(void **state)
{
	struct bs_config cfg;
	size_t resolved = 0;

	(void)state;
	if (load("compartments = (\n{ name = \"web\";\n destinations = [ \"localhost:8080\" ];\n"
		 " max_connections = 3; });\n", &cfg, true) != 0)
		fail_msg("%s", err);
	assert_int_equal(cfg.rules[0].kind, RULE_HOST);
	assert_true(has_rule(&cfg, "127.0.0.1", 8080, 0));
	if (hosts_file_has("::1", "localhost"))
		assert_true(has_rule(&cfg, "::1", 8080, 0));
	for (size_t i = 1; i < cfg.nrules; i++) {
		assert_int_equal(cfg.rules[i].kind, RULE_IP);
		assert_int_equal(cfg.rules[i].line, 3);
		assert_int_equal(cfg.rules[i].port_lo, 8080);
		/* The name goes along, for a reload to keep the address. */
		assert_string_equal(cfg.rules[i].host, "localhost");
		resolved++;
	}
	assert_true(resolved >= 1 && resolved <= 2);
	cfg_free(&cfg);
}

static void without_resolve_only_host_rules_are_kept(void **state)
{
	struct bs_config cfg;

	(void)state;
	assert_int_equal(load("compartments = ({ name = \"web\"; destinations = [ \"localhost:8080\" ];"
			      " max_connections = 3; });\n", &cfg, false), 0);
	assert_int_equal(cfg.nrules, 1);
	assert_int_equal(cfg.rules[0].kind, RULE_HOST);
	cfg_free(&cfg);
}

static void resolved_addresses_are_not_repeated(void **state)
{
	struct bs_config cfg;
	size_t ip = 0;

	(void)state;
	/* localhost twice in web, plus an explicit 127.0.0.1:8080 in "db": the
	 * explicit rule keeps the address, and no duplicate error follows. */
	if (load("compartments = (\n"
		 "{ name = \"db\"; destinations = [ \"127.0.0.1:8080\" ]; max_connections = 1; },\n"
		 "{ name = \"web\"; destinations = [ \"localhost:8080\", \"LOCALHOST.:8080\" ];\n"
		 "  max_connections = 3; });\n", &cfg, true) != 0)
		fail_msg("%s", err);
	for (size_t i = 0; i < cfg.nrules; i++)
		ip += cfg.rules[i].kind == RULE_IP;
	assert_int_equal(ip, 1);
	assert_true(has_rule(&cfg, "127.0.0.1", 8080, 0));
	assert_false(has_rule(&cfg, "127.0.0.1", 8080, 1));
	cfg_free(&cfg);
}

static void unresolvable_host_is_not_an_error(void **state)
{
	struct bs_config cfg;

	(void)state;
	if (load("resolve_timeout_ms = 300;\ncompartments = ({ name = \"x\"; destinations = "
		 "[ \"no-such-host.invalid:80\" ]; max_connections = 1; });\n", &cfg, true) != 0)
		fail_msg("%s", err);
	assert_int_equal(cfg.nrules, 1);
	assert_int_equal(cfg.rules[0].kind, RULE_HOST);
	cfg_free(&cfg);
}

/* A name that gives no address is one line naming the file and line of
 * its destination (an included file's own), for the library, run and
 * check to say; a name that resolves adds none. */
static void an_unresolved_host_is_one_line_at_its_file_and_line(void **state)
{
	static const char main_text[] = "segment = \"x\";\nresolve_timeout_ms = 300;\n"
					"@include \"hosts.cfg\"\n";
	static const char hosts[] = "compartments = (\n"
				    "{ name = \"a\"; destinations = [ \"localhost:80\" ];\n"
				    "  max_connections = 1; },\n"
				    "{ name = \"b\"; destinations = [ \"127.0.0.1:81\",\n"
				    "  \"no-such-host.invalid:82\" ]; max_connections = 1; });\n";
	struct bs_config cfg;
	char dir[64], p[128], want[512];

	(void)state;
	make_dir(dir, sizeof(dir));
	put_file(dir, "svc.cfg", main_text, sizeof(main_text) - 1);
	put_file(dir, "hosts.cfg", hosts, sizeof(hosts) - 1);
	snprintf(p, sizeof(p), "%s/svc.cfg", dir);
	assert_int_equal(cfg_load(p, &cfg, true, err, sizeof(err)), 0);
	assert_int_equal(cfg.nunresolved, 1);
	assert_non_null(cfg.unresolved);
	snprintf(want, sizeof(want), "hosts.cfg:5: host \"no-such-host.invalid\" of compartment "
		 "\"b\" resolves to nothing (");
	assert_non_null(strstr(cfg.unresolved, want));
	assert_non_null(strstr(cfg.unresolved, "): connections to no-such-host.invalid:82 are not "
			       "limited until the program's own lookup of the name returns an "
			       "address\n"));
	assert_int_equal(strchr(cfg.unresolved, '\n')[1], '\0');
	cfg_free(&cfg);
	/* Not resolved, nothing is known: no line. */
	assert_int_equal(cfg_load(p, &cfg, false, err, sizeof(err)), 0);
	assert_int_equal(cfg.nunresolved, 0);
	assert_null(cfg.unresolved);
	cfg_free(&cfg);
	remove_dir(dir);
}

static bool wants_strict(const char *text)
{
	bool strict;

	write_cfg(text);
	strict = cfg_wants_strict(path);
	unlink(path);
	return strict;
}

static void broken_config_can_still_ask_for_strict(void **state)
{
	struct bs_config cfg;

	(void)state;
	write_cfg("strict = true;\ncompartments = ( );\n");
	assert_int_equal(cfg_load(path, &cfg, false, err, sizeof(err)), -EINVAL);
	assert_true(cfg_wants_strict(path));
	unlink(path);
	assert_false(wants_strict("strict = false;\ncompartments = ( );\n"));
	assert_false(wants_strict("compartments = ( );\n"));
	assert_false(wants_strict("strict = 1;\n"));
	assert_false(wants_strict("strict = true;\nsyntax error here\n"));
	assert_false(cfg_wants_strict("/nonexistent/bulkshim.cfg"));
	assert_false(cfg_wants_strict(NULL));
}

static void default_segment_comes_from_the_file_name(void **state)
{
	char out[BS_NAME_MAX], small[4];

	(void)state;
	cfg_default_segment("/etc/bulkshim/shop.cfg", out, sizeof(out));
	assert_string_equal(out, "shop");
	cfg_default_segment("shop.prod.cfg", out, sizeof(out));
	assert_string_equal(out, "shop.prod");
	cfg_default_segment("/etc/my shop+1.conf", out, sizeof(out));
	assert_string_equal(out, "my_shop_1");
	cfg_default_segment("/etc/bulkshim/noext", out, sizeof(out));
	assert_string_equal(out, "noext");
	cfg_default_segment("", out, sizeof(out));
	assert_string_equal(out, "default");
	cfg_default_segment("/etc/bulkshim/.cfg", out, sizeof(out));
	assert_string_equal(out, "default");
	cfg_default_segment("/etc/bulkshim/", out, sizeof(out));
	assert_string_equal(out, "default");
	cfg_default_segment(NULL, out, sizeof(out));
	assert_string_equal(out, "default");
	cfg_default_segment("/x/abcdefgh.cfg", small, sizeof(small));
	assert_string_equal(small, "abc");
}

static void cfg_free_zeroes_the_config(void **state)
{
	struct bs_config cfg;

	(void)state;
	assert_int_equal(load(good, &cfg, false), 0);
	cfg_free(&cfg);
	assert_zeroed(&cfg);
	cfg_free(&cfg);
	cfg_free(NULL);
}

/* ---- pools ---- */

static const char pooled[] =
	"pools = (\n"									/* 1 */
	"  { name = \"pg\"; size = 100; reserved = 10; }\n"			/* 2 */
	");\n"										/* 3 */
	"compartments = (\n"								/* 4 */
	" { name = \"checkout\"; pool = \"pg\"; guaranteed = 30; max_connections = 60;\n"	/* 5 */
	"   destinations = [\"10.0.0.1\"]; },\n"					/* 6 */
	" { name = \"reports\"; pool = \"pg\"; destinations = [\"10.0.0.2\"]; },\n"	/* 7 */
	" { name = \"alone\"; destinations = [\"10.0.0.3\"]; max_connections = 5; }\n"	/* 8 */
	");\n";

static void pools_guarantees_and_ceilings_are_read(void **state)
{
	struct bs_config cfg;

	(void)state;
	if (load(pooled, &cfg, false) != 0)
		fail_msg("%s", err);
	assert_int_equal(cfg.npools, 1);
	assert_string_equal(cfg.pools[0].name, "pg");
	assert_int_equal(cfg.pools[0].size, 100);
	assert_int_equal(cfg.pools[0].reserved, 10);
	assert_int_equal(cfg.comp[0].pool, 0);
	assert_int_equal(cfg.comp[0].guaranteed, 30);
	assert_int_equal(cfg.comp[0].max_connections, 60);
	/* No max_connections in a pool: the pool's room is the ceiling. */
	assert_int_equal(cfg.comp[1].pool, 0);
	assert_int_equal(cfg.comp[1].guaranteed, 0);
	assert_int_equal(cfg.comp[1].max_connections, 90);
	assert_int_equal(cfg.comp[2].pool, BS_NO_POOL);
	cfg_free(&cfg);
}

/* cfg_load_all reports every error, one per line; cfg_load the first. */
static void load_all_reports_every_error(void **state)
{
	const char *text = "max_sockets = 3;\ncompartments = (\n"
			   " { name = \"a\"; destinations = [ \"10.0.0.1:80\" ]; max_connections = 2; x = 1; },\n"
			   " { name = \"b\"; destinations = [ \"10.0.0.2:80\" ]; max_connections = 2; "
			   "max_wait_ms = -1; }\n);\n";
	struct bs_config cfg;
	char *second;

	(void)state;
	write_cfg(text);
	assert_int_equal(cfg_load_all(path, &cfg, false, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, ":3: unknown key \"x\""));
	second = strchr(err, '\n');
	assert_non_null(second);
	assert_non_null(strstr(second, ":4: "));
	assert_non_null(strstr(second, "max_wait_ms"));
	assert_non_null(strstr(second, ":1: max_sockets = 3 is below the 4 connections"));
	assert_zeroed(&cfg);
	assert_int_equal(cfg_load(path, &cfg, false, err, sizeof(err)), -EINVAL);
	assert_null(strchr(err, '\n'));
	assert_non_null(strstr(err, "unknown key \"x\""));
	unlink(path);
}

/* The segment of a file with errors, which the unprotected count is kept in. */
static void segment_of_a_broken_file(void **state)
{
	char seg[BS_NAME_MAX];

	(void)state;
	write_cfg("segment = \"named\";\nbogus = 1;\n");
	cfg_segment_of(path, seg, sizeof(seg));
	assert_string_equal(seg, "named");
	unlink(path);
	write_cfg("segment = \"named\"\n = ;\n");
	cfg_segment_of(path, seg, sizeof(seg));
	assert_non_null(strstr(seg, "bulkshim-test-"));
	unlink(path);
}

static void class_guarantees_are_read_and_every_class_gets_a_ceiling(void **state)
{
	struct bs_config cfg;

	(void)state;
	if (load("classes = { web = [\"web*\"];\n"
		 " batch = [\"nightly\"]; };\n"
		 "compartments = ( { name = \"pg\"; max_connections = 50; destinations = [\"10.0.0.1\"];\n"
		 " class_limits = { batch = 30; };\n class_guaranteed = { web = 35; batch = 5; }; } );\n",
		 &cfg, false) != 0)
		fail_msg("%s", err);
	assert_true(cfg.comp[0].class_shares);
	assert_int_equal(cfg.comp[0].class_guaranteed[1], 35);
	assert_int_equal(cfg.comp[0].class_guaranteed[2], 5);
	assert_int_equal(cfg.comp[0].class_limit[0], 50);
	assert_int_equal(cfg.comp[0].class_limit[1], 50);
	assert_int_equal(cfg.comp[0].class_limit[2], 30);
	cfg_free(&cfg);
}

static void a_budget_counts_a_pool_once(void **state)
{
	struct bs_config cfg;
	char want[256];

	(void)state;
	/* Ceilings 60 + 70 overlap inside the pool's 70: the budget sees 70 + 20. */
	if (load("budget = { pool = 90; };\npools = ( { name = \"pg\"; size = 80; reserved = 10; } );\n"
		 "compartments = (\n { name = \"a\"; pool = \"pg\"; guaranteed = 30; max_connections = 60;"
		 " destinations = [\"10.0.0.1\"]; },\n"
		 " { name = \"b\"; pool = \"pg\"; max_connections = 70; destinations = [\"10.0.0.2\"]; },\n"
		 " { name = \"c\"; max_connections = 20; destinations = [\"10.0.0.3\"]; } );\n",
		 &cfg, false) != 0)
		fail_msg("%s", err);
	cfg_free(&cfg);
	expect_error("budget = { pool = 89; };\npools = ( { name = \"pg\"; size = 80; reserved = 10; } );\n"
		     "compartments = (\n { name = \"a\"; pool = \"pg\"; guaranteed = 30; max_connections = 60;"
		     " destinations = [\"10.0.0.1\"]; },\n"
		     " { name = \"b\"; pool = \"pg\"; max_connections = 70; destinations = [\"10.0.0.2\"]; },\n"
		     " { name = \"c\"; max_connections = 20; destinations = [\"10.0.0.3\"]; } );\n",
		     ":1: ", "budget exceeded", NULL);
	snprintf(want, sizeof(want), "%s:1: budget exceeded: 20 + 70 (pool pg) = 90 > 89", path);
	assert_string_equal(err, want);
}

/* ---- configs that are refused, and what they are told ---- */

/* Runs of zeros, for names and patterns one character too long. */
#define ZEROS8 "00000000"
#define ZEROS64 ZEROS8 ZEROS8 ZEROS8 ZEROS8 ZEROS8 ZEROS8 ZEROS8 ZEROS8

/* Mistakes in the file as a whole: its syntax, its keys and their types,
 * the segment's name and mode, numbers. */
static const struct error_case file_errors[] = {
	{ .what = "syntax error names its line",
	  "segment = \"x\";\n" COMPS "max_sockets = ;\n",
	  ":3: ", "syntax error", NULL },
	{ .what = "unknown top level key is an error",
	  COMPS "\nsegmnt = \"x\";\n",
	  ":3: ", "unknown key \"segmnt\"", "(did you mean \"segment\"?)" },
	{ .what = "unknown key unlike any known has no suggestion",
	  COMPS "colour = \"blue\";\n",
	  ":2: ", "unknown key \"colour\"", NULL,
	  .absent = "did you mean" },
	{ .what = "wrong type is an error",
	  "compartments = (\n" "{ name = \"a\"; destinations = [\"10.0.0.1\"];\n"
	  "  max_connections = \"15\"; });\n",
	  ":3: ", "\"max_connections\" must be an integer, not a string", NULL },
	{ .what = "wrong type is an error",
	  COMPS "max_processes = 1.5;\n",
	  ":2: ", "\"max_processes\" must be an integer", NULL },
	{ .what = "wrong type is an error",
	  COMPS "segment = 7;\n",
	  ":2: ", "\"segment\" must be a string", NULL },
	{ .what = "wrong type is an error",
	  COMPS "budget = 7;\n",
	  ":2: ", "\"budget\" must be a group", NULL },
	{ .what = "missing compartments is an error",
	  "segment = \"x\";\n",
	  ": ", "no \"compartments\"", NULL },
	{ .what = "empty compartments is an error",
	  "segment = \"x\";\ncompartments = ( );\n",
	  ":2: ", "\"compartments\" is empty", NULL },
	{ .what = "empty compartments is an error",
	  "segment = \"x\";\ncompartments = [ ];\n",
	  ":2: ", "\"compartments\" is empty", NULL },
	{ .what = "empty compartments is an error",
	  "segment = \"x\";\ncompartments = { };\n",
	  ":2: ", "must be a list", NULL },
	{ .what = "bad segment name is an error",
	  COMPS "segment = \"shop/1\";\n",
	  ":2: ", "segment name \"shop/1\"", NULL },
	{ .what = "bad segment name is an error",
	  COMPS "\nsegment = \"" ZEROS64 "000000\";\n",
	  ":3: ", "segment name", "more than 63" },
	{ .what = "bad segment name is an error",
	  COMPS "segment = \"\";\n",
	  ":2: ", "empty segment name", NULL },
	{ .what = "mode with digit 8 or 9 is an error",
	  COMPS "mode = 680;\n",
	  ":2: ", "bad mode \"680\"", "octal" },
	{ .what = "mode with digit 8 or 9 is an error",
	  COMPS "mode = \"0609\";\n",
	  ":2: ", "bad mode \"0609\"", "octal" },
	{ .what = "other bad modes are errors",
	  COMPS "mode = \"rw-rw----\";\n",
	  ":2: ", "bad mode", NULL },
	{ .what = "other bad modes are errors",
	  COMPS "mode = \"1777\";\n",
	  ":2: ", "bad mode \"1777\"", NULL },
	{ .what = "other bad modes are errors",
	  COMPS "mode = -600;\n",
	  ":2: ", "bad mode", NULL },
	{ .what = "other bad modes are errors",
	  COMPS "mode = 0x1b0;\n",
	  ":2: ", "bad mode", "hex" },
	{ .what = "other bad modes are errors",
	  COMPS "mode = true;\n",
	  ":2: ", "\"mode\" must be", NULL },
	{ .what = "unknown owner or group is an error",
	  COMPS "owner = \"no-such-user-xyz\";\n",
	  ":2: ", "unknown user \"no-such-user-xyz\"", NULL },
	{ .what = "unknown owner or group is an error",
	  COMPS "\ngroup = \"no-such-group-xyz\";\n",
	  ":3: ", "unknown group \"no-such-group-xyz\"", NULL },
	{ .what = "unknown owner or group is an error",
	  COMPS "owner = -1;\n",
	  ":2: ", "bad user id", NULL },
	{ .what = "numeric settings out of range are errors",
	  COMPS "max_processes = 0;\n",
	  ":2: ", "\"max_processes\" must be between 1 and 65536", NULL },
	{ .what = "numeric settings out of range are errors",
	  COMPS "max_sockets = 1048577;\n",
	  ":2: ", "\"max_sockets\" must be between 1", NULL },
	{ .what = "numeric settings out of range are errors",
	  COMPS "resolve_timeout_ms = 60001;\n",
	  ":2: ", "\"resolve_timeout_ms\" must be between 0 and 60000", NULL },
	{ .what = "strict must be a boolean",
	  COMPS "strict = 1;\n",
	  ":2: ", "\"strict\" must be true or false", NULL },
	{ .what = "integers above 32 bits are read whole",
	  "compartments = ( { name = \"a\"; destinations = [ \"10.0.0.1:80\" ];\n"
	  "max_connections = 4294967297; } );\n",
	  ":2: ", "4294967297", NULL },
	{ .what = "integers above 32 bits are read whole",
	  COMPS "budget = { pool = 4294967306; };\n",
	  ":2: ", "not 4294967306", NULL },
	{ .what = "integers above 32 bits are read whole",
	  COMPS "max_processes = 99999999999;\n",
	  ":2: ", "not 99999999999", NULL },
	{ .what = "integers above 32 bits are read whole",
	  COMPS "max_sockets = 99999999999999999999;\n",
	  ":2: ", "too large", NULL },
	{ .what = "integers above 32 bits are read whole",
	  COMPS "max_sockets = 0x100000004;\n",
	  ":2: ", "not 4294967300", NULL },
	{ .what = "integers above 32 bits are read whole",
	  COMPS "owner = 4294967296;\n",
	  ":2: ", "bad user id 4294967296", NULL },
	{ .what = "syntax errors get hints",
	  "compartments = ( { name = \"a\"; destinations = [ \"10.0.0.1:80\", ];\n"
	  "max_connections = 5; } );\n",
	  ":1: ", "syntax error", "a comma before \"]\"" },
	{ .what = "syntax errors get hints",
	  "max_sockets 10;\n" COMPS,
	  ":1: ", "syntax error", "missing \"=\"" },
	{ .what = "syntax errors get hints",
	  "segment = \"x\";\n" COMPS "max_sockets = ;\n",
	  ":3: ", "syntax error", NULL },
};

static void mistakes_in_the_file_as_a_whole_are_refused(void **state)
{
	(void)state;
	check_errors(file_errors, NELEM(file_errors));
}

/* Mistakes in a compartment: its name, its destinations, its limits,
 * waits and timeouts, enforce, errno, and typos of its keys. */
static const struct error_case comp_errors[] = {
	{ .what = "compartment must be a group",
	  "compartments = (\n \"a\" );\n",
	  ":2: ", "compartment 1 must be a group", NULL },
	{ .what = "compartment without name is an error",
	  "compartments = (\n"
	  "{ name = \"a\"; destinations = [\"10.0.0.1\"]; max_connections = 1; },\n"
	  "{ destinations = [\"10.0.0.2\"]; max_connections = 1; });\n",
	  ":3: ", "compartment 2 has no \"name\"", NULL },
	{ .what = "empty compartment name is an error",
	  "compartments = (\n"
	  "{ name = \"\"; destinations = [\"10.0.0.1\"]; max_connections = 1; });\n",
	  ":2: ", "empty compartment name", NULL },
	{ .what = "compartment name with bad character is an error",
	  "\ncompartments = (\n"
	  "{ name = \"pay ments\"; destinations = [\"10.0.0.1\"]; max_connections = 1; });\n",
	  ":3: ", "\"pay ments\" has a character outside [A-Za-z0-9_.-]", NULL },
	{ .what = "duplicate compartment name names both lines",
	  "compartments = (\n"
	  "{ name = \"a\"; destinations = [\"10.0.0.1\"]; max_connections = 1; },\n"
	  "{ name = \"b\"; destinations = [\"10.0.0.2\"]; max_connections = 1; },\n"
	  "{ name = \"a\"; destinations = [\"10.0.0.3\"]; max_connections = 1; });\n",
	  ":4: ", "duplicate compartment name \"a\"", "line 2" },
	{ .what = "unknown key in compartment suggests the close one",
	  "segment = \"s\";\n" "compartments = (\n" "  {\n" "    name = \"payments\";\n"
	  "    destinations = [ \"10.0.0.5:443\" ];\n" "    max_connections = 15;\n"
	  "    max_conections = 15;\n" "  }\n" ");\n",
	  ":7: ", "unknown key", NULL,
	  .exact = ":7: unknown key \"max_conections\" in compartment "
	      "\"payments\" (did you mean \"max_connections\"?)" },
	{ .what = "missing destinations is an error",
	  "compartments = (\n{ name = \"a\";\n max_connections = 1; });\n",
	  ":2: ", "compartment \"a\" has no \"destinations\"", NULL },
	{ .what = "empty destinations is an error",
	  "compartments = (\n{ name = \"a\";\n destinations = [ ];\n" " max_connections = 1; });\n",
	  ":3: ", "compartment \"a\" has no destinations", NULL },
	{ .what = "bad destination gives the reason",
	  "compartments = (\n{ name = \"a\";\n destinations = [ \"10.0.0.2\",\n"
	  "   \"10.0.0.1:99999\" ];\n max_connections = 1; });\n",
	  ":4: ", "compartment \"a\": bad port \"99999\" in \"10.0.0.1:99999\"", NULL },
	{ .what = "bad destination gives the reason",
	  "compartments = (\n{ name = \"a\";\n destinations = [ 80 ];\n"
	  " max_connections = 1; });\n",
	  ":3: ", "must be a string, not an integer", NULL },
	{ .what = "duplicate destination names both compartments",
	  "compartments = (\n"
	  "{ name = \"payments\"; destinations = [\"10.0.0.5:443\"]; max_connections = 1; },\n"
	  "{ name = \"other\"; destinations = [\"10.0.0.9\"]; max_connections = 1; },\n"
	  "{ name = \"recs\"; destinations = [\"[::ffff:10.0.0.5]:443\"];\n"
	  "  max_connections = 1; });\n",
	  ":4: ", "duplicate destination \"[::ffff:10.0.0.5]:443\" in compartment \"recs\"",
	  "(already in compartment \"payments\" on line 2)" },
	{ .what = "duplicate destination names both compartments",
	  "compartments = (\n"
	  "{ name = \"a\"; destinations = [\"unix:@sock\"]; max_connections = 1; },\n"
	  "{ name = \"b\"; destinations = [\"unix:@sock\"]; max_connections = 1; });\n",
	  ":3: ", "duplicate destination \"unix:@sock\"", "\"a\" on line 2" },
	{ .what = "compartment without either limit is an error",
	  "compartments = (\n\n{ name = \"a\"; destinations = [\"10.0.0.1\"]; });\n",
	  ":3: ", "compartment \"a\" sets neither max_connections nor max_inflight", NULL,
	  .exact = ":3: compartment \"a\" sets neither max_connections nor " "max_inflight" },
	{ .what = "max connections below one is an error",
	  "compartments = (\n{ name = \"a\"; destinations = [\"10.0.0.1\"];\n"
	  " max_connections = 0; });\n",
	  ":3: ", "must be at least 1, not 0", NULL },
	{ .what = "max connections below one is an error",
	  "compartments = (\n{ name = \"a\"; destinations = [\"10.0.0.1\"];\n"
	  " max_connections = -4; });\n",
	  ":3: ", "must be at least 1, not -4", NULL },
	{ .what = "absurd max connections is an error",
	  "compartments = (\n{ name = \"a\"; destinations = [\"10.0.0.1\"];\n"
	  " max_connections = 1000001; });\n",
	  ":3: ", "absurd", "1000001" },
	{ .what = "unknown errno is an error",
	  "compartments = (\n{ name = \"a\"; destinations = [\"10.0.0.1\"];\n"
	  " max_connections = 1;\n errno = \"EPERM\"; });\n",
	  ":4: ", "unknown errno \"EPERM\"", NULL },
	{ .what = "max inflight out of range is an error",
	  COMP_A " max_connections = 5;\n max_inflight = 0; });\n",
	  ":4: ", "max_inflight of \"a\" must be at least 1, not 0", NULL },
	{ .what = "max inflight out of range is an error",
	  COMP_A " max_inflight = 1000001; });\n",
	  ":3: ", "max_inflight of \"a\" is 1000001", "absurd" },
	{ .what = "max inflight out of range is an error",
	  COMP_A " max_inflight = \"3\"; });\n",
	  ":3: ", "\"max_inflight\" must be an integer, not a string", NULL },
	{ .what = "max wait ms out of range is an error",
	  COMP_A " max_connections = 5;\n max_wait_ms = 600001; });\n",
	  ":4: ", "\"max_wait_ms\" must be between 0 and 600000, not 600001", NULL },
	{ .what = "max wait ms out of range is an error",
	  COMP_A " max_connections = 5;\n max_wait_ms = -1; });\n",
	  ":4: ", "\"max_wait_ms\" must be between 0 and 600000, not -1", NULL },
	{ .what = "max wait ms out of range is an error",
	  COMP_A " max_connections = 5;\n max_wait_ms = 0.5; });\n",
	  ":4: ", "\"max_wait_ms\" must be an integer", NULL },
	{ .what = "max waiting out of range is an error",
	  COMP_A " max_connections = 5; max_wait_ms = 100;\n max_waiting = 0; });\n",
	  ":4: ", "\"max_waiting\" must be between 1 and 1000000, not 0", NULL },
	{ .what = "max waiting out of range is an error",
	  COMP_A " max_connections = 5; max_wait_ms = 100;\n" " max_waiting = 1000001; });\n",
	  ":4: ", "\"max_waiting\" must be between 1 and 1000000", NULL },
	{ .what = "max waiting without max wait ms is an error",
	  COMP_A " max_connections = 5;\n max_waiting = 3; });\n",
	  ":4: ", "max_waiting without max_wait_ms in compartment \"a\"", NULL },
	{ .what = "max waiting without max wait ms is an error",
	  COMP_A " max_connections = 5; max_wait_ms = 0;\n max_waiting = 3; });\n",
	  ":4: ", "max_waiting without max_wait_ms in compartment \"a\"", NULL },
	{ .what = "connect timeout ms out of range is an error",
	  COMP_A " max_connections = 5;\n connect_timeout_ms = 3600001; });\n",
	  ":4: ", "\"connect_timeout_ms\" must be between 0 and 3600000, not 3600001", NULL },
	{ .what = "connect timeout ms out of range is an error",
	  COMP_A " max_connections = 5;\n connect_timeout_ms = \"2s\"; });\n",
	  ":4: ", "\"connect_timeout_ms\" must be an integer, not a string", NULL },
	{ .what = "io timeout ms out of range is an error",
	  COMP_A " max_connections = 5;\n\n io_timeout_ms = -5; });\n",
	  ":5: ", "\"io_timeout_ms\" must be between 0 and 3600000, not -5", NULL },
	{ .what = "enforce must be a boolean",
	  COMPS "\nenforce = 1;\n",
	  ":3: ", "\"enforce\" must be true or false, not " "an integer", NULL },
	{ .what = "enforce must be a boolean",
	  COMP_A " max_connections = 5;\n enforce = \"no\"; });\n",
	  ":4: ", "\"enforce\" must be true or false, not a string", NULL },
	{ .what = "eagain with max inflight is an error",
	  "compartments = ( { name = \"a\"; destinations = [ \"10.0.0.1:80\" ];\n"
	  "max_inflight = 5; errno = \"EAGAIN\"; } );\n",
	  ":2: ", "EAGAIN cannot go with " "max_inflight", "busy loop" },
	{ .what = "new keys are suggested for typos",
	  COMP_A " max_connections = 10;\n max_inflght = 2; });\n",
	  ":4: ", "unknown key \"max_inflght\"", "(did you mean \"max_inflight\"?)" },
	{ .what = "new keys are suggested for typos",
	  COMP_A " max_connections = 10;\n class_limit = { }; });\n",
	  ":4: ", "unknown key \"class_limit\"", "(did you mean \"class_limits\"?)" },
	{ .what = "new keys are suggested for typos",
	  COMP_A " max_connections = 10;\n io_timeuot_ms = 5; });\n",
	  ":4: ", "unknown key \"io_timeuot_ms\"", "(did you mean \"io_timeout_ms\"?)" },
	{ .what = "new keys are suggested for typos",
	  COMPS "clases = { };\n",
	  ":2: ", "unknown key \"clases\"", "(did you mean \"classes\"?)" },
	{ .what = "new keys are suggested for typos",
	  COMPS "enforced = true;\n",
	  ":2: ", "unknown key \"enforced\"", "(did you mean \"enforce\"?)" },
};

static void mistakes_in_a_compartment_are_refused(void **state)
{
	(void)state;
	check_errors(comp_errors, NELEM(comp_errors));
}

/* Mistakes in the budget and the pools. */
static const struct error_case budget_errors[] = {
	{ .what = "unknown key in budget is an error",
	  COMPS "budget = {\n pool = 10;\n reservd = 1; };\n",
	  ":4: ", "unknown key \"reservd\" in budget", "(did you mean \"reserved\"?)" },
	{ .what = "budget pool must be positive",
	  COMPS "budget = {\n pool = 0; };\n",
	  ":3: ", "budget pool", "not 0" },
	{ .what = "budget pool must be positive",
	  COMPS "budget = {\n pool = -5; };\n",
	  ":3: ", "budget pool", "not -5" },
	{ .what = "budget pool must be positive",
	  COMPS "budget = { reserved = 1; };\n",
	  ":2: ", "budget has no \"pool\"", NULL },
	{ .what = "budget reserved must be below the pool",
	  COMPS "budget = { pool = 10;\n reserved = -1; };\n",
	  ":3: ", "budget reserved", "not -1" },
	{ .what = "budget reserved must be below the pool",
	  COMPS "budget = { pool = 10;\n reserved = 10; };\n",
	  ":3: ", "budget reserved", "not 10" },
	{ .what = "budget overrun lists each allocation",
	  overrun,
	  ":2: ", "budget exceeded", NULL,
	  .exact = ":2: budget exceeded: 40 + 25 + 15 + 10 = 90 > 100 - 20 reserved" },
	{ .what = "guarantees beyond the pool list each term",
	  "pools = ( { name = \"pg\"; size = 50;\n reserved = 10; } );\n" "compartments = (\n"
	  " { name = \"a\"; pool = \"pg\"; guaranteed = 30; destinations = [\"10.0.0.1\"]; },\n"
	  " { name = \"b\"; pool = \"pg\"; guaranteed = 15; destinations = [\"10.0.0.2\"]; }\n"
	  ");\n",
	  ":1: ", "guarantees exceed", NULL,
	  .exact = ":1: pool \"pg\": guarantees exceed its room: "
	      "30 (a) + 15 (b) = 45 > 50 - 10 reserved" },
	{ .what = "pool mistakes are errors at their line",
	  "pools = ( { name = \"pg\"; size = 5; } );\ncompartments = (\n"
	  " { name = \"a\"; pool = \"pq\"; destinations = [\"10.0.0.1\"]; } );\n",
	  ":3: ", "names pool \"pq\"", NULL },
	{ .what = "pool mistakes are errors at their line",
	  "compartments = (\n { name = \"a\"; guaranteed = 3;\n"
	  " destinations = [\"10.0.0.1\"]; max_connections = 5; } );\n",
	  ":2: ", "needs a \"pool\"", NULL },
	{ .what = "pool mistakes are errors at their line",
	  "pools = ( { name = \"pg\"; size = 50; } );\ncompartments = (\n"
	  " { name = \"a\"; pool = \"pg\";\n guaranteed = 9; max_connections = 5;"
	  " destinations = [\"10.0.0.1\"]; } );\n",
	  ":4: ", "above its ceiling", NULL },
	{ .what = "pool mistakes are errors at their line",
	  "pools = ( { name = \"pg\";\n size = 5; reserved = 5; } );\n" COMPS,
	  ":2: ", "reserved of pool \"pg\"", "below its size" },
	{ .what = "pool mistakes are errors at their line",
	  "pools = ( { name = \"pg\"; size = 5; },\n { name = \"pg\"; size = 6; } );\n" COMPS,
	  ":2: ", "duplicate pool name", NULL },
	{ .what = "pool mistakes are errors at their line",
	  "pools = ( { name = \"pg\"; size = 0; } );\n" COMPS,
	  ":1: ", "size of pool", NULL },
	{ .what = "pool mistakes are errors at their line",
	  "pools = ( { name = \"pg\"; size = 5; sise = 3; } );\n" COMPS,
	  ":1: ", "unknown key \"sise\" in a pool", "(did you mean \"size\"?)" },
};

static void mistakes_in_budgets_and_pools_are_refused(void **state)
{
	(void)state;
	check_errors(budget_errors, NELEM(budget_errors));
}

/* Mistakes in the classes, and in the class limits and guarantees of a
 * compartment. */
static const struct error_case class_errors[] = {
	{ .what = "classes must be a group of arrays",
	  COMPS "classes = [ \"pg_dump\" ];\n",
	  ":2: ", "\"classes\" must be a group", NULL },
	{ .what = "classes must be a group of arrays",
	  COMPS "classes = {\n batch = \"pg_dump\"; };\n",
	  ":3: ", "class \"batch\" must be an array of program-name patterns", "not a string" },
	{ .what = "bad class pattern is an error",
	  COMPS "classes = { batch = [\n \"pg_dump\",\n \"\" ]; };\n",
	  ":4: ", "empty pattern in class \"batch\"", NULL },
	{ .what = "bad class pattern is an error",
	  COMPS "classes = { batch = (\n \"pg_dump\",\n 7 ); };\n",
	  ":4: ", "pattern 2 of class \"batch\" must be a string, not an integer", NULL },
	{ .what = "bad class pattern is an error",
	  COMPS "classes = { batch = [\n \"/usr/bin/pg_dump\" ]; };\n",
	  ":3: ", "pattern \"/usr/bin/pg_dump\" of class \"batch\" has a '/'", NULL },
	{ .what = "bad class pattern is an error",
	  COMPS "classes = { batch = [\n \"" ZEROS64 "\" ]; };\n",
	  ":3: ", "of class \"batch\" is 64 characters, more than 63", NULL },
	{ .what = "duplicate class name is named",
	  COMPS "classes = {\n batch = [ \"a\" ];\n batch = [ \"b\" ]; };\n",
	  ":4: ", "duplicate key \"batch\"", "each class in \"classes\"" },
	{ .what = "duplicate class name is named",
	  COMPS "classes = {\n a = [ ]; batch = [ ]; c = [ ]; batch = [ ]; };\n",
	  ":3: ", "duplicate key \"batch\"", NULL },
	{ .what = "duplicate class name is named",
	  COMP_A " max_connections = 20;\n" " class_limits = { batch = 2;\n batch = 3; }; });\n"
	  "classes = { batch = [ ]; };\n",
	  ":5: ", "duplicate key \"batch\"", NULL },
	{ .what = "class limit above max connections is an error",
	  "classes = { batch = [ \"pg_dump\" ]; };\n"
	  "compartments = (\n{ name = \"x\"; destinations = [\"10.0.0.1\"];\n"
	  " max_connections = 10;\n class_limits = {\n batch = 20; }; });\n",
	  ":6: ", "class limit batch = 20 is above max_connections 10 of \"x\"", NULL,
	  .exact = ":6: class limit batch = 20 is above max_connections 10 " "of \"x\"" },
	{ .what = "unknown class in class limits is an error",
	  "classes = { batch = [ ]; };\n" COMP_A " max_connections = 10;\n"
	  " class_limits = { bacth = 2; }; });\n",
	  ":5: ", "unknown class \"bacth\" in class_limits of \"a\"", "(did you mean \"batch\"?)" },
	{ .what = "unknown class in class limits is an error",
	  COMP_A " max_connections = 10;\n class_limits = { batch = 2; }; });\n",
	  ":4: ", "unknown class \"batch\" in class_limits of \"a\"", "\"classes\"" },
	{ .what = "bad class limit is an error",
	  "classes = { batch = [ ]; };\n" COMP_A " max_connections = 10;\n"
	  " class_limits = { batch = \"4\"; }; });\n",
	  ":5: ", "class limit batch of \"a\" must be an integer, not a string", NULL },
	{ .what = "bad class limit is an error",
	  "classes = { batch = [ ]; };\n" COMP_A " max_connections = 10;\n"
	  " class_limits = { batch = 0; }; });\n",
	  ":5: ", "class limit batch of \"a\" must be between 1 and 1000000, not 0", NULL },
	{ .what = "bad class limit is an error",
	  "classes = { batch = [ ]; };\n" COMP_A " max_connections = 10;\n"
	  " class_limits = [ 4 ]; });\n",
	  ":5: ", "\"class_limits\" must be a group", NULL },
	{ .what = "class guarantees beyond the compartment list each term",
	  "classes = { web = [\"web*\"];\n" " batch = [\"nightly\"]; };\n"
	  "compartments = ( { name = \"pg\"; max_connections = 50; destinations = [\"10.0.0.1\"];\n"
	  " class_guaranteed = { web = 35; batch = 20; }; } );\n",
	  ":4: ", "guarantees exceed", NULL,
	  .exact = ":4: classes of \"pg\": guarantees exceed its room: "
	      "35 (web) + 20 (batch) = 55 > max_connections 50" },
	{ .what = "class guarantees beyond the compartment list each term",
	  "classes = { web = [\"web*\"]; };\n"
	  "compartments = ( { name = \"pg\"; max_connections = 50; destinations = [\"10.0.0.1\"];\n"
	  " class_limits = { web = 10; };\n class_guaranteed = { web = 20; }; } );\n",
	  ":4: ", "above its ceiling", NULL },
	{ .what = "class guarantees beyond the compartment list each term",
	  "classes = { web = [\"web*\"]; };\n"
	  "compartments = ( { name = \"pg\"; max_inflight = 5; destinations = [\"10.0.0.1\"];\n"
	  " class_guaranteed = { web = 2; }; } );\n",
	  ":3: ", "needs max_connections", NULL },
	{ .what = "class guarantees beyond the compartment list each term",
	  "classes = { web = [\"web*\"]; };\n"
	  "compartments = ( { name = \"pg\"; max_connections = 5; destinations = [\"10.0.0.1\"];\n"
	  " class_guaranteed = { wbe = 2; }; } );\n",
	  ":3: ", "unknown class \"wbe\" in " "class_guaranteed", "(did you mean \"web\"?)" },
};

static void mistakes_in_classes_are_refused(void **state)
{
	(void)state;
	check_errors(class_errors, NELEM(class_errors));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(good_config_sets_every_field),
		cmocka_unit_test(absent_keys_get_their_defaults),
		cmocka_unit_test(max_sockets_defaults_from_the_limits),
		cmocka_unit_test(missing_file_is_enoent),
		cmocka_unit_test(directory_or_bad_path_is_an_error),
		cmocka_unit_test(unreadable_file_is_an_error),
		cmocka_unit_test(a_fifo_or_a_device_is_refused_without_waiting),
		cmocka_unit_test(a_config_of_more_than_16_mib_is_refused),
		cmocka_unit_test(a_nul_byte_is_refused_at_its_line),
		cmocka_unit_test(an_include_is_read_next_to_the_config),
		cmocka_unit_test(an_include_by_an_absolute_name_is_read),
		cmocka_unit_test(an_error_is_placed_in_the_file_and_line_that_hold_it),
		cmocka_unit_test(includes_put_in_place_parse_as_libconfig_reads_them),
		cmocka_unit_test(an_include_of_a_fifo_or_of_too_much_is_refused_at_its_line),
		cmocka_unit_test(an_include_that_opens_but_cannot_be_read_is_refused_at_its_line),
		cmocka_unit_test(includes_ten_deep_load_on_a_small_thread_stack),
		cmocka_unit_test(long_compartment_name_is_an_error),
		cmocka_unit_test(destination_lines_are_where_the_strings_are),
		cmocka_unit_test(every_allowed_errno_is_accepted),
		cmocka_unit_test(modes_are_read_as_octal),
		cmocka_unit_test(owner_and_group_take_names_or_ids),
		cmocka_unit_test(budget_that_fits_exactly_is_accepted),
		cmocka_unit_test(budget_overrun_too_long_to_list_gives_the_sum),
		cmocka_unit_test(too_many_compartments_is_an_error),
		cmocka_unit_test(too_many_destinations_is_an_error),
		cmocka_unit_test(duplicate_destination_in_one_compartment_is_fine),
		cmocka_unit_test(limits_waits_and_timeouts_are_read),
		cmocka_unit_test(enforce_is_inherited_unless_a_compartment_sets_it),
		cmocka_unit_test(class_patterns_are_read_in_order),
		cmocka_unit_test(reserved_or_bad_class_name_is_an_error),
		cmocka_unit_test(too_many_patterns_or_classes_is_an_error),
		cmocka_unit_test(class_limits_are_stored_by_class_index),
		cmocka_unit_test(budget_ignores_inflight_only_compartments),
		cmocka_unit_test(load_all_reports_every_error),
		cmocka_unit_test(segment_of_a_broken_file),
		cmocka_unit_test(every_new_key_is_read),
		cmocka_unit_test(resolving_localhost_adds_ip_rules),
		cmocka_unit_test(without_resolve_only_host_rules_are_kept),
		cmocka_unit_test(resolved_addresses_are_not_repeated),
		cmocka_unit_test(unresolvable_host_is_not_an_error),
		cmocka_unit_test(an_unresolved_host_is_one_line_at_its_file_and_line),
		cmocka_unit_test(broken_config_can_still_ask_for_strict),
		cmocka_unit_test(default_segment_comes_from_the_file_name),
		cmocka_unit_test(cfg_free_zeroes_the_config),
		cmocka_unit_test(pools_guarantees_and_ceilings_are_read),
		cmocka_unit_test(class_guarantees_are_read_and_every_class_gets_a_ceiling),
		cmocka_unit_test(a_budget_counts_a_pool_once),
		cmocka_unit_test(mistakes_in_the_file_as_a_whole_are_refused),
		cmocka_unit_test(mistakes_in_a_compartment_are_refused),
		cmocka_unit_test(mistakes_in_budgets_and_pools_are_refused),
		cmocka_unit_test(mistakes_in_classes_are_refused),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}

/* notice.c - what the shim tells the operator at start-up, once per process tree, with the fix. */
#include <errno.h>
#include <grp.h>
#include <stdarg.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "interpose/interpose.h"

#define NOTICED_ENV	"BULKSHIM_NOTICED"
#define NOTICED_MAX	2048

/*
 * A wrapper script that starts 36 programs must not print the same warning
 * 36 times. The keys of the warnings already given travel in the
 * environment, which exec and fork pass on: the first process of a tree
 * says it, its descendants stay quiet. Only called from the constructor,
 * before the program's own threads exist, so setenv is safe here.
 */
bool
notice_once(const char *key)
{
	const char *old = getenv(NOTICED_ENV);
	char buf[NOTICED_MAX];
	size_t klen = strlen(key);

	for (const char *p = old; p != NULL && *p != '\0';) {
		const char *end = strchr(p, '|');
		size_t n = end ? (size_t)(end - p) : strlen(p);

		if (n == klen && memcmp(p, key, n) == 0)
			return false;
		p = end ? end + 1 : p + n;
	}
	/* A key that does not fit is said every time rather than never. */
	if (snprintf(buf, sizeof(buf), "%s%s%s", old ? old : "", old && *old ? "|" : "", key) <
	    (int)sizeof(buf))
		setenv(NOTICED_ENV, buf, 1);
	return true;
}

/*
 * Counts, in the segment `segment` if this process may write it, one
 * process that meant to run with limits and runs inert, and why; `bulkshim
 * status` shows it. A segment that does not exist or cannot be written is
 * left alone: nothing can be told there.
 */
void
notice_unprotected(const char *segment, const char *why)
{
	char err[BS_ERRLEN];
	struct seg_header *h;
	struct seg *s;

	if (segment == NULL || segment[0] == '\0' || seg_open(segment, true, &s, err, sizeof(err)) < 0)
		return;
	h = seg_header(s);
	snprintf(h->unprotected_why, sizeof(h->unprotected_why), "pid %d: %s", (int)getpid(), why);
	atomic_store(&h->unprotected_ms, now_real_ms());
	atomic_fetch_add(&h->unprotected, 1);
	seg_close(s);
}

/* bs_log with the whole of printf (bs_log's own formatter is the
 * signal-safe subset); start-up only. */
static void __attribute__((format(printf, 2, 3)))
say(int level, const char *fmt, ...)
{
	char msg[BS_ERRLEN];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	bs_log(level, "%s", msg);
}

/* The name of uid or gid, else the number, into buf. */
static const char *
id_name(bool group, unsigned id, char *buf, size_t len)
{
	char tmp[4096];
	struct passwd pw, *pr = NULL;
	struct group gr, *gres = NULL;

	if (group && getgrgid_r((gid_t)id, &gr, tmp, sizeof(tmp), &gres) == 0 && gres != NULL)
		snprintf(buf, len, "%s", gres->gr_name);
	else if (!group && getpwuid_r((uid_t)id, &pw, tmp, sizeof(tmp), &pr) == 0 && pr != NULL)
		snprintf(buf, len, "%s", pr->pw_name);
	else
		snprintf(buf, len, "%u", id);
	return buf;
}

/*
 * Says how to fix a segment this user may not open: who owns it, with which
 * mode, and the lines of the config that let this process in. Logged at
 * error level, after give_up's own line.
 */
void
notice_denied(const struct bs_config *cfg)
{
	char path[BS_NAME_MAX + 32], owner[64], group[64], mygroup[64];
	struct stat st;

	snprintf(path, sizeof(path), "/dev/shm/bulkshim.%s", cfg->segment);
	if (stat(path, &st) < 0)
		return;
	id_name(false, (unsigned)st.st_uid, owner, sizeof(owner));
	id_name(true, (unsigned)st.st_gid, group, sizeof(group));
	id_name(true, (unsigned)getegid(), mygroup, sizeof(mygroup));
	say(LOG_ERROR, "fix: segment %s belongs to %s:%s with mode 0%o and this process runs as "
	    "uid %u gid %u", path, owner, group, (unsigned)(st.st_mode & 0777), (unsigned)geteuid(),
	    (unsigned)getegid());
	say(LOG_ERROR, "fix: add to %s the line   mode = \"0660\"; group = \"%s\";   "
	    "(or owner = \"<this user>\";), stop the programs using the segment and run "
	    "`bulkshim rm %s` so that the next start creates it with them",
	    cfg->path, mygroup, cfg->segment);
}

/* Appends "; " and text to buf (of len bytes) while there is room. */
static void
append(char *buf, size_t len, const char *text)
{
	size_t n = strlen(buf);

	if (n + 1 < len)
		snprintf(buf + n, len - n, "%s%s", n ? "; " : "", text);
}

/* The limits of config compartment cc that the segment's compartment c
 * does not have, appended to buf. */
static void
mismatches(const struct cfg_compartment *cc, const struct seg_comp *c, char *buf, size_t len)
{
	const struct {
		const char *key;
		uint32_t file, live;
	} v[] = {
		{ "max_connections", cc->max_connections ? cc->max_connections : UINT32_MAX,
		  atomic_load(&c->limit) },
		{ "max_inflight", cc->max_inflight ? cc->max_inflight : UINT32_MAX,
		  atomic_load(&c->inflight_limit) },
		{ "enforce", cc->enforce, atomic_load(&c->enforce) },
		{ "max_wait_ms", cc->max_wait_ms, atomic_load(&c->max_wait_ms) },
		{ "connect_timeout_ms", cc->connect_timeout_ms, atomic_load(&c->connect_timeout_ms) },
		{ "io_timeout_ms", cc->io_timeout_ms, atomic_load(&c->io_timeout_ms) },
		{ "errno", (uint32_t)cc->reject_errno, (uint32_t)atomic_load(&c->reject_errno) },
	};
	char one[160], a[16], b[16];

	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		if (v[i].file == v[i].live)
			continue;
		if (strcmp(v[i].key, "errno") == 0) {
			const char *f = cfg_errno_name((int)v[i].file), *l = cfg_errno_name((int)v[i].live);

			snprintf(one, sizeof(one), "%s errno %s (segment: %s)", cc->name, f ? f : "?",
			    l ? l : "?");
		} else {
			snprintf(a, sizeof(a), v[i].file == UINT32_MAX ? "none" : "%u", v[i].file);
			snprintf(b, sizeof(b), v[i].live == UINT32_MAX ? "none" : "%u", v[i].live);
			snprintf(one, sizeof(one), "%s %s %s (segment: %s)", cc->name, v[i].key, a, b);
		}
		append(buf, len, one);
	}
}

/*
 * A process attached to s with cfg: counts it, and says once per process
 * tree when the segment's live limits are not the file's (another file, or
 * a `bulkshim set` since) and when the segment was set up from another
 * config file: two services sharing one set of limits by accident.
 */
void
notice_attached(const struct bs_config *cfg, struct seg *s)
{
	struct seg_header *h = seg_header(s);
	char diff[768] = "", key[BS_NAME_MAX + 16], rp[PATH_MAX];
	struct stat st;

	atomic_fetch_add(&h->attaches, 1);
	for (size_t i = 0; i < cfg->ncomp; i++) {
		int j = seg_comp_index(s, i);

		if (j >= 0)
			mismatches(&cfg->comp[i], seg_comp(s, (uint32_t)j), diff, sizeof(diff));
	}
	snprintf(key, sizeof(key), "limits:%s", cfg->segment);
	if (diff[0] != '\0' && notice_once(key))
		say(LOG_WARN, "segment %s runs with limits other than %s says, and they apply to "
		    "this process: %s (`bulkshim reload -c %s` applies the file)", cfg->segment,
		    cfg->path, diff, cfg->path);
	if (stat(cfg->path, &st) < 0 || h->config_ino == 0)
		return;
	/* The same path with another inode is the same file, edited by an
	 * editor that writes a new one. */
	if (realpath(cfg->path, rp) != NULL &&
	    strncmp(rp, h->config_path, sizeof(h->config_path)) == 0)
		return;
	snprintf(key, sizeof(key), "files:%s", cfg->segment);
	if ((h->config_dev != (uint64_t)st.st_dev || h->config_ino != (uint64_t)st.st_ino) &&
	    notice_once(key))
		say(LOG_WARN, "segment %s was set up from %.*s but this process reads %s, another "
		    "file: both share one set of limits; give one of them its own segment = \"...\"",
		    cfg->segment, (int)strnlen(h->config_path, sizeof(h->config_path)), h->config_path,
		    cfg->path);
}

void
notice_unresolved(const struct bs_config *cfg)
{
	char key[BS_NAME_MAX + 16];
	const char *line = cfg->unresolved;

	if (line == NULL)
		return;
	snprintf(key, sizeof(key), "unresolved:%s", cfg->segment);
	if (!notice_once(key))
		return;
	while (*line != '\0') {
		size_t n = strcspn(line, "\n");

		say(LOG_WARN, "%.*s", (int)n, line);
		line += n + (line[n] == '\n');
	}
}

/* config_file.c - reads a config file's text, and what it includes, so that no file can stall the reader. */
#include "shim.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/*
 * A config is read inside the host program: at start-up, and at a reload
 * inside one of its connects. A FIFO that nobody writes would block that
 * read for ever, a device such as /dev/zero never end, and a file of
 * gigabytes take all the memory. So a config and each file it includes
 * is opened without blocking, must be a regular file, and all of them
 * together may have at most BS_CONFIG_MAX bytes. The text is read once
 * and parsed from memory, so that what is checked is what is parsed.
 */

#define MAX_DEPTH	10	/* libconfig's own limit on nested @include */

static const char *
kind_of(mode_t m)
{
	if (S_ISFIFO(m))
		return "a FIFO";
	if (S_ISCHR(m))
		return "a character device";
	if (S_ISBLK(m))
		return "a block device";
	if (S_ISSOCK(m))
		return "a socket";
	return "not a regular file";
}

/*
 * Reads the regular file at path, of at most room bytes, into a new
 * NUL-terminated buffer (*out, *len). Returns 0, or -errno with *why a
 * phrase saying what is wrong ("is a FIFO, not a regular file"), *opened
 * telling whether the file could be opened at all, and nothing to free.
 */
static int
slurp(const char *path, size_t room, char **out, size_t *len, char *why, size_t whylen,
    bool *opened)
{
	size_t got = 0, cap;
	struct stat st;
	char *text;
	ssize_t n;
	int fd, rc;

	*out = NULL;
	/* O_NONBLOCK: a FIFO opens at once instead of waiting for a
	 * writer, and a file that would block a read (/proc/kmsg) says so. */
	fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
	*opened = fd >= 0;
	if (fd < 0) {
		rc = -errno;
		if (rc == -ENOENT)
			snprintf(why, whylen, "no such file");
		else if (rc == -EACCES || rc == -EPERM)
			snprintf(why, whylen, "cannot read: %s", strerror(-rc));
		else
			snprintf(why, whylen, "%s", strerror(-rc));
		return rc;
	}
	if (fstat(fd, &st) < 0) {
		rc = -errno;
		snprintf(why, whylen, "%s", strerror(-rc));
		goto fail;
	}
	if (S_ISDIR(st.st_mode)) {
		rc = -EISDIR;
		snprintf(why, whylen, "is a directory");
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = -EINVAL;
		snprintf(why, whylen, "is %s, not a regular file", kind_of(st.st_mode));
		goto fail;
	}
	if (st.st_size < 0 || (uint64_t)st.st_size > room) {
		rc = -EFBIG;
		goto too_big;
	}
	cap = (size_t)st.st_size + 1;
	if ((text = malloc(cap + 1)) == NULL) {
		rc = -ENOMEM;
		snprintf(why, whylen, "out of memory");
		goto fail;
	}
	/* The size is a start, not a promise: the file may grow meanwhile,
	 * and a few files (in /proc) say 0. Never more than room + 1. */
	for (;;) {
		if (got == cap) {
			char *bigger;

			if (cap > room) {
				free(text);
				rc = -EFBIG;
				goto too_big;
			}
			cap = cap * 2 < room + 1 ? cap * 2 : room + 1;
			if ((bigger = realloc(text, cap + 1)) == NULL) {
				free(text);
				rc = -ENOMEM;
				snprintf(why, whylen, "out of memory");
				goto fail;
			}
			text = bigger;
		}
		n = read(fd, text + got, cap - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = -errno;
			free(text);
			snprintf(why, whylen, "cannot read: %s", strerror(-rc));
			goto fail;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	if (got > room) {
		free(text);
		rc = -EFBIG;
		goto too_big;
	}
	close(fd);
	text[got] = '\0';
	*out = text;
	*len = got;
	return 0;
too_big:
	snprintf(why, whylen, "is too big: a config and what it includes may have %u MiB in all",
	    BS_CONFIG_MAX >> 20);
fail:
	close(fd);
	return rc;
}

/* The line (from 1) of text at offset off. */
static int
line_at(const char *text, size_t off)
{
	int line = 1;

	for (size_t i = 0; i < off; i++)
		line += text[i] == '\n';
	return line;
}

/* A NUL byte would end the text that libconfig parses there, silently:
 * the rest of the file would not count. -EINVAL at its line. */
static int
no_nul(struct cfg_ctx *c, const char *file, const char *text, size_t len)
{
	const char *nul = memchr(text, '\0', len);

	if (nul == NULL)
		return 0;
	return cfg_fail_at(c, file, line_at(text, (size_t)(nul - text)), -EINVAL,
	    "a NUL byte: a config file is text");
}

/*
 * The name of the @include directive that starts at line (libconfig's
 * rule: the line's first word, then a quoted name with \\ and \"
 * escapes), into name. False if the line is no such directive. One inside
 * a comment or a string is taken for one too: checking a file that is not
 * read costs nothing but the check.
 */
static bool
include_name(const char *line, const char *end, char *name, size_t size)
{
	static const char word[] = "@include";
	const char *p = line;
	size_t n = 0;

	while (p < end && (*p == ' ' || *p == '\t'))
		p++;
	if ((size_t)(end - p) < sizeof(word) || memcmp(p, word, sizeof(word) - 1) != 0)
		return false;
	p += sizeof(word) - 1;
	if (*p != ' ' && *p != '\t')
		return false;
	while (p < end && (*p == ' ' || *p == '\t'))
		p++;
	if (p == end || *p++ != '"')
		return false;
	for (; p < end && *p != '"'; p++) {
		if (*p == '\\' && p + 1 < end && (p[1] == '\\' || p[1] == '"'))
			p++;
		if (n + 1 >= size)
			return false;
		name[n++] = *p;
	}
	name[n] = '\0';
	return p < end;
}

/*
 * Checks what text (the file shown as `file`, NULL for the config itself)
 * includes, and what those include, depth levels deep: each must be a
 * regular file that reads to its end without blocking, and all of them
 * fit in what is left of *room. A file that cannot be opened is left to
 * libconfig, which cannot open it either and says so at its line. The
 * names are on the heap: ten levels of two paths would be 80 KB of the
 * stack of whichever thread of the program reloads.
 */
static int
check_text(struct cfg_ctx *c, const char *dir, const char *file, const char *text, size_t len,
    size_t *room, int depth)
{
	const char *p = text, *end = text + len, *eol;
	struct {
		char name[PATH_MAX], full[PATH_MAX];
	} *b;
	char *name, *full, *sub, why[256];
	int rc = 0, line = 0;
	size_t sub_len;
	bool opened;

	if ((b = malloc(sizeof(*b))) == NULL)
		return cfg_fail_at(c, file, 0, -ENOMEM, "out of memory");
	name = b->name;
	full = b->full;
	for (; p < end && rc == 0; p = eol + 1) {
		line++;
		if ((eol = memchr(p, '\n', (size_t)(end - p))) == NULL)
			eol = end;
		if (!include_name(p, eol, name, PATH_MAX))
			continue;
		/* As libconfig finds it: after the include directory when
		 * there is one (1.5 puts it before an absolute name too, and
		 * fails to open that), else from the working directory. */
		if ((size_t)snprintf(full, PATH_MAX, "%s%s",
		    dir != NULL && name[0] != '/' ? dir : "", name) >= PATH_MAX)
			continue;
		rc = slurp(full, *room, &sub, &sub_len, why, sizeof(why), &opened);
		if (rc < 0 && !opened) {
			rc = 0;
			continue;
		}
		if (rc < 0) {
			rc = cfg_fail_at(c, file, line, rc, "@include \"%s\": %s %s", name, full, why);
			continue;
		}
		*room -= sub_len;
		rc = no_nul(c, full, sub, sub_len);
		if (rc == 0 && depth + 1 < MAX_DEPTH)
			rc = check_text(c, dir, full, sub, sub_len, room, depth + 1);
		free(sub);
	}
	free(b);
	return rc;
}

/* See shim.h. */
int
cfg_read_file(struct cfg_ctx *c, const char *dir)
{
	size_t len, room = BS_CONFIG_MAX;
	char why[256];
	bool opened;
	char *text;
	int rc;

	rc = slurp(c->path, room, &text, &len, why, sizeof(why), &opened);
	if (rc < 0)
		return cfg_fail(c, NULL, rc, "%s", why);
	c->text = text;
	c->nlines = 1;
	for (size_t i = 0; i < len; i++)
		c->nlines += text[i] == '\n';
	c->line_end = malloc(c->nlines * sizeof(*c->line_end));
	if (c->line_end == NULL)
		return cfg_fail(c, NULL, -ENOMEM, "out of memory");
	for (size_t i = 0, k = 0; i <= len; i++)
		if (i == len || text[i] == '\n')
			c->line_end[k++] = i;
	if ((rc = no_nul(c, NULL, text, len)) < 0)
		return rc;
	room -= len;
	return check_text(c, dir, NULL, text, len, &room, 0);
}

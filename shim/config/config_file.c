/* config_file.c - reads a config file's text, and what it includes, so that no file can stall the reader. */
#include "config/config_int.h"
#include "sys.h"

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
		n = sys_read(fd, text + got, cap - got);
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
	sys_close(fd);
	text[got] = '\0';
	*out = text;
	*len = got;
	return 0;
too_big:
	snprintf(why, whylen, "is too big: a config and what it includes may have %u MiB in all",
	    BS_CONFIG_MAX >> 20);
fail:
	sys_close(fd);
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
 * rule: at the start of a line, "@include", blanks, then a quoted name with
 * \\ and \" escapes), into name. Returns where the directive ends (after
 * the closing quote), or NULL if the line is no such directive or the name
 * does not end on it.
 */
static const char *
include_name(const char *line, const char *end, char *name, size_t size)
{
	static const char word[] = "@include";
	const char *p = line;
	size_t n = 0;

	while (p < end && (*p == ' ' || *p == '\t'))
		p++;
	if ((size_t)(end - p) < sizeof(word) || memcmp(p, word, sizeof(word) - 1) != 0)
		return NULL;
	p += sizeof(word) - 1;
	if (*p != ' ' && *p != '\t')
		return NULL;
	while (p < end && (*p == ' ' || *p == '\t'))
		p++;
	if (p == end || *p++ != '"')
		return NULL;
	for (; p < end && *p != '"'; p++) {
		if (*p == '\\' && p + 1 < end && (p[1] == '\\' || p[1] == '"'))
			p++;
		if (n + 1 >= size || *p == '\n')
			return NULL;
		name[n++] = *p;
	}
	name[n] = '\0';
	return p < end ? p + 1 : NULL;
}

/*
 * The text libconfig parses is the config with each @include line replaced
 * by the text of the file it names, read here once, like the config, so
 * that libconfig opens no file itself: what was checked is what is parsed,
 * and an absolute name works (libconfig 1.5 puts its include directory
 * before it). A directive counts where libconfig's scanner would see one:
 * outside comments and strings, whose state runs on across files as in its
 * scanner. The spans (config_int.h) say where each line of the result came from.
 */
enum lex { LEX_CODE, LEX_STRING, LEX_COMMENT, LEX_LINE };

struct expand {
	struct cfg_ctx *c;
	const char *dir;	/* before a relative name; NULL: none */
	char *out;
	size_t len, cap;
	int line;		/* the line of out being written, from 1 */
	size_t room;		/* bytes of files that may still be read */
	enum lex lex;
};

static int
put(struct expand *x, const char *p, size_t n)
{
	if (x->len + n + 1 > x->cap) {
		size_t cap = x->cap ? x->cap : 4096;
		char *bigger;

		while (cap < x->len + n + 1)
			cap *= 2;
		if ((bigger = realloc(x->out, cap)) == NULL)
			return -ENOMEM;
		x->out = bigger;
		x->cap = cap;
	}
	memcpy(x->out + x->len, p, n);
	x->len += n;
	x->out[x->len] = '\0';
	for (size_t i = 0; i < n; i++)
		x->line += p[i] == '\n';
	return 0;
}

/* From the line of out being written on, lines come from line `line` of
 * file (NULL: the config). */
static int
span(struct expand *x, const char *file, int line)
{
	struct cfg_ctx *c = x->c;
	struct cfg_span *bigger;

	if (c->nspan > 0 && c->span[c->nspan - 1].first == x->line)
		c->nspan--;
	if (c->nspan == c->spancap) {
		size_t cap = c->spancap ? c->spancap * 2 : 16;

		if ((bigger = realloc(c->span, cap * sizeof(*bigger))) == NULL)
			return -ENOMEM;
		c->span = bigger;
		c->spancap = cap;
	}
	c->span[c->nspan++] = (struct cfg_span){ .first = x->line, .line = line, .file = file };
	return 0;
}

/* Runs the scanner's state over n bytes (whole lines, so that no pair of
 * characters is split). */
static void
lex(enum lex *st, const char *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		char ch = p[i], next = i + 1 < n ? p[i + 1] : '\0';

		switch (*st) {
		case LEX_CODE:
			if (ch == '"')
				*st = LEX_STRING;
			else if (ch == '#' || (ch == '/' && next == '/'))
				*st = LEX_LINE;
			else if (ch == '/' && next == '*') {
				*st = LEX_COMMENT;
				i++;
			}
			break;
		case LEX_STRING:
			if (ch == '\\' && (next == '"' || next == '\\'))
				i++;
			else if (ch == '"')
				*st = LEX_CODE;
			break;
		case LEX_COMMENT:
			if (ch == '*' && next == '/') {
				*st = LEX_CODE;
				i++;
			}
			break;
		case LEX_LINE:
			if (ch == '\n')
				*st = LEX_CODE;
			break;
		}
	}
}

static int expand_text(struct expand *x, const char *file, const char *text, size_t len,
    int depth);

/* The file that the directive at line `line` of file names, put in its
 * place; refused at that line if it is not a regular file that reads to
 * its end without blocking, or does not fit in what is left of room. */
static int
include(struct expand *x, const char *file, int line, const char *name, int depth)
{
	struct cfg_ctx *c = x->c;
	char *full, *sub, why[256], **names;
	const char *dir;
	size_t sub_len, len;
	bool opened;
	int rc;

	if (depth + 1 > MAX_DEPTH)
		return cfg_fail_at(c, file, line, -EINVAL, "@include \"%s\": included files "
		    "nest more than %d deep", name, MAX_DEPTH);
	if (name[0] == '\0')
		return cfg_fail_at(c, file, line, -EINVAL, "@include \"\": no file named");
	/* The name lives as long as the text (the spans, and so the
	 * settings' places, point at it), at its own length: a file may be
	 * included a thousand times. */
	dir = x->dir != NULL && name[0] != '/' ? x->dir : "";
	if ((len = strlen(dir) + strlen(name)) >= PATH_MAX)
		return cfg_fail_at(c, file, line, -ENAMETOOLONG, "@include \"%s\": the name is "
		    "too long", name);
	if ((full = malloc(len + 1)) == NULL)
		return cfg_fail_at(c, file, line, -ENOMEM, "out of memory");
	snprintf(full, len + 1, "%s%s", dir, name);
	rc = slurp(full, x->room, &sub, &sub_len, why, sizeof(why), &opened);
	if (rc < 0) {
		rc = opened ? cfg_fail_at(c, file, line, rc, "@include \"%s\": %s %s", name, full,
		    why) : cfg_fail_at(c, file, line, rc, "@include \"%s\": cannot open %s: %s",
		    name, full, strerror(-rc));
		free(full);
		return rc;
	}
	if ((names = realloc(c->files, (c->nfiles + 1) * sizeof(*names))) == NULL) {
		free(full);
		free(sub);
		return cfg_fail_at(c, file, line, -ENOMEM, "out of memory");
	}
	c->files = names;
	c->files[c->nfiles++] = full;
	x->room -= sub_len;
	rc = no_nul(c, full, sub, sub_len);
	if (rc == 0)
		rc = expand_text(x, full, sub, sub_len, depth + 1);
	/* Its last line ends here, as its scanner's buffer would. */
	if (rc == 0 && sub_len > 0 && sub[sub_len - 1] != '\n')
		rc = put(x, "\n", 1) < 0 ? cfg_fail_at(c, file, line, -ENOMEM, "out of memory") : 0;
	free(sub);
	return rc;
}

/* Puts text, of file (NULL: the config), into x with what it includes. */
static int
expand_text(struct expand *x, const char *file, const char *text, size_t len, int depth)
{
	const char *p = text, *end = text + len, *eol, *after;
	char *name;
	int rc = 0, line = 1;

	if ((name = malloc(PATH_MAX)) == NULL || span(x, file, 1) < 0) {
		free(name);
		return cfg_fail_at(x->c, file, 0, -ENOMEM, "out of memory");
	}
	for (; p < end && rc == 0; p = eol, line++) {
		eol = memchr(p, '\n', (size_t)(end - p));
		eol = eol != NULL ? eol + 1 : end;
		after = x->lex == LEX_CODE ? include_name(p, eol, name, PATH_MAX) : NULL;
		if (after == NULL) {
			if (put(x, p, (size_t)(eol - p)) < 0)
				rc = cfg_fail_at(x->c, file, line, -ENOMEM, "out of memory");
			lex(&x->lex, p, (size_t)(eol - p));
			continue;
		}
		if ((rc = include(x, file, line, name, depth)) < 0)
			break;
		/* What follows the name on its line (a comment, say) is read
		 * after the included text, as libconfig does. A second
		 * directive there, which libconfig refuses, is refused here. */
		if (include_name(after, eol, name, PATH_MAX) != NULL && x->lex == LEX_CODE)
			rc = cfg_fail_at(x->c, file, line, -EINVAL, "one @include per line");
		else if (span(x, file, line) < 0 || put(x, after, (size_t)(eol - after)) < 0 ||
		    (eol[-1] != '\n' && put(x, "\n", 1) < 0))
			rc = cfg_fail_at(x->c, file, line, -ENOMEM, "out of memory");
		lex(&x->lex, after, (size_t)(eol - after));
	}
	free(name);
	return rc;
}

/* See config_int.h. */
int
cfg_read_file(struct cfg_ctx *c, const char *dir)
{
	struct expand x = { .c = c, .dir = dir, .line = 1, .room = BS_CONFIG_MAX };
	size_t len;
	char why[256];
	bool opened;
	char *text;
	int rc;

	rc = slurp(c->path, x.room, &text, &len, why, sizeof(why), &opened);
	if (rc < 0)
		return cfg_fail(c, NULL, rc, "%s", why);
	x.room -= len;
	rc = no_nul(c, NULL, text, len);
	if (rc == 0)
		rc = expand_text(&x, NULL, text, len, 0);
	free(text);
	if (rc == 0 && x.out == NULL && put(&x, "", 0) < 0)
		rc = cfg_fail(c, NULL, -ENOMEM, "out of memory");
	c->text = x.out;
	if (rc < 0)
		return rc;
	c->nlines = (size_t)x.line;	/* put() counted them */
	c->line_end = malloc(c->nlines * sizeof(*c->line_end));
	if (c->line_end == NULL)
		return cfg_fail(c, NULL, -ENOMEM, "out of memory");
	for (size_t i = 0, k = 0; i <= x.len; i++)
		if (i == x.len || x.out[i] == '\n')
			c->line_end[k++] = i;
	return 0;
}

/* See config_int.h. */
void
cfg_text_free(struct cfg_ctx *c)
{
	for (size_t i = 0; i < c->nfiles; i++)
		free(c->files[i]);
	free(c->files);
	free(c->span);
	free(c->text);
	free(c->line_end);
	c->files = NULL;
	c->span = NULL;
	c->text = NULL;
	c->line_end = NULL;
	c->nfiles = c->nspan = c->spancap = 0;
}

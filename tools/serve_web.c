/* serve_web.c - what `bulkshim serve` answers: the web page, /status.json and /metrics over several segments. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "serve.h"

/* The page, linked in from tools/web/index.html by tools/web/page.S. */
extern const char bs_web_page[];
extern const char bs_web_page_end[];

void
web_page(const char **body, size_t *len)
{
	*body = bs_web_page;
	*len = (size_t)(bs_web_page_end - bs_web_page);
}

/* ---- which segments ---- */

static int
by_name(const void *a, const void *b)
{
	return strcmp(a, b);
}

size_t
web_segments(const struct serve_set *set, char (*out)[BS_NAME_MAX], size_t max)
{
	static const char prefix[] = "bulkshim.";
	struct dirent *de;
	size_t n = 0;
	DIR *d;

	if (!set->all) {
		for (n = 0; n < set->n && n < max; n++)
			memcpy(out[n], set->name[n], BS_NAME_MAX);
		return n;
	}
	/* Every segment this user may read, rescanned per request so that
	 * segments created later show up. */
	d = opendir("/dev/shm");
	if (d == NULL)
		return 0;
	while (n < max && (de = readdir(d)) != NULL) {
		char path[300];
		const char *name = de->d_name + sizeof(prefix) - 1;

		if (strncmp(de->d_name, prefix, sizeof(prefix) - 1) != 0 || *name == '\0' ||
		    strlen(name) >= BS_NAME_MAX || strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
		    "abcdefghijklmnopqrstuvwxyz0123456789_.-") != strlen(name))
			continue;
		snprintf(path, sizeof(path), "/dev/shm/%s", de->d_name);
		if (access(path, R_OK) != 0)
			continue;
		snprintf(out[n++], BS_NAME_MAX, "%s", name);
	}
	closedir(d);
	qsort(out, n, BS_NAME_MAX, by_name);
	return n;
}

/* Opens a segment for one request; it may have been created, replaced or
 * removed since the last one. Read-write when allowed, to reclaim the
 * permits of dead processes first; read-only else. */
static int
open_for_request(const char *name, struct seg **s, char *err, size_t errlen)
{
	int r = seg_open(name, true, s, err, errlen);

	if (r == 0) {
		proc_reclaim(*s, false);
		return 0;
	}
	if (r == -EACCES || r == -EPERM || r == -EROFS)
		r = seg_open(name, false, s, err, errlen);
	return r;
}

/* ---- /status.json ---- */

/* The config that made segment name: the -c FILE that named it, else
 * the absolute path the segment's creator recorded. */
static const char *
config_of(const struct serve_set *set, const char *name, const struct cli_snap *snap)
{
	const char *path = snap->config_path;

	for (size_t i = 0; !set->all && i < set->n; i++) {
		if (set->config[i] != NULL && strcmp(set->name[i], name) == 0)
			return set->config[i];
	}
	return path[0] == '/' ? path : NULL;
}

/* `"budget": {...}` from the config file (read afresh, without resolving
 * host names), or null. The segment holds no budget, and the page wants the
 * pool the compartments share. */
static void
write_budget(FILE *f, const char *path)
{
	struct bs_config cfg;
	char err[BS_ERRLEN];

	fputs(", \"budget\": ", f);
	if (path == NULL || cfg_load(path, &cfg, false, err, sizeof(err)) < 0) {
		fputs("null", f);
		return;
	}
	if (cfg.has_budget) {
		fprintf(f, "{\"pool\": %u, \"reserved\": %u, \"config\": ", cfg.pool,
		    cfg.reserved);
		cli_json_string(f, path);
		fputs("}", f);
	} else {
		fputs("null", f);
	}
	cfg_free(&cfg);
}

/* The object `status --json` prints (without what host names resolve to),
 * with "budget" added before its end. */
static void
write_status(FILE *f, const struct serve_set *set, const char *name, const struct seg *s)
{
	struct cli_snap snap;
	char *buf = NULL;
	size_t len = 0;
	FILE *m;

	if (cli_snap_read(s, &snap) == 0 && (m = open_memstream(&buf, &len)) != NULL) {
		cli_status_json(m, &snap, false);
		if (fclose(m) != 0)
			len = 0;
	}
	if (buf != NULL && len >= 2 && buf[len - 2] == '}') {
		fwrite(buf, 1, len - 2, f);
		write_budget(f, config_of(set, name, &snap));
		fputs("}\n", f);
	} else {
		fputs("{\"segment\": ", f);
		cli_json_string(f, name);
		fputs(", \"error\": \"out of memory\"}", f);
	}
	cli_snap_free(&snap);
	free(buf);
}

int
web_status(FILE *f, const struct serve_set *set, char *err, size_t errlen)
{
	char (*names)[BS_NAME_MAX] = calloc(SERVE_MAX, BS_NAME_MAX);
	size_t n;
	struct seg *s;

	if (names == NULL) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	n = web_segments(set, names, SERVE_MAX);
	/* One segment named on the command line: the object `status --json`
	 * prints, as before. */
	if (!set->all && n == 1) {
		int r = open_for_request(names[0], &s, err, errlen);

		if (r == 0) {
			write_status(f, set, names[0], s);
			seg_close(s);
		}
		free(names);
		return r;
	}
	/* Several: {"segments": [status objects]}; one that cannot be opened
	 * is {"segment": name, "error": why}, and the others still show. */
	fputs("{\"segments\": [", f);
	for (size_t i = 0; i < n; i++) {
		char why[BS_ERRLEN];

		if (i)
			fputs(", ", f);
		if (open_for_request(names[i], &s, why, sizeof(why)) < 0) {
			fputs("{\"segment\": ", f);
			cli_json_string(f, names[i]);
			fputs(", \"error\": ", f);
			cli_json_string(f, why);
			fputs("}", f);
			continue;
		}
		write_status(f, set, names[i], s);
		seg_close(s);
	}
	fputs("]}\n", f);
	free(names);
	return 0;
}

/* ---- /metrics ---- */

/* One metric family in one segment's exposition: its "# HELP"/"# TYPE"
 * lines and its samples, as offsets into that text. */
struct block {
	char name[128];
	const char *head, *samples, *end;
};

/* Splits an exposition into its families; returns how many (at most max). */
static size_t
split_families(const char *text, struct block *b, size_t max)
{
	const char *p = text;
	size_t n = 0;

	while (*p) {
		const char *eol = strchr(p, '\n');
		const char *next = eol ? eol + 1 : p + strlen(p);

		if (strncmp(p, "# HELP ", 7) == 0 && n < max) {
			size_t len = strcspn(p + 7, " \n");

			if (n > 0)
				b[n - 1].end = p;
			snprintf(b[n].name, sizeof(b[n].name), "%.*s", (int)len, p + 7);
			b[n].head = p;
			b[n].samples = NULL;
			n++;
		} else if (n > 0 && b[n - 1].samples == NULL && *p != '#') {
			b[n - 1].samples = p;
		}
		p = next;
	}
	if (n > 0)
		b[n - 1].end = p;
	for (size_t i = 0; i < n; i++) {
		if (b[i].samples == NULL)
			b[i].samples = b[i].end;
	}
	return n;
}

#define FAMILIES_MAX	256

/*
 * The text format wants each family's HELP and TYPE once and its samples
 * together, so the expositions of several segments are merged family by
 * family rather than concatenated. Families keep the order in which they
 * first appear.
 */
static int
merge_expositions(FILE *f, char **text, size_t n)
{
	struct block **b = calloc(n, sizeof(*b));
	size_t *nb = calloc(n, sizeof(*nb));
	int r = -ENOMEM;

	if (b == NULL || nb == NULL)
		goto done;
	for (size_t i = 0; i < n; i++) {
		b[i] = calloc(FAMILIES_MAX, sizeof(**b));
		if (b[i] == NULL)
			goto done;
		nb[i] = split_families(text[i], b[i], FAMILIES_MAX);
	}
	for (size_t i = 0; i < n; i++) {
		for (size_t k = 0; k < nb[i]; k++) {
			bool seen = false;

			for (size_t j = 0; j < i && !seen; j++) {
				for (size_t m = 0; m < nb[j] && !seen; m++)
					seen = strcmp(b[j][m].name, b[i][k].name) == 0;
			}
			if (seen)
				continue;
			fwrite(b[i][k].head, 1, (size_t)(b[i][k].samples - b[i][k].head), f);
			for (size_t j = i; j < n; j++) {
				for (size_t m = 0; m < nb[j]; m++) {
					if (strcmp(b[j][m].name, b[i][k].name) == 0)
						fwrite(b[j][m].samples, 1,
						    (size_t)(b[j][m].end - b[j][m].samples), f);
				}
			}
		}
	}
	r = 0;
done:
	for (size_t i = 0; b != NULL && i < n; i++)
		free(b[i]);
	free(b);
	free(nb);
	return r;
}

int
web_metrics(FILE *f, const struct serve_set *set, char *err, size_t errlen)
{
	char (*names)[BS_NAME_MAX] = calloc(SERVE_MAX, BS_NAME_MAX);
	char **text = calloc(SERVE_MAX, sizeof(char *));
	size_t n = 0, got = 0;
	int r = -ENOMEM;

	snprintf(err, errlen, "out of memory");
	if (names == NULL || text == NULL)
		goto done;
	n = web_segments(set, names, SERVE_MAX);
	for (size_t i = 0; i < n; i++) {
		size_t len = 0;
		struct seg *s;
		FILE *m;

		/* A segment that cannot be opened has no samples; with one
		 * segment that is the reply's error. */
		if (open_for_request(names[i], &s, err, errlen) < 0)
			continue;
		m = open_memstream(&text[got], &len);
		if (m != NULL) {
			struct cli_snap snap;

			/* Out of memory, the segment has no samples. */
			if (cli_snap_read(s, &snap) == 0) {
				cli_write_metrics(m, &snap, true);
				cli_snap_free(&snap);
			}
			if (fclose(m) == 0)
				got++;
			else
				free(text[got]);
		}
		seg_close(s);
	}
	if (got == 0 && n > 0 && !set->all) {
		r = -ENOENT;
		goto done;
	}
	r = merge_expositions(f, text, got);
done:
	for (size_t i = 0; text != NULL && i < got; i++)
		free(text[i]);
	free(text);
	free(names);
	return r;
}

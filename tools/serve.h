/* serve.h - what cmd_serve.c (the HTTP server) and serve_web.c (what it answers) share. */
#ifndef BULKSHIM_SERVE_H
#define BULKSHIM_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "admit/admit.h"
#include "log.h"
#include "sys.h"

#define SERVE_MAX	64	/* segments one server shows */

/* The segments a server shows: those named with -s and -c, or with --all
 * every segment in /dev/shm this user may read, looked up per request. */
struct serve_set {
	bool all;
	size_t n;
	char name[SERVE_MAX][BS_NAME_MAX];
	const char *config[SERVE_MAX];	/* the -c FILE that named it, or NULL */
};

/* The web page (tools/web/index.html, linked into the binary); cannot fail. */
void web_page(const char **body, size_t *len);
/* The names of set's segments into out (at most max, sorted for --all);
 * returns how many. */
size_t web_segments(const struct serve_set *set, char (*out)[BS_NAME_MAX], size_t max);
/* Writes /status.json: with one named segment the object `status --json`
 * prints plus "budget" ({"pool", "reserved", "config"} from the segment's
 * config file, or null when it has none or cannot be read), else {"segments": [...]} with an {"segment", "error"} object for
 * each segment that cannot be opened. Returns 0, or -errno with the reason
 * in err when the one named segment cannot be opened. */
int web_status(FILE *f, const struct serve_set *set, char *err, size_t errlen);
/* Writes /metrics: the expositions of set's segments merged family by
 * family. Returns 0, or -errno with the reason in err when no named
 * segment can be opened. */
int web_metrics(FILE *f, const struct serve_set *set, char *err, size_t errlen);

#endif

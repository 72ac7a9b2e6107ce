/* drill_plot.c - a drill's timeline drawn with gnuplot: probe latency and success, the drilled compartment's connections against its limit. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "drill.h"

static bool
have_gnuplot(void)
{
	const char *path = getenv("PATH");
	char buf[PATH_MAX], *dirs, *save = NULL;

	if (path == NULL || (dirs = strdup(path)) == NULL)
		return false;
	for (char *d = strtok_r(dirs, ":", &save); d != NULL; d = strtok_r(NULL, ":", &save)) {
		snprintf(buf, sizeof(buf), "%s/gnuplot", d);
		if (access(buf, X_OK) == 0) {
			free(dirs);
			return true;
		}
	}
	free(dirs);
	return false;
}

static int
cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* The data of the timeline, one row a second: the drilled compartment's
 * in_use and live limit, then for each probe its success percentage and
 * p99 latency (ms) among the attempts begun in that second. */
static int
plot_data(FILE *f, const struct drill_report *rep, const struct drill_tick *ticks, size_t nticks,
    uint64_t began_ms, uint64_t end_ms)
{
	uint64_t secs = (end_ms - began_ms) / 1000 + 1;
	uint32_t *lat = NULL;

	for (uint64_t sec = 0; sec < secs; sec++) {
		uint32_t in_use = 0, limit = 0;
		bool any = false;

		for (size_t k = 0; k < nticks; k++) {
			if (ticks[k].ms / 1000 != sec)
				continue;
			any = true;
			in_use = ticks[k].in_use > in_use ? ticks[k].in_use : in_use;
			limit = ticks[k].limit;
		}
		if (!any)
			continue;
		fprintf(f, "%llu %u ", (unsigned long long)sec, in_use);
		if (limit == UINT32_MAX)
			fputs("NaN", f);
		else
			fprintf(f, "%u", limit);
		for (size_t p = 0; p < rep->nprobe; p++) {
			struct drill_probe *pr = &rep->probe[p];
			size_t n = 0, ok = 0;

			pthread_mutex_lock(&pr->lock);
			free(lat);
			lat = malloc((pr->n ? pr->n : 1) * sizeof(*lat));
			for (size_t i = 0; lat != NULL && i < pr->n; i++) {
				if ((pr->samples[i].start_ms - began_ms) / 1000 != sec ||
				    pr->samples[i].start_ms < began_ms)
					continue;
				lat[n++] = pr->samples[i].ms;
				ok += pr->samples[i].ok;
			}
			pthread_mutex_unlock(&pr->lock);
			if (n == 0) {
				fputs(" NaN NaN", f);
				continue;
			}
			qsort(lat, n, sizeof(*lat), cmp_u32);
			fprintf(f, " %.1f %u", 100.0 * (double)ok / (double)n,
			    lat[(n * 99 + 99) / 100 - 1]);
		}
		fputc('\n', f);
	}
	free(lat);
	return 0;
}

/* s inside a gnuplot single-quoted string, whose only escape is ''. */
static void
gp_text(FILE *g, const char *s)
{
	for (; *s; s++) {
		if (*s == '\'')
			fputc('\'', g);
		if ((unsigned char)*s >= ' ')
			fputc(*s, g);
	}
}

/* One plot of every probe's column of the data file, the first probe's at
 * column col0 and each next two further on; no probe: an empty plot. */
static void
plot_probes(FILE *g, const struct drill_report *rep, const char *data, size_t col0)
{
	if (rep->nprobe == 0) {
		fputs("plot 1/0 notitle\n", g);
		return;
	}
	fputs("plot ", g);
	for (size_t p = 0; p < rep->nprobe; p++) {
		fprintf(g, "%s'%s' using 1:%zu with linespoints title '", p ? ", " : "", data,
		    col0 + 2 * p);
		gp_text(g, rep->probe[p].what);
		fputc('\'', g);
	}
	fputc('\n', g);
}

void
drill_plot(const char *png, const struct drill_report *rep, const struct drill_tick *ticks,
    size_t nticks, const uint64_t *phase_start, uint64_t began_ms, uint64_t end_ms)
{
	char data[] = "/tmp/bulkshim-drill-XXXXXX", spec[256];
	double t[PH_N + 1];
	FILE *f, *g;
	int fd, st;

	if (!have_gnuplot()) {
		fprintf(stderr, "bulkshim: gnuplot not installed: no plot\n");
		return;
	}
	if ((fd = mkstemp(data)) < 0 || (f = fdopen(fd, "w")) == NULL) {
		fprintf(stderr, "bulkshim: cannot write the plot's data: %s\n", strerror(errno));
		if (fd >= 0)
			close(fd);
		return;
	}
	plot_data(f, rep, ticks, nticks, began_ms, end_ms);
	fclose(f);
	for (int ph = 0; ph < PH_N; ph++)
		t[ph] = phase_start[ph] ? (double)(phase_start[ph] - began_ms) / 1000 : -1;
	t[PH_N] = (double)(end_ms - began_ms) / 1000;
	if ((g = popen("gnuplot", "w")) == NULL) {
		fprintf(stderr, "bulkshim: cannot run gnuplot: %s\n", strerror(errno));
		unlink(data);
		return;
	}
	fputs("set terminal pngcairo size 1000,700 noenhanced\nset output '", g);
	gp_text(g, png);
	fputs("'\nset multiplot layout 3,1 title 'drill on ", g);
	gp_text(g, rep->compartment);
	fputs(": ", g);
	gp_text(g, drill_spec_text(&rep->spec, spec, sizeof(spec)));
	fputs(" (shaded)'\n", g);
	fputs("set key outside right\nset grid\nset xlabel 'seconds'\n", g);
	if (t[PH_DRILL] >= 0)
		fprintf(g, "set object 1 rect from %.2f, graph 0 to %.2f, graph 1 fc rgb '#ffdddd' "
		    "fs solid 0.5 behind\n", t[PH_DRILL], t[PH_AFTER] >= 0 ? t[PH_AFTER] : t[PH_N]);
	fputs("set ylabel 'p99 ms'\nset logscale y\n", g);
	if (rep->nprobe == 0)
		fputs("set label 'no probes' at graph 0.5, graph 0.5\n", g);
	plot_probes(g, rep, data, 5);
	fputs("unset logscale y\nset ylabel 'success %'\nset yrange [0:105]\n", g);
	plot_probes(g, rep, data, 4);
	/* Room above the limit's line, which would lie on the frame. */
	fprintf(g, "set yrange [0:*]\nset offsets 0, 0, graph 0.2, 0\nset ylabel 'connections'\n"
	    "plot '%s' using 1:2 with steps lw 2 title 'in use', '%s' using 1:3 with steps dt 2 "
	    "title 'live limit'\n", data, data);
	fputs("unset multiplot\n", g);
	st = pclose(g);
	unlink(data);
	if (st != 0)
		fprintf(stderr, "bulkshim: gnuplot failed: no plot\n");
	else
		fprintf(stderr, "bulkshim: timeline drawn in %s\n", png);
}

/* cmd_watch.c - `bulkshim watch`: a live view, ANSI on a terminal, plain lines in a pipe. */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/*
 * Every refresh maps the segment again, so the view survives the segment
 * being created late, replaced or removed. On a terminal the view uses the
 * alternate screen and redraws in place; the terminal is put in
 * non-canonical mode to read `q` and restored on every way out: q, -n,
 * SIGINT, SIGTERM, SIGHUP, and around a suspension (^Z).
 */

#define PLAIN_COLUMNS	80
#define NAME_MIN	11
#define NAME_MAX_SHOWN	24
#define NAME_FLOOR	8	/* names are cut to this before bars vanish */
#define COUNT_WIDTH	9	/* "1000/1000" */
#define BAR_MIN		4
#define BAR_MAX		30
/* What a row takes besides its name and two bars: " FLG [" "] COUNT" twice,
 * then waiting and the rate (see row()). */
#define ROW_FIXED	(1 + 3 + 2 * (4 + COUNT_WIDTH) + 16)
#define HEAD_LINES	3	/* title, segment, column names */
#define ROWS_MIN	5	/* lines of rows the tables under them leave */

static volatile sig_atomic_t got_stop, got_suspend;
/* The first row shown when the compartments do not fit the screen, and
 * how many rows the last frame showed (a page, for space and b). */
static long scroll_top, page_rows = 1;

static struct termios saved_tty;
static bool tty_raw, alt_screen;

static void
on_stop(int sig)
{
	got_stop = sig;
}

static void
on_suspend(int sig)
{
	(void)sig;
	got_suspend = 1;
}

static void
put(const char *s)
{
	ssize_t n = write(STDOUT_FILENO, s, strlen(s));

	(void)n;
}

static void
screen_enter(bool ansi, bool use_tty)
{
	struct termios t;

	if (use_tty && tcgetattr(STDIN_FILENO, &saved_tty) == 0) {
		t = saved_tty;
		/* Keys one at a time, not echoed; ^C still sends SIGINT. */
		t.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
		t.c_cc[VMIN] = 1;
		t.c_cc[VTIME] = 0;
		tty_raw = tcsetattr(STDIN_FILENO, TCSANOW, &t) == 0;
	}
	if (ansi) {
		put("\033[?1049h\033[?25l\033[H\033[2J");
		alt_screen = true;
	}
}

static void
screen_leave(void)
{
	if (alt_screen)
		put("\033[?25h\033[?1049l");
	if (tty_raw)
		tcsetattr(STDIN_FILENO, TCSANOW, &saved_tty);
	alt_screen = tty_raw = false;
}

/* Blocks the signals watch handles except inside ppoll, so none is lost
 * between checking the flags and going to sleep. */
static void
catch_signals(sigset_t *during_poll)
{
	struct sigaction sa;
	sigset_t block;

	memset(&sa, 0, sizeof(sa));
	sigemptyset(&sa.sa_mask);
	sa.sa_handler = on_stop;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	sa.sa_handler = on_suspend;
	sigaction(SIGTSTP, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&block);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, SIGHUP);
	sigaddset(&block, SIGTSTP);
	sigprocmask(SIG_BLOCK, &block, during_poll);
	sigdelset(during_poll, SIGINT);
	sigdelset(during_poll, SIGTERM);
	sigdelset(during_poll, SIGHUP);
	sigdelset(during_poll, SIGTSTP);
}

/* ---- one frame ---- */

/* Rejections (and, in observe mode, would-be rejections) so far, by name,
 * for the per-second rates of the next frame. */
struct prev {
	char name[BS_NAME_MAX];
	uint64_t refused;
};

struct view {
	const char *segment;
	bool ansi;
	double interval;
	struct prev *prev;
	size_t nprev;
	uint64_t prev_ms;	/* CLOCK_MONOTONIC of the previous frame, 0 = none */
};

static uint64_t
refused(const struct cli_comp *c)
{
	uint64_t n = c->rejected;

	for (int r = 0; r < REASON_MAX; r++)
		n += c->would_reject[r];
	return n;
}

/* How busy a compartment is, for the order of the rows: refusals per
 * second since the last frame (-1 before there is one), then how full its
 * fuller limit is. */
struct busy {
	const struct cli_comp *c;
	double rate;
	double fill;
};

static double
fill_of(uint32_t used, uint32_t limit)
{
	return limit == UINT32_MAX || limit == 0 ? 0.0 : (double)used / (double)limit;
}

/* HOT first, then the busiest, then the segment's order. */
static int
busiest_first(const void *a, const void *b)
{
	const struct busy *x = a, *y = b;

	if (x->c->hot != y->c->hot)
		return x->c->hot ? -1 : 1;
	if (x->rate != y->rate)
		return x->rate > y->rate ? -1 : 1;
	if (x->fill != y->fill)
		return x->fill > y->fill ? -1 : 1;
	if (x->c->waiting != y->c->waiting)
		return x->c->waiting > y->c->waiting ? -1 : 1;
	return x->c->index < y->c->index ? -1 : x->c->index > y->c->index;
}

/* The terminal's rows, 0 when not a terminal (then every row is printed). */
static int
lines(bool ansi)
{
	struct winsize ws;

	if (ansi && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0)
		return ws.ws_row;
	return 0;
}

static int
columns(bool ansi)
{
	struct winsize ws;

	if (ansi && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
		return ws.ws_col;
	return PLAIN_COLUMNS;
}

/* Refusals per second since the previous frame; -1 when unknown. The
 * previous frame's list is in the same order as the segment, so the same
 * index is tried first. */
static double
rate_of(const struct view *v, const struct cli_comp *c, uint64_t now)
{
	for (size_t k = 0; k < v->nprev && v->prev_ms != 0 && now > v->prev_ms; k++) {
		size_t i = (c->index + k) % v->nprev;

		if (strcmp(v->prev[i].name, c->name) != 0)
			continue;
		if (refused(c) < v->prev[i].refused)
			return -1;
		return (double)(refused(c) - v->prev[i].refused) * 1000.0 / (double)(now - v->prev_ms);
	}
	return -1;
}

/* A bar and its "used/limit" of c, or a bar of '?' and "damaged" when
 * either value is. */
static void
gauge(char *bar, size_t bw, char *num, size_t len, const struct cli_comp *c, uint32_t used,
    uint32_t limit, enum cli_field fused, enum cli_field flimit)
{
	char lim[16];

	if (CLI_DAMAGED(c->damaged, fused) || CLI_DAMAGED(c->damaged, flimit)) {
		cli_bar(bar, bw, 1, 1, '?');
		snprintf(num, len, "%s", CLI_DAMAGED_TEXT);
		return;
	}
	cli_bar(bar, bw, used, limit, '#');
	snprintf(num, len, "%u/%s", used, cli_limit_text(limit, lim, sizeof(lim)));
}

static void
row(FILE *f, struct view *v, const struct busy *b, const char *name, int namew, size_t bw)
{
	const struct cli_comp *c = b->c;
	char bar1[64], bar2[64], n1[32], n2[32], wait[24], rate[32];
	const char *flag = c->hot ? "HOT" : !c->enforce ? "obs" : c->kernel ? "krn" : "";

	/* Both bars against what admission enforces now (live_limit has
	 * the fleet share and an adaptive connection limit in it). */
	gauge(bar1, bw, n1, sizeof(n1), c, c->in_use, c->live_limit, CF_IN_USE, CF_LIVE_LIMIT);
	gauge(bar2, bw, n2, sizeof(n2), c, c->inflight, c->inflight_limit_now, CF_INFLIGHT,
	    CF_INFLIGHT_LIVE_LIMIT);
	cli_count_text(c->waiting, CLI_DAMAGED(c->damaged, CF_WAITING), wait, sizeof(wait));
	if (b->rate < 0)
		snprintf(rate, sizeof(rate), "-");
	else
		snprintf(rate, sizeof(rate), b->rate < 1000 ? "%.1f" : "%.0f", b->rate);
	fprintf(f, "%-*.*s ", namew, namew, name);
	if (v->ansi && c->hot)
		fprintf(f, "\033[1;31m%-3s\033[0m", flag);
	else
		fprintf(f, "%-3s", flag);
	fprintf(f, " [%s] %-*.*s [%s] %-*.*s %7s %7.7s%s\n", bar1, COUNT_WIDTH, COUNT_WIDTH, n1, bar2,
	    COUNT_WIDTH, COUNT_WIDTH, n2, wait, rate, v->ansi ? "\033[K" : "");
}

/* Whether a live limit of c comes from another level than the static one
 * (or none), which its row's bars do not say. */
static bool
live_other(const struct cli_comp *c)
{
	return (c->live_by != LIMIT_BY_STATIC && c->live_by != LIMIT_BY_NONE) ||
	    (c->inflight_live_by != LIMIT_BY_STATIC && c->inflight_live_by != LIMIT_BY_NONE) ||
	    c->pool_full || c->class_full;
}

/* The lines under c's row: what binds its live limits, its adaptive limit. */
static int
details(const struct cli_comp *c)
{
	return live_other(c) + (c->ad.mode != AD_NONE);
}

static void
detail_lines(FILE *f, const struct cli_comp *c, bool ansi)
{
	char a[16], b[16], conn[CLI_LIVE_TEXT + 32] = "", fl[64] = "";

	if (c->live_by != LIMIT_BY_STATIC && c->live_by != LIMIT_BY_NONE)
		snprintf(conn, sizeof(conn), "live limit %s (%s)",
		    cli_limit_text(c->live_limit, a, sizeof(a)), c->live_by_text);
	if (c->inflight_live_by != LIMIT_BY_STATIC && c->inflight_live_by != LIMIT_BY_NONE)
		snprintf(fl, sizeof(fl), "%sin flight %s (%s)", conn[0] ? ", " : "live limit ",
		    cli_limit_text(c->inflight_limit_now, b, sizeof(b)),
		    limit_by_name(c->inflight_live_by));
	if (live_other(c))
		fprintf(f, "  %s%s%s%s%s%s%s\n", conn, fl,
		    (conn[0] || fl[0]) && (c->pool_full || c->class_full) ? "; " : "",
		    c->pool_full ? "pool has no room" : "",
		    c->pool_full && c->class_full ? ", " : "",
		    c->class_full ? "its busiest class is at its limit" : "", ansi ? "\033[K" : "");
	cli_adaptive_watch(f, c, ansi);
}

/* status's WARNING line about damaged values, cut to the screen's width
 * (a line that wraps would scroll the screen); nothing when there are none. */
static void
damage_line(FILE *f, const struct cli_snap *snap, int cols, bool ansi)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&buf, &len);
	int n;

	if (m == NULL)
		return;
	cli_text_damaged(m, snap, "");
	if (fclose(m) == 0 && len > 1) {
		n = (int)len - 1;
		if (ansi && n > cols)
			n = cols;
		fprintf(f, "%s%.*s%s\n", ansi ? "\033[1;31m" : "", n, buf, ansi ? "\033[0m\033[K" : "");
	}
	free(buf);
}

/* Remembers this frame's counts for the next frame's rates. */
static void
remember(struct view *v, const struct cli_comp *all, uint32_t n, uint64_t now)
{
	struct prev *p = realloc(v->prev, (n ? n : 1) * sizeof(*p));

	if (p == NULL)
		return;
	for (uint32_t i = 0; i < n; i++) {
		memcpy(p[i].name, all[i].name, sizeof(p[i].name));
		p[i].refused = refused(&all[i]);
	}
	v->prev = p;
	v->nprev = n;
	v->prev_ms = now;
}

/* The fleet lines and the class and pool tables under the rows, as text
 * (NULL when short of memory), and how many lines it has. */
static char *
extra_lines(struct view *v, const struct cli_snap *snap, char (*ab)[CLI_ABBREV_MAX], int cols,
    long *nlines)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&buf, &len);

	*nlines = 0;
	if (m == NULL)
		return NULL;
	for (uint32_t i = 0; i < snap->ncomp; i++) {
		char line[256];

		if (snap->comp[i].fleet_limit == 0)
			continue;
		cli_fleet_line(&snap->comp[i], ab[i], line, sizeof(line));
		fprintf(m, "  %s%s\n", line, v->ansi ? "\033[K" : "");
	}
	cli_text_pools(m, snap, v->ansi ? "\033[K" : "", v->ansi ? cols : 0);
	if (fclose(m) != 0) {
		free(buf);
		return NULL;
	}
	for (size_t i = 0; i < len; i++)
		*nlines += buf[i] == '\n';
	return buf;
}

/* The first n lines of text to f. */
static void
print_lines(FILE *f, const char *text, long n)
{
	for (const char *p = text; p != NULL && *p != '\0' && n > 0; n--) {
		const char *nl = strchr(p, '\n');
		size_t len = nl != NULL ? (size_t)(nl - p) + 1 : strlen(p);

		fwrite(p, 1, len, f);
		p += len;
	}
}

static void
frame_body(FILE *f, struct view *v, const struct cli_snap *snap, uint64_t now)
{
	const struct cli_comp *all = snap->comp;
	uint32_t n = snap->ncomp, procs = snap->processes;
	struct busy *order = calloc(n ? n : 1, sizeof(*order));
	char (*ab)[CLI_ABBREV_MAX] = calloc(n ? n : 1, sizeof(*ab));
	const char **names = calloc(n ? n : 1, sizeof(*names));
	int namew = NAME_MIN, cols = columns(v->ansi), room = lines(v->ansi), avail;
	long shown, top, budget, keep, nextra = 0;
	char *extras = NULL;
	size_t bw;

	if (order == NULL || ab == NULL || names == NULL)
		goto done;
	for (uint32_t i = 0; i < n; i++) {
		if ((int)strlen(all[i].name) > namew)
			namew = (int)strlen(all[i].name);
	}
	if (namew > NAME_MAX_SHOWN)
		namew = NAME_MAX_SHOWN;
	/* Every row fits the width: two bars share what the rest leaves,
	 * and names are cut before the bars go below BAR_MIN. */
	if (namew + ROW_FIXED + 2 * BAR_MIN > cols)
		namew = cols - ROW_FIXED - 2 * BAR_MIN;
	if (namew < NAME_FLOOR)
		namew = NAME_FLOOR;
	/* Names too long for the column keep their head and as much of
	 * their tail as keeps them apart ("svc-with-a-r~name-17"). */
	for (uint32_t i = 0; i < n; i++)
		names[i] = all[i].name;
	cli_abbrev(names, n, (size_t)namew, ab);
	avail = (cols - namew - ROW_FIXED) / 2;
	bw = avail < BAR_MIN ? BAR_MIN : avail > BAR_MAX ? BAR_MAX : (size_t)avail;
	fprintf(f, "segment %s, %u process%s holding permits%s\n", snap->name, procs,
	    procs == 1 ? "" : "es", v->ansi ? "\033[K" : "");
	damage_line(f, snap, cols, v->ansi);
	fprintf(f, "%-*s %-3s %-*s %-*s %7s %7s%s\n", namew, "COMPARTMENT", "", (int)bw + 3 +
	    COUNT_WIDTH, "CONNECTIONS", (int)bw + 3 + COUNT_WIDTH, "IN FLIGHT", "WAITING",
	    "REJ/S", v->ansi ? "\033[K" : "");
	for (uint32_t i = 0; i < n; i++) {
		order[i].c = &all[i];
		order[i].rate = rate_of(v, &all[i], now);
		order[i].fill = fill_of(all[i].in_use, all[i].live_limit);
		if (fill_of(all[i].inflight, all[i].inflight_limit_now) > order[i].fill)
			order[i].fill = fill_of(all[i].inflight, all[i].inflight_limit_now);
	}
	qsort(order, n, sizeof(*order), busiest_first);
	extras = extra_lines(v, snap, ab, cols, &nextra);
	if (room <= 0) {
		/* Not a terminal: every row, then the fleet and pool tables. */
		for (uint32_t i = 0; i < n; i++) {
			row(f, v, &order[i], ab[order[i].c->index], namew, bw);
			detail_lines(f, order[i].c, v->ansi);
		}
		if (extras != NULL)
			fputs(extras, f);
		goto counted;
	}
	/* The screen holds the header, the rows (an adaptive one takes two
	 * lines), the fleet and pool tables and a last line; the tables give
	 * way to at least ROWS_MIN lines of rows, and the rows are paged,
	 * busiest first. */
	budget = room - HEAD_LINES - 1 - (snap->ndamaged > 0);
	keep = nextra;
	if (budget - keep < ROWS_MIN)
		keep = budget - ROWS_MIN > 0 ? budget - ROWS_MIN : 0;
	budget -= keep;
	if (budget < 1)
		budget = 1;
	top = scroll_top;
	if (top > (long)n - 1)
		top = (long)n - 1;
	/* Not past the point where the last page is full. */
	for (long used = 0, i = (long)n - 1; i >= 0; i--) {
		used += 1 + details(order[i].c);
		if (used > budget) {
			if (top > i + 1)
				top = i + 1;
			break;
		}
		if (i == 0)
			top = 0;
	}
	if (top < 0)
		top = 0;
	scroll_top = top;
	shown = 0;
	for (long i = top, used = 0; i < (long)n; i++) {
		int need = 1 + details(order[i].c);

		if (used + need > budget && shown > 0)
			break;
		row(f, v, &order[i], ab[order[i].c->index], namew, bw);
		if (need > 1 && used + need <= budget)
			detail_lines(f, order[i].c, v->ansi);
		used += need;
		shown++;
	}
	page_rows = shown;
	print_lines(f, extras, keep);
	if (top > 0 || top + shown < (long)n || keep < nextra)
		/* The screen's last line: no newline, or the screen scrolls. */
		fprintf(f, "rows %ld-%ld of %u, busiest first; j/k, space/b scroll%s%s", top + 1,
		    top + shown, n, keep < nextra ? "; pools and fleets cut" : "",
		    v->ansi ? "\033[K" : "\n");
counted:
	free(extras);
	remember(v, all, n, now);
done:
	free(order);
	free(ab);
	free(names);
}

/* Copies text to f with every line cut to cols characters on the screen
 * (escape sequences take none and are all kept), so that no line wraps and
 * scrolls the screen. */
static void
fit_lines(FILE *f, const char *text, size_t len, int cols)
{
	int col = 0;

	for (size_t i = 0; i < len; i++) {
		char ch = text[i];

		if (ch == '\033') {
			/* CSI: ESC [ parameters, then a final byte @ to ~. */
			size_t j = i + 1;

			if (j < len && text[j] == '[') {
				for (j++; j < len && (text[j] < '@' || text[j] > '~'); j++)
					;
			}
			fwrite(text + i, 1, (j < len ? j : len - 1) - i + 1, f);
			i = j < len ? j : len - 1;
			continue;
		}
		if (ch == '\n')
			col = -1;
		if (col < cols)
			fputc(ch, f);
		col++;
	}
}

/* One frame's body; on a terminal, cut to its width. */
static void
frame_fitted(FILE *f, struct view *v, const struct cli_snap *snap, uint64_t now)
{
	char *body = NULL;
	size_t len = 0;
	FILE *m;

	if (!v->ansi || (m = open_memstream(&body, &len)) == NULL) {
		frame_body(f, v, snap, now);
		return;
	}
	frame_body(m, v, snap, now);
	if (fclose(m) == 0)
		fit_lines(f, body, len, columns(v->ansi));
	free(body);
}

/* Opens the segment for one frame, read-write when allowed so that the
 * permits of dead processes are back before counting. */
static int
open_quiet(const char *name, struct seg **s, char *err, size_t errlen)
{
	int r = seg_open(name, true, s, err, errlen);

	if (r == 0)
		proc_reclaim(*s, false);
	else if (r == -EACCES || r == -EPERM || r == -EROFS)
		r = seg_open(name, false, s, err, errlen);
	return r;
}

static void
frame(struct view *v)
{
	char *buf = NULL, err[BS_ERRLEN], when[32];
	size_t len = 0;
	uint64_t now = now_mono_ms();
	time_t t = time(NULL);
	struct cli_snap snap;
	struct seg *s;
	FILE *f = open_memstream(&buf, &len);
	int r;

	if (f == NULL)
		return;
	strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", localtime(&t));
	if (v->ansi)
		fprintf(f, "\033[H\033[1mbulkshim watch\033[0m  %s  every %gs  q quits\033[K\n",
		    when, v->interval);
	else
		fprintf(f, "%s ", when);
	r = open_quiet(v->segment, &s, err, sizeof(err));
	if (r == 0) {
		/* Out of memory, the frame has its title only. */
		if (cli_snap_read(s, &snap) == 0) {
			frame_fitted(f, v, &snap, now);
			cli_snap_free(&snap);
		}
		seg_close(s);
	} else if (r == -ENOENT) {
		fprintf(f, "waiting for segment %s: no program has attached to it yet%s\n",
		    v->segment, v->ansi ? "\033[K" : "");
		v->prev_ms = 0;
	} else {
		fprintf(f, "%s%s\n", err, v->ansi ? "\033[K" : "");
		v->prev_ms = 0;
	}
	fputs(v->ansi ? "\033[J" : "\n", f);
	if (fclose(f) == 0)
		fwrite(buf, 1, len, stdout);
	free(buf);
	/* A reader that went away (`watch | head`) ends the view, through the
	 * same exit that restores the terminal. */
	if (fflush(stdout) != 0 || ferror(stdout))
		got_stop = SIGPIPE;
}

/* ---- the loop ---- */

/* Waits up to ms for a key; true when it is time to quit. */
static bool
wait_key(int ms, bool *use_stdin, const sigset_t *during_poll, bool *redraw)
{
	struct pollfd pf = { STDIN_FILENO, POLLIN, 0 };
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };
	char keys[64];
	ssize_t n;

	if (ppoll(&pf, *use_stdin ? 1 : 0, &ts, during_poll) <= 0)
		return false;
	n = read(STDIN_FILENO, keys, sizeof(keys));
	if (n <= 0) {
		/* End of input (a pipe or /dev/null): keep going without it. */
		*use_stdin = false;
		return false;
	}
	for (ssize_t i = 0; i < n; i++) {
		long page = page_rows > 0 ? page_rows : 1;

		/* The arrows arrive as ESC [ A and ESC [ B. */
		if (keys[i] == 'j' || (keys[i] == 'B' && i >= 2 && keys[i - 1] == '['))
			scroll_top++;
		else if (keys[i] == 'k' || (keys[i] == 'A' && i >= 2 && keys[i - 1] == '['))
			scroll_top--;
		else if (keys[i] == ' ')
			scroll_top += page;
		else if (keys[i] == 'b')
			scroll_top -= page;
		else if (keys[i] == 'g')
			scroll_top = 0;
	}
	if (scroll_top < 0)
		scroll_top = 0;
	*redraw = true;
	return memchr(keys, 'q', (size_t)n) != NULL || memchr(keys, 'Q', (size_t)n) != NULL;
}

static void
suspend(bool ansi, bool use_tty)
{
	screen_leave();
	got_suspend = 0;
	/* SIGSTOP cannot be caught: the shell sees a stopped job as usual. */
	kill(getpid(), SIGSTOP);
	screen_enter(ansi, use_tty);
}

int
cmd_watch(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct cli_target t = { NULL, NULL };
	struct view v = { NULL, false, 1.0, NULL, 0, 0 };
	const char *term = getenv("TERM");
	char name[BS_NAME_MAX], err[BS_ERRLEN], *end;
	uint64_t count = 0, limit = 0;
	bool use_stdin, use_tty;
	sigset_t during_poll;
	struct seg *s;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+c:s:i:n:h", longopts, NULL)) != -1) {
		if (cli_target_opt(&t, c, optarg))
			continue;
		switch (c) {
		case 'i':
			v.interval = strtod(optarg, &end);
			if (*end != '\0' || end == optarg || !(v.interval >= 0.05 &&
			    v.interval <= 3600)) {
				fprintf(stderr, "bulkshim: -i wants seconds from 0.05 to 3600, not "
				    "\"%s\"\n", optarg);
				return 2;
			}
			break;
		case 'n':
			if (!cli_parse_u64(optarg, &limit) || limit == 0) {
				fprintf(stderr, "bulkshim: -n wants a count of at least 1, not \"%s\"\n",
				    optarg);
				return 2;
			}
			break;
		case 'h':
			return cli_help("watch", stdout, 0);
		default:
			return cli_help("watch", stderr, 2);
		}
	}
	if (optind != argc || (t.config != NULL && t.segment != NULL))
		return cli_help("watch", stderr, 2);
	if (cli_segment_name(&t, name, sizeof(name)) < 0)
		return 1;
	/* A segment not created yet is waited for, as `serve` does; any
	 * other reason not to open it is an error now. */
	c = open_quiet(name, &s, err, sizeof(err));
	if (c < 0 && c != -ENOENT) {
		fprintf(stderr, "bulkshim: %s\n", err);
		return 1;
	}
	if (c == 0)
		seg_close(s);
	v.segment = name;
	v.ansi = isatty(STDOUT_FILENO) && term != NULL && *term != '\0' &&
	    strcmp(term, "dumb") != 0;
	/* A background job must not touch the terminal's modes or read it. */
	use_tty = isatty(STDIN_FILENO) && tcgetpgrp(STDIN_FILENO) == getpgrp();
	use_stdin = use_tty || !isatty(STDIN_FILENO);
	catch_signals(&during_poll);
	screen_enter(v.ansi, use_tty);
	while (!got_stop) {
		bool redraw = false;
		uint64_t next;

		frame(&v);
		if (limit != 0 && ++count >= limit)
			break;
		next = now_mono_ms() + (uint64_t)(v.interval * 1000);
		for (;;) {
			uint64_t now = now_mono_ms();

			if (got_stop || now >= next)
				break;
			if (wait_key((int)(next - now), &use_stdin, &during_poll, &redraw)) {
				got_stop = SIGTERM;
				break;
			}
			if (redraw) {
				/* A scroll key: show the new page now, not at
				 * the next refresh. */
				break;
			}
			if (got_suspend) {
				suspend(v.ansi, use_tty);
				break;
			}
		}
	}
	screen_leave();
	free(v.prev);
	return got_stop == SIGPIPE ? 1 : 0;
}

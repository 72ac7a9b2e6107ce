/* cmd_serve.c - `bulkshim serve`: a small read-only HTTP/1.0 server for the web page, /metrics and /status.json. */
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli.h"
#include "serve.h"

/*
 * One request per connection, answered with "Connection: close", so a
 * client is a small state machine: read the request head, write the whole
 * reply, then read and discard what the client still sends until it closes
 * (closing with unread data would reset the connection and could cut the
 * reply short). Every client has a deadline, the request head is bounded,
 * and nothing a client sends can make the server do more than answer 400.
 *
 * Connections that say nothing must not keep anyone else waiting: the
 * table holds as many clients as the descriptor limit allows (raised to
 * its hard limit, up to CLIENTS_MAX), a client's request buffer exists
 * only once it sends something, and a new connection that finds the table
 * full takes the place of the connection that has been silent longest.
 */

#define DEFAULT_LISTEN	"127.0.0.1:9464"
#define CLIENTS_MAX	8192	/* clients at once, at most */
#define FDS_SPARE	32	/* descriptors kept for segments, stdio and the listener */
#define REQUEST_MAX	8192	/* bytes of request line and headers */
#define CLIENT_MS	10000	/* a client's time to send its request and read the reply */
#define LINGER_MS	2000	/* discarding what a client sends after the reply */

enum client_state { C_FREE, C_READING, C_WRITING, C_DRAINING };

struct client {
	int fd;
	enum client_state state;
	size_t len;
	char *req;		/* REQUEST_MAX bytes, from the first byte received */
	char *out;
	size_t outlen, outoff;
	uint64_t since;		/* accepted, for choosing whom a full table lets go */
	uint64_t deadline;
};

/* The table of clients, sized once at start. */
struct clients {
	struct client *cl;
	struct pollfd *pf;
	int *who;
	int cap;
};

static volatile sig_atomic_t stop_signal;

static void
on_signal(int sig)
{
	stop_signal = sig;
}

/* ---- replies ---- */

static const char *
reason_phrase(int code)
{
	switch (code) {
	case 200: return "OK";
	case 400: return "Bad Request";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 431: return "Request Header Fields Too Large";
	case 503: return "Service Unavailable";
	}
	return "Internal Server Error";
}

/* Sets the client's reply: status line, headers, and body unless head. */
static void
reply(struct client *cl, int code, const char *type, const char *body, size_t len, bool head)
{
	char *out = NULL;
	size_t outlen = 0;
	FILE *f = open_memstream(&out, &outlen);

	if (f == NULL)
		return;
	fprintf(f, "HTTP/1.0 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
	    "Connection: close\r\nCache-Control: no-store\r\n", code, reason_phrase(code), type,
	    len);
	if (code == 405)
		fputs("Allow: GET, HEAD\r\n", f);
	fputs("\r\n", f);
	if (!head && len > 0)
		fwrite(body, 1, len, f);
	if (fclose(f) != 0) {
		free(out);
		return;
	}
	cl->out = out;
	cl->outlen = outlen;
	cl->outoff = 0;
	cl->state = C_WRITING;
}

static void
reply_text(struct client *cl, int code, const char *text, bool head)
{
	reply(cl, code, "text/plain; charset=utf-8", text, strlen(text), head);
}

/* Answers a GET or HEAD of path; nothing a client asks changes a segment. */
static void
serve_path(struct client *cl, const struct serve_set *set, const char *path, bool head)
{
	char err[BS_ERRLEN + 2], *body = NULL;
	size_t len = 0;
	bool metrics = strcmp(path, "/metrics") == 0;
	FILE *f;
	int r;

	if (strcmp(path, "/") == 0 || strcmp(path, "/index.html") == 0) {
		const char *page;

		web_page(&page, &len);
		reply(cl, 200, "text/html; charset=utf-8", page, len, head);
		return;
	}
	if (!metrics && strcmp(path, "/status.json") != 0) {
		reply_text(cl, 404, "not found: try /, /metrics or /status.json\n", head);
		return;
	}
	f = open_memstream(&body, &len);
	if (f == NULL) {
		reply_text(cl, 503, "out of memory\n", head);
		return;
	}
	r = metrics ? web_metrics(f, set, err, sizeof(err) - 2) :
	    web_status(f, set, err, sizeof(err) - 2);
	if (fclose(f) == 0 && r == 0)
		reply(cl, 200, metrics ? "text/plain; version=0.0.4; charset=utf-8" :
		    "application/json", body, len, head);
	free(body);
	if (r < 0) {
		strcat(err, "\n");
		reply_text(cl, 503, err, head);
	} else if (cl->state != C_WRITING)
		reply_text(cl, 503, "out of memory\n", head);
}

/* Parses "METHOD TARGET HTTP/x.y" and answers it. */
static void
handle_request(struct client *cl, const struct serve_set *set)
{
	char *line = cl->req, *end = memchr(cl->req, '\n', cl->len), *method, *target, *version;
	char *save = NULL, *extra;
	bool head;

	if (end == NULL) {
		reply_text(cl, 400, "bad request\n", false);
		return;
	}
	*end = '\0';
	if (end > line && end[-1] == '\r')
		end[-1] = '\0';
	for (char *p = line; *p; p++) {
		if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f) {
			reply_text(cl, 400, "bad request\n", false);
			return;
		}
	}
	method = strtok_r(line, " ", &save);
	target = strtok_r(NULL, " ", &save);
	version = strtok_r(NULL, " ", &save);
	extra = strtok_r(NULL, " ", &save);
	if (method == NULL || target == NULL || version == NULL || extra != NULL ||
	    strncmp(version, "HTTP/", 5) != 0 || target[0] != '/') {
		reply_text(cl, 400, "bad request\n", false);
		return;
	}
	head = strcmp(method, "HEAD") == 0;
	if (!head && strcmp(method, "GET") != 0) {
		reply_text(cl, 405, "only GET and HEAD\n", false);
		return;
	}
	target[strcspn(target, "?#")] = '\0';
	serve_path(cl, set, target, head);
}

/* ---- connections ---- */

static void
drop(struct client *cl)
{
	close(cl->fd);
	free(cl->out);
	free(cl->req);
	cl->out = NULL;
	cl->req = NULL;
	cl->state = C_FREE;
}

/* A request head ends with an empty line; bare LFs are accepted too. */
static bool
head_complete(const struct client *cl)
{
	for (size_t i = 1; i < cl->len; i++) {
		if (cl->req[i] == '\n' && (cl->req[i - 1] == '\n' ||
		    (i >= 2 && cl->req[i - 1] == '\r' && cl->req[i - 2] == '\n')))
			return true;
	}
	return false;
}

static void
on_readable(struct client *cl, const struct serve_set *set)
{
	char sink[4096];
	ssize_t n;

	if (cl->state == C_DRAINING) {
		n = recv(cl->fd, sink, sizeof(sink), 0);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
			drop(cl);
		return;
	}
	if (cl->req == NULL && (cl->req = malloc(REQUEST_MAX)) == NULL) {
		drop(cl);
		return;
	}
	n = recv(cl->fd, cl->req + cl->len, REQUEST_MAX - cl->len, 0);
	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
		drop(cl);
		return;
	}
	if (n < 0)
		return;
	cl->len += (size_t)n;
	if (head_complete(cl))
		handle_request(cl, set);
	else if (cl->len == REQUEST_MAX)
		reply_text(cl, 431, "request too large\n", false);
}

static void
on_writable(struct client *cl)
{
	ssize_t n = send(cl->fd, cl->out + cl->outoff, cl->outlen - cl->outoff, MSG_NOSIGNAL);

	if (n < 0) {
		if (errno != EAGAIN && errno != EINTR)
			drop(cl);
		return;
	}
	cl->outoff += (size_t)n;
	if (cl->outoff < cl->outlen)
		return;
	free(cl->out);
	cl->out = NULL;
	shutdown(cl->fd, SHUT_WR);
	cl->state = C_DRAINING;
	cl->deadline = now_mono_ms() + LINGER_MS;
}

/* How readily a client gives its place to a new one: one whose reply is
 * sent (only lingering) first, then one that has sent nothing, then one
 * still sending its request; one being answered never. */
static int
let_go_rank(const struct client *c)
{
	switch (c->state) {
	case C_DRAINING:
		return 3;
	case C_READING:
		return c->len == 0 ? 2 : 1;
	default:
		return 0;
	}
}

/* The place for a new client: a free one, or else that of the client
 * most readily let go (the oldest of its rank), which is closed. -1 when
 * every client is being answered. */
static int
free_place(struct clients *t)
{
	int best = -1, best_rank = 0;

	for (int i = 0; i < t->cap; i++) {
		const struct client *c = &t->cl[i];
		int rank;

		if (c->state == C_FREE)
			return i;
		rank = let_go_rank(c);
		if (rank > best_rank || (rank == best_rank && rank > 0 &&
		    c->since < t->cl[best].since)) {
			best = i;
			best_rank = rank;
		}
	}
	if (best >= 0)
		drop(&t->cl[best]);
	return best;
}

/* Accepts what is pending. Returns -1 when out of descriptors: the
 * listener stays readable, so the caller stops polling it for a moment. */
static int
accept_clients(int lfd, struct clients *t)
{
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC), i;

		if (fd < 0)
			return errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
			    errno == ENOMEM ? -1 : 0;
		i = free_place(t);
		if (i < 0) {
			/* Every client is being answered: this one waits
			 * its turn by coming again. */
			close(fd);
			continue;
		}
		t->cl[i].fd = fd;
		t->cl[i].state = C_READING;
		t->cl[i].len = 0;
		t->cl[i].req = NULL;
		t->cl[i].out = NULL;
		t->cl[i].since = now_mono_ms();
		t->cl[i].deadline = t->cl[i].since + CLIENT_MS;
	}
}

/* Sizes the table from the descriptor limit, raising its soft value to
 * the hard one first. Returns 0, or -1 with the error printed. */
static int
clients_init(struct clients *t)
{
	struct rlimit rl;
	rlim_t fds = 1024;

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		if (rl.rlim_cur < rl.rlim_max) {
			rlim_t want = rl.rlim_max;

			if (want == RLIM_INFINITY || want > CLIENTS_MAX + FDS_SPARE)
				want = CLIENTS_MAX + FDS_SPARE;
			if (want > rl.rlim_cur) {
				rl.rlim_cur = want;
				setrlimit(RLIMIT_NOFILE, &rl);
				getrlimit(RLIMIT_NOFILE, &rl);
			}
		}
		fds = rl.rlim_cur;
	}
	t->cap = fds > CLIENTS_MAX + FDS_SPARE ? CLIENTS_MAX :
	    fds > 2 * FDS_SPARE ? (int)(fds - FDS_SPARE) : FDS_SPARE;
	t->cl = calloc((size_t)t->cap, sizeof(*t->cl));
	t->pf = calloc((size_t)t->cap + 1, sizeof(*t->pf));
	t->who = calloc((size_t)t->cap + 1, sizeof(*t->who));
	if (t->cl == NULL || t->pf == NULL || t->who == NULL) {
		cli_log(LOG_ERROR, "bulkshim: ", "serve: out of memory for %d clients", t->cap);
		return -1;
	}
	return 0;
}

static void
clients_free(struct clients *t)
{
	for (int i = 0; i < t->cap; i++) {
		if (t->cl[i].state != C_FREE)
			drop(&t->cl[i]);
	}
	free(t->cl);
	free(t->pf);
	free(t->who);
}

/* Binds ADDR:PORT ("[::1]:9464", "0.0.0.0:80", "localhost:0"); returns the
 * listening descriptor or -1 with the error printed. */
static int
listen_on(const char *spec, char *shown, size_t shownlen)
{
	struct addrinfo hints, *res = NULL, *ai;
	char host[256], port[16], h[NI_MAXHOST], p[NI_MAXSERV];
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	const char *colon = strrchr(spec, ':');
	int fd = -1, one = 1, r;

	if (colon == NULL || colon[1] == '\0' || strlen(colon + 1) >= sizeof(port) ||
	    (size_t)(colon - spec) >= sizeof(host)) {
		cli_log(LOG_ERROR, "bulkshim: ", "--listen wants ADDR:PORT, not \"%s\"", spec);
		return -1;
	}
	snprintf(host, sizeof(host), "%.*s", (int)(colon - spec), spec);
	snprintf(port, sizeof(port), "%s", colon + 1);
	if (strspn(port, "0123456789") != strlen(port) || atoi(port) > 65535) {
		cli_log(LOG_ERROR, "bulkshim: ", "--listen %s: the port must be 0 to 65535", spec);
		return -1;
	}
	if (host[0] == '[' && host[strlen(host) - 1] == ']') {
		memmove(host, host + 1, strlen(host));
		host[strlen(host) - 1] = '\0';
	}
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	r = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
	if (r != 0) {
		cli_log(LOG_ERROR, "bulkshim: ", "--listen %s: %s", spec, gai_strerror(r));
		return -1;
	}
	for (ai = res; ai != NULL; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0)
			continue;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0)
			break;
		r = errno;
		close(fd);
		fd = -1;
		errno = r;
	}
	if (fd < 0)
		cli_log(LOG_ERROR, "bulkshim: ", "cannot listen on %s: %s", spec, strerror(errno));
	freeaddrinfo(res);
	if (fd >= 0 && getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
	    getnameinfo((struct sockaddr *)&ss, sl, h, sizeof(h), p, sizeof(p),
	    NI_NUMERICHOST | NI_NUMERICSERV) == 0)
		snprintf(shown, shownlen, strchr(h, ':') ? "[%s]:%s" : "%s:%s", h, p);
	return fd;
}

/* Blocks SIGINT and SIGTERM except inside ppoll, so a signal can never slip
 * in between checking the flag and going to sleep. */
static void
catch_signals(sigset_t *during_poll)
{
	struct sigaction sa;
	sigset_t block;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&block);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGTERM);
	sigprocmask(SIG_BLOCK, &block, during_poll);
	sigdelset(during_poll, SIGINT);
	sigdelset(during_poll, SIGTERM);
}

static void
serve_loop(int lfd, const struct serve_set *set, struct clients *t)
{
	uint64_t accept_after = 0;
	sigset_t during_poll;

	catch_signals(&during_poll);
	while (!stop_signal) {
		uint64_t now = now_mono_ms(), next = now + 1000;
		struct pollfd *pf = t->pf;
		int *who = t->who;
		struct timespec ts;
		nfds_t n = 0;

		for (int i = 0; i < t->cap; i++) {
			if (t->cl[i].state == C_FREE)
				continue;
			if (t->cl[i].deadline <= now) {
				drop(&t->cl[i]);
				continue;
			}
			if (t->cl[i].deadline < next)
				next = t->cl[i].deadline;
			pf[n].fd = t->cl[i].fd;
			pf[n].events = t->cl[i].state == C_WRITING ? POLLOUT : POLLIN;
			who[n++] = i;
		}
		if (accept_after > now && accept_after < next)
			next = accept_after;
		if (now >= accept_after) {
			pf[n].fd = lfd;
			pf[n].events = POLLIN;
			who[n++] = -1;
		}
		ts.tv_sec = (time_t)((next - now) / 1000);
		ts.tv_nsec = (long)((next - now) % 1000) * 1000000;
		if (ppoll(pf, n, &ts, &during_poll) <= 0)
			continue;
		for (nfds_t k = 0; k < n; k++) {
			struct client *c = who[k] >= 0 ? &t->cl[who[k]] : NULL;

			if (pf[k].revents == 0)
				continue;
			if (c == NULL) {
				/* The listener comes last: the clients of
				 * this round are done before places are reused. */
				if (accept_clients(lfd, t) < 0)
					accept_after = now_mono_ms() + 100;
			} else if (pf[k].revents & (POLLERR | POLLNVAL))
				drop(c);
			else if (c->state == C_WRITING)
				on_writable(c);
			else
				on_readable(c, set);
		}
	}
}

/* Adds the segment that -c FILE or -s SEGMENT names (once); -1 after
 * printing why it cannot. */
static int
add_target(struct serve_set *set, int opt, const char *arg)
{
	struct cli_target t = { NULL, NULL };
	char name[BS_NAME_MAX];

	cli_target_opt(&t, opt, arg);
	if (cli_segment_name(&t, name, sizeof(name)) < 0)
		return -1;
	for (size_t i = 0; i < set->n; i++) {
		if (strcmp(set->name[i], name) == 0)
			return 0;
	}
	if (set->n == SERVE_MAX) {
		cli_log(LOG_ERROR, "bulkshim: ", "serve shows at most %d segments", SERVE_MAX);
		return -1;
	}
	set->config[set->n] = opt == 'c' ? arg : NULL;
	memcpy(set->name[set->n++], name, BS_NAME_MAX);
	return 0;
}

int
cmd_serve(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "listen", required_argument, NULL, 'l' },
		{ "all", no_argument, NULL, 'a' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	static struct serve_set set;
	struct clients clients = { NULL, NULL, NULL, 0 };
	const char *listen_spec = DEFAULT_LISTEN;
	char shown[300], err[BS_ERRLEN];
	struct seg *s;
	int c, lfd;

	cli_log_init("bulkshim serve", false);
	optind = 1;
	while ((c = getopt_long(argc, argv, "+c:s:h", longopts, NULL)) != -1) {
		if (c == 'c' || c == 's') {
			if (add_target(&set, c, optarg) < 0)
				return 1;
		} else if (c == 'l')
			listen_spec = optarg;
		else if (c == 'a')
			set.all = true;
		else if (c == 'h')
			return cli_help("serve", stdout, 0);
		else
			return cli_help("serve", stderr, 2);
	}
	if (optind != argc || (set.all && set.n > 0))
		return cli_help("serve", stderr, 2);
	if (!set.all && set.n == 0 && add_target(&set, 0, NULL) < 0)
		return 1;
	if (clients_init(&clients) < 0) {
		clients_free(&clients);
		return 1;
	}
	snprintf(shown, sizeof(shown), "%s", listen_spec);
	lfd = listen_on(listen_spec, shown, sizeof(shown));
	if (lfd < 0) {
		clients_free(&clients);
		return 1;
	}
	cli_log(LOG_INFO, "bulkshim: ", "serving %s on http://%s/metrics, /status.json and the "
	    "page at http://%s/", set.all ? "every readable segment" : set.n == 1 ? set.name[0] :
	    "several segments", shown, shown);
	for (size_t i = 0; i < set.n; i++) {
		if (seg_open(set.name[i], false, &s, err, sizeof(err)) < 0)
			cli_log(LOG_WARN, "bulkshim: ", "%s; shown once it exists", err);
		else
			seg_close(s);
	}
	serve_loop(lfd, &set, &clients);
	clients_free(&clients);
	close(lfd);
	cli_log(LOG_INFO, "bulkshim: ", "%s, stopped", strsignal(stop_signal));
	return 0;
}

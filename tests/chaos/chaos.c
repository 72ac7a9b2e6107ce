/* chaos.c - the chaos driver: loopback servers that witness every limit, workers it kills and restarts. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chaos.h"

/*
 * usage: chaos -b BUILD [-t SECONDS] [-p PROCS] [-n THREADS] [-s SEED] [-l L0,L1,L2] [-P] [-K] [-D]
 *        [-k] [-m] [-A] [-a ALG,ALG,ALG] [-T SOCKETS,PROCESSES] [-S]
 *
 * Starts a loopback server per compartment (and one no rule matches), writes
 * a config giving the compartments limits L0..L2, and runs PROCS workers of
 * THREADS threads under the shim for SECONDS, SIGKILLing a random worker (or
 * its whole process group, forked children included) every few tens of
 * milliseconds and starting a new one in its place. Workers also end by
 * themselves (exit or _exit) and are replaced.
 *
 * The witness is this process, which is not under the shim. Its servers count
 * the connections they accepted and have not yet seen end (end of file or
 * reset; every connection is polled with epoll, and all of a compartment's
 * connections are read again before a new one is counted). The count only
 * grows at an accept, so checking it there checks every instant. When it
 * exceeds the limit, the server may simply not have seen a close yet (the
 * FIN of a closed socket can wait in a softirq queue while the permit it
 * freed is already taken again), so each live connection's *client* socket
 * is looked up in the kernel with sock_diag: a client socket still open
 * (ESTABLISHED, SYN_SENT, CLOSE_WAIT) is a connection that is really there.
 * All of those were open at the start of the lookups, so more than the limit
 * of them is a real overshoot; fewer is counted as witness lag.
 *
 * With -P the three compartments share a pool of POOL_SIZE less POOL_RESERVED
 * permits, with guarantees 2, 1 and 1 and their limits as ceilings (which sum
 * to more than the pool): the witness then also checks, at every accept, the
 * connections open to the three servers together against the pool, the same
 * way (a count above it is confirmed with sock_diag). c0's classes split it as
 * well (class_guaranteed): workers alternate between classes crit and bulk,
 * each binding its sockets to a source address of its own, and the witness
 * checks each class's open connections to c0 against its ceiling.
 *
 * With -A the compartments are adaptive (`adaptive = { window_ms = 10; }`,
 * so that windows close every few milliseconds, on the
 * connection releases of workers that are being killed), and a window
 * closer (chaos_adclose.c) that spends nearly all its time closing windows
 * is SIGKILLed every few milliseconds and restarted: kills land inside
 * window closes. The witness's limits stay the static ones (the adaptive
 * limit is never above them), and a thread checks every 200 ms, and once
 * at the end, that `status --json` shows each adaptive limit within its
 * [min, max], with min and max as configured (in a pool: the guarantee and
 * the ceiling). -a names the controller of each compartment (`algorithm`;
 * bulkshim's own by default): the check also wants each compartment's
 * controller as configured, and its windows still closing: a compartment
 * whose window count stands still for STUCK_CHECKS checks in a row while the
 * workers run (a close left half done by a kill, never finished) is stuck.
 *
 * After the run, when every process is gone, each compartment's in_use as
 * `bulkshim status -s SEG --json` shows it must be 0 within 1 s.
 * Exit status 0 only if the worst overshoot is 0, in_use came back to 0, no
 * worker died of anything but our SIGKILL, and nothing hung.
 *
 * -T gives the segment small tables (max_sockets, max_processes), so that
 * forks share unconnected sockets without pending slots and children get
 * no process record: their sockets' permits must then wait for the kernel.
 *
 * -S has the workers also make children without fork(), with posix_spawn
 * and vfork (chaos_worker.c's op_spawn): the children keep, use or close
 * the sockets they inherit, exec a worker image or sleep under the shim or
 * without it, or exit, while their parent closes its copies. Permits of
 * sockets a child may still have wait for the kernel (the reconcile): the
 * same witness and the same settle check hold.
 *
 * -k runs the workers under the kernel engine instead of the shim: in a
 * cgroup of their own with `bulkshim attach`, no preload, and with sockets
 * also handed to forked children over Unix sockets (SCM_RIGHTS). The
 * witness and the checks are the same; in_use is the engine's count.
 *
 * -m mixes both engines on the same compartments: the engine is attached
 * to a cgroup as with -k, and the workers take turns being preloaded
 * (outside the cgroup), in the cgroup without the preload (handing sockets
 * over SCM_RIGHTS too), and in the cgroup with the preload (the library
 * counts those, the engine lets them pass). The witness checks the limits
 * against all of them together, and after the run the count the two share
 * (kernel_joint in `status --json`) must come back to 0 with the rest.
 *
 * To hunt a failure down: -K turns the kills off, CHAOS_DISABLE (see
 * chaos_worker.c) turns operations off, and -D stops every worker and then
 * this driver (SIGSTOP) at the first overshoot, so that the segment and
 * /proc can be looked at as they were; SIGCONT the driver to finish.
 */

#define MAX_PROCS	64
#define MAX_CONNS	65536
#define SETTLE_MS	1000	/* in_use must be 0 this soon after the last exit */
#define DRAIN_MS	15000	/* workers must all be gone this soon after the end */

struct conn {
	int fd;
	int server;
	int index;		/* in byserver[server] */
	uint16_t peer_port;
	uint32_t peer_addr;	/* network order: its last byte names the worker's class */
	int cls;		/* -P: CLS_CRIT, CLS_BULK, or -1 */
};

static int limits[CHAOS_COMPS] = { 3, 5, 2 };
/* -P: one pool for the three compartments. */
#define POOL_SIZE	8
#define POOL_RESERVED	1
static const int guarantees[CHAOS_COMPS] = { 2, 1, 1 };
/* -P: c0's classes split it too (class_guaranteed): workers alternate
 * between classes crit and bulk, and bind their sockets to 127.0.0.2 and
 * 127.0.0.3, so that the witness tells a connection's class by its source.
 * Ceilings (class limits): crit c0's limit, bulk 2; guarantees 1 and 1. */
enum { CLS_CRIT, CLS_BULK, CLS_N };
static const char *const cls_name[CLS_N] = { "crit", "bulk" };
static const int cls_ceiling[CLS_N] = { 3, 2 };
static const int cls_guarantee[CLS_N] = { 1, 1 };
static int cls_live[CLS_N], max_cls_live[CLS_N], max_cls_confirmed[CLS_N];
static _Atomic int worst_class_overshoot;
static bool pooled;
static bool adaptive;			/* -A: adaptive compartments */
static char algs[CHAOS_COMPS][16] = { "bulkshim", "bulkshim", "bulkshim" };	/* -a */
#define STUCK_CHECKS	10		/* 2 s of checks with no window closed */
static long long last_windows[CHAOS_COMPS];
static int still_checks[CHAOS_COMPS];
static _Atomic bool workers_running;	/* windows must advance only meanwhile */
static _Atomic long long adaptive_checks, adaptive_bad;
static _Atomic int checker_stop;
static pid_t closer_pid;		/* -A: chaos_adclose, killed every few ms */
static long long closer_started, closer_kills, closer_starts, windows_closed;
static bool closer_killed;
static char closer_path[PATH_MAX];
static int pool_room, max_pool_live, max_pool_confirmed;
static _Atomic int worst_pool_overshoot;
static int lsock[CHAOS_SERVERS];
static uint16_t ports[CHAOS_SERVERS];
static struct chaos_stats *stats;

/* Witness state: touched only by the witness thread, except the atomics. */
static struct conn *byserver[CHAOS_SERVERS][MAX_CONNS];
static int live[CHAOS_SERVERS];
static int max_live[CHAOS_SERVERS];
static int max_confirmed[CHAOS_SERVERS];
static _Atomic long long accepted_total, lag_events, checks, overshoot_events;
static _Atomic int worst_overshoot, live_now[CHAOS_SERVERS];
static _Atomic int witness_stop;
static bool freeze_on_overshoot;	/* -D: stop every worker at the first overshoot */
static bool spawning;			/* -S: workers spawn children without fork() */
static bool no_kills;			/* -K: workers end only by themselves */
static void freeze_workers(void);
static void show_worker_log(void);
static int diag_fd = -1;
static bool kernel_mode;		/* -k: the kernel engine, not the shim */
static bool mixed_mode;			/* -m: both, on the same compartments */
static char cgroup_dir[PATH_MAX];

static long long
mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void
die(const char *what)
{
	fprintf(stderr, "chaos: %s: %s\n", what, strerror(errno));
	exit(2);
}

/* ---- the witness ---- */

/* The TCP state of the client end of a connection to server `srv` from
 * local port `peer`, and its inode: -1 if the kernel knows no such socket. */
static int
client_state(int srv, const struct conn *c, unsigned *inode)
{
	struct {
		struct nlmsghdr nlh;
		struct inet_diag_req_v2 r;
	} req;
	char buf[8192];
	struct sockaddr_nl nl = { .nl_family = AF_NETLINK };
	ssize_t n;

	memset(&req, 0, sizeof(req));
	req.nlh.nlmsg_len = sizeof(req);
	req.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	req.nlh.nlmsg_flags = NLM_F_REQUEST;
	req.r.sdiag_family = AF_INET;
	req.r.sdiag_protocol = IPPROTO_TCP;
	req.r.idiag_states = ~0U;
	req.r.id.idiag_sport = htons(c->peer_port);
	req.r.id.idiag_dport = htons(ports[srv]);
	req.r.id.idiag_src[0] = c->peer_addr;
	req.r.id.idiag_dst[0] = htonl(INADDR_LOOPBACK);
	req.r.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
	req.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
	if (sendto(diag_fd, &req, sizeof(req), 0, (struct sockaddr *)&nl, sizeof(nl)) < 0)
		return -2;
	n = recv(diag_fd, buf, sizeof(buf), 0);
	for (struct nlmsghdr *h = (struct nlmsghdr *)buf; n > 0 && NLMSG_OK(h, (size_t)n);
	    h = NLMSG_NEXT(h, n)) {
		if (h->nlmsg_type == NLMSG_ERROR)
			return -1;
		if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY) {
			struct inet_diag_msg *m = NLMSG_DATA(h);

			*inode = m->idiag_inode;
			return m->idiag_state;
		}
	}
	return -1;
}

static bool
client_open(int srv, const struct conn *c, unsigned *inode)
{
	int st = client_state(srv, c, inode);

	return st == TCP_ESTABLISHED || st == TCP_SYN_SENT || st == TCP_CLOSE_WAIT;
}

/* Names the processes holding socket inode ino, for the overshoot report. */
static void
holders_of(unsigned ino, char *out, size_t len)
{
	char want[64], path[600], link[64];
	size_t used = 0;
	struct dirent *p, *f;
	DIR *proc = opendir("/proc"), *fds;

	out[0] = '\0';
	snprintf(want, sizeof(want), "socket:[%u]", ino);
	while (proc != NULL && (p = readdir(proc)) != NULL) {
		if (p->d_name[0] < '1' || p->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/fd", p->d_name);
		if ((fds = opendir(path)) == NULL)
			continue;
		while ((f = readdir(fds)) != NULL) {
			ssize_t n;

			snprintf(path, sizeof(path), "/proc/%s/fd/%s", p->d_name, f->d_name);
			n = readlink(path, link, sizeof(link) - 1);
			if (n <= 0)
				continue;
			link[n] = '\0';
			if (strcmp(link, want) == 0 && used + 1 < len)
				used += (size_t)snprintf(out + used, len - used, " %s/fd%s", p->d_name,
				    f->d_name);
		}
		closedir(fds);
		if (used + 1 >= len)
			break;
	}
	if (proc != NULL)
		closedir(proc);
}

static void
drop_conn(int epfd, struct conn *c)
{
	struct conn **list = byserver[c->server];

	epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	if (c->cls >= 0)
		cls_live[c->cls]--;
	live[c->server]--;
	list[c->index] = list[live[c->server]];
	list[c->index]->index = c->index;
	list[live[c->server]] = NULL;
	atomic_store(&live_now[c->server], live[c->server]);
	free(c);
}

/* Reads what a connection sent; false once it has ended. */
static bool
still_open(struct conn *c)
{
	char buf[4096];

	for (;;) {
		ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);

		if (n > 0)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return true;
		if (n < 0 && errno == EINTR)
			continue;
		return false;	/* end of file or reset */
	}
}

/* Reads every live connection of server srv again, dropping ended ones. */
static void
rescan(int epfd, int srv)
{
	for (int i = live[srv] - 1; i >= 0; i--) {
		struct conn *c = byserver[srv][i];

		if (!still_open(c))
			drop_conn(epfd, c);
	}
}

/* `over` open connections beyond a limit were confirmed (or none, over <= 0:
 * the witness lagged). Records it in *worst; false when it was lag. */
static bool
overshoot(int over, _Atomic int *worst)
{
	if (over <= 0) {
		atomic_fetch_add(&lag_events, 1);
		return false;
	}
	atomic_fetch_add(&overshoot_events, 1);
	if (over > atomic_load(worst))
		atomic_store(worst, over);
	if (freeze_on_overshoot)
		freeze_workers();
	return true;
}

/* After the report of an overshoot, with -D: stop here too. */
static void
freeze_self(void)
{
	if (freeze_on_overshoot) {
		fprintf(stderr, "chaos: stopping myself too (pid %d); SIGCONT it to go on\n",
		    (int)getpid());
		raise(SIGSTOP);
	}
}

/* The count of server srv just grew past its limit: is it real? */
static void
confirm(int epfd, int srv)
{
	static unsigned inode[MAX_CONNS];
	int open = 0, over;

	rescan(epfd, srv);
	if (live[srv] <= limits[srv])
		return;
	for (int i = 0; i < live[srv]; i++) {
		if (client_open(srv, byserver[srv][i], &inode[i]))
			open++;
		else
			inode[i] = 0;
	}
	if (open > max_confirmed[srv])
		max_confirmed[srv] = open;
	over = open - limits[srv];
	if (!overshoot(over, &worst_overshoot))
		return;
	fprintf(stderr, "chaos: OVERSHOOT: compartment c%d has %d open connections, limit %d\n",
	    srv, open, limits[srv]);
	for (int i = 0; i < live[srv]; i++) {
		char who[512];

		if (inode[i] == 0)
			continue;
		holders_of(inode[i], who, sizeof(who));
		fprintf(stderr, "chaos:   client port %u, socket inode %u, held by pid/fd:%s\n",
		    byserver[srv][i]->peer_port, inode[i], who[0] ? who : " (nobody now)");
	}
	freeze_self();
}

/* The three compartments' count just grew past the pool: is it real? */
static void
confirm_pool(int epfd)
{
	unsigned inode;
	int open = 0, live_all = 0, over;

	for (int srv = 0; srv < CHAOS_COMPS; srv++) {
		rescan(epfd, srv);
		live_all += live[srv];
	}
	if (live_all <= pool_room)
		return;
	for (int srv = 0; srv < CHAOS_COMPS; srv++) {
		for (int i = 0; i < live[srv]; i++)
			open += client_open(srv, byserver[srv][i], &inode);
	}
	if (open > max_pool_confirmed)
		max_pool_confirmed = open;
	over = open - pool_room;
	if (!overshoot(over, &worst_pool_overshoot))
		return;
	fprintf(stderr, "chaos: OVERSHOOT: the pool has %d open connections, room %d\n", open,
	    pool_room);
	freeze_self();
}

/* Class k of c0 just grew past its ceiling: is it real? */
static void
confirm_class(int epfd, int k)
{
	unsigned inode;
	int open = 0, over;

	rescan(epfd, 0);
	if (cls_live[k] <= cls_ceiling[k])
		return;
	for (int i = 0; i < live[0]; i++)
		if (byserver[0][i]->cls == k)
			open += client_open(0, byserver[0][i], &inode);
	if (open > max_cls_confirmed[k])
		max_cls_confirmed[k] = open;
	over = open - cls_ceiling[k];
	if (!overshoot(over, &worst_class_overshoot))
		return;
	fprintf(stderr, "chaos: OVERSHOOT: class %s of c0 has %d open connections, ceiling %d\n",
	    cls_name[k], open, cls_ceiling[k]);
	freeze_self();
}

static void
accept_all(int epfd, int srv)
{
	for (;;) {
		struct sockaddr_in peer;
		socklen_t plen = sizeof(peer);
		struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP };
		struct conn *c;
		int fd = accept4(lsock[srv], (struct sockaddr *)&peer, &plen, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0)
			return;
		if (srv < CHAOS_COMPS && live[srv] + 1 > limits[srv])
			rescan(epfd, srv);
		if (live[srv] >= MAX_CONNS || (c = calloc(1, sizeof(*c))) == NULL) {
			close(fd);
			continue;
		}
		c->fd = fd;
		c->server = srv;
		c->peer_port = ntohs(peer.sin_port);
		c->peer_addr = peer.sin_addr.s_addr;
		c->cls = -1;
		if (pooled && srv == 0) {
			uint32_t host = ntohl(peer.sin_addr.s_addr) & 0xff;

			c->cls = host == 2 ? CLS_CRIT : host == 3 ? CLS_BULK : -1;
		}
		c->index = live[srv];
		byserver[srv][live[srv]] = c;
		ev.data.ptr = c;
		epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
		atomic_fetch_add(&accepted_total, 1);
		live[srv]++;
		atomic_store(&live_now[srv], live[srv]);
		if (live[srv] > max_live[srv])
			max_live[srv] = live[srv];
		if (srv < CHAOS_COMPS) {
			atomic_fetch_add(&checks, 1);
			if (live[srv] > limits[srv])
				confirm(epfd, srv);
		}
		if (c->cls >= 0) {
			cls_live[c->cls]++;
			if (cls_live[c->cls] > max_cls_live[c->cls])
				max_cls_live[c->cls] = cls_live[c->cls];
			if (cls_live[c->cls] > cls_ceiling[c->cls])
				confirm_class(epfd, c->cls);
		}
		if (srv < CHAOS_COMPS && pooled) {
			int all = live[0] + live[1] + live[2];

			if (all > max_pool_live)
				max_pool_live = all;
			if (all > pool_room)
				confirm_pool(epfd);
		}
	}
}

static void *
witness(void *arg)
{
	struct epoll_event evs[1024];
	int epfd = epoll_create1(EPOLL_CLOEXEC);

	(void)arg;
	if (epfd < 0)
		die("epoll_create1");
	for (int i = 0; i < CHAOS_SERVERS; i++) {
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };

		ev.data.u64 = (uint64_t)i + 1;
		epoll_ctl(epfd, EPOLL_CTL_ADD, lsock[i], &ev);
	}
	while (!atomic_load(&witness_stop)) {
		int n = epoll_wait(epfd, evs, 1024, 5), any_listen = 0;

		/* Ends before starts: a close seen in the same batch as an
		 * accept is applied first. */
		for (int i = 0; i < n; i++) {
			struct conn *c;

			if (evs[i].data.u64 <= CHAOS_SERVERS) {
				any_listen |= 1 << (evs[i].data.u64 - 1);
				continue;
			}
			c = evs[i].data.ptr;
			if (!still_open(c))
				drop_conn(epfd, c);
		}
		for (int i = 0; i < CHAOS_SERVERS; i++) {
			if (any_listen & (1 << i))
				accept_all(epfd, i);
		}
	}
	for (int srv = 0; srv < CHAOS_SERVERS; srv++)
		rescan(epfd, srv);
	close(epfd);
	return NULL;
}

/* ---- workers ---- */

struct worker {
	pid_t pid;		/* 0: slot empty */
	bool killed;
};

static struct worker workers[MAX_PROCS];
static char worker_path[PATH_MAX], lib_path[PATH_MAX], cli_path[PATH_MAX], cfg_path[PATH_MAX];
static char stats_path[PATH_MAX];
static char ports_arg[64], segment[64], log_path[4096];
static long long until_ms;
static int nthreads = 16;
static uint64_t seed_state;
static long long kills, group_kills, crashes, restarts;

static uint64_t
rnd(void)
{
	seed_state ^= seed_state >> 12;
	seed_state ^= seed_state << 25;
	seed_state ^= seed_state >> 27;
	return seed_state * 2685821657736338717ULL;
}

/* -k: the worker enters the cgroup the engine is attached to. */
static int
kernel_join(void)
{
	char path[PATH_MAX + 16];
	int fd, r;

	snprintf(path, sizeof(path), "%s/cgroup.procs", cgroup_dir);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	r = write(fd, "0\n", 2) == 2 ? 0 : -1;
	close(fd);
	return r;
}

/* -m: in the child of start_worker, puts the n-th worker on its side:
 * preloaded outside the cgroup (n % 3 == 0), in the cgroup without the
 * preload (1), or in the cgroup and preloaded (2). True for the side
 * without the preload, whose worker also hands sockets over SCM_RIGHTS
 * (only the engine follows them). */
static bool
mixed_side(long long n)
{
	if (n % 3 != 0 && kernel_join() < 0)
		_exit(126);
	return n % 3 == 1;
}

/* -k: a cgroup under the cgroup v2 mount, with the engine attached. */
static void
kernel_setup(void)
{
	char line[PATH_MAX * 2], cmd[PATH_MAX * 5], mnt[PATH_MAX] = "", type[64];
	FILE *f = fopen("/proc/self/mounts", "re");

	while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
		if (sscanf(line, "%*s %4095s %63s", mnt, type) == 2 && strcmp(type, "cgroup2") == 0)
			break;
		mnt[0] = '\0';
	}
	if (f != NULL)
		fclose(f);
	if (mnt[0] == '\0')
		die("no cgroup v2 mount for -k");
	snprintf(cgroup_dir, sizeof(cgroup_dir), "%s/bulkshim-chaos.%d", mnt, (int)getpid());
	if (mkdir(cgroup_dir, 0755) < 0)
		die(cgroup_dir);
	snprintf(cmd, sizeof(cmd), "'%s' attach -c '%s' --cgroup '%s' >/dev/null 2>>'%s'",
	    cli_path, cfg_path, cgroup_dir, log_path);
	if (system(cmd) != 0) {
		rmdir(cgroup_dir);
		show_worker_log();
		die("bulkshim attach");
	}
}

static void
kernel_teardown(void)
{
	char cmd[PATH_MAX * 3];

	snprintf(cmd, sizeof(cmd), "'%s' detach -c '%s' >/dev/null", cli_path, cfg_path);
	if (system(cmd) != 0)
		fprintf(stderr, "chaos: bulkshim detach failed\n");
	rmdir(cgroup_dir);
}

static pid_t
start_worker(void)
{
	char until[32], seed[32], threads[16], life[32];
	char *argv[] = { worker_path, stats_path, ports_arg, until, seed, threads, life, "main", "0",
			 NULL };
	pid_t pid;

	snprintf(until, sizeof(until), "%lld", until_ms);
	snprintf(seed, sizeof(seed), "%llu", (unsigned long long)(rnd() >> 1));
	snprintf(threads, sizeof(threads), "%d", nthreads);
	snprintf(life, sizeof(life), "%llu", (unsigned long long)(500 + rnd() % 3500));
	pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		int fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);

		setpgid(0, 0);
		if (spawning)
			setenv("CHAOS_SPAWN", "1", 1);
		if (fd >= 0) {
			dup2(fd, 2);
			close(fd);
		}
		if (kernel_mode || (mixed_mode && mixed_side(restarts))) {
			if (kernel_mode && kernel_join() < 0)
				_exit(126);
			setenv("CHAOS_SCM", "1", 1);
			execv(worker_path, argv);
			_exit(127);
		}
		setenv("LD_PRELOAD", lib_path, 1);
		setenv("BULKSHIM_CONFIG", cfg_path, 1);
		if (pooled) {
			setenv("BULKSHIM_CLASS", cls_name[restarts % CLS_N], 1);
			setenv("CHAOS_SRC", restarts % CLS_N == CLS_CRIT ? "127.0.0.2" : "127.0.0.3", 1);
		}
		setenv("BULKSHIM_LOG", "error", 1);
		execv(worker_path, argv);
		_exit(127);
	}
	setpgid(pid, pid);
	restarts++;
	return pid;
}

/* Stops every worker's process group where it stands, for a post-mortem:
 * `bulkshim status` and /proc show the state that let the overshoot in. */
static void
freeze_workers(void)
{
	static bool frozen;

	if (frozen)
		return;
	frozen = true;
	for (int i = 0; i < MAX_PROCS; i++) {
		if (workers[i].pid > 0)
			kill(-workers[i].pid, SIGSTOP);
	}
	fprintf(stderr, "chaos: workers stopped (SIGSTOP) for inspection; segment %s\n", segment);
}

static struct worker *
find_worker(pid_t pid)
{
	for (int i = 0; i < MAX_PROCS; i++) {
		if (workers[i].pid == pid)
			return &workers[i];
	}
	return NULL;
}

/* Reaps every exited descendant (we are their subreaper); a worker slot
 * that emptied is refilled when `refill` is set. */
static int
reap(bool refill)
{
	int st, n = 0;
	pid_t pid;

	while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
		struct worker *w = find_worker(pid);

		n++;
		if (WIFSIGNALED(st) && WTERMSIG(st) != SIGKILL) {
			crashes++;
			fprintf(stderr, "chaos: process %d died of signal %d\n", (int)pid,
			    WTERMSIG(st));
		} else if (WIFEXITED(st) && WEXITSTATUS(st) != 0) {
			crashes++;
			fprintf(stderr, "chaos: process %d exited with status %d\n", (int)pid,
			    WEXITSTATUS(st));
		}
		if (w != NULL) {
			w->pid = refill ? start_worker() : 0;
			w->killed = false;
		}
		if (pid == closer_pid)
			closer_pid = 0;
	}
	return n;
}

/* ---- the segment's view, through the CLI ---- */

/* Sums the values of `key` in JSON text out and lists them in shown
 * (len bytes, *used of them written), each after `label` ("/" between
 * unlabelled ones). */
static long
sum_key(const char *out, const char *key, const char *label, char *shown, size_t len,
    size_t *used)
{
	size_t kl = strlen(key);
	long total = 0;

	for (const char *p = strstr(out, key); p != NULL; p = strstr(p + 1, key)) {
		long v = strtol(p + kl, NULL, 10);

		total += v;
		*used += (size_t)snprintf(shown + *used, *used < len ? len - *used : 0, "%s%ld",
		    *label ? label : *used ? "/" : "", v);
		if (*used >= len)
			*used = len - 1;
	}
	return total;
}

/* `bulkshim status --json` of the run's segment into out (len bytes, NUL
 * ended); -1 if the command could not run or failed (out then says why). */
static int
status_json(char *out, size_t len)
{
	char cmd[8400];
	size_t n;
	FILE *f;

	out[0] = '\0';
	snprintf(cmd, sizeof(cmd), "'%s' status -s '%s' --json 2>&1", cli_path, segment);
	f = popen(cmd, "r");
	if (f == NULL)
		return -1;
	n = fread(out, 1, len - 1, f);
	out[n] = '\0';
	return pclose(f) == 0 ? 0 : -1;
}

/* Sums and lists each compartment's in_use from `bulkshim status --json`;
 * returns the total, or -1 if the command failed. */
static long
in_use_total(char *shown, size_t len)
{
	char out[65536];
	size_t used = 0;
	long total = 0;

	if (status_json(out, sizeof(out)) < 0) {
		snprintf(shown, len, "%.200s", out);
		return -1;
	}
	shown[0] = '\0';
	/* Every count of permits: compartments', classes', pools' in_use,
	 * c2's requests in flight (its max_inflight), the pools' lent permits
	 * and those lent to classes (class_lent). */
	total += sum_key(out, "\"in_use\":", "", shown, len, &used);
	total += sum_key(out, "\"inflight\":", " inflight ", shown, len, &used);
	total += sum_key(out, "lent\":", " lent ", shown, len, &used);
	/* -m: the count both engines share, of each compartment. */
	total += sum_key(out, "\"kernel_joint\":", " joint ", shown, len, &used);
	return total;
}

/* -P: the pool's peak as `status --json` shows it (the first "peak" after
 * "pools"), or -1. Kills leave the statistic it is raised from one low at
 * worst, never high: it must stay within the pool's room. */
static long
pool_peak(void)
{
	char out[65536];
	const char *p;

	if (status_json(out, sizeof(out)) < 0 || (p = strstr(out, "\"pools\"")) == NULL ||
	    (p = strstr(p, "\"peak\":")) == NULL)
		return -1;
	return strtol(p + strlen("\"peak\":"), NULL, 10);
}

/* -A: every adaptive limit `status --json` shows is within its bounds,
 * and the bounds and the controller are the configured ones (min 1, or the
 * guarantee in a pool; max the compartment's limit). During the run, each
 * compartment's windows must keep closing. Counts the objects checked. */
static void
adaptive_check(const char *when)
{
	char out[65536], *p;
	bool during = strcmp(when, "during the run") == 0;
	int k = 0;

	if (status_json(out, sizeof(out)) < 0)
		return;		/* the segment not there yet */
	for (p = strstr(out, "\"adaptive\": {"); p != NULL; p = strstr(p + 1, "\"adaptive\": {")) {
		const char *l = strstr(p, "\"limit\": "), *mn = strstr(p, "\"min\": ");
		const char *mx = strstr(p, "\"max\": "), *wn = strstr(p, "\"windows\": ");
		const char *al = strstr(p, "\"algorithm\": \"");
		long lim, lo, hi, want_lo = pooled ? guarantees[k] : 1, want_hi = limits[k];
		long long windows;
		size_t n;

		if (l == NULL || mn == NULL || mx == NULL || wn == NULL || al == NULL ||
		    k >= CHAOS_COMPS)
			break;
		lim = strtol(l + 9, NULL, 10);
		lo = strtol(mn + 7, NULL, 10);
		hi = strtol(mx + 7, NULL, 10);
		windows = strtoll(wn + 11, NULL, 10);
		al += strlen("\"algorithm\": \"");
		n = strlen(algs[k]);
		if (!during)
			windows_closed += windows;
		adaptive_checks++;
		if (lim < lo || lim > hi || lo != want_lo || hi != want_hi) {
			adaptive_bad++;
			fprintf(stderr, "chaos: %s: c%d's adaptive limit %ld outside [%ld, %ld] (configured "
			    "[%ld, %ld])\n", when, k, lim, lo, hi, want_lo, want_hi);
		}
		if (strncmp(al, algs[k], n) != 0 || al[n] != '"') {
			adaptive_bad++;
			fprintf(stderr, "chaos: %s: c%d's controller is not %s: %.20s\n", when, k,
			    algs[k], al);
		}
		if (during && atomic_load(&workers_running)) {
			still_checks[k] = windows == last_windows[k] ? still_checks[k] + 1 : 0;
			last_windows[k] = windows;
			if (still_checks[k] == STUCK_CHECKS) {
				adaptive_bad++;
				fprintf(stderr, "chaos: %s: c%d's windows stopped closing at %lld for "
				    "%d checks\n", when, k, windows, STUCK_CHECKS);
			}
		}
		k++;
	}
	if (k != CHAOS_COMPS) {
		adaptive_bad++;
		fprintf(stderr, "chaos: %s: %d adaptive compartments in status --json, want %d\n", when,
		    k, CHAOS_COMPS);
	}
}

static void *
checker(void *arg)
{
	(void)arg;
	while (!atomic_load(&checker_stop)) {
		struct timespec ts = { 0, 200 * 1000000 };

		adaptive_check("during the run");
		nanosleep(&ts, NULL);
	}
	return NULL;
}

/* -A: (re)starts the window closer; it is not under the shim. */
static void
start_closer(void)
{
	char until[32], seed[32];
	char *argv[] = { closer_path, segment, until, seed, NULL };

	snprintf(until, sizeof(until), "%lld", until_ms);
	snprintf(seed, sizeof(seed), "%llu", (unsigned long long)(rnd() >> 1));
	closer_pid = fork();
	if (closer_pid < 0)
		die("fork");
	if (closer_pid == 0) {
		execv(closer_path, argv);
		_exit(127);
	}
	closer_started = mono_ms();
	closer_killed = false;
	closer_starts++;
}

/* ---- set-up ---- */

static void
listen_all(void)
{
	for (int i = 0; i < CHAOS_SERVERS; i++) {
		struct sockaddr_in a = { .sin_family = AF_INET };
		socklen_t alen = sizeof(a);
		int one = 1;

		a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		lsock[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (lsock[i] < 0)
			die("socket");
		setsockopt(lsock[i], SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(lsock[i], (struct sockaddr *)&a, sizeof(a)) < 0 || listen(lsock[i], 4096) < 0 ||
		    getsockname(lsock[i], (struct sockaddr *)&a, &alen) < 0)
			die("listen");
		ports[i] = ntohs(a.sin_port);
	}
	snprintf(ports_arg, sizeof(ports_arg), "%u,%u,%u,%u", ports[0], ports[1], ports[2], ports[3]);
}

/* -T: the segment's max_sockets and max_processes (0: the defaults). */
static int table_sockets, table_procs;

static void
write_config(const char *dir)
{
	FILE *f;

	snprintf(cfg_path, sizeof(cfg_path), "%s/chaos.cfg", dir);
	f = fopen(cfg_path, "w");
	if (f == NULL)
		die(cfg_path);
	fprintf(f, "segment = \"%s\";\n", segment);
	if (table_sockets > 0)
		fprintf(f, "max_sockets = %d;\nmax_processes = %d;\n", table_sockets, table_procs);
	if (pooled) {
		fprintf(f, "pools = ( { name = \"p\"; size = %d; reserved = %d; } );\n", POOL_SIZE,
		    POOL_RESERVED);
		fprintf(f, "classes = { %s = [ \"no-such-program-a\" ]; %s = [ \"no-such-program-b\" ]; };\n",
		    cls_name[CLS_CRIT], cls_name[CLS_BULK]);
	}
	fprintf(f, "compartments = (\n");
	for (int i = 0; i < CHAOS_COMPS; i++) {
		char pool[256] = "";

		if (pooled)
			snprintf(pool, sizeof(pool), " pool = \"p\"; guaranteed = %d;", guarantees[i]);
		if (pooled && i == 0)
			snprintf(pool + strlen(pool), sizeof(pool) - strlen(pool),
			    " class_limits = { %s = %d; }; class_guaranteed = { %s = %d; %s = %d; };",
			    cls_name[CLS_BULK], cls_ceiling[CLS_BULK], cls_name[CLS_CRIT],
			    cls_guarantee[CLS_CRIT], cls_name[CLS_BULK], cls_guarantee[CLS_BULK]);
		if (adaptive)
			snprintf(pool + strlen(pool), sizeof(pool) - strlen(pool),
			    " adaptive = { window_ms = 10; algorithm = \"%s\"; };", algs[i]);
		/* c1 lets blocking callers wait a little, to have futex
		 * waiters woken by releases and by reclaims (and, in a
		 * pool, by the other compartments' releases). c2 (unless
		 * adaptive) limits requests in flight: its writes take and
		 * its closes give in-flight permits under the kills too. */
		fprintf(f, "  { name = \"c%d\"; destinations = [ \"127.0.0.1:%u\" ]; "
		    "max_connections = %d;%s%s%s }%s\n", i, ports[i], limits[i],
		    i == 1 ? " max_wait_ms = 20;" : "", i == 2 && !adaptive ? " max_inflight = 1;" : "",
		    pool, i + 1 < CHAOS_COMPS ? "," : "");
	}
	fprintf(f, ");\n");
	if (fclose(f) != 0)
		die(cfg_path);
}

static void
make_stats(const char *dir)
{
	int fd;

	snprintf(stats_path, sizeof(stats_path), "%s/stats", dir);
	fd = open(stats_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0 || ftruncate(fd, sizeof(*stats)) < 0)
		die(stats_path);
	stats = mmap(NULL, sizeof(*stats), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (stats == MAP_FAILED)
		die("mmap");
	close(fd);
	stats->magic = CHAOS_MAGIC;
}

/* Replaces path (PATH_MAX bytes) by its absolute form. */
static int
absolute(char *path)
{
	char abs[PATH_MAX];

	if (realpath(path, abs) == NULL)
		return -1;
	snprintf(path, PATH_MAX, "%s", abs);
	return 0;
}

static uint64_t
k(enum chaos_counter c)
{
	return atomic_load(&stats->n[c]);
}

/* What the shim said in the workers, one line per distinct message with
 * its count (the pid prefix and numbers taken out), most frequent first. */
static void
show_worker_log(void)
{
	char cmd[PATH_MAX + 256];

	snprintf(cmd, sizeof(cmd), "sed -e 's/^bulkshim\\[[0-9]*\\]: //' -e 's/[0-9][0-9]*/N/g' '%s' "
	    "2>/dev/null | sort | uniq -c | sort -rn | head -n 12 | sed 's/^/chaos: worker log: /'",
	    log_path);
	if (system(cmd) != 0)
		printf("chaos: (no worker log)\n");
}

/* -S: what the workers spawned; a run that spawned nothing tested nothing. */
static void
spawn_report(int *status)
{
	printf("chaos: %llu children made with posix_spawn or vfork\n",
	    (unsigned long long)k(K_SPAWN));
	if (k(K_SPAWN) == 0)
		*status = 1;
}

int
main(int argc, char **argv)
{
	const char *build = "build";
	char dir[] = "/tmp/bulkshim-chaos-XXXXXX", shown[256], shm[128];
	double seconds = 20;
	long long t0, end, drained_at, zero_at = -1, last_kill;
	int procs = 8, c, status = 0;
	long total = -1;
	pthread_t wt, ct;
	struct rlimit rl;

	seed_state = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	while ((c = getopt(argc, argv, "b:t:p:n:s:l:T:a:DKPkmAS")) != -1) {
		switch (c) {
		case 'S':
			spawning = true;
			break;
		case 'A':
			adaptive = true;
			break;
		case 'P':
			pooled = true;
			pool_room = POOL_SIZE - POOL_RESERVED;
			break;
		case 'k':
			kernel_mode = true;
			break;
		case 'm':
			mixed_mode = true;
			break;
		case 'K':
			no_kills = true;
			break;
		case 'D':
			freeze_on_overshoot = true;
			break;
		case 'b':
			build = optarg;
			break;
		case 't':
			seconds = atof(optarg);
			break;
		case 'p':
			procs = atoi(optarg);
			break;
		case 'n':
			nthreads = atoi(optarg);
			break;
		case 's':
			seed_state = strtoull(optarg, NULL, 0);
			break;
		case 'l':
			if (sscanf(optarg, "%d,%d,%d", &limits[0], &limits[1], &limits[2]) != 3)
				goto usage;
			break;
		case 'a':
			if (sscanf(optarg, "%15[a-z0-9],%15[a-z0-9],%15[a-z0-9]", algs[0], algs[1],
			    algs[2]) != 3)
				goto usage;
			break;
		case 'T':
			if (sscanf(optarg, "%d,%d", &table_sockets, &table_procs) != 2 ||
			    table_sockets < 1 || table_procs < 1)
				goto usage;
			break;
		default:
			goto usage;
		}
	}
	if (optind != argc || procs < 1 || procs > MAX_PROCS || nthreads < 1 || nthreads > 32 ||
	    seconds <= 0 || seconds > 3600)
		goto usage;
	seed_state |= 1;
	printf("chaos: seed %llu\n", (unsigned long long)seed_state);
	snprintf(worker_path, sizeof(worker_path), "%s/tests/chaos_worker", build);
	snprintf(lib_path, sizeof(lib_path), "%s/libbulkshim.so", build);
	snprintf(cli_path, sizeof(cli_path), "%s/bulkshim", build);
	snprintf(closer_path, sizeof(closer_path), "%s/tests/chaos_adclose", build);
	if (absolute(worker_path) < 0 || absolute(lib_path) < 0 || absolute(cli_path) < 0 ||
	    (adaptive && absolute(closer_path) < 0))
		die("build products (make all chaos-bin)");
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 65536) {
		rl.rlim_cur = rl.rlim_max < 65536 ? rl.rlim_max : 65536;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	/* Orphans of killed workers come to us: we reap them and know when
	 * the last process is gone. */
	if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0)
		die("PR_SET_CHILD_SUBREAPER");
	if (mkdtemp(dir) == NULL)
		die("mkdtemp");
	snprintf(segment, sizeof(segment), "chaos_%d", (int)getpid());
	snprintf(shm, sizeof(shm), "/dev/shm/bulkshim.%s", segment);
	snprintf(log_path, sizeof(log_path), "%s/workers.log", dir);
	diag_fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (diag_fd < 0)
		die("sock_diag");
	listen_all();
	write_config(dir);
	make_stats(dir);
	if (kernel_mode || mixed_mode)
		kernel_setup();
	if (pthread_create(&wt, NULL, witness, NULL) != 0)
		die("pthread_create");

	t0 = mono_ms();
	until_ms = chaos_now_ms() + (long long)(seconds * 1000);
	end = t0 + (long long)(seconds * 1000);
	for (int i = 0; i < procs; i++)
		workers[i].pid = start_worker();
	last_kill = t0;
	atomic_store(&workers_running, true);
	if (adaptive && pthread_create(&ct, NULL, checker, NULL) != 0)
		die("pthread_create");
	while (mono_ms() < end) {
		long long gap = 15 + (long long)(rnd() % 120);
		struct timespec ts = { 0, 5 * 1000000 };

		nanosleep(&ts, NULL);
		if (adaptive && closer_pid == 0 && mono_ms() < end - 200)
			start_closer();
		else if (adaptive && closer_pid > 0 && !closer_killed && !no_kills &&
		    mono_ms() - closer_started >= 40 + (long long)(rnd() % 100)) {
			kill(closer_pid, SIGKILL);
			closer_kills++;
			closer_killed = true;
		}
		reap(mono_ms() < end - 200);
		if (!no_kills && mono_ms() - last_kill >= gap) {
			struct worker *w = &workers[rnd() % (unsigned)procs];

			last_kill = mono_ms();
			if (w->pid > 0 && !w->killed) {
				if (rnd() % 3 == 0) {
					kill(-w->pid, SIGKILL);
					group_kills++;
				} else {
					kill(w->pid, SIGKILL);
				}
				w->killed = true;
				kills++;
			}
		}
	}

	/* The end: workers stop by themselves at until_ms. */
	atomic_store(&workers_running, false);
	drained_at = mono_ms();
	for (;;) {
		int st;
		pid_t pid = waitpid(-1, &st, WNOHANG);

		if (pid < 0 && errno == ECHILD)
			break;
		if (pid > 0) {
			struct worker *w = find_worker(pid);

			if (WIFSIGNALED(st) && WTERMSIG(st) != SIGKILL) {
				crashes++;
				fprintf(stderr, "chaos: process %d died of signal %d\n", (int)pid,
				    WTERMSIG(st));
			}
			if (w != NULL)
				w->pid = 0;
			continue;
		}
		if (mono_ms() - drained_at > DRAIN_MS) {
			fprintf(stderr, "chaos: processes still running %d s after the end; killing them\n",
			    DRAIN_MS / 1000);
			for (int i = 0; i < procs; i++) {
				if (workers[i].pid > 0)
					kill(-workers[i].pid, SIGKILL);
			}
			status = 1;
			drained_at = mono_ms();
		}
		{
			struct timespec ts = { 0, 2 * 1000000 };

			nanosleep(&ts, NULL);
		}
	}
	drained_at = mono_ms();
	for (;;) {
		total = in_use_total(shown, sizeof(shown));
		if (total == 0) {
			zero_at = mono_ms();
			break;
		}
		if (mono_ms() - drained_at > SETTLE_MS)
			break;
		{
			struct timespec ts = { 0, 20 * 1000000 };

			nanosleep(&ts, NULL);
		}
	}
	if (adaptive) {
		atomic_store(&checker_stop, 1);
		pthread_join(ct, NULL);
		adaptive_check("after the run");
	}
	atomic_store(&witness_stop, 1);
	pthread_join(wt, NULL);
	if (kernel_mode || mixed_mode)
		kernel_teardown();

	printf("chaos: %.1f s, %d processes x %d threads, limits c0=%d c1=%d c2=%d%s\n",
	    (double)(drained_at - t0) / 1000, procs, nthreads, limits[0], limits[1], limits[2],
	    kernel_mode ? ", kernel engine" : mixed_mode ? ", kernel engine and library mixed" : "");
	printf("chaos: %llu operations: %llu connects (%llu non-blocking; %llu admitted, "
	    "%llu unmatched, %llu refused, %llu failed, %llu abandoned), %llu closes, %llu writes, "
	    "%llu dup, %llu dup2 over a counted socket, %llu dup2 to a free number, %llu dup3, "
	    "%llu F_DUPFD, %llu close_range\n",
	    (unsigned long long)k(K_OPS), (unsigned long long)(k(K_CONNECT) + k(K_CONNECT_NB)),
	    (unsigned long long)k(K_CONNECT_NB), (unsigned long long)k(K_ADMITTED),
	    (unsigned long long)k(K_UNMATCHED), (unsigned long long)k(K_REFUSED),
	    (unsigned long long)k(K_CONNECT_ERR), (unsigned long long)k(K_ABANDONED),
	    (unsigned long long)k(K_CLOSE), (unsigned long long)k(K_WRITE),
	    (unsigned long long)k(K_DUP), (unsigned long long)k(K_DUP2),
	    (unsigned long long)k(K_DUP2_FRESH), (unsigned long long)k(K_DUP3),
	    (unsigned long long)k(K_DUPFD), (unsigned long long)k(K_CLOSE_RANGE));
	printf("chaos: %lld kills (%lld of whole process groups), %llu forks, %llu execs of a "
	    "worker + %llu execs in forked children, %llu sockets adopted after exec, "
	    "%llu worker images started, %llu exit(), %llu _exit()\n",
	    kills, group_kills, (unsigned long long)k(K_FORK), (unsigned long long)k(K_EXEC),
	    (unsigned long long)k(K_CHILD_EXEC), (unsigned long long)k(K_ADOPTED),
	    (unsigned long long)k(K_WORKER_START), (unsigned long long)k(K_EXIT),
	    (unsigned long long)k(K_UNDERSCORE_EXIT));
	if (kernel_mode || mixed_mode)
		printf("chaos: %llu sockets handed to a child with SCM_RIGHTS\n",
		    (unsigned long long)k(K_PASS));
	if (spawning)
		spawn_report(&status);
	printf("chaos: witness: %lld connections accepted, %lld checks (one per accept in a limited "
	    "compartment), %lld lag events (a close not yet seen), peak live c0=%d c1=%d c2=%d "
	    "(confirmed open %d/%d/%d)\n",
	    (long long)atomic_load(&accepted_total), (long long)atomic_load(&checks),
	    (long long)atomic_load(&lag_events), max_live[0], max_live[1], max_live[2],
	    max_confirmed[0], max_confirmed[1], max_confirmed[2]);
	if (pooled)
		printf("chaos: pool of %d - %d reserved, guarantees %d/%d/%d: peak live together %d "
		    "(confirmed open %d), worst pool overshoot %d\n", POOL_SIZE, POOL_RESERVED,
		    guarantees[0], guarantees[1], guarantees[2], max_pool_live, max_pool_confirmed,
		    atomic_load(&worst_pool_overshoot));
	if (pooled) {
		long pk = pool_peak();

		printf("chaos: the pool's peak in status: %ld (its room %d)\n", pk,
		    POOL_SIZE - POOL_RESERVED);
		if (pk < 1 || pk > POOL_SIZE - POOL_RESERVED)
			status = 1;
	}
	if (pooled)
		printf("chaos: classes of c0 (ceilings %d/%d, guarantees %d/%d): peak live crit %d "
		    "bulk %d (confirmed open %d/%d), worst class overshoot %d\n", cls_ceiling[0],
		    cls_ceiling[1], cls_guarantee[0], cls_guarantee[1], max_cls_live[0],
		    max_cls_live[1], max_cls_confirmed[0], max_cls_confirmed[1],
		    atomic_load(&worst_class_overshoot));
	if (adaptive)
		printf("chaos: adaptive limits (window 10 ms; controllers %s, %s, %s): %lld checks of "
		    "[min, max], controller and progress, %lld bad; "
		    "%lld windows closed; window closer started %lld times, SIGKILLed %lld times\n",
		    algs[0], algs[1], algs[2],
		    (long long)atomic_load(&adaptive_checks), (long long)atomic_load(&adaptive_bad),
		    windows_closed, closer_starts, closer_kills);
	printf("chaos: worst overshoot %d (%lld events); in_use after the last exit: %s%s",
	    atomic_load(&worst_overshoot), (long long)atomic_load(&overshoot_events),
	    total < 0 ? "status failed: " : "", shown);
	if (zero_at >= 0)
		printf(" (0 after %lld ms)\n", zero_at - drained_at);
	else
		printf(" (NOT 0 after %d ms)\n", SETTLE_MS);
	if (atomic_load(&worst_overshoot) > 0 || atomic_load(&worst_pool_overshoot) > 0 ||
	    atomic_load(&worst_class_overshoot) > 0 ||
	    zero_at < 0 || crashes > 0 || atomic_load(&adaptive_bad) > 0 ||
	    (adaptive && (atomic_load(&adaptive_checks) == 0 || (!no_kills && closer_kills == 0)))) {
		status = 1;
		if (crashes > 0)
			printf("chaos: %lld processes crashed or failed\n", crashes);
	}
	for (int i = 0; i < CHAOS_COMPS; i++) {
		if (atomic_load(&live_now[i]) != 0) {
			printf("chaos: server c%d still sees %d live connections after every process "
			    "exited\n", i, atomic_load(&live_now[i]));
			status = 1;
		}
	}
	if (k(K_ADMITTED) == 0 || k(K_REFUSED) == 0) {
		printf("chaos: the run admitted %llu and refused %llu: it did not test the limits\n",
		    (unsigned long long)k(K_ADMITTED), (unsigned long long)k(K_REFUSED));
		status = 1;
	}
	fflush(stdout);
	show_worker_log();
	printf("chaos: %s\n", status == 0 ? "PASS" : "FAIL");
	if (status == 0)
		unlink(shm);
	else
		printf("chaos: segment kept for inspection: %s\n", shm);
	unlink(cfg_path);
	unlink(stats_path);
	unlink(log_path);
	rmdir(dir);
	return status;
usage:
	fprintf(stderr, "usage: chaos -b BUILD [-t SECONDS] [-p PROCS] [-n THREADS] [-s SEED] "
	    "[-l L0,L1,L2] [-P] [-K] [-D] [-k] [-m] [-A] [-a ALG,ALG,ALG] [-T SOCKETS,PROCESSES] "
	    "[-S]\n");
	return 2;
}

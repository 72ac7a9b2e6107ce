/* chaos_worker.c - one chaos process under the shim: threads doing random socket operations. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chaos.h"

/*
 * usage: chaos_worker STATS PORTS UNTIL_MS SEED THREADS LIFE_MS MODE GEN
 *
 * STATS is the driver's counters file, PORTS "p0,p1,p2,p3" (the three
 * limited servers, then the unmatched one), UNTIL_MS the CLOCK_REALTIME
 * millisecond at which everything stops, LIFE_MS how long this image lives
 * before it exits by itself, MODE "main" or "child" (a forked child that
 * exec'ed: one thread, a short life, no fork or exec), GEN how many execs
 * led to this image.
 *
 * Each thread owns the descriptors in its list and a private range of
 * descriptor numbers (RANGE_BASE + id * RANGE_LEN ...) where it may dup2
 * and close_range without touching another thread's descriptors. Sockets
 * inherited across exec are found in /proc/self/fd and shared out.
 *
 * Nothing here reads from a socket and nothing ever half-closes one: a
 * connection ends with its last descriptor, as the driver's witness expects.
 */

#define HELD_MAX	10
#define RANGE_BASE	1000
#define RANGE_LEN	32
#define MAX_THREADS	32
#define CONNECT_WAIT_MS	300

struct thr {
	pthread_t tid;
	int id;
	uint64_t rng;
	int held[HELD_MAX + RANGE_LEN];
	int nheld;
	int lo, hi;		/* this thread's own descriptor numbers */
};

static struct chaos_stats *stats;
static struct sockaddr_in servers[CHAOS_SERVERS];
/* CHAOS_SRC: the source address of every socket (the driver tells a
 * worker's class by it). */
static struct sockaddr_in src;
static bool have_src;
static long long until_ms, life_end_ms, image_start_ms;
static int nthreads, gen;
static bool child_mode;
static char **self_argv;
static char self_path[4096];
static struct thr thr[MAX_THREADS];
static _Atomic int execing;

static void
count(enum chaos_counter k)
{
	if (stats != NULL) {
		atomic_fetch_add_explicit(&stats->n[k], 1, memory_order_relaxed);
		if (k != K_OPS && k != K_ADOPTED && k != K_WORKER_START && k != K_EXIT &&
		    k != K_UNDERSCORE_EXIT)
			atomic_fetch_add_explicit(&stats->n[K_OPS], 1, memory_order_relaxed);
	}
}

/* xorshift64*: good enough, and the same sequence for the same seed. */
static uint64_t
rnd(struct thr *t)
{
	t->rng ^= t->rng >> 12;
	t->rng ^= t->rng << 25;
	t->rng ^= t->rng >> 27;
	return t->rng * 2685821657736338717ULL;
}

static unsigned
pick(struct thr *t, unsigned n)
{
	return (unsigned)(rnd(t) % n);
}

static void
sleep_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static bool
is_held(const struct thr *t, int fd)
{
	for (int i = 0; i < t->nheld; i++) {
		if (t->held[i] == fd)
			return true;
	}
	return false;
}

static void
push(struct thr *t, int fd)
{
	if (t->nheld < (int)(sizeof(t->held) / sizeof(t->held[0])) && !is_held(t, fd))
		t->held[t->nheld++] = fd;
}

static int
take_at(struct thr *t, int i)
{
	int fd = t->held[i];

	t->held[i] = t->held[--t->nheld];
	return fd;
}

static void
close_one(struct thr *t)
{
	if (t->nheld > 0) {
		close(take_at(t, (int)pick(t, (unsigned)t->nheld)));
		count(K_CLOSE);
	}
}

/* A number of this thread's range that holds nothing, or -1. */
static int
fresh_number(struct thr *t)
{
	for (int tries = 0; tries < 8; tries++) {
		int n = t->lo + (int)pick(t, RANGE_LEN);

		if (!is_held(t, n))
			return n;
	}
	return -1;
}

static bool no_early_inherit;
static pthread_rwlock_t connect_lock = PTHREAD_RWLOCK_INITIALIZER;
static void connect_locked(struct thr *t, bool nonblock);

/*
 * One connect, blocking or not, to a random server. A fork() by another
 * thread between socket() and connect() gives the child a socket the
 * parent then connects: the connection is open in both processes, and the
 * shim, which took the permit in the parent, cannot know about the child's
 * copy. With CHAOS_DISABLE=inherit-unconnected that window is closed.
 */
static void
op_connect(struct thr *t, bool nonblock)
{
	if (no_early_inherit)
		pthread_rwlock_rdlock(&connect_lock);
	connect_locked(t, nonblock);
	if (no_early_inherit)
		pthread_rwlock_unlock(&connect_lock);
}

static void
connect_locked(struct thr *t, bool nonblock)
{
	unsigned srv = pick(t, 4) == 0 ? CHAOS_COMPS : pick(t, CHAOS_COMPS);
	int type = SOCK_STREAM | (pick(t, 2) ? SOCK_CLOEXEC : 0) | (nonblock ? SOCK_NONBLOCK : 0);
	struct timeval tv = { 0, CONNECT_WAIT_MS * 1000 };
	int fd, r, err = 0;
	socklen_t elen = sizeof(err);

	while (t->nheld >= HELD_MAX)
		close_one(t);
	fd = socket(AF_INET, type, 0);
	if (fd < 0)
		return;
	if (have_src)
		bind(fd, (struct sockaddr *)&src, sizeof(src));
	/* A blocking connect waits at most this long, even if the driver's
	 * accept queue ever overflowed. */
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	count(nonblock ? K_CONNECT_NB : K_CONNECT);
	r = connect(fd, (struct sockaddr *)&servers[srv], sizeof(servers[srv]));
	if (r < 0 && errno == EINPROGRESS && nonblock) {
		struct pollfd p = { .fd = fd, .events = POLLOUT };

		if (pick(t, 4) == 0) {
			close(fd);
			count(K_ABANDONED);
			return;
		}
		if (poll(&p, 1, CONNECT_WAIT_MS) == 1 &&
		    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) == 0 && err == 0)
			r = 0;
		else
			errno = err != 0 ? err : ETIMEDOUT;
	}
	if (r == 0) {
		push(t, fd);
		count(srv == CHAOS_COMPS ? K_UNMATCHED : K_ADMITTED);
		return;
	}
	count(errno == ECONNREFUSED ? K_REFUSED : K_CONNECT_ERR);
	close(fd);
}

static void
op_write(struct thr *t)
{
	if (t->nheld > 0) {
		(void)!send(t->held[pick(t, (unsigned)t->nheld)], "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
		count(K_WRITE);
	}
}

static void
op_dup(struct thr *t)
{
	int fd;

	if (t->nheld == 0 || t->nheld >= HELD_MAX + RANGE_LEN / 2)
		return;
	fd = dup(t->held[pick(t, (unsigned)t->nheld)]);
	if (fd >= 0) {
		push(t, fd);
		count(K_DUP);
	}
}

/* dup2 onto another socket of ours (a counted one loses a holder) or onto
 * a free number of our range. */
static void
op_dup2(struct thr *t)
{
	int a, b;

	if (t->nheld == 0)
		return;
	a = t->held[pick(t, (unsigned)t->nheld)];
	if (t->nheld > 1 && pick(t, 2)) {
		b = t->held[pick(t, (unsigned)t->nheld)];
		if (a != b && dup2(a, b) == b)
			count(K_DUP2);
		return;
	}
	b = fresh_number(t);
	if (b >= 0 && dup2(a, b) == b) {
		push(t, b);
		count(K_DUP2_FRESH);
	}
}

static void
op_dup3(struct thr *t)
{
	int a, b;

	if (t->nheld == 0)
		return;
	a = t->held[pick(t, (unsigned)t->nheld)];
	b = pick(t, 2) && t->nheld > 1 ? t->held[pick(t, (unsigned)t->nheld)] : fresh_number(t);
	if (b < 0 || a == b)
		return;
	if (dup3(a, b, pick(t, 2) ? O_CLOEXEC : 0) == b) {
		push(t, b);
		count(K_DUP3);
	}
}

static void
op_dupfd(struct thr *t)
{
	int fd;

	if (t->nheld == 0 || t->nheld >= HELD_MAX + RANGE_LEN / 2)
		return;
	fd = fcntl(t->held[pick(t, (unsigned)t->nheld)], pick(t, 2) ? F_DUPFD_CLOEXEC : F_DUPFD, 3);
	if (fd >= 0) {
		push(t, fd);
		count(K_DUPFD);
	}
}

/* close_range over part of our own range. */
static void
op_close_range(struct thr *t)
{
	int x = t->lo + (int)pick(t, RANGE_LEN), y = x + (int)pick(t, RANGE_LEN);

	if (y > t->hi)
		y = t->hi;
	if (close_range((unsigned)x, (unsigned)y, 0) < 0)
		return;
	for (int i = 0; i < t->nheld;) {
		if (t->held[i] >= x && t->held[i] <= y)
			take_at(t, i);
		else
			i++;
	}
	count(K_CLOSE_RANGE);
}

static void
end_process(struct thr *t, int status)
{
	if (pick(t, 5) == 0) {
		count(K_UNDERSCORE_EXIT);
		_exit(status);
	}
	count(K_EXIT);
	exit(status);
}

/* The argv of a new image: same servers and deadline, new seed and life. */
static void
next_argv(struct thr *t, char **argv, char bufs[4][32], const char *mode, long life_ms)
{
	snprintf(bufs[0], sizeof(bufs[0]), "%llu", (unsigned long long)(rnd(t) >> 1));
	snprintf(bufs[1], sizeof(bufs[1]), "%ld", life_ms);
	snprintf(bufs[2], sizeof(bufs[2]), "%s", mode);
	snprintf(bufs[3], sizeof(bufs[3]), "%d", gen + 1);
	argv[0] = self_argv[0];
	argv[1] = self_argv[1];
	argv[2] = self_argv[2];
	argv[3] = self_argv[3];
	argv[4] = bufs[0];
	argv[5] = self_argv[5];
	argv[6] = bufs[1];
	argv[7] = bufs[2];
	argv[8] = bufs[3];
	argv[9] = NULL;
}

/* A forked child keeps, uses or closes what it inherited, then exits or
 * execs a short-lived worker image; the parent waits for it. */
static void
op_fork(struct thr *t)
{
	char bufs[4][32], *argv[10];
	unsigned what = pick(t, 5);
	long nap = 2 + (long)pick(t, 40);
	pid_t pid;
	int st;

	if (child_mode)
		return;
	next_argv(t, argv, bufs, "child", 5 + (long)pick(t, 60));
	if (no_early_inherit)
		pthread_rwlock_wrlock(&connect_lock);
	pid = fork();
	if (no_early_inherit && pid != 0)
		pthread_rwlock_unlock(&connect_lock);
	if (pid < 0)
		return;
	if (pid > 0) {
		count(K_FORK);
		while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
			;
		return;
	}
	switch (what) {
	case 0:
		while (t->nheld > 0)
			close(take_at(t, 0));
		break;
	case 1:
		for (int i = 0; i < t->nheld; i++)
			(void)!send(t->held[i], "y", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
		break;
	case 2:
		sleep_ms(nap);
		break;
	default:
		count(K_CHILD_EXEC);
		execv(self_path, argv);
		_exit(127);
	}
	end_process(t, 0);
}

/* With the kernel engine only (CHAOS_SCM set; the shim cannot follow a
 * socket handed over a Unix socket): a forked child that closed everything
 * it inherited receives one of our sockets with SCM_RIGHTS, while we may
 * close our copy; the child holds it a moment and exits, so the connection
 * ends with its last holder, in another process. */
static bool pass_on;

static void
op_pass(struct thr *t)
{
	char cbuf[CMSG_SPACE(sizeof(int))], byte = 'p';
	struct iovec iov = { &byte, 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			     .msg_controllen = sizeof(cbuf) };
	long nap = 1 + (long)pick(t, 30);
	int sv[2], i, st;
	pid_t pid;

	if (child_mode || t->nheld == 0 ||
	    socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return;
	pid = fork();
	if (pid < 0) {
		close(sv[0]);
		close(sv[1]);
		return;
	}
	if (pid == 0) {
		close_range(3, (unsigned)sv[1] - 1, 0);
		close_range((unsigned)sv[1] + 1, ~0u, 0);
		if (recvmsg(sv[1], &mh, MSG_CMSG_CLOEXEC) == 1)
			sleep_ms(nap);
		_exit(0);
	}
	close(sv[1]);
	i = (int)pick(t, (unsigned)t->nheld);
	memset(cbuf, 0, sizeof(cbuf));
	CMSG_FIRSTHDR(&mh)->cmsg_level = SOL_SOCKET;
	CMSG_FIRSTHDR(&mh)->cmsg_type = SCM_RIGHTS;
	CMSG_FIRSTHDR(&mh)->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(CMSG_FIRSTHDR(&mh)), &t->held[i], sizeof(int));
	if (sendmsg(sv[0], &mh, MSG_NOSIGNAL) == 1) {
		count(K_PASS);
		if (pick(t, 2))
			close(take_at(t, i));
	}
	close(sv[0]);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
}

/*
 * With -S (CHAOS_SPAWN set): children made without fork(), as CPython's
 * subprocess, Java and glibc's posix_spawn make them. The child inherits
 * every socket of this process that is not close-on-exec (and, through a
 * file action, one that is), and either execs a short-lived worker image
 * under the shim (which adopts, uses and closes what it inherited), or
 * sleep for up to 40 ms with or without the shim (which keeps it all until
 * it exits), or, made by vfork, closes some of this thread's sockets in its
 * own table and exits. Meanwhile the parent closes some of its copies, which
 * the child may still have, and then waits for it.
 */
static bool spawn_on;
static char **bare_env;		/* environ without LD_PRELOAD */
extern char **environ;

static void
spawn_setup(void)
{
	int n = 0, k = 0;

	spawn_on = getenv("CHAOS_SPAWN") != NULL;
	if (!spawn_on)
		return;
	while (environ[n] != NULL)
		n++;
	bare_env = calloc((size_t)n + 1, sizeof(char *));
	if (bare_env == NULL) {
		spawn_on = false;
		return;
	}
	for (int i = 0; i < n; i++) {
		if (strncmp(environ[i], "LD_PRELOAD=", 11) != 0)
			bare_env[k++] = environ[i];
	}
}

/* The vfork child: shares our memory, so it only closes, execs or exits. */
static void
vfork_child(unsigned what, const int *closing, int nclose, char **argv, char **sleep_argv)
{
	for (int i = 0; i < nclose; i++)
		close(closing[i]);
	if (what == 2)
		execv(self_path, argv);
	else if (what == 3)
		execve("/bin/sleep", sleep_argv, bare_env);
	_exit(0);
}

static void
op_spawn(struct thr *t)
{
	char bufs[4][32], *argv[10], nap[16];
	char *sleep_argv[] = { "sleep", nap, NULL };
	int closing[HELD_MAX + RANGE_LEN], nclose = 0, st, err = 0, b;
	unsigned what = pick(t, 6);
	posix_spawn_file_actions_t fa;
	pid_t pid = -1;

	if (child_mode)
		return;
	snprintf(nap, sizeof(nap), "0.0%02u", 1 + pick(t, 40));
	next_argv(t, argv, bufs, "child", 5 + (long)pick(t, 60));
	for (int i = 0; i < t->nheld; i++) {
		if (pick(t, 3) == 0)
			closing[nclose++] = t->held[i];
	}
	switch (what) {
	case 0:
		err = posix_spawn(&pid, self_path, NULL, NULL, argv, environ);
		break;
	case 1:
		/* sleep without the shim: some of our sockets closed in the
		 * child, one (close-on-exec or not) copied to a free number. */
		if (posix_spawn_file_actions_init(&fa) != 0)
			return;
		/* The copy first: its source may be one of those closed. */
		if (t->nheld > 0 && (b = fresh_number(t)) >= 0)
			posix_spawn_file_actions_adddup2(&fa, t->held[pick(t, (unsigned)t->nheld)], b);
		for (int i = 0; i < nclose; i++)
			posix_spawn_file_actions_addclose(&fa, closing[i]);
		err = posix_spawnp(&pid, "sleep", &fa, NULL, sleep_argv, bare_env);
		posix_spawn_file_actions_destroy(&fa);
		break;
	case 5:
		err = posix_spawn(&pid, "/bin/sleep", NULL, NULL, sleep_argv, environ);
		break;
	default:
		pid = vfork();
		if (pid == 0)
			vfork_child(what, closing, nclose, argv, sleep_argv);
		break;
	}
	if (err != 0 || pid < 0) {
		fprintf(stderr, "chaos_worker: spawn %u failed: %s\n", what,
		    strerror(err != 0 ? err : errno));
		return;
	}
	count(K_SPAWN);
	for (int i = 0; i < t->nheld;) {
		if (pick(t, 3) == 0) {
			close(take_at(t, i));
			count(K_CLOSE);
		} else {
			i++;
		}
	}
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
}

/* The whole process execs a new image of itself; some of this thread's
 * sockets lose close-on-exec so that they live on in it. */
static void
op_exec(struct thr *t)
{
	char bufs[4][32], *argv[10];
	int expected = 0;

	if (child_mode || gen >= 40 || chaos_now_ms() - image_start_ms < 300)
		return;
	if (!atomic_compare_exchange_strong(&execing, &expected, 1))
		return;
	for (int i = 0; i < t->nheld; i++) {
		if (pick(t, 2))
			fcntl(t->held[i], F_SETFD, 0);
	}
	next_argv(t, argv, bufs, "main", 300 + (long)pick(t, 2500));
	count(K_EXEC);
	execv(self_path, argv);
	atomic_store(&execing, 0);
}

/* CHAOS_DISABLE=fork,exec,dup,range,nonblock turns operations off, to
 * find which one a failure needs; "inherit-unconnected" keeps fork() away
 * from sockets that are made but not yet connected (see op_connect). */
static bool no_fork, no_exec, no_dup, no_range, no_nonblock;

static void
read_disabled(void)
{
	const char *d = getenv("CHAOS_DISABLE");

	if (d == NULL)
		return;
	no_fork = strstr(d, "fork") != NULL;
	no_exec = strstr(d, "exec") != NULL;
	no_dup = strstr(d, "dup") != NULL;
	no_range = strstr(d, "range") != NULL;
	no_nonblock = strstr(d, "nonblock") != NULL;
	no_early_inherit = strstr(d, "inherit-unconnected") != NULL;
}

static void
one_op(struct thr *t)
{
	unsigned r = pick(t, 1000);

	if ((no_dup && r >= 640 && r < 870) || (no_range && r >= 870 && r < 900) ||
	    (no_fork && r >= 900 && r < 912) || (no_exec && r >= 912 && r < 915))
		r = 500;	/* a close instead */
	if (no_nonblock && r >= 200 && r < 330)
		r = 0;
	if (r < 200)
		op_connect(t, false);
	else if (r < 330)
		op_connect(t, true);
	else if (r < 560)
		close_one(t);
	else if (r < 640)
		op_write(t);
	else if (r < 700)
		op_dup(t);
	else if (r < 780)
		op_dup2(t);
	else if (r < 830)
		op_dup3(t);
	else if (r < 870)
		op_dupfd(t);
	else if (r < 900)
		op_close_range(t);
	else if (r < 912)
		op_fork(t);
	else if (r < 915)
		op_exec(t);
	else if (r < 925 && pass_on)
		op_pass(t);
	else if (r >= 925 && r < 937 && spawn_on)
		op_spawn(t);
	else
		sleep_ms((long)pick(t, 3));
}

static void *
thread_main(void *arg)
{
	struct thr *t = arg;

	while (!atomic_load(&execing)) {
		long long now = chaos_now_ms();

		if (now >= until_ms || now >= life_end_ms)
			break;
		one_op(t);
	}
	return NULL;
}

/* Sockets that survived an exec: each goes to the thread whose range it
 * is in, or round robin; what does not fit is closed. */
static void
adopt_inherited(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int next = 0;

	if (d == NULL)
		return;
	while ((e = readdir(d)) != NULL) {
		struct stat st;
		int fd = atoi(e->d_name), owner;

		if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd < 3 || fd == dirfd(d))
			continue;
		if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
			continue;
		if (fd >= RANGE_BASE && fd < RANGE_BASE + nthreads * RANGE_LEN)
			owner = (fd - RANGE_BASE) / RANGE_LEN;
		else
			owner = next++ % nthreads;
		if (thr[owner].nheld < HELD_MAX + RANGE_LEN / 2) {
			push(&thr[owner], fd);
			count(K_ADOPTED);
		} else {
			close(fd);
		}
	}
	closedir(d);
}

static int
parse_ports(const char *s)
{
	for (int i = 0; i < CHAOS_SERVERS; i++) {
		char *end;
		long p = strtol(s, &end, 10);

		if (p <= 0 || p > 65535 || (i < CHAOS_SERVERS - 1 ? *end != ',' : *end != '\0'))
			return -1;
		memset(&servers[i], 0, sizeof(servers[i]));
		servers[i].sin_family = AF_INET;
		servers[i].sin_port = htons((uint16_t)p);
		servers[i].sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		s = end + 1;
	}
	return 0;
}

static void
map_stats(const char *path)
{
	int fd = open(path, O_RDWR | O_CLOEXEC);
	void *p;

	if (fd < 0) {
		fprintf(stderr, "chaos_worker: %s: %s\n", path, strerror(errno));
		_exit(2);
	}
	p = mmap(NULL, sizeof(*stats), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED || ((struct chaos_stats *)p)->magic != CHAOS_MAGIC) {
		fprintf(stderr, "chaos_worker: %s is not a chaos counters file\n", path);
		_exit(2);
	}
	stats = p;
}

int
main(int argc, char **argv)
{
	struct rlimit rl;
	uint64_t seed;
	ssize_t n;

	if (argc != 9 || parse_ports(argv[2]) < 0) {
		fprintf(stderr, "usage: chaos_worker STATS PORTS UNTIL_MS SEED THREADS LIFE_MS "
		    "MODE GEN\n");
		return 2;
	}
	self_argv = argv;
	n = readlink("/proc/self/exe", self_path, sizeof(self_path) - 1);
	if (n <= 0)
		return 2;
	self_path[n] = '\0';
	map_stats(argv[1]);
	until_ms = atoll(argv[3]);
	seed = strtoull(argv[4], NULL, 10) | 1;
	nthreads = atoi(argv[5]);
	child_mode = strcmp(argv[7], "child") == 0;
	gen = atoi(argv[8]);
	if (child_mode)
		nthreads = 1;
	if (nthreads < 1 || nthreads > MAX_THREADS)
		return 2;
	image_start_ms = chaos_now_ms();
	life_end_ms = image_start_ms + atol(argv[6]);
	/* Room for every thread's range above the ordinary descriptors. */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 4096) {
		rl.rlim_cur = rl.rlim_max < 4096 ? rl.rlim_max : 4096;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	read_disabled();
	pass_on = getenv("CHAOS_SCM") != NULL;
	spawn_setup();
	if (getenv("CHAOS_SRC") != NULL &&
	    inet_pton(AF_INET, getenv("CHAOS_SRC"), &src.sin_addr) == 1) {
		src.sin_family = AF_INET;
		have_src = true;
	}
	count(K_WORKER_START);
	for (int i = 0; i < nthreads; i++) {
		thr[i].id = i;
		thr[i].rng = seed * (uint64_t)(2 * i + 1) + 0x9e3779b97f4a7c15ULL;
		thr[i].lo = RANGE_BASE + i * RANGE_LEN;
		thr[i].hi = thr[i].lo + RANGE_LEN - 1;
	}
	adopt_inherited();
	for (int i = 1; i < nthreads; i++) {
		int e = pthread_create(&thr[i].tid, NULL, thread_main, &thr[i]);

		/* A busy shared machine can run short of threads for a moment:
		 * that is no finding about permits, so wait a little for one. */
		for (int k = 0; e == EAGAIN && k < 50; k++) {
			sleep_ms(10);
			e = pthread_create(&thr[i].tid, NULL, thread_main, &thr[i]);
		}
		if (e != 0) {
			fprintf(stderr, "chaos_worker: pthread_create failed: %s\n", strerror(e));
			_exit(2);
		}
	}
	thread_main(&thr[0]);
	for (int i = 1; i < nthreads; i++)
		pthread_join(thr[i].tid, NULL);
	/* Exit holding whatever is still open: the shim gives it back. */
	end_process(&thr[0], 0);
	return 0;
}

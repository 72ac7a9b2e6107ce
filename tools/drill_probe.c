/* drill_probe.c - a drill's probes: a URL (libcurl) or a shell command, tried at a bounded rate, each attempt timed. */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "drill.h"

/*
 * Open loop, as users arrive: each probe begins an attempt every 1/rate s
 * whether or not the earlier ones have ended, so that a service that hangs
 * shows as failures piling up rather than as a probe that slows down with
 * it. Each attempt runs in a thread of its own and ends within its timeout;
 * at most PROBE_MAX_RUNNING run at once per probe, and an attempt that would
 * pass that is not begun and counts as a failure (the service left that
 * many users waiting).
 */

#define PROBE_MAX_RUNNING	32
#define PROBE_MAX_SAMPLES	(DRILL_MAX_RATE * 3600)	/* an hour at the highest rate */

extern char **environ;

static atomic_bool stopping;

static void
record(struct drill_probe *p, uint64_t start, uint64_t end, bool ok)
{
	pthread_mutex_lock(&p->lock);
	if (p->n == p->cap && p->cap < PROBE_MAX_SAMPLES) {
		size_t cap = p->cap ? p->cap * 2 : 256;
		struct drill_sample *v = realloc(p->samples, cap * sizeof(*v));

		if (v != NULL) {
			p->samples = v;
			p->cap = cap;
		}
	}
	if (p->n < p->cap)
		p->samples[p->n++] = (struct drill_sample){ start, (uint32_t)(end - start), ok };
	pthread_mutex_unlock(&p->lock);
}

static size_t
discard(void *buf, size_t size, size_t n, void *arg)
{
	(void)buf;
	(void)arg;
	return size * n;
}

/* One fetch of the URL: a transfer that completes with a status below 400. */
static bool
try_url(const struct drill_probe *p)
{
	CURL *c = curl_easy_init();
	long status = 0;
	CURLcode r;

	if (c == NULL)
		return false;
	curl_easy_setopt(c, CURLOPT_URL, p->what);
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)p->timeout_ms);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
	curl_easy_setopt(c, CURLOPT_USERAGENT, "bulkshim-drill/" BS_VERSION);
	r = curl_easy_perform(c);
	if (r == CURLE_OK)
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
	curl_easy_cleanup(c);
	return r == CURLE_OK && status > 0 && status < 400;
}

/* One run of the command with sh -c, in a process group of its own (killed
 * whole at the timeout), its output thrown away: exit 0 is success. */
static bool
try_command(const struct drill_probe *p)
{
	char *argv[] = { (char *)"sh", (char *)"-c", p->what, NULL };
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	sigset_t def;
	uint64_t until = now_mono_ms() + p->timeout_ms;
	pid_t pid;
	int st = 0, r;

	if (posix_spawn_file_actions_init(&fa) != 0)
		return false;
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
	posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
	posix_spawnattr_init(&at);
	/* The command gets SIGPIPE back, which the drill ignores. */
	sigemptyset(&def);
	sigaddset(&def, SIGPIPE);
	posix_spawnattr_setsigdefault(&at, &def);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF);
	posix_spawnattr_setpgroup(&at, 0);
	r = posix_spawn(&pid, "/bin/sh", &fa, &at, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&at);
	if (r != 0)
		return false;
	/* Polled: a thread cannot wait for one child with a timeout otherwise. */
	while ((r = (int)waitpid(pid, &st, WNOHANG)) == 0 && now_mono_ms() < until) {
		struct timespec ts = { 0, 5 * 1000 * 1000 };

		nanosleep(&ts, NULL);
	}
	if (r == 0) {
		kill(-pid, SIGKILL);
		waitpid(pid, &st, 0);
		return false;
	}
	return r == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

static void *
attempt(void *arg)
{
	struct drill_probe *p = arg;
	uint64_t start = now_mono_ms();
	bool ok = p->url ? try_url(p) : try_command(p);

	record(p, start, now_mono_ms(), ok);
	pthread_mutex_lock(&p->lock);
	p->running--;
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

/* The probe's schedule: an attempt every 1/rate s, in a detached thread. */
static void *
schedule(void *arg)
{
	struct drill_probe *p = arg;
	uint64_t step_ns = 1000000000ULL / p->rate;
	struct timespec next;

	clock_gettime(CLOCK_MONOTONIC, &next);
	while (!atomic_load(&stopping)) {
		pthread_attr_t at;
		pthread_t t;
		bool begin;

		pthread_mutex_lock(&p->lock);
		begin = p->running < PROBE_MAX_RUNNING;
		if (begin)
			p->running++;
		else
			p->skipped++;
		pthread_mutex_unlock(&p->lock);
		if (!begin) {
			uint64_t now = now_mono_ms();

			record(p, now, now, false);
		} else {
			pthread_attr_init(&at);
			pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
			pthread_attr_setstacksize(&at, 256 * 1024);
			if (pthread_create(&t, &at, attempt, p) != 0) {
				pthread_mutex_lock(&p->lock);
				p->running--;
				pthread_mutex_unlock(&p->lock);
			}
			pthread_attr_destroy(&at);
		}
		next.tv_nsec += (long)step_ns;
		while (next.tv_nsec >= 1000000000L) {
			next.tv_nsec -= 1000000000L;
			next.tv_sec++;
		}
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR)
			;
	}
	return NULL;
}

int
drill_probes_start(struct drill_probe *probes, size_t n)
{
	atomic_store(&stopping, false);
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		struct drill_probe *p = &probes[i];
		int r;

		if ((r = pthread_create(&p->thread, NULL, schedule, p)) != 0) {
			drill_probes_stop(probes, i);
			return -r;
		}
		p->started = true;
	}
	return 0;
}

void
drill_probes_stop(struct drill_probe *probes, size_t n)
{
	uint64_t until = 0;

	atomic_store(&stopping, true);
	for (size_t i = 0; i < n; i++) {
		if (probes[i].started)
			pthread_join(probes[i].thread, NULL);
		if (probes[i].timeout_ms + 1000 > until)
			until = probes[i].timeout_ms + 1000;
	}
	/* Every attempt ends within its timeout; a second more for curl. */
	until += now_mono_ms();
	for (size_t i = 0; i < n; i++) {
		for (;;) {
			uint32_t left;

			pthread_mutex_lock(&probes[i].lock);
			left = probes[i].running;
			pthread_mutex_unlock(&probes[i].lock);
			if (left == 0 || now_mono_ms() >= until)
				break;
			usleep(10 * 1000);
		}
	}
}

void
drill_probes_free(struct drill_probe *probes, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		pthread_mutex_lock(&probes[i].lock);
		free(probes[i].samples);
		probes[i].samples = NULL;
		probes[i].n = probes[i].cap = 0;
		pthread_mutex_unlock(&probes[i].lock);
	}
}

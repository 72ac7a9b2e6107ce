/* racer.c - N threads released together by a barrier each connect once and hold, to test exact admission. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/*
 * usage: racer HOST PORT NTHREADS [START_MS]
 *
 * Every thread makes its socket first, then all wait on one barrier and call
 * connect() at the same moment. With START_MS (CLOCK_REALTIME milliseconds)
 * the barrier opens at that instant, so that racers in several processes
 * start together. Prints "ok=N refused=N other=N" (and "errno=E" for each
 * unexpected failure), then holds every connection until stdin is closed.
 */

#define MAX_THREADS 1024

static struct sockaddr_in addr;
static pthread_barrier_t barrier;
static long long start_ms;
static int results[MAX_THREADS];
static int fds[MAX_THREADS];

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void *racer(void *arg)
{
	int i = (int)(long)arg;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0) {
		results[i] = errno;
		pthread_barrier_wait(&barrier);
		return NULL;
	}
	if (i == 0 && start_ms > 0) {
		/* Thread 0 holds the barrier shut until the agreed instant. */
		while (now_ms() < start_ms)
			usleep(200);
	}
	pthread_barrier_wait(&barrier);
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0) {
		results[i] = 0;
		fds[i] = fd;
	} else {
		results[i] = errno;
		fds[i] = -1;
		close(fd);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t th[MAX_THREADS];
	int n, i, ok = 0, refused = 0, other = 0;
	char buf[64];

	if (argc < 4) {
		fprintf(stderr, "usage: racer HOST PORT NTHREADS [START_MS]\n");
		return 2;
	}
	memset(&addr, 0, sizeof(addr));
	addr.sin_family = AF_INET;
	addr.sin_port = htons((uint16_t)atoi(argv[2]));
	if (inet_pton(AF_INET, argv[1], &addr.sin_addr) != 1) {
		fprintf(stderr, "racer: bad address %s\n", argv[1]);
		return 2;
	}
	n = atoi(argv[3]);
	if (n < 1 || n > MAX_THREADS) {
		fprintf(stderr, "racer: bad thread count %s\n", argv[3]);
		return 2;
	}
	if (argc > 4)
		start_ms = atoll(argv[4]);
	pthread_barrier_init(&barrier, NULL, (unsigned)n);
	for (i = 0; i < n; i++) {
		if (pthread_create(&th[i], NULL, racer, (void *)(long)i) != 0) {
			fprintf(stderr, "racer: pthread_create failed\n");
			return 2;
		}
	}
	for (i = 0; i < n; i++)
		pthread_join(th[i], NULL);
	for (i = 0; i < n; i++) {
		if (results[i] == 0)
			ok++;
		else if (results[i] == ECONNREFUSED)
			refused++;
		else
			other++;
	}
	printf("ok=%d refused=%d other=%d", ok, refused, other);
	for (i = 0; i < n; i++)
		if (results[i] != 0 && results[i] != ECONNREFUSED)
			printf(" errno=%d", results[i]);
	printf("\n");
	fflush(stdout);
	while (fgets(buf, sizeof(buf), stdin))
		;
	for (i = 0; i < n; i++)
		if (results[i] == 0)
			close(fds[i]);
	return 0;
}

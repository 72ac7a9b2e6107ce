/* fdtable.c - descriptor -> counted socket, a flat array read with atomic loads. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

/*
 * One 32-bit entry per possible descriptor, holding the segment slot + 1 of
 * the counted socket, or 0. The table is sized once for the largest
 * descriptor the kernel can hand out (/proc/sys/fs/nr_open, which bounds
 * every RLIMIT_NOFILE) and mapped with MAP_NORESERVE: untouched pages cost
 * nothing, and the hot path is a bounds check and one load.
 */
#define FDT_DEFAULT	(1u << 20)
#define FDT_CAP		(1u << 24)

static _Atomic(_Atomic uint32_t *) fdt;
static uint32_t fdt_size;
static _Atomic int fdt_high_water;

/* One bit per descriptor: a stream socket made by socket() that a fork may
 * share before it is connected (interpose.c). Stale bits are harmless:
 * fork checks each descriptor before acting on it. */
static _Atomic uint64_t *fresh;
static _Atomic int fresh_high;

/* Reads /proc/sys/fs/nr_open with raw system calls (init runs before
 * anything else is safe to use); returns 0 if unknown. */
static uint32_t
read_nr_open(void)
{
	char buf[32];
	long n, fd;
	uint32_t v = 0;

	fd = syscall(SYS_openat, AT_FDCWD, "/proc/sys/fs/nr_open", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = syscall(SYS_read, fd, buf, sizeof(buf) - 1);
	syscall(SYS_close, fd);
	for (long i = 0; i < n && buf[i] >= '0' && buf[i] <= '9'; i++)
		v = v * 10 + (uint32_t)(buf[i] - '0');
	return v;
}

int
fdt_init(void)
{
	uint32_t n = read_nr_open();
	struct rlimit rl;
	void *p;

	if (fdt != NULL)
		return 0;
	if (n == 0)
		n = FDT_DEFAULT;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max != RLIM_INFINITY &&
	    rl.rlim_max > n)
		n = (uint32_t)(rl.rlim_max < FDT_CAP ? rl.rlim_max : FDT_CAP);
	if (n > FDT_CAP)
		n = FDT_CAP;
	p = mmap(NULL, (size_t)n * sizeof(*fdt), PROT_READ | PROT_WRITE,
	    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return -errno;
	fresh = mmap(NULL, ((size_t)n + 63) / 64 * sizeof(*fresh), PROT_READ | PROT_WRITE,
	    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (fresh == MAP_FAILED) {
		int e = errno;

		munmap(p, (size_t)n * sizeof(*fdt));
		fresh = NULL;
		return -e;
	}
	fdt_size = n;
	atomic_store_explicit(&fdt, p, memory_order_release);
	return 0;
}

bool
fdt_valid(int fd)
{
	return fd >= 0 && (uint32_t)fd < fdt_size && fdt != NULL;
}

uint32_t
fdt_get(int fd)
{
	_Atomic uint32_t *t = atomic_load_explicit(&fdt, memory_order_acquire);

	if (t == NULL || fd < 0 || (uint32_t)fd >= fdt_size)
		return 0;
	return atomic_load_explicit(&t[fd], memory_order_acquire);
}

uint32_t
fdt_set(int fd, uint32_t slot)
{
	int high;

	if (!fdt_valid(fd))
		return 0;
	high = atomic_load(&fdt_high_water);
	while (fd >= high && !atomic_compare_exchange_weak(&fdt_high_water, &high, fd + 1))
		;
	return atomic_exchange(&fdt[fd], slot + 1);
}

uint32_t
fdt_take(int fd)
{
	if (!fdt_valid(fd) || atomic_load_explicit(&fdt[fd], memory_order_relaxed) == 0)
		return 0;
	return atomic_exchange(&fdt[fd], 0);
}

int
fdt_high(void)
{
	return atomic_load(&fdt_high_water);
}

void
fdt_mark_fresh(int fd)
{
	int high;

	if (!fdt_valid(fd) || fresh == NULL)
		return;
	high = atomic_load(&fresh_high);
	while (fd >= high && !atomic_compare_exchange_weak(&fresh_high, &high, fd + 1))
		;
	atomic_fetch_or(&fresh[fd / 64], 1ULL << (fd % 64));
}

void
fdt_clear_fresh(int fd)
{
	uint64_t m = 1ULL << (fd % 64);

	if (fdt_valid(fd) && fresh != NULL && (atomic_load(&fresh[fd / 64]) & m))
		atomic_fetch_and(&fresh[fd / 64], ~m);
}

int
fdt_next_fresh(int fd)
{
	int high = atomic_load(&fresh_high);

	if (fresh == NULL || fd < 0)
		return -1;
	for (; fd < high; fd++) {
		uint64_t w = atomic_load(&fresh[fd / 64]) >> (fd % 64);

		if (w == 0) {
			fd |= 63;
			continue;
		}
		fd += __builtin_ctzll(w);
		return fd < high ? fd : -1;
	}
	return -1;
}

bool
fdt_take_if(int fd, uint32_t e)
{
	return fdt_valid(fd) && e != 0 && atomic_compare_exchange_strong(&fdt[fd], &e, 0);
}

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
 * One 64-bit entry per possible descriptor: the segment slot + 1 of the
 * counted socket (or 0) in the low half, and in the high half the I/O
 * verdict cached for it (FDT_PLAIN | settings sequence, or 0). The table is
 * sized once for the largest descriptor the kernel can hand out
 * (/proc/sys/fs/nr_open, which bounds every RLIMIT_NOFILE) and mapped with
 * MAP_NORESERVE: untouched pages cost nothing, and the hot path is a bounds
 * check and one load (fdt_entry in shim.h).
 */
#define FDT_DEFAULT	(1u << 20)
#define FDT_CAP		(1u << 24)

/* Until the segment is attached, the sequence is this word's 0: no entry
 * carries a verdict before then. */
static _Atomic uint32_t no_seq;
struct fdt_tab fdt_tab = { NULL, 0, &no_seq };
_Atomic int fdt_high_water;

/* One bit per descriptor: a stream socket made by socket() that a fork may
 * share before it is connected (interpose.c). Stale bits are harmless:
 * fork checks each descriptor before acting on it. */
_Atomic uint64_t *fdt_fresh;
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
	_Atomic uint64_t *fresh;
	void *p;

	if (fdt_tab.t != NULL)
		return 0;
	if (n == 0)
		n = FDT_DEFAULT;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max != RLIM_INFINITY &&
	    rl.rlim_max > n)
		n = (uint32_t)(rl.rlim_max < FDT_CAP ? rl.rlim_max : FDT_CAP);
	if (n > FDT_CAP)
		n = FDT_CAP;
	p = mmap(NULL, (size_t)n * sizeof(*fdt_tab.t), PROT_READ | PROT_WRITE,
	    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return -errno;
	fresh = mmap(NULL, ((size_t)n + 63) / 64 * sizeof(*fresh), PROT_READ | PROT_WRITE,
	    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (fresh == MAP_FAILED) {
		int e = errno;

		munmap(p, (size_t)n * sizeof(*fdt_tab.t));
		return -e;
	}
	fdt_fresh = fresh;
	/* The table goes first: a reader that sees a size sees the table. */
	fdt_tab.t = p;
	atomic_store_explicit(&fdt_tab.size, n, memory_order_release);
	return 0;
}

void
fdt_set_seq(_Atomic uint32_t *seq)
{
	fdt_tab.seq = seq != NULL ? seq : &no_seq;
}

uint32_t
fdt_set(int fd, uint32_t slot)
{
	return fdt_valid(fd) ? fdt_set_valid(fd, slot) : 0;
}

void
fdt_verdict(int fd, uint64_t was, uint32_t verdict)
{
	uint64_t next = (uint64_t)verdict << 32 | (uint32_t)was;

	/* Only if the entry is still the one the verdict was made for: a
	 * close or a new socket behind the number in between wins. */
	if (fdt_valid(fd) && (uint32_t)was != 0 && next != was)
		atomic_compare_exchange_strong(&fdt_tab.t[fd], &was, next);
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

	if (!fdt_valid(fd) || fdt_fresh == NULL)
		return;
	high = atomic_load_explicit(&fresh_high, memory_order_relaxed);
	while (fd >= high && !atomic_compare_exchange_weak(&fresh_high, &high, fd + 1))
		;
	atomic_fetch_or(&fdt_fresh[fd / 64], 1ULL << (fd % 64));
}

int
fdt_next_fresh(int fd)
{
	int high = atomic_load(&fresh_high);

	if (fdt_fresh == NULL || fd < 0)
		return -1;
	for (; fd < high; fd++) {
		uint64_t w = atomic_load(&fdt_fresh[fd / 64]) >> (fd % 64);

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
	uint64_t w;

	if (!fdt_valid(fd) || e == 0)
		return false;
	/* The verdict half may change under us; only the slot half decides. */
	w = atomic_load(&fdt_tab.t[fd]);
	while ((uint32_t)w == e) {
		if (atomic_compare_exchange_weak(&fdt_tab.t[fd], &w, 0))
			return true;
	}
	return false;
}

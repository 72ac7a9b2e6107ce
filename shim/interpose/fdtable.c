/* fdtable.c - descriptor -> counted socket, a flat array read with atomic loads. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "interpose/fdtable.h"
#include "sys.h"

/*
 * One 64-bit entry per possible descriptor: the segment slot + 1 of the
 * counted socket (or 0) in the low half, and in the high half the I/O
 * verdict cached for it (FDT_PLAIN | settings sequence, or 0); the entry of
 * an uncounted stream socket fresh from socket() is FDT_FRESH. The table is
 * sized once for the largest descriptor the kernel can hand out
 * (/proc/sys/fs/nr_open, which bounds every RLIMIT_NOFILE) and mapped with
 * MAP_NORESERVE: untouched pages cost nothing, and the hot path is a bounds
 * check and one load (fdt_entry below).
 */
#define FDT_DEFAULT	(1u << 20)
#define FDT_CAP		(1u << 24)

/* Until the segment is attached, the sequence is this word's 0: no entry
 * carries a verdict before then. */
static _Atomic uint32_t no_seq;
/* The table: `size` is 0 until the table is mapped; `seq` points to the
 * segment's settings sequence once attached (no_seq before). Addressed
 * directly by every wrapper (hidden, as the whole library is). */
static struct {
	_Atomic uint64_t *t;
	_Atomic uint32_t size;
	_Atomic uint32_t *seq;
} fdt_tab = { NULL, 0, &no_seq };
/* One past the highest fd ever recorded (fdt_high). */
static _Atomic int fdt_high_water;

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wattributes"
BS_LTO_INLINE bool
fdt_valid(int fd)
{
	return fd >= 0 && (uint32_t)fd < atomic_load_explicit(&fdt_tab.size, memory_order_acquire);
}

BS_LTO_INLINE uint64_t
fdt_entry_valid(int fd)
{
	return atomic_load_explicit(&fdt_tab.t[fd], memory_order_relaxed);
}

BS_LTO_INLINE uint64_t
fdt_entry(int fd)
{
	if ((unsigned)fd >= atomic_load_explicit(&fdt_tab.size, memory_order_acquire))
		return 0;
	return fdt_entry_valid(fd);
}

BS_LTO_INLINE uint32_t
fdt_get(int fd)
{
	return (uint32_t)fdt_entry(fd);
}

BS_LTO_INLINE bool
fdt_plain(uint64_t e)
{
	return (uint32_t)(e >> 32) ==
	    (FDT_PLAIN | atomic_load_explicit(fdt_tab.seq, memory_order_acquire));
}

BS_LTO_INLINE void
fdt_raise_high(int fd)
{
	int high = atomic_load_explicit(&fdt_high_water, memory_order_relaxed);

	while (fd >= high && !atomic_compare_exchange_weak(&fdt_high_water, &high, fd + 1))
		;
}

BS_LTO_INLINE uint32_t
fdt_set_valid(int fd, uint32_t slot)
{
	fdt_raise_high(fd);
	return (uint32_t)atomic_exchange(&fdt_tab.t[fd], (uint64_t)slot + 1);
}

BS_LTO_INLINE uint32_t
fdt_take_counted(int fd)
{
	return (uint32_t)atomic_exchange(&fdt_tab.t[fd], 0);
}

BS_LTO_INLINE uint32_t
fdt_take(int fd)
{
	if (fdt_entry(fd) == 0)
		return 0;
	return fdt_take_counted(fd);
}

BS_LTO_INLINE uint32_t
fdt_seq(void)
{
	return atomic_load_explicit(fdt_tab.seq, memory_order_acquire);
}

BS_LTO_INLINE uint64_t
fdt_entry_sync(int fd)
{
	return atomic_load(&fdt_tab.t[fd]);
}
#pragma GCC diagnostic pop

/* Reads /proc/sys/fs/nr_open with raw system calls (init runs before
 * anything else is safe to use); returns 0 if unknown. */
static uint32_t
read_nr_open(void)
{
	char buf[32];
	long n = sys_read_small("/proc/sys/fs/nr_open", buf, sizeof(buf));
	uint32_t v = 0;

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
	uint64_t none = 0;

	if (!fdt_valid(fd))
		return;
	/* Within the high-water mark, which bounds fork's search for them. */
	fdt_raise_high(fd);
	/* Only over an empty entry (an uncounted one is 0 or already fresh):
	 * in a vfork child, which shares our memory but not our descriptors,
	 * the number may be a counted socket of the parent's, whose entry
	 * must stay. */
	atomic_compare_exchange_strong(&fdt_tab.t[fd], &none, FDT_FRESH);
}

void
fdt_clear_fresh(int fd)
{
	uint64_t w = FDT_FRESH;

	if (fdt_valid(fd) && fdt_entry_valid(fd) == w)
		atomic_compare_exchange_strong(&fdt_tab.t[fd], &w, 0);
}

uint32_t
fdt_unclaim(int fd, bool fresh)
{
	if (!fdt_valid(fd))
		return 0;
	return (uint32_t)atomic_exchange(&fdt_tab.t[fd], fresh ? FDT_FRESH : 0);
}

int
fdt_next_fresh(int fd)
{
	int high = fdt_high();

	for (fd = fd < 0 ? 0 : fd; fd < high; fd++) {
		if (fdt_entry_valid(fd) == FDT_FRESH)
			return fd;
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

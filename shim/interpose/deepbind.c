/* deepbind.c - libraries loaded with RTLD_DEEPBIND reach the shim's wrappers after all. */
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "interpose/interpose.h"

/*
 * dlopen(..., RTLD_DEEPBIND) puts the loaded object's own scope (itself and
 * its dependencies, libc among them) ahead of the global one, so the object
 * and every library it pulls in bind connect, close, socket... straight to
 * libc, past the preload. PHP loads each extension this way (so that an
 * extension's symbols do not clash with the host's), and libcurl or libpq
 * under php-curl or php-pgsql then never reach the shim.
 *
 * Clearing the flag would change what every other symbol of the extension
 * binds to, the very thing DEEPBIND is there for. Instead the object is
 * loaded as asked, and then, in each object that this load brought in, the
 * GOT entries (JUMP_SLOT and GLOB_DAT relocations) of the names the shim
 * exports, and that the object does not define itself, are pointed at the
 * shim's wrappers: exactly what a normal load would have bound them to.
 * Every other symbol keeps its deep binding. A RELRO page is made writable
 * for the write and read-only again, as ld.so leaves it.
 */

#define MAX_EXPORTS	96	/* the shim exports about 40 names */
#define MAX_NEW		512	/* objects one dlopen may bring in */

struct export {
	const char *name;
	void *addr;
};

static struct export exports[MAX_EXPORTS];
static size_t nexports;
static pthread_once_t exports_once = PTHREAD_ONCE_INIT;

/* An address in the dynamic section: absolute after relocation on most
 * targets, relative to the load base on some (and in the vDSO). */
static uintptr_t
dyn_ptr(uintptr_t base, uintptr_t v)
{
	return v < base ? v + base : v;
}

/* The number of symbols in a DT_GNU_HASH table: one past the highest
 * index any bucket chain reaches. */
static size_t
gnu_hash_nsyms(const uint32_t *gh)
{
	uint32_t nbuckets = gh[0], symoffset = gh[1], bloom = gh[2], max = 0;
	const uint32_t *buckets = (const uint32_t *)(const void *)((const ElfW(Addr) *)(gh + 4) + bloom);
	const uint32_t *chain = buckets + nbuckets;

	for (uint32_t b = 0; b < nbuckets; b++) {
		if (buckets[b] > max)
			max = buckets[b];
	}
	if (max < symoffset)
		return symoffset;
	while (!(chain[max - symoffset] & 1))
		max++;
	return (size_t)max + 1;
}

struct dyn_info {
	const ElfW(Sym) *symtab;
	const char *strtab;
	const uint32_t *gnu_hash;
	const uint32_t *sysv_hash;
	const ElfW(Rela) *jmprel, *rela;
	size_t jmprel_sz, rela_sz;
	bool plt_rela;
};

static void
read_dynamic(uintptr_t base, const ElfW(Dyn) *d, struct dyn_info *di)
{
	memset(di, 0, sizeof(*di));
	di->plt_rela = true;
	for (; d->d_tag != DT_NULL; d++) {
		uintptr_t v = (uintptr_t)d->d_un.d_ptr;

		switch (d->d_tag) {
		case DT_SYMTAB: di->symtab = (const void *)dyn_ptr(base, v); break;
		case DT_STRTAB: di->strtab = (const void *)dyn_ptr(base, v); break;
		case DT_GNU_HASH: di->gnu_hash = (const void *)dyn_ptr(base, v); break;
		case DT_HASH: di->sysv_hash = (const void *)dyn_ptr(base, v); break;
		case DT_JMPREL: di->jmprel = (const void *)dyn_ptr(base, v); break;
		case DT_PLTRELSZ: di->jmprel_sz = (size_t)d->d_un.d_val; break;
		case DT_PLTREL: di->plt_rela = d->d_un.d_val == DT_RELA; break;
		case DT_RELA: di->rela = (const void *)dyn_ptr(base, v); break;
		case DT_RELASZ: di->rela_sz = (size_t)d->d_un.d_val; break;
		}
	}
}

static const ElfW(Dyn) *
dynamic_of(const struct dl_phdr_info *info)
{
	for (int i = 0; i < info->dlpi_phnum; i++) {
		if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
			return (const void *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
	}
	return NULL;
}

/* dl_iterate_phdr callback: fills `exports` from the object loaded at
 * *(uintptr_t *)data, which is the shim. */
static int
collect_exports(struct dl_phdr_info *info, size_t size, void *data)
{
	const ElfW(Dyn) *dyn;
	struct dyn_info di;
	size_t n;

	(void)size;
	if (info->dlpi_addr != *(uintptr_t *)data || (dyn = dynamic_of(info)) == NULL)
		return 0;
	read_dynamic(info->dlpi_addr, dyn, &di);
	if (di.symtab == NULL || di.strtab == NULL)
		return 1;
	n = di.gnu_hash != NULL ? gnu_hash_nsyms(di.gnu_hash) :
	    di.sysv_hash != NULL ? di.sysv_hash[1] : 0;
	for (size_t i = 1; i < n && nexports < MAX_EXPORTS; i++) {
		const ElfW(Sym) *sym = &di.symtab[i];

		if (sym->st_shndx == SHN_UNDEF || ELF64_ST_TYPE(sym->st_info) != STT_FUNC ||
		    ELF64_ST_VISIBILITY(sym->st_other) != STV_DEFAULT)
			continue;
		exports[nexports].name = di.strtab + sym->st_name;
		exports[nexports].addr = (void *)(info->dlpi_addr + sym->st_value);
		nexports++;
	}
	return 1;
}

static void
build_exports(void)
{
	Dl_info self;
	uintptr_t base;

	if (dladdr((void *)build_exports, &self) == 0)
		return;
	base = (uintptr_t)self.dli_fbase;
	dl_iterate_phdr(collect_exports, &base);
}

static void *
export_of(const char *name)
{
	for (size_t i = 0; i < nexports; i++) {
		if (name[0] == exports[i].name[0] && strcmp(name, exports[i].name) == 0)
			return exports[i].addr;
	}
	return NULL;
}

/* Writes value into a GOT slot, through a RELRO page if it is one. */
static void
write_slot(void **slot, void *value, uintptr_t relro_lo, uintptr_t relro_hi)
{
	uintptr_t a = (uintptr_t)slot;
	long pg = sysconf(_SC_PAGESIZE);
	uintptr_t page = a & ~((uintptr_t)pg - 1);
	bool ro = a >= relro_lo && a < relro_hi;

	if (ro && mprotect((void *)page, (size_t)pg, PROT_READ | PROT_WRITE) < 0)
		return;
	__atomic_store_n(slot, value, __ATOMIC_RELEASE);
	if (ro)
		mprotect((void *)page, (size_t)pg, PROT_READ);
}

static size_t
patch_relocs(uintptr_t base, const struct dyn_info *di, const ElfW(Rela) *r, size_t bytes,
    uintptr_t relro_lo, uintptr_t relro_hi)
{
	size_t n = 0;

	for (size_t i = 0; i < bytes / sizeof(*r); i++) {
		uint32_t type = (uint32_t)ELF64_R_TYPE(r[i].r_info);
		const ElfW(Sym) *sym = &di->symtab[ELF64_R_SYM(r[i].r_info)];
		void **slot, *ours;

#if defined(__x86_64__)
		if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT)
			continue;
#elif defined(__aarch64__)
		if (type != R_AARCH64_JUMP_SLOT && type != R_AARCH64_GLOB_DAT)
			continue;
#else
		(void)type;
		continue;
#endif
		/* A name the object defines itself stays its own. */
		if (ELF64_R_SYM(r[i].r_info) == 0 || sym->st_shndx != SHN_UNDEF)
			continue;
		ours = export_of(di->strtab + sym->st_name);
		if (ours == NULL)
			continue;
		slot = (void **)(base + r[i].r_offset);
		if (__atomic_load_n(slot, __ATOMIC_ACQUIRE) != ours) {
			write_slot(slot, ours, relro_lo, relro_hi);
			n++;
		}
	}
	return n;
}

struct patch_job {
	uintptr_t base[MAX_NEW];
	size_t n;
	size_t patched;
};

static int
patch_one(struct dl_phdr_info *info, size_t size, void *data)
{
	struct patch_job *job = data;
	uintptr_t relro_lo = 0, relro_hi = 0;
	const ElfW(Dyn) *dyn;
	struct dyn_info di;
	bool wanted = false;

	(void)size;
	for (size_t i = 0; i < job->n && !wanted; i++)
		wanted = job->base[i] == info->dlpi_addr;
	if (!wanted || (dyn = dynamic_of(info)) == NULL)
		return 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		if (info->dlpi_phdr[i].p_type == PT_GNU_RELRO) {
			long pg = sysconf(_SC_PAGESIZE);

			relro_lo = info->dlpi_addr + info->dlpi_phdr[i].p_vaddr;
			relro_hi = relro_lo + info->dlpi_phdr[i].p_memsz;
			relro_lo &= ~((uintptr_t)pg - 1);
			relro_hi = (relro_hi + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
		}
	}
	read_dynamic(info->dlpi_addr, dyn, &di);
	if (di.symtab == NULL || di.strtab == NULL || !di.plt_rela)
		return 0;
	if (di.jmprel != NULL)
		job->patched += patch_relocs(info->dlpi_addr, &di, di.jmprel, di.jmprel_sz,
		    relro_lo, relro_hi);
	if (di.rela != NULL)
		job->patched += patch_relocs(info->dlpi_addr, &di, di.rela, di.rela_sz,
		    relro_lo, relro_hi);
	return 0;
}

void *
deepbind_load(void *(*open)(void *ctx, const char *file, int mode), void *ctx,
    const char *file, int mode)
{
	struct patch_job job;
	struct link_map *lm = NULL;
	void *h, *old;
	int saved;

	/* Already loaded: its bindings were made at its first load, and
	 * patched then if that load was deep. */
	old = open(ctx, file, (mode & ~(RTLD_NOW | RTLD_LAZY)) | RTLD_NOLOAD | RTLD_LAZY);
	if (old != NULL) {
		dlclose(old);
		return open(ctx, file, mode);
	}
	h = open(ctx, file, mode);
	if (h == NULL || file == NULL)
		return h;
	saved = errno;
	pthread_once(&exports_once, build_exports);
	/* The objects this load brought in follow its own in the chain. */
	job.n = 0;
	job.patched = 0;
	if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0) {
		for (; lm != NULL && job.n < MAX_NEW; lm = lm->l_next)
			job.base[job.n++] = (uintptr_t)lm->l_addr;
	}
	if (job.n > 0 && nexports > 0)
		dl_iterate_phdr(patch_one, &job);
	bs_log(LOG_DEBUG, "%s loaded with RTLD_DEEPBIND: %lu calls of %lu objects bound "
	    "to the shim", file, (unsigned long)job.patched, (unsigned long)job.n);
	errno = saved;
	return h;
}

/* ---- dlopen(): RTLD_DEEPBIND must not take a library past the shim ---- */

static void *
open_base(void *ctx, const char *file, int mode)
{
	(void)ctx;
	return real.dlopen(file, mode);
}

static void *
open_ns(void *ctx, const char *file, int mode)
{
	return real.dlmopen(*(long *)ctx, file, mode);
}

/* Without RTLD_DEEPBIND the call is passed on as a tail call, so libc sees
 * the program's own caller (whose RPATH and namespace dlopen uses). */
BS_EXPORT void *
dlopen(const char *file, int mode)
{
	if (!(mode & RTLD_DEEPBIND))
		return real.dlopen(file, mode);
	return deepbind_load(open_base, NULL, file, mode);
}

/* A new namespace (LM_ID_NEWLM) has a libc of its own, with its own errno:
 * its objects are left as they are. */
BS_EXPORT void *
dlmopen(long ns, const char *file, int mode)
{
	if (!(mode & RTLD_DEEPBIND) || ns != LM_ID_BASE)
		return real.dlmopen(ns, file, mode);
	return deepbind_load(open_ns, &ns, file, mode);
}

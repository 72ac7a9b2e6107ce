/* kern_maps.c - the kernel engine's maps: compartments by name, destination rules as a trie. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <bpf/bpf.h>

#include "engine.h"

/* One rule of the config on its way into the trie. */
struct ksrc {
	struct kern_key key;
	struct kern_range range;
	unsigned width;		/* hi - lo: narrower ranges rank first */
	size_t order;		/* config order breaks ties, as in match.c */
	int line;
};

static int
cmp_src(const void *a, const void *b)
{
	const struct ksrc *x = a, *y = b;
	int c;

	if (x->key.prefixlen != y->key.prefixlen)
		return x->key.prefixlen < y->key.prefixlen ? -1 : 1;
	if ((c = memcmp(x->key.addr, y->key.addr, 16)) != 0)
		return c;
	if (x->width != y->width)
		return x->width < y->width ? -1 : 1;
	return x->order < y->order ? -1 : (x->order > y->order);
}

/* Sites are sorted by (prefix, address): the first k fields of a ksrc. */
static int
cmp_key(const void *a, const void *b)
{
	const struct kern_key *x = a, *y = b;

	if (x->prefixlen != y->prefixlen)
		return x->prefixlen < y->prefixlen ? -1 : 1;
	return memcmp(x->addr, y->addr, 16);
}

static size_t
kern_page(size_t n)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);

	return (n + pg - 1) / pg * pg;
}

static size_t
view_size(void)
{
	return kern_page(sizeof(struct kern_comp) * KERN_MAX_COMPS);
}

void
kern_pin_path(char *out, size_t len, const char *segment, const char *name)
{
	char seg[KERN_NAME_MAX];
	size_t i;

	for (i = 0; segment[i] != '\0' && i < sizeof(seg) - 1; i++)
		seg[i] = segment[i] == '.' ? '+' : segment[i];
	seg[i] = '\0';
	snprintf(out, len, "%s/%s%s%s", KERN_PIN_ROOT, seg, name ? "/" : "", name ? name : "");
}

static int
view_map(int fd, bool writable, struct kern_view *v)
{
	int prot = PROT_READ | (writable ? PROT_WRITE : 0);
	void *p = mmap(NULL, view_size(), prot, MAP_SHARED, fd, 0);

	if (p == MAP_FAILED)
		return -errno;
	v->comp = p;
	v->size = view_size();
	return 0;
}

int
kern_view_open(const char *segment, bool writable, struct kern_view *v)
{
	char path[PATH_MAX];
	struct stat st;
	int fd, r;

	memset(v, 0, sizeof(*v));
	kern_pin_path(path, sizeof(path), segment, "comps");
	/* A user who may not look into the BPF file system cannot know if
	 * an engine is there: that reads as none. */
	if (stat(path, &st) < 0)
		return -ENOENT;
	fd = bpf_obj_get(path);
	if (fd < 0)
		return -errno;
	r = view_map(fd, writable, v);
	if (r == 0) {
		struct bpf_map_info info;
		__u32 len = sizeof(info);

		memset(&info, 0, sizeof(info));
		if (bpf_obj_get_info_by_fd(fd, &info, &len) == 0)
			v->id = info.id;
	}
	close(fd);
	return r;
}

/* chown and chmod of one pinned file or directory, kept quiet about an
 * owner this process may not give (it keeps root's). */
static int
share_one(const char *path, const struct stat *seg, mode_t mode, char *err, size_t errlen)
{
	if (chown(path, seg->st_uid, seg->st_gid) < 0 && errno != EPERM) {
		bs_format(err, errlen, "cannot give %s the segment's owner: %s", path,
		    strerror(errno));
		return -errno;
	}
	if (chmod(path, mode) < 0) {
		bs_format(err, errlen, "cannot set the mode of %s: %s", path, strerror(errno));
		return -errno;
	}
	return 0;
}

int
kern_share(const struct bs_config *cfg, char *err, size_t errlen)
{
	char shm[PATH_MAX], path[PATH_MAX];
	static const char *const files[] = { "comps", "socks" };
	struct stat st, root;
	mode_t rw, x;
	int r;

	snprintf(shm, sizeof(shm), "/dev/shm/bulkshim.%s", cfg->segment);
	if (stat(shm, &st) < 0) {
		bs_format(err, errlen, "%s: %s", shm, strerror(errno));
		return -errno;
	}
	rw = st.st_mode & 0666;
	/* Directories: searchable by whoever may read or write the maps. */
	x = (rw & 0066) ? ((rw & 0060) ? 0010 : 0) | ((rw & 0006) ? 0001 : 0) : 0;
	/* The root of every segment's pins lets anyone search it (as
	 * /dev/shm does) but lists nothing new: each segment's directory
	 * has its own owner and mode. */
	if (stat(KERN_PIN_ROOT, &root) == 0 && (root.st_mode & 0111) != 0111 &&
	    chmod(KERN_PIN_ROOT, (root.st_mode & 07777) | 0111) < 0) {
		bs_format(err, errlen, "cannot set the mode of %s: %s", KERN_PIN_ROOT,
		    strerror(errno));
		return -errno;
	}
	/* The BPF file system itself is usually mounted 0700 (systemd does,
	 * and so does kern_check): then no other user reaches any pin below
	 * it. A segment shared with its group or with everyone gets the
	 * search bit that sharing needs there too, and no more (no listing;
	 * every other pin keeps its own mode). */
	if (x != 0 && stat(KERN_BPFFS, &root) == 0 && (root.st_mode & x) != x &&
	    chmod(KERN_BPFFS, (root.st_mode & 07777) | x) < 0) {
		bs_format(err, errlen, "cannot let the segment's users search %s: %s", KERN_BPFFS,
		    strerror(errno));
		return -errno;
	}
	kern_pin_path(path, sizeof(path), cfg->segment, NULL);
	if ((r = share_one(path, &st, 0700 | x, err, errlen)) < 0)
		return r;
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		kern_pin_path(path, sizeof(path), cfg->segment, files[i]);
		if ((r = share_one(path, &st, rw, err, errlen)) < 0)
			return r;
	}
	return 0;
}

void
kern_view_close(struct kern_view *v)
{
	if (v->comp != NULL)
		munmap(v->comp, v->size);
	v->comp = NULL;
}

struct kern_comp *
kern_view_find(const struct kern_view *v, const char *name)
{
	for (size_t i = 0; v->comp != NULL && i < KERN_MAX_COMPS; i++) {
		if (v->comp[i].name[0] == '\0')
			return NULL;
		if (strncmp(v->comp[i].name, name, KERN_NAME_MAX) == 0)
			return &v->comp[i];
	}
	return NULL;
}

unsigned long long
kern_boot_to_real_ms(unsigned long long boot_ns)
{
	struct timespec b, r;
	unsigned long long now_boot, now_real;

	if (boot_ns == 0)
		return 0;
	clock_gettime(CLOCK_BOOTTIME, &b);
	clock_gettime(CLOCK_REALTIME, &r);
	now_boot = (unsigned long long)b.tv_sec * 1000000000ULL + (unsigned long long)b.tv_nsec;
	now_real = (unsigned long long)r.tv_sec * 1000ULL + (unsigned long long)r.tv_nsec / 1000000;
	if (boot_ns > now_boot)
		return now_real;
	return now_real - (now_boot - boot_ns) / 1000000;
}

/* Gives each config compartment its entry: the one of the same name, else
 * the first unused one. Names are written once and never move, so a socket
 * admitted before a reload gives its permit back to the right count. */
static int
apply_comps(struct kern_view *v, const struct bs_config *cfg, uint32_t *kidx, char *err,
    size_t errlen)
{
	for (size_t i = 0; i < cfg->ncomp; i++) {
		const struct cfg_compartment *cc = &cfg->comp[i];
		struct kern_comp *k = kern_view_find(v, cc->name);

		if (k == NULL) {
			size_t j = 0;

			while (j < KERN_MAX_COMPS && v->comp[j].name[0] != '\0')
				j++;
			if (j == KERN_MAX_COMPS) {
				bs_format(err, errlen, "%s: the kernel engine has no room for "
				    "compartment \"%s\"", cfg->path, cc->name);
				return -ENOSPC;
			}
			k = &v->comp[j];
			snprintf(k->name, sizeof(k->name), "%s", cc->name);
		}
		kidx[i] = (uint32_t)(k - v->comp);
		__atomic_store_n(&k->limit, cc->max_connections ? cc->max_connections :
		    KERN_NO_LIMIT, __ATOMIC_RELAXED);
		__atomic_store_n(&k->enforce, cc->enforce ? 1u : 0u, __ATOMIC_RELAXED);
		__atomic_store_n(&k->reject_errno, cc->reject_errno ? cc->reject_errno :
		    ECONNREFUSED, __ATOMIC_RELAXED);
	}
	return 0;
}

/* The config's address rules, sorted by site then rank, into *out. */
static int
collect_rules(const struct bs_config *cfg, const uint32_t *kidx, struct ksrc **out, size_t *n)
{
	struct ksrc *src = calloc(cfg->nrules ? cfg->nrules : 1, sizeof(*src));
	size_t k = 0;

	if (src == NULL)
		return -ENOMEM;
	for (size_t i = 0; i < cfg->nrules; i++) {
		const struct rule *r = &cfg->rules[i];

		if (r->kind != RULE_IP || r->comp < 0 || (size_t)r->comp >= cfg->ncomp)
			continue;
		src[k].key.prefixlen = (uint32_t)r->prefix;
		memcpy(src[k].key.addr, r->addr, 16);
		src[k].range.lo = r->port_lo;
		src[k].range.hi = r->port_hi;
		src[k].range.comp = kidx[r->comp];
		src[k].width = (unsigned)r->port_hi - r->port_lo;
		src[k].order = i;
		src[k].line = r->line;
		k++;
	}
	qsort(src, k, sizeof(*src), cmp_src);
	*out = src;
	*n = k;
	return 0;
}

/* Groups sorted rules into sites; checks the bounds the program loops to. */
static int
build_sites(const struct bs_config *cfg, const struct ksrc *src, size_t n,
    struct kern_key **keys, struct kern_site **vals, size_t *nsites, char *err, size_t errlen)
{
	struct kern_key *kk = calloc(n ? n : 1, sizeof(*kk));
	struct kern_site *vv = calloc(n ? n : 1, sizeof(*vv));
	size_t m = 0;

	if (kk == NULL || vv == NULL)
		goto nomem;
	for (size_t i = 0; i < n; i++) {
		if (m == 0 || cmp_key(&kk[m - 1], &src[i].key) != 0) {
			kk[m] = src[i].key;
			vv[m].prefix = src[i].key.prefixlen;
			m++;
		}
		if (vv[m - 1].n == KERN_SITE_RANGES) {
			bs_format(err, errlen, "%s:%d: the kernel engine takes at most %d port "
			    "ranges for one address and prefix", cfg->path, src[i].line,
			    KERN_SITE_RANGES);
			goto fail;
		}
		vv[m - 1].r[vv[m - 1].n++] = src[i].range;
	}
	/* A lookup climbs from the longest prefix holding the address to
	 * shorter ones, at most KERN_DEPTH of them. */
	for (size_t i = 0; i < m; i++) {
		int depth = 1;

		for (int p = (int)kk[i].prefixlen - 1; p >= 0; p--) {
			struct kern_key probe = { .prefixlen = (uint32_t)p };

			memcpy(probe.addr, kk[i].addr, 16);
			match_mask_addr(probe.addr, p);
			if (bsearch(&probe, kk, m, sizeof(*kk), cmp_key) != NULL)
				depth++;
		}
		if (depth > KERN_DEPTH) {
			bs_format(err, errlen, "%s: more than %d nested prefixes hold one address; "
			    "the kernel engine looks through at most %d", cfg->path, KERN_DEPTH,
			    KERN_DEPTH);
			goto fail;
		}
	}
	*keys = kk;
	*vals = vv;
	*nsites = m;
	return 0;
nomem:
	bs_format(err, errlen, "out of memory");
fail:
	free(kk);
	free(vv);
	return -EINVAL;
}

/* Puts the new sites in, then takes out the sites no rule names now. */
static int
write_sites(int fd, const struct kern_key *keys, const struct kern_site *vals, size_t n,
    char *err, size_t errlen)
{
	struct kern_key cur, next, *stale = NULL;
	size_t nstale = 0, cap = 0;
	void *prev = NULL;

	for (size_t i = 0; i < n; i++) {
		if (bpf_map_update_elem(fd, &keys[i], &vals[i], BPF_ANY) < 0) {
			bs_format(err, errlen, "cannot write a destination into the kernel "
			    "engine's trie: %s", strerror(errno));
			return -errno;
		}
	}
	while (bpf_map_get_next_key(fd, prev, &next) == 0) {
		if (bsearch(&next, keys, n, sizeof(*keys), cmp_key) == NULL) {
			if (nstale == cap) {
				struct kern_key *p;

				cap = cap ? cap * 2 : 64;
				p = realloc(stale, cap * sizeof(*p));
				if (p == NULL) {
					free(stale);
					return -ENOMEM;
				}
				stale = p;
			}
			stale[nstale++] = next;
		}
		cur = next;
		prev = &cur;
	}
	for (size_t i = 0; i < nstale; i++)
		bpf_map_delete_elem(fd, &stale[i]);
	free(stale);
	return 0;
}

int
kern_apply(int comps_fd, int sites_fd, const struct bs_config *cfg, char *err, size_t errlen)
{
	struct kern_view v = { NULL, 0, 0 };
	struct kern_key *keys = NULL;
	struct kern_site *vals = NULL;
	struct ksrc *src = NULL;
	uint32_t *kidx = calloc(cfg->ncomp ? cfg->ncomp : 1, sizeof(*kidx));
	size_t n, nsites;
	int r;

	if (kidx == NULL) {
		bs_format(err, errlen, "out of memory");
		return -ENOMEM;
	}
	if ((r = view_map(comps_fd, true, &v)) < 0) {
		bs_format(err, errlen, "cannot map the kernel engine's compartments: %s",
		    strerror(-r));
		goto done;
	}
	if ((r = apply_comps(&v, cfg, kidx, err, errlen)) < 0)
		goto done;
	if ((r = collect_rules(cfg, kidx, &src, &n)) < 0) {
		bs_format(err, errlen, "out of memory");
		goto done;
	}
	if ((r = build_sites(cfg, src, n, &keys, &vals, &nsites, err, errlen)) < 0)
		goto done;
	r = write_sites(sites_fd, keys, vals, nsites, err, errlen);
done:
	kern_view_close(&v);
	free(keys);
	free(vals);
	free(src);
	free(kidx);
	return r;
}

int
kern_apply_pinned(const struct bs_config *cfg, char *err, size_t errlen)
{
	char path[PATH_MAX];
	int cfd, sfd, r;

	kern_pin_path(path, sizeof(path), cfg->segment, "comps");
	cfd = bpf_obj_get(path);
	kern_pin_path(path, sizeof(path), cfg->segment, "sites");
	sfd = bpf_obj_get(path);
	if (cfd < 0 || sfd < 0) {
		bs_format(err, errlen, "no kernel engine is loaded for segment %s", cfg->segment);
		r = -ENOENT;
	} else {
		r = kern_apply(cfd, sfd, cfg, err, errlen);
	}
	if (cfd >= 0)
		close(cfd);
	if (sfd >= 0)
		close(sfd);
	return r;
}

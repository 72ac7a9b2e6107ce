/* cli_pool.c - pools and class shares: read for the snapshot, shown by status, watch and metrics, changed by set and reload. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

void
cli_read_pool(const struct seg *s, uint32_t p, struct cli_pool *out)
{
	const struct seg_pool *pool = &seg_header(s)->pools[p];
	uint32_t room;

	memset(out, 0, sizeof(*out));
	memcpy(out->name, pool->name, sizeof(out->name));
	out->name[sizeof(out->name) - 1] = '\0';
	out->size = atomic_load(&pool->size);
	out->reserved = atomic_load(&pool->reserved);
	out->shared = atomic_load(&pool->shared);
	out->lent = atomic_load(&pool->lent);
	out->peak = atomic_load(&pool->peak);
	out->sleepers = atomic_load(&pool->sleepers);
	out->rejected = atomic_load(&pool->rejected);
	out->in_use = pool_in_use(s, p, &out->borrowed);
	for (uint32_t i = 0; i < s->ncomp; i++) {
		const struct seg_comp *c = seg_comp(s, i);

		if (atomic_load(&c->pool) == p + 1)
			out->guaranteed += atomic_load(&c->guaranteed);
	}
	room = out->size > out->reserved ? out->size - out->reserved : 0;
	out->free = room > out->in_use ? room - out->in_use : 0;
}

void
cli_read_comp_pool(const struct seg *s, struct cli_comp *c)
{
	const struct seg_comp *sc = seg_comp(s, c->index);
	const struct seg_pool *pool = seg_pool_of(s, sc);
	uint32_t n;

	c->pool = -1;
	c->class_lent = atomic_load(&sc->cls_lent);
	if (pool == NULL)
		return;
	c->pool = (int)atomic_load(&sc->pool) - 1;
	memcpy(c->pool_name, pool->name, sizeof(c->pool_name));
	c->pool_name[sizeof(c->pool_name) - 1] = '\0';
	c->guaranteed = atomic_load(&sc->guaranteed);
	n = atomic_load(&sc->in_use);
	c->borrowed = n > c->guaranteed ? n - c->guaranteed : 0;
}

uint32_t
cli_pool_room(const struct seg *s, const struct seg_comp *sc)
{
	const struct seg_pool *pool = seg_pool_of(s, sc);
	uint32_t n, g, lent, shared;
	uint64_t room;

	if (pool == NULL)
		return UINT32_MAX;
	n = atomic_load(&sc->in_use);
	g = atomic_load(&sc->guaranteed);
	lent = atomic_load(&pool->lent);
	shared = atomic_load(&pool->shared);
	/* pool_take: lent beyond the shared part (it shrank live) stops
	 * even takes within a guarantee until it drains. */
	if (lent > shared)
		return 0;
	room = (uint64_t)(g > n ? g - n : 0) + (shared - lent);
	return room < BS_MAX_LIMIT ? (uint32_t)room : BS_MAX_LIMIT;
}

void
cli_json_pools(FILE *f, const struct cli_snap *snap)
{
	fputs(", \"pools\": [", f);
	for (uint32_t p = 0; p < snap->npools; p++) {
		const struct cli_pool *v = &snap->pool[p];

		fputs(p ? ", {\"name\": " : "{\"name\": ", f);
		cli_json_string(f, v->name);
		cli_json_field(f, v->damaged, CF_SIZE, v->size);
		cli_json_field(f, v->damaged, CF_RESERVED, v->reserved);
		cli_json_field(f, v->damaged, CF_IN_USE, v->in_use);
		cli_json_field(f, v->damaged, CF_BORROWED, v->borrowed);
		cli_json_field(f, v->damaged, CF_FREE, v->free);
		cli_json_field(f, v->damaged, CF_GUARANTEED, v->guaranteed);
		cli_json_field(f, v->damaged, CF_SHARED, v->shared);
		cli_json_field(f, v->damaged, CF_LENT, v->lent);
		cli_json_field(f, v->damaged, CF_PEAK, v->peak);
		cli_json_field(f, v->damaged, CF_REJECTED, v->rejected);
		cli_json_damaged(f, v->damaged);
		fputc('}', f);
	}
	fputc(']', f);
}

void
cli_json_comp_pool(FILE *f, const struct cli_comp *c)
{
	cli_json_field(f, c->damaged, CF_CLASS_LENT, c->class_lent);
	fputs(", \"pool\": ", f);
	if (c->pool < 0) {
		fputs("null", f);
		return;
	}
	cli_json_string(f, c->pool_name);
	cli_json_field(f, c->damaged, CF_GUARANTEED, c->guaranteed);
	cli_json_value(f, "ceiling", c->limit == UINT32_MAX ? 0 : c->limit,
	    CLI_DAMAGED(c->damaged, CF_LIMIT));
	cli_json_field(f, c->damaged, CF_BORROWED, c->borrowed);
}

/* A cell of a class, compartment or pool (mask its damaged values). */
static const char *
cell(char *buf, size_t len, uint64_t mask, enum cli_field field, uint64_t v)
{
	return cli_count_text(v, CLI_DAMAGED(mask, field), buf, len);
}

/* What the tables of classes and pools take at full width. */
#define POOLS_WIDE	110
#define NARROW_NAME	14

/* The name of item i as shown: its abbreviation when there are some. */
static const char *
shown(char (*ab)[CLI_ABBREV_MAX], size_t i, const char *name)
{
	return ab != NULL ? ab[i] : name;
}

/* Abbreviations, NARROW_NAME wide, of the snapshot's compartment names;
 * NULL when not narrow, or short of memory (the names are then cut). */
static char (*narrow_names(bool narrow, const struct cli_snap *snap))[CLI_ABBREV_MAX]
{
	char (*ab)[CLI_ABBREV_MAX];
	const char **names;

	if (!narrow || snap->ncomp == 0)
		return NULL;
	ab = calloc(snap->ncomp, sizeof(*ab));
	names = calloc(snap->ncomp, sizeof(*names));
	if (ab == NULL || names == NULL) {
		free(ab);
		free(names);
		return NULL;
	}
	for (uint32_t i = 0; i < snap->ncomp; i++)
		names[i] = snap->comp[i].name;
	cli_abbrev(names, snap->ncomp, NARROW_NAME, ab);
	free(names);
	return ab;
}

/* The table of compartments whose classes split them (status, watch). */
static void
text_class_shares(FILE *f, const struct cli_snap *snap, const char *eol, bool narrow,
    char (*ab)[CLI_ABBREV_MAX])
{
	bool head = false;
	int nw = narrow ? NARROW_NAME : 24, cw = narrow ? 10 : 14, vw = narrow ? 6 : 7;
	int gw = narrow ? vw : 10, bw = narrow ? vw : 8;

	for (uint32_t i = 0; i < snap->ncomp; i++) {
		const struct cli_comp *c = &snap->comp[i];

		if (!c->shares)
			continue;
		if (!head)
			fprintf(f, "%s\n%-*s %-*s %*s %*s %*s %*s%s\n", eol, nw,
			    narrow ? "CLASSES" : "CLASSES SHARING", cw, "CLASS", vw,
			    narrow ? "USE" : "IN USE", vw, narrow ? "CEIL" : "CEILING", gw,
			    narrow ? "GUAR" : "GUARANTEED", bw, narrow ? "BORR" : "BORROWED", eol);
		head = true;
		for (size_t k = 0; k < c->nclass; k++) {
			const struct cli_class *cc = &c->cls[k];
			char v[4][24];

			fprintf(f, "%-*.*s %-*.*s %*s %*s %*s %*s%s\n", nw, nw,
			    k == 0 ? shown(ab, i, c->name) : "", cw, cw, cc->name,
			    vw, cell(v[0], sizeof(v[0]), cc->damaged, CF_IN_USE, cc->in_use),
			    vw, cell(v[1], sizeof(v[1]), cc->damaged, CF_LIMIT, cc->limit),
			    gw, cell(v[2], sizeof(v[2]), cc->damaged, CF_GUARANTEED, cc->guaranteed),
			    bw, cell(v[3], sizeof(v[3]), cc->damaged, CF_BORROWED, cc->borrowed), eol);
		}
	}
}

void
cli_text_pools(FILE *f, const struct cli_snap *snap, const char *eol, int width)
{
	bool narrow = width > 0 && width < POOLS_WIDE;
	char (*ab)[CLI_ABBREV_MAX] = narrow_names(narrow, snap);
	char (*pab)[CLI_ABBREV_MAX] = NULL;
	int nw = narrow ? NARROW_NAME : 24, vw = 5, bw = 20;
	char bar[21];

	text_class_shares(f, snap, eol, narrow, ab);
	if (snap->npools == 0)
		goto done;
	if (narrow && (pab = calloc(snap->npools, sizeof(*pab))) != NULL) {
		const char *names[BS_MAX_POOLS];

		for (uint32_t p = 0; p < snap->npools && p < BS_MAX_POOLS; p++)
			names[p] = snap->pool[p].name;
		cli_abbrev(names, snap->npools < BS_MAX_POOLS ? snap->npools : BS_MAX_POOLS,
		    (size_t)nw, pab);
	}
	if (narrow) {
		/* The name, seven numbers, a space and the bar's brackets. */
		bw = width - nw - 7 * (vw + 1) - 3;
		bw = bw < 4 ? 4 : bw > 20 ? 20 : bw;
		fprintf(f, "%s\n%-*s %*s %*s %*s %*s %*s %*s %*s%s\n", eol, nw, "POOL", vw, "SIZE",
		    vw, "RSVD", vw, "USE", vw, "BORR", vw, "FREE", vw, "GUAR", vw, "PEAK", eol);
	} else {
		fprintf(f, "%s\n%-24s %7s %8s %7s %8s %7s %10s %7s%s\n", eol, "POOL", "SIZE",
		    "RESERVED", "IN USE", "BORROWED", "FREE", "GUARANTEED", "PEAK", eol);
	}
	for (uint32_t p = 0; p < snap->npools; p++) {
		const struct cli_pool *v = &snap->pool[p];
		const uint64_t m = v->damaged;
		char n[7][24];

		cell(n[0], sizeof(n[0]), m, CF_SIZE, v->size);
		cell(n[1], sizeof(n[1]), m, CF_RESERVED, v->reserved);
		cell(n[2], sizeof(n[2]), m, CF_IN_USE, v->in_use);
		cell(n[3], sizeof(n[3]), m, CF_BORROWED, v->borrowed);
		cell(n[4], sizeof(n[4]), m, CF_FREE, v->free);
		cell(n[5], sizeof(n[5]), m, CF_GUARANTEED, v->guaranteed);
		cell(n[6], sizeof(n[6]), m, CF_PEAK, v->peak);
		if (narrow)
			fprintf(f, "%-*.*s %*s %*s %*s %*s %*s %*s %*s", nw, nw,
			    pab != NULL && p < BS_MAX_POOLS ? pab[p] : v->name, vw, n[0], vw,
			    n[1], vw, n[2], vw, n[3], vw, n[4], vw, n[5], vw, n[6]);
		else
			fprintf(f, "%-24s %7s %8s %7s %8s %7s %10s %7s", v->name, n[0], n[1], n[2],
			    n[3], n[4], n[5], n[6]);
		if (m & (1ULL << CF_IN_USE | 1ULL << CF_SIZE | 1ULL << CF_RESERVED))
			cli_bar(bar, (size_t)bw, 1, 1, '?');
		else
			cli_bar(bar, (size_t)bw, v->in_use, v->size > v->reserved ?
			    v->size - v->reserved : 0, '#');
		fprintf(f, narrow ? " [%s]%s\n" : "  [%s]%s\n", bar, eol);
		for (uint32_t i = 0; i < snap->ncomp; i++) {
			const struct cli_comp *c = &snap->comp[i];

			if (c->pool != (int)p)
				continue;
			cell(n[0], sizeof(n[0]), c->damaged, CF_IN_USE, c->in_use);
			cell(n[1], sizeof(n[1]), c->damaged, CF_LIMIT,
			    c->limit == UINT32_MAX ? 0 : c->limit);
			cell(n[2], sizeof(n[2]), c->damaged, CF_GUARANTEED, c->guaranteed);
			cell(n[3], sizeof(n[3]), c->damaged, CF_BORROWED, c->borrowed);
			if (narrow)
				fprintf(f, "  %-*s in use %s of %s, guaranteed %s, borrowed %s%s\n", nw,
				    shown(ab, i, c->name), n[0], n[1], n[2], n[3], eol);
			else
				fprintf(f, "  %-22s in use %s of ceiling %s, guaranteed %s, borrowed "
				    "%s%s\n", c->name, n[0], n[1], n[2], n[3], eol);
		}
	}
done:
	free(ab);
	free(pab);
}

static void
gauge(FILE *f, const char *name, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
}

/* The classes' guaranteed shares of their compartments: guarantee,
 * ceiling, borrowed, for compartments whose classes split them. */
static void
class_metrics(FILE *f, const char *seg, const struct cli_comp *all, uint32_t n)
{
	static const char *const fam[3][2] = {
		{ "bulkshim_class_guaranteed", "Permits of its compartment guaranteed to the class." },
		{ "bulkshim_class_ceiling", "The most permits the class may hold (its class limit)." },
		{ "bulkshim_class_borrowed", "Permits the class holds above its guarantee." },
	};
	bool any = false;

	for (uint32_t i = 0; i < n && !any; i++)
		any = all[i].nclass > 0 && all[i].cls[0].shares;
	if (!any)
		return;
	for (int m = 0; m < 3; m++) {
		gauge(f, fam[m][0], fam[m][1]);
		for (uint32_t i = 0; i < n; i++)
			for (size_t k = 0; k < all[i].nclass; k++) {
				const struct cli_class *cc = &all[i].cls[k];

				if (!cc->shares || CLI_DAMAGED(cc->damaged, m == 0 ? CF_GUARANTEED :
				    m == 1 ? CF_LIMIT : CF_BORROWED))
					continue;
				fprintf(f, "%s{segment=\"%s\",compartment=\"%s\",class=\"%s\"} %u\n",
				    fam[m][0], seg, all[i].name, cc->name,
				    m == 0 ? cc->guaranteed : m == 1 ? cc->limit : cc->borrowed);
			}
	}
}

void
cli_metrics_pools(FILE *f, const struct cli_snap *snap, const struct cli_comp *all,
    uint32_t n)
{
	static const struct {
		const char *name, *help;
	} fam[] = {
		{ "bulkshim_pool_size", "Permits of the pool." },
		{ "bulkshim_pool_reserved", "Permits of the pool never handed out." },
		{ "bulkshim_pool_in_use", "Permits of the pool its compartments hold now." },
		{ "bulkshim_pool_borrowed", "Permits held above their compartments' guarantees." },
		{ "bulkshim_pool_free", "Permits of the pool neither in use nor reserved." },
		{ "bulkshim_pool_rejections_total", "Connects refused because the pool had lent "
		    "its shared part (pool_full)." },
	};
	class_metrics(f, snap->name, all, n);
	if (snap->npools == 0)
		return;
	for (size_t k = 0; k < sizeof(fam) / sizeof(fam[0]); k++) {
		if (k == 5)
			fprintf(f, "# HELP %s %s\n# TYPE %s counter\n", fam[k].name, fam[k].help,
			    fam[k].name);
		else
			gauge(f, fam[k].name, fam[k].help);
		for (uint32_t p = 0; p < snap->npools; p++) {
			static const enum cli_field field[] = { CF_SIZE, CF_RESERVED, CF_IN_USE,
				CF_BORROWED, CF_FREE, CF_REJECTED };
			const struct cli_pool *v = &snap->pool[p];
			unsigned long long x;

			if (CLI_DAMAGED(v->damaged, field[k]))
				continue;
			x = k == 0 ? v->size : k == 1 ? v->reserved : k == 2 ? v->in_use :
			    k == 3 ? v->borrowed : k == 4 ? v->free : v->rejected;
			fprintf(f, "%s{segment=\"%s\",pool=\"%s\"} %llu\n", fam[k].name, snap->name,
			    v->name, x);
		}
	}
	gauge(f, "bulkshim_guaranteed", "Permits of its pool guaranteed to the compartment.");
	for (uint32_t i = 0; i < n; i++)
		if (all[i].pool >= 0 && !CLI_DAMAGED(all[i].damaged, CF_GUARANTEED))
			fprintf(f, "bulkshim_guaranteed{segment=\"%s\",compartment=\"%s\",pool=\"%s\"} "
			    "%u\n", snap->name, all[i].name, all[i].pool_name, all[i].guaranteed);
	gauge(f, "bulkshim_borrowed", "Permits the compartment holds above its guarantee.");
	for (uint32_t i = 0; i < n; i++)
		if (all[i].pool >= 0 && !CLI_DAMAGED(all[i].damaged, CF_BORROWED))
			fprintf(f, "bulkshim_borrowed{segment=\"%s\",compartment=\"%s\",pool=\"%s\"} "
			    "%u\n", snap->name, all[i].name, all[i].pool_name, all[i].borrowed);
}

/* ---- set and reload ---- */

int
cli_find_pool(const struct seg *s, const char *name)
{
	const struct seg_header *h = seg_header(s);

	for (uint32_t p = 0; p < h->npools && p < BS_MAX_POOLS; p++) {
		if (strncmp(h->pools[p].name, name, BS_NAME_MAX) == 0)
			return (int)p;
	}
	return -1;
}

/* The sum of the guarantees of pool p's compartments, with compartment
 * `but` counted as `instead`. */
static uint64_t
guarantees(const struct seg *s, uint32_t p, int but, uint32_t instead)
{
	uint64_t sum = 0;

	for (uint32_t i = 0; i < s->ncomp; i++) {
		const struct seg_comp *c = seg_comp(s, i);

		if (atomic_load(&c->pool) == p + 1)
			sum += (int)i == but ? instead : atomic_load(&c->guaranteed);
	}
	return sum;
}

bool
cli_pool_key(const char *key)
{
	return strcmp(key, "size") == 0 || strcmp(key, "reserved") == 0;
}

int
cli_set_pool(struct seg *s, const char *name, const char *key, uint32_t v)
{
	int p = cli_find_pool(s, name);
	struct seg_pool *pool;
	uint32_t size, reserved, old;
	uint64_t g;

	if (p < 0) {
		fprintf(stderr, "bulkshim: no compartment or pool \"%s\" in segment %s\n", name,
		    seg_header(s)->name);
		return 1;
	}
	pool = &seg_header(s)->pools[p];
	size = strcmp(key, "size") == 0 ? v : atomic_load(&pool->size);
	reserved = strcmp(key, "reserved") == 0 ? v : atomic_load(&pool->reserved);
	g = guarantees(s, (uint32_t)p, -1, 0);
	if (size == 0 || reserved >= size || g > (uint64_t)size - reserved) {
		fprintf(stderr, "bulkshim: pool %s: size %u - reserved %u leaves less than its "
		    "guarantees (%llu); lower a guarantee first\n", name, size, reserved,
		    (unsigned long long)g);
		return 1;
	}
	old = atomic_exchange(strcmp(key, "size") == 0 ? &pool->size : &pool->reserved, v);
	pool_update_shared(s, (uint32_t)p);
	printf("%s: pool %s %s %u -> %u (shared part %u)", seg_header(s)->name, name, key, old, v,
	    atomic_load(&pool->shared));
	if (atomic_load(&pool->lent) > atomic_load(&pool->shared))
		printf(" (%u lent: nothing is revoked; new admissions above the guarantees wait "
		    "for it to drain)", atomic_load(&pool->lent));
	putchar('\n');
	return 0;
}

int
cli_set_guaranteed(struct seg *s, uint32_t i, uint32_t v)
{
	struct seg_comp *c = seg_comp(s, i);
	struct seg_pool *pool = seg_pool_of(s, c);
	uint32_t p, old, room, lim = atomic_load(&c->limit);
	uint64_t g;

	if (pool == NULL) {
		fprintf(stderr, "bulkshim: compartment %s is in no pool: a guarantee needs one\n",
		    c->name);
		return 1;
	}
	p = atomic_load(&c->pool) - 1;
	if (v > lim) {
		fprintf(stderr, "bulkshim: guaranteed %u of %s is above its ceiling, "
		    "max_connections %u\n", v, c->name, lim);
		return 1;
	}
	g = guarantees(s, p, (int)i, v);
	room = atomic_load(&pool->size) - atomic_load(&pool->reserved);
	if (g > room) {
		fprintf(stderr, "bulkshim: pool %s: guarantees would sum to %llu > %u - %u reserved\n",
		    pool->name, (unsigned long long)g, atomic_load(&pool->size),
		    atomic_load(&pool->reserved));
		return 1;
	}
	old = atomic_exchange(&c->guaranteed, v);
	pool_update_shared(s, p);
	share_guarantee_changed(s, seg_comp(s, i), 0, SHARE_POOL, old, v);
	printf("%s: %s guaranteed %u -> %u (pool %s, shared part %u)\n", seg_header(s)->name,
	    c->name, old, v, pool->name, atomic_load(&pool->shared));
	return 0;
}

bool
cli_ceiling_ok(const struct seg *s, uint32_t i, uint32_t v)
{
	const struct seg_comp *c = seg_comp(s, i);

	if (seg_pool_of(s, c) == NULL || v >= atomic_load(&c->guaranteed))
		return true;
	fprintf(stderr, "bulkshim: max_connections %u of %s is below its guarantee %u; lower "
	    "the guarantee first\n", v, c->name, atomic_load(&c->guaranteed));
	return false;
}

int
cli_set_class_guaranteed(struct seg *s, uint32_t i, uint32_t k, uint32_t v)
{
	struct seg_comp *c = seg_comp(s, i);
	const struct seg_header *h = seg_header(s);
	uint64_t sum = v;
	uint32_t old, lim;

	if (c == NULL || k >= BS_MAX_CLASSES)
		return 1;
	if (!atomic_load(&c->cls_shares)) {
		fprintf(stderr, "bulkshim: the classes of %s do not split it: give it "
		    "class_guaranteed in the config and reload\n", c->name);
		return 1;
	}
	lim = atomic_load(&c->cls[k].limit);
	if (v > lim) {
		fprintf(stderr, "bulkshim: guarantee %u of class %s is above its ceiling, class "
		    "limit %u\n", v, h->class_name[k], lim);
		return 1;
	}
	for (uint32_t j = 0; j < BS_MAX_CLASSES; j++)
		if (j != k)
			sum += atomic_load(&c->cls_guaranteed[j]);
	if (sum > atomic_load(&c->limit)) {
		fprintf(stderr, "bulkshim: classes of %s: guarantees would sum to %llu > "
		    "max_connections %u\n", c->name, (unsigned long long)sum, atomic_load(&c->limit));
		return 1;
	}
	old = atomic_exchange(&c->cls_guaranteed[k], v);
	share_update_classes(c);
	share_guarantee_changed(s, seg_comp(s, i), k, SHARE_CLASS, old, v);
	printf("%s: %s guaranteed.%s %u -> %u (unguaranteed part %u)\n", h->name, c->name,
	    h->class_name[k], old, v, atomic_load(&c->cls_shared));
	return 0;
}

void
cli_text_class_share(FILE *f, const struct cli_class *cc)
{
	char g[24], b[24];

	if (cc->shares)
		fprintf(f, ", guaranteed %s, borrowed %s",
		    cell(g, sizeof(g), cc->damaged, CF_GUARANTEED, cc->guaranteed),
		    cell(b, sizeof(b), cc->damaged, CF_BORROWED, cc->borrowed));
}

void
cli_json_class_share(FILE *f, const struct cli_class *cc)
{
	/* Without shares: guarantee 0, every permit below the ceiling. */
	cli_json_field(f, cc->damaged, CF_GUARANTEED, cc->guaranteed);
	cli_json_value(f, "ceiling", cc->limit, CLI_DAMAGED(cc->damaged, CF_LIMIT));
	cli_json_field(f, cc->damaged, CF_BORROWED, cc->borrowed);
}

void
cli_reload_pools(struct seg *s, const struct bs_config *cfg, const int *cmap)
{
	const struct seg_header *h = seg_header(s);
	uint32_t size[BS_MAX_POOLS], reserved[BS_MAX_POOLS];

	for (uint32_t p = 0; p < h->npools && p < BS_MAX_POOLS; p++) {
		size[p] = atomic_load(&h->pools[p].size);
		reserved[p] = atomic_load(&h->pools[p].reserved);
	}
	pool_apply(s, cfg, cmap, false);
	for (uint32_t p = 0; p < h->npools && p < BS_MAX_POOLS; p++) {
		if (atomic_load(&h->pools[p].size) != size[p] ||
		    atomic_load(&h->pools[p].reserved) != reserved[p])
			printf("  pool %s size %u reserved %u -> size %u reserved %u\n",
			    h->pools[p].name, size[p], reserved[p], atomic_load(&h->pools[p].size),
			    atomic_load(&h->pools[p].reserved));
	}
}

void
cli_check_pools(const struct bs_config *cfg)
{
	for (size_t p = 0; p < cfg->npools; p++) {
		const struct cfg_pool *pool = &cfg->pools[p];
		uint64_t guar = 0;
		bool first = true;

		printf("  pool %s: size %u, reserved %u; guaranteed", pool->name, pool->size,
		    pool->reserved);
		for (size_t i = 0; i < cfg->ncomp; i++) {
			const struct cfg_compartment *cc = &cfg->comp[i];

			if (cc->pool != (int)p)
				continue;
			printf("%s %u (%s, ceiling %u)", first ? "" : " +", cc->guaranteed, cc->name,
			    cc->max_connections);
			guar += cc->guaranteed;
			first = false;
		}
		printf(" = %llu; shared %llu\n", (unsigned long long)guar,
		    (unsigned long long)(pool->size - pool->reserved - guar));
	}
	for (size_t i = 0; i < cfg->ncomp; i++) {
		const struct cfg_compartment *cc = &cfg->comp[i];
		uint64_t guar = 0;

		if (!cc->class_shares)
			continue;
		printf("  classes of %s share its %u: guaranteed", cc->name, cc->max_connections);
		for (size_t k = 0; k < cfg->nclass && k < BS_MAX_CLASSES; k++) {
			printf("%s %u (%s, ceiling %u)", k ? " +" : "", cc->class_guaranteed[k],
			    cfg->classes[k].name, cc->class_limit[k]);
			guar += cc->class_guaranteed[k];
		}
		printf(" = %llu; unguaranteed %llu\n", (unsigned long long)guar,
		    (unsigned long long)(cc->max_connections - guar));
	}
}

/*
 * `suggest` for a compartment whose classes split it: per class a
 * guarantee for what it was seen to hold at once, and a ceiling for its
 * bursts. The segment keeps per class its peak and its refusals, not its
 * rate or latency, so the proposal is from peaks: the guarantees are the
 * peaks, scaled down together (rounded down) when they would sum past the
 * compartment's limit, as the start-up assertion wants; a ceiling stays
 * where it is unless the class was refused while at it (its peak reached
 * it), when the compartment's limit is proposed: it wanted more.
 */
static void
class_proposal(const struct cli_comp *c, const struct cli_class *k, uint64_t sum,
    uint32_t *guar, uint32_t *ceiling)
{
	uint32_t lim = c->limit;

	*guar = sum > lim ? (uint32_t)((uint64_t)k->peak * lim / sum) : k->peak;
	*ceiling = k->rejected > 0 && k->peak >= k->limit ? lim : k->limit;
	if (*ceiling < *guar)
		*ceiling = *guar;
}

static uint64_t
class_peaks(const struct cli_comp *c)
{
	uint64_t sum = 0;

	for (size_t k = 0; k < c->nclass; k++)
		sum += c->cls[k].peak;
	return sum;
}

void
cli_suggest_classes(FILE *f, const struct cli_comp *c, bool json)
{
	uint64_t sum = class_peaks(c);
	uint32_t guar, ceiling;
	bool first = true;

	if (c->nclass == 0 || !c->cls[0].shares || c->limit == UINT32_MAX)
		return;
	if (json)
		fputs(", \"classes\": [", f);
	for (size_t k = 0; k < c->nclass; k++) {
		const struct cli_class *cc = &c->cls[k];

		class_proposal(c, cc, sum, &guar, &ceiling);
		if (json) {
			fprintf(f, "%s{\"name\": ", first ? "" : ", ");
			cli_json_string(f, cc->name);
			fprintf(f, ", \"peak\": %u, \"rejected\": %llu, \"guaranteed\": %u, "
			    "\"suggested_guaranteed\": %u, \"ceiling\": %u, \"suggested_ceiling\": %u}",
			    cc->peak, (unsigned long long)cc->rejected, cc->guaranteed, guar,
			    cc->limit, ceiling);
		} else {
			char label[BS_CLASS_NAME_MAX + 8];

			snprintf(label, sizeof(label), "class %s", cc->name);
			fprintf(f, "  %-20s guaranteed %u, propose %u (its peak %u%s); ceiling %u, "
			    "propose %u%s\n", label, cc->guaranteed, guar, cc->peak,
			    sum > c->limit ? ", peaks scaled to the limit" : "", cc->limit, ceiling,
			    ceiling > cc->limit ? " (refused at its ceiling)" : "");
		}
		first = false;
	}
	if (json)
		fputc(']', f);
}

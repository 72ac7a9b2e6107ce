/* seg_access.c - who may use a segment: its owner, group and mode against a user, and status's warning. */
#include <errno.h>
#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cli.h"

/*
 * A segment is usable by a process when the process can open it
 * read-write (the permission bits, as the kernel checks them: owner, else
 * group, else others, and root past all of them) and when seg_attach
 * trusts it (it belongs to the process's user, to root, or to the owner
 * the config names). A process that fails either runs without limits, and
 * cannot even count itself as unprotected in the segment.
 */

/* Whether this process has capability cap in its effective set. */
static bool
has_cap(unsigned cap)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];

	memset(d, 0, sizeof(d));
	if (syscall(SYS_capget, &h, d) < 0)
		return false;
	return (d[cap / 32].effective & (1u << (cap % 32))) != 0;
}

const char *
seg_id_name(unsigned id, bool group, char *buf, size_t len)
{
	char tmp[4096];
	int rc;

	if (group) {
		struct group gr, *res = NULL;

		rc = getgrgid_r((gid_t)id, &gr, tmp, sizeof(tmp), &res);
		if (rc == 0 && res != NULL) {
			snprintf(buf, len, "%s", res->gr_name);
			return buf;
		}
	} else {
		struct passwd pw, *res = NULL;

		rc = getpwuid_r((uid_t)id, &pw, tmp, sizeof(tmp), &res);
		if (rc == 0 && res != NULL) {
			snprintf(buf, len, "%s", res->pw_name);
			return buf;
		}
	}
	snprintf(buf, len, "%s %u", group ? "gid" : "uid", id);
	return buf;
}

int
seg_user_of(uid_t uid, struct seg_user *u)
{
	char tmp[4096];
	struct passwd pw, *res = NULL;
	gid_t first;
	int n = 1;

	memset(u, 0, sizeof(*u));
	u->uid = uid;
	u->dac_override = u->chown = uid == 0;
	if (getpwuid_r(uid, &pw, tmp, sizeof(tmp), &res) != 0 || res == NULL) {
		snprintf(u->name, sizeof(u->name), "uid %u", (unsigned)uid);
		return 0;
	}
	snprintf(u->name, sizeof(u->name), "%s", res->pw_name);
	/* The first call counts (into n); the primary group comes first. */
	getgrouplist(res->pw_name, res->pw_gid, &first, &n);
	u->gids = calloc(n > 0 ? (size_t)n : 1, sizeof(gid_t));
	if (u->gids == NULL)
		return -ENOMEM;
	if (n > 0 && getgrouplist(res->pw_name, res->pw_gid, u->gids, &n) >= 0)
		u->ngids = (size_t)n;
	else
		u->gids[u->ngids++] = res->pw_gid;
	return 0;
}

int
seg_user_self(struct seg_user *u)
{
	int n = getgroups(0, NULL);

	memset(u, 0, sizeof(*u));
	u->uid = geteuid();
	seg_id_name(u->uid, false, u->name, sizeof(u->name));
	u->dac_override = has_cap(CAP_DAC_OVERRIDE);
	u->chown = has_cap(CAP_CHOWN);
	u->gids = calloc((n > 0 ? (size_t)n : 0) + 1, sizeof(gid_t));
	if (u->gids == NULL)
		return -ENOMEM;
	u->gids[0] = getegid();
	if (n > 0 && (n = getgroups(n, u->gids + 1)) < 0)
		n = 0;
	u->ngids = 1 + (size_t)(n > 0 ? n : 0);
	return 0;
}

void
seg_user_free(struct seg_user *u)
{
	free(u->gids);
	u->gids = NULL;
	u->ngids = 0;
}

bool
seg_user_in(const struct seg_user *u, gid_t gid)
{
	for (size_t i = 0; i < u->ngids; i++) {
		if (u->gids[i] == gid)
			return true;
	}
	return false;
}

bool
seg_user_can_open(const struct seg_perm *p, const struct seg_user *u)
{
	unsigned rw;

	if (u->dac_override)
		return true;
	/* The kernel takes the first class that applies, not the best. */
	if (p->uid == u->uid)
		rw = 0600;
	else if (seg_user_in(u, p->gid))
		rw = 0060;
	else
		rw = 0006;
	return (p->mode & rw) == rw;
}

enum seg_refusal
seg_refusal_of(const struct seg_perm *p, const struct seg_user *u, const struct bs_config *cfg)
{
	if (p->uid != u->uid && p->uid != 0 && !(cfg->has_owner && p->uid == cfg->owner))
		return SEG_UNTRUSTED;
	return seg_user_can_open(p, u) ? SEG_USABLE : SEG_UNWRITABLE;
}

int
seg_perm_of(const char *segment, struct seg_perm *p, off_t *size)
{
	char path[BS_NAME_MAX + 32];
	struct stat st;

	snprintf(path, sizeof(path), "/dev/shm/bulkshim.%s", segment);
	if (lstat(path, &st) < 0)
		return -errno;
	p->uid = st.st_uid;
	p->gid = st.st_gid;
	p->mode = (unsigned)(st.st_mode & 07777);
	if (size != NULL)
		*size = st.st_size;
	return 0;
}

const char *
seg_perm_text(const struct seg_perm *p, char *buf, size_t len)
{
	char user[64], group[64];

	snprintf(buf, len, "%s:%s, mode %04o", seg_id_name(p->uid, false, user, sizeof(user)),
	    seg_id_name(p->gid, true, group, sizeof(group)), p->mode);
	return buf;
}

/* The configured owner cannot use the segment: the programs the config
 * is for run without limits. */
static void
warn_owner(FILE *f, const char *name, const char *perm, const struct seg_user *svc,
    enum seg_refusal why)
{
	fprintf(f, "WARNING: segment %s (/dev/shm/bulkshim.%s) is %s: %s, the config's owner, %s, "
	    "so its programs run WITHOUT LIMITS; fix: stop them, run `bulkshim rm %s` and start "
	    "them again (the first to start creates it as the config says)\n", name, name, perm,
	    svc->name, why == SEG_UNTRUSTED ? "does not trust it (it belongs to neither that user "
	    "nor root)" : "cannot write it", name);
}

/* Nothing says who the programs are; but a segment that no program ever
 * attached to and that only its owner may write was made by a command
 * (an agent started first), and a program of any other user cannot open
 * it. The kernel engine counts without attaching: its segments are left
 * alone. */
static bool
looks_unattachable(const struct seg_perm *p, const struct cli_snap *snap)
{
	if (snap->attaches != 0 || snap->processes != 0 || (p->mode & 0060) == 0060 ||
	    (p->mode & 0006) == 0006)
		return false;
	for (uint32_t i = 0; i < snap->ncomp; i++) {
		if (snap->comp[i].kernel)
			return false;
	}
	return true;
}

void
cli_seg_access_warn(FILE *f, const struct cli_target *t, const struct cli_snap *snap)
{
	char name[BS_NAME_MAX], perm[160], err[BS_ERRLEN];
	struct bs_config cfg;
	struct seg_perm p;
	struct seg_user svc;
	bool has_cfg = false;

	if (t->segment != NULL) {
		snprintf(name, sizeof(name), "%s", t->segment);
	} else {
		/* cli_open loaded the same file a moment ago. */
		if (cfg_load(cli_config_path(t), &cfg, false, err, sizeof(err)) < 0)
			return;
		snprintf(name, sizeof(name), "%s", cfg.segment);
		has_cfg = true;
	}
	if (seg_perm_of(name, &p, NULL) < 0)
		goto done;
	seg_perm_text(&p, perm, sizeof(perm));
	if (has_cfg && cfg.has_owner) {
		enum seg_refusal why;

		if (seg_user_of(cfg.owner, &svc) < 0)
			goto done;
		why = seg_refusal_of(&p, &svc, &cfg);
		if (why != SEG_USABLE)
			warn_owner(f, name, perm, &svc, why);
		seg_user_free(&svc);
	} else if (looks_unattachable(&p, snap)) {
		fprintf(f, "WARNING: segment %s (/dev/shm/bulkshim.%s) is %s and no program has "
		    "attached to it: programs of any other user cannot open it and run WITHOUT "
		    "LIMITS; fix: name their user in the config (owner = \"USER\";), stop them, run "
		    "`bulkshim rm %s` and start them again\n", name, name, perm, name);
	}
done:
	if (has_cfg)
		cfg_free(&cfg);
}

/* fleet_seg.c - the agent and its segment: attach to the service's, create it as the config says, wait, or refuse. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "cli.h"
#include "fleet.h"

/*
 * The agent writes into the segment of the service it leases for, and that
 * segment is only any use if the service's programs can attach to it. So
 * the agent never makes a segment that they could not use: it creates one
 * only when the config names its owner (the service's user) and the agent
 * can give it to that owner, and otherwise leaves the creation to the
 * service and waits. A segment that exists is checked before it is used:
 * when the config's owner, or the agent itself, cannot use it, the agent
 * says why in one line, with the fix, and refuses to run.
 */

/* The names and config values a message needs. */
struct words {
	char path[BS_NAME_MAX + 32];	/* /dev/shm/bulkshim.SEGMENT */
	char perm[160];			/* "root:root, mode 0600" */
	char owner[64];			/* a user's name, for adduser */
	char owner_key[80];		/* the same as a config value: "name", or the uid */
	char group[64];
	char group_key[80];		/* the group to give the agent */
};

/* id as a config value: its name in quotes, or the number when it has none
 * (owner = 1234; is valid, owner = "uid 1234"; is not). */
static void
config_value(unsigned id, bool group, char *buf, size_t len)
{
	char name[64];

	seg_id_name(id, group, name, sizeof(name));
	if (strncmp(name, group ? "gid " : "uid ", 4) == 0)
		snprintf(buf, len, "%u", id);
	else
		snprintf(buf, len, "\"%s\"", name);
}

/* The words for a segment of perm p (NULL: none yet) owned, when it is
 * created, by uid; the group to suggest is the config's, else the agent's. */
static void
words_for(struct words *w, const struct bs_config *cfg, const struct seg_perm *p, uid_t uid,
    const struct seg_user *self)
{
	gid_t g = cfg->has_group ? cfg->group : self->ngids > 0 ? self->gids[0] : 0;

	snprintf(w->path, sizeof(w->path), "/dev/shm/bulkshim.%s", cfg->segment);
	w->perm[0] = '\0';
	if (p != NULL)
		seg_perm_text(p, w->perm, sizeof(w->perm));
	seg_id_name(uid, false, w->owner, sizeof(w->owner));
	config_value(uid, false, w->owner_key, sizeof(w->owner_key));
	seg_id_name(g, true, w->group, sizeof(w->group));
	config_value(g, true, w->group_key, sizeof(w->group_key));
}

/* What the service's programs would create if they started first: their
 * user, the config's group if they may give it (root, or a member), else
 * their own, and the config's mode. */
static void
made_by_service(const struct bs_config *cfg, const struct seg_user *svc, struct seg_perm *p)
{
	p->uid = svc->uid;
	p->gid = svc->ngids > 0 ? svc->gids[0] : 0;
	if (cfg->has_group && (svc->chown || seg_user_in(svc, cfg->group)))
		p->gid = cfg->group;
	p->mode = cfg->mode & 07777;
}

/* The segment does not exist yet. */
static enum fleet_seg_step
plan_missing(const struct bs_config *cfg, const struct seg_user *self, const struct seg_user *svc,
    char *msg, size_t len)
{
	struct seg_perm p;
	struct words w;

	if (!cfg->has_owner || svc == NULL) {
		words_for(&w, cfg, NULL, self->uid, self);
		snprintf(msg, len, "segment %s is created by the service's programs when they start "
		    "(the config names no owner, so this agent does not create it)", w.path);
		return FSEG_WAIT;
	}
	p.uid = cfg->owner;
	p.gid = cfg->has_group ? cfg->group : self->ngids > 0 ? self->gids[0] : 0;
	p.mode = cfg->mode & 07777;
	words_for(&w, cfg, &p, cfg->owner, self);
	if (!self->chown && (cfg->owner != self->uid ||
	    (cfg->has_group && !seg_user_in(self, cfg->group)))) {
		snprintf(msg, len, "segment %s is created by the service's programs when they start "
		    "(this agent, user %s, cannot give it to %s without CAP_CHOWN)", w.path, self->name,
		    w.owner);
		return FSEG_WAIT;
	}
	if (seg_refusal_of(&p, svc, cfg) != SEG_USABLE) {
		snprintf(msg, len, "the config's mode %04o would not let %s, its owner, write segment %s: "
		    "give it a mode like \"0660\"", p.mode, w.owner, w.path);
		return FSEG_REFUSE;
	}
	if (seg_refusal_of(&p, self, cfg) != SEG_USABLE) {
		snprintf(msg, len, "this agent (user %s) could not open again the segment %s it would "
		    "create (%s): add group = %s; mode = \"0660\"; to the config", self->name, w.path,
		    w.perm, w.group_key);
		return FSEG_REFUSE;
	}
	msg[0] = '\0';
	made_by_service(cfg, svc, &p);
	if (seg_refusal_of(&p, self, cfg) == SEG_USABLE)
		return FSEG_CREATE;
	seg_perm_text(&p, w.perm, sizeof(w.perm));
	if (cfg->has_group)
		snprintf(msg, len, "warning: if the service's programs start before this agent, they "
		    "create segment %s as %s, which this agent cannot write: add %s to group %s "
		    "(adduser %s %s)", w.path, w.perm, w.owner, w.group, w.owner, w.group);
	else if (svc->chown || (self->ngids > 0 && seg_user_in(svc, self->gids[0])))
		snprintf(msg, len, "warning: if the service's programs start before this agent, they "
		    "create segment %s as %s, which this agent cannot write: add group = %s; to the "
		    "config", w.path, w.perm, w.group_key);
	else
		snprintf(msg, len, "warning: if the service's programs start before this agent, they "
		    "create segment %s as %s, which this agent cannot write: add group = %s; to the "
		    "config and %s to that group (adduser %s %s)", w.path, w.perm, w.group_key, w.owner,
		    w.owner, w.group);
	return FSEG_CREATE;
}

/* The segment exists, as p says. */
static enum fleet_seg_step
plan_existing(const struct bs_config *cfg, const struct seg_perm *p, const struct seg_user *self,
    const struct seg_user *svc, char *msg, size_t len)
{
	enum seg_refusal why;
	struct words w;

	words_for(&w, cfg, p, p->uid, self);
	if (svc != NULL && (why = seg_refusal_of(p, svc, cfg)) != SEG_USABLE) {
		snprintf(msg, len, "segment %s is %s: %s, the config's owner, %s, so the service's "
		    "programs run without limits; stop them, run `bulkshim rm %s` and start this "
		    "agent first: it creates the segment as the config says", w.path, w.perm, svc->name,
		    why == SEG_UNTRUSTED ? "does not trust it" : "cannot write it", cfg->segment);
		return FSEG_REFUSE;
	}
	why = seg_refusal_of(p, self, cfg);
	if (why == SEG_UNTRUSTED && seg_user_can_open(p, self)) {
		snprintf(msg, len, "segment %s is %s, and this agent (user %s) trusts only a segment of "
		    "its own user, of root or of the config's owner: if %s runs the service, add "
		    "owner = %s; to the config", w.path, w.perm, self->name, w.owner, w.owner_key);
		return FSEG_REFUSE;
	}
	if (why == SEG_UNTRUSTED) {
		snprintf(msg, len, "segment %s is %s, and this agent (user %s) trusts only a segment of "
		    "its own user, of root or of the config's owner: if %s runs the service, add "
		    "owner = %s; group = %s; mode = \"0660\"; to the config, stop its programs and run "
		    "`bulkshim rm %s`", w.path, w.perm, self->name, w.owner, w.owner_key, w.group_key,
		    cfg->segment);
		return FSEG_REFUSE;
	}
	if (why == SEG_UNWRITABLE && cfg->has_group && p->gid != cfg->group) {
		snprintf(msg, len, "this agent (user %s) cannot write segment %s (%s): its creator "
		    "could not give it to group %s; add %s to that group (adduser %s %s), stop the "
		    "service's programs and run `bulkshim rm %s`", self->name, w.path, w.perm, w.group,
		    w.owner, w.owner, w.group, cfg->segment);
		return FSEG_REFUSE;
	}
	if (why == SEG_UNWRITABLE) {
		snprintf(msg, len, "this agent (user %s) cannot write segment %s (%s): add group = %s; "
		    "mode = \"0660\"; to the config, stop the service's programs and run `bulkshim rm "
		    "%s`", self->name, w.path, w.perm, w.group_key, cfg->segment);
		return FSEG_REFUSE;
	}
	msg[0] = '\0';
	return FSEG_ATTACH;
}

enum fleet_seg_step
fleet_seg_plan(const struct bs_config *cfg, const struct seg_perm *p, const struct seg_user *self,
    const struct seg_user *svc, char *msg, size_t len)
{
	if (p == NULL)
		return plan_missing(cfg, self, svc, msg, len);
	return plan_existing(cfg, p, self, svc, msg, len);
}

/* ---- who the agent is, to Redis ---- */

/* This boot of this machine: the kernel's boot id, 32 hex digits, or
 * "noboot" where /proc cannot say (then the segment's inode alone tells
 * segments of one machine apart). */
static void
boot_id(char *out, size_t len)
{
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
	char line[64] = "";
	size_t n = 0;

	if (f != NULL) {
		if (fgets(line, sizeof(line), f) == NULL)
			line[0] = '\0';
		fclose(f);
	}
	for (const char *p = line; *p != '\0' && n + 1 < len; p++)
		if (isxdigit((unsigned char)*p))
			out[n++] = *p;
	out[n] = '\0';
	if (n == 0)
		snprintf(out, len, "noboot");
}

void
fleet_me_init(struct fleet_me *me, const char *segment)
{
	char name[BS_NAME_MAX + 16], path[BS_NAME_MAX + 32], boot[40];
	struct utsname u;
	struct stat st;

	/* The segment file's device and inode tell it from every other on
	 * this boot (a container's /dev/shm is a device of its own); the boot
	 * id tells this machine from a clone of it. A restarted agent of the
	 * same segment has the same token, and takes its entry back. */
	boot_id(boot, sizeof(boot));
	seg_shm_name(segment, name, sizeof(name));
	snprintf(path, sizeof(path), "/dev/shm%s", name);
	if (stat(path, &st) < 0)
		memset(&st, 0, sizeof(st));
	snprintf(me->token, sizeof(me->token), "%s-%llx-%llx", boot, (unsigned long long)st.st_dev,
	    (unsigned long long)st.st_ino);
	if (uname(&u) < 0)
		snprintf(u.nodename, sizeof(u.nodename), "?");
	snprintf(me->agent, sizeof(me->agent), "pid %d on %.64s, segment %s, boot %.8s",
	    (int)getpid(), u.nodename, segment, boot);
}

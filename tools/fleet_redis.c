/* fleet_redis.c - the fleet agent's Redis side over hiredis: connect, authenticate, renew, read. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>

#include "fleet.h"

#define FLEET_PASSWORD_MAX	512

struct fleet_conn {
	redisContext *rc;
	char sha[48];		/* of the script, as SCRIPT LOAD answered */
};

const char *
fleet_state_name(uint32_t state)
{
	switch (state) {
	case FLEET_OK: return "ok";
	case FLEET_UNREACHABLE: return "unreachable";
	case FLEET_REFUSED: return "refused";
	default: return "no agent";
	}
}

void
fleet_key(const char *fleet, const char *comp, char *out, size_t len)
{
	snprintf(out, len, "bulkshim:fleet:%s:%s", fleet, comp);
}

static struct timeval
ms_tv(uint32_t ms)
{
	struct timeval tv = { .tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000 };

	return tv;
}

/* Reads the password: the file's first line, without its newline. */
static int
read_password(const char *path, char *out, size_t len, char *err, size_t errlen)
{
	FILE *f = fopen(path, "re");
	size_t n;

	if (f == NULL) {
		snprintf(err, errlen, "cannot read password_file %s: %s", path, strerror(errno));
		return -errno;
	}
	if (fgets(out, (int)len, f) == NULL)
		out[0] = '\0';
	fclose(f);
	n = strcspn(out, "\r\n");
	out[n] = '\0';
	if (n == 0) {
		snprintf(err, errlen, "password_file %s is empty", path);
		return -EINVAL;
	}
	return 0;
}

/* Runs one command of argc words; returns the reply (the caller frees it)
 * or NULL with the connection's error in err. */
static redisReply *
run(redisContext *rc, int argc, const char **argv, char *err, size_t errlen)
{
	redisReply *r = redisCommandArgv(rc, argc, argv, NULL);

	if (r == NULL)
		snprintf(err, errlen, "%s", rc->errstr[0] ? rc->errstr : "connection lost");
	return r;
}

struct fleet_conn *
fleet_connect(const struct cfg_fleet *f, bool *refused, char *err, size_t errlen)
{
	struct fleet_conn *fc = calloc(1, sizeof(*fc));
	char host[BS_FLEET_ADDR_MAX], pass[FLEET_PASSWORD_MAX];
	const char *colon, *argv[3];
	redisReply *r = NULL;
	size_t hl;

	*refused = false;
	if (fc == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if (strncmp(f->redis, "unix:", 5) == 0) {
		fc->rc = redisConnectUnixWithTimeout(f->redis + 5, ms_tv(f->timeout_ms));
	} else {
		colon = strrchr(f->redis, ':');
		hl = (size_t)(colon - f->redis);
		snprintf(host, sizeof(host), "%.*s", (int)hl, f->redis);
		if (host[0] == '[') {	/* [v6]:port */
			memmove(host, host + 1, hl);
			host[hl - 2] = '\0';
		}
		fc->rc = redisConnectWithTimeout(host, atoi(colon + 1), ms_tv(f->timeout_ms));
	}
	if (fc->rc == NULL || fc->rc->err) {
		snprintf(err, errlen, "cannot connect to Redis at %s: %s", f->redis,
		    fc->rc ? fc->rc->errstr : "out of memory");
		goto fail;
	}
	if (redisSetTimeout(fc->rc, ms_tv(f->timeout_ms)) != REDIS_OK) {
		snprintf(err, errlen, "cannot set the timeout of the Redis connection");
		goto fail;
	}
	if (f->password_file[0] != '\0') {
		if (read_password(f->password_file, pass, sizeof(pass), err, errlen) < 0) {
			*refused = true;
			goto fail;
		}
		argv[0] = "AUTH";
		argv[1] = pass;
		r = run(fc->rc, 2, argv, err, errlen);
		memset(pass, 0, sizeof(pass));
		if (r == NULL)
			goto fail;
		if (r->type == REDIS_REPLY_ERROR) {
			snprintf(err, errlen, "Redis at %s refused the password of %s: %s", f->redis,
			    f->password_file, r->str);
			*refused = true;
			goto fail;
		}
		freeReplyObject(r);
		r = NULL;
	}
	argv[0] = "SCRIPT";
	argv[1] = "LOAD";
	argv[2] = fleet_lua;
	if ((r = run(fc->rc, 3, argv, err, errlen)) == NULL)
		goto fail;
	if (r->type != REDIS_REPLY_STRING || r->len >= sizeof(fc->sha)) {
		snprintf(err, errlen, "Redis at %s did not load the fleet script: %s", f->redis,
		    r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
		*refused = true;
		goto fail;
	}
	memcpy(fc->sha, r->str, r->len);
	freeReplyObject(r);
	return fc;
fail:
	if (r != NULL)
		freeReplyObject(r);
	fleet_disconnect(fc);
	return NULL;
}

void
fleet_disconnect(struct fleet_conn *fc)
{
	if (fc == NULL)
		return;
	if (fc->rc != NULL)
		redisFree(fc->rc);
	free(fc);
}

/* An integer element of the script's answer, which Lua numbers come back as. */
static bool
int_elem(const redisReply *r, size_t i, uint32_t *out)
{
	if (i >= r->elements || r->element[i]->type != REDIS_REPLY_INTEGER ||
	    r->element[i]->integer < 0 || r->element[i]->integer > UINT32_MAX)
		return false;
	*out = (uint32_t)r->element[i]->integer;
	return true;
}

/* Reads the script's answer into a; false (with a->note) if it is not one. */
static bool
take_answer(struct fleet_ask *a, const redisReply *r)
{
	uint32_t lease, soon;

	a->ok = false;
	a->refused = true;
	if (r->type == REDIS_REPLY_ERROR) {
		snprintf(a->note, sizeof(a->note), "%s", r->str);
		return false;
	}
	if (r->type != REDIS_REPLY_ARRAY || r->elements != 8 || !int_elem(r, 0, &a->share) ||
	    !int_elem(r, 1, &lease) || !int_elem(r, 2, &a->live) || !int_elem(r, 3, &a->known) ||
	    r->element[4]->type != REDIS_REPLY_STRING || !int_elem(r, 5, &a->in_force) ||
	    r->element[6]->type != REDIS_REPLY_STRING || !int_elem(r, 7, &soon) ||
	    a->share > a->ceiling ||
	    a->share > a->in_force || a->in_force > a->limit) {
		snprintf(a->note, sizeof(a->note), "malformed reply from Redis");
		return false;
	}
	a->soon = soon != 0;
	snprintf(a->note, sizeof(a->note), "%s", r->element[4]->str);
	snprintf(a->lowest, sizeof(a->lowest), "%s", r->element[6]->str);
	a->ok = true;
	a->refused = false;
	return true;
}

int
fleet_renew(struct fleet_conn *fc, const struct cfg_fleet *f, const struct fleet_me *me,
    struct fleet_ask *asks, size_t n, uint64_t seq, char *err, size_t errlen)
{
	char key[BS_NAME_MAX * 2 + 32], num[8][24], sq[24], lease[16], forget[24], hosts[16];
	const char *argv[18];
	void *reply;

	snprintf(sq, sizeof(sq), "%llu", (unsigned long long)seq);
	snprintf(lease, sizeof(lease), "%u", f->lease_ms);
	snprintf(hosts, sizeof(hosts), "%u", f->max_hosts);
	/* A host silent this long is taken for gone: what it held, and its
	 * floor, return to the others. */
	snprintf(forget, sizeof(forget), "%llu", (unsigned long long)f->forget_s * 1000);
	for (size_t i = 0; i < n; i++) {
		struct fleet_ask *a = &asks[i];
		const uint32_t v[6] = { a->limit, a->floor, a->ceiling, a->held, a->want, a->applied };

		a->ok = a->refused = a->soon = false;
		a->note[0] = a->lowest[0] = '\0';
		a->in_force = 0;
		fleet_key(f->name, a->comp, key, sizeof(key));
		for (int k = 0; k < 6; k++)
			snprintf(num[k], sizeof(num[k]), "%u", v[k]);
		argv[0] = "EVALSHA";
		argv[1] = fc->sha;
		argv[2] = "1";
		argv[3] = key;
		argv[4] = f->host;
		for (int k = 0; k < 6; k++)
			argv[5 + k] = num[k];
		argv[11] = lease;
		argv[12] = forget;
		argv[13] = sq;
		argv[14] = hosts;
		argv[15] = me->token;
		argv[16] = me->agent;
		argv[17] = a->leave ? "leave" : "";
		if (redisAppendCommandArgv(fc->rc, 18, argv, NULL) != REDIS_OK)
			goto lost;
	}
	for (size_t i = 0; i < n; i++) {
		if (redisGetReply(fc->rc, &reply) != REDIS_OK || reply == NULL)
			goto lost;
		take_answer(&asks[i], reply);
		freeReplyObject(reply);
		/* The script is gone (SCRIPT FLUSH): connect again, which loads it. */
		if (strncmp(asks[i].note, "NOSCRIPT", 8) == 0) {
			snprintf(err, errlen, "Redis lost the fleet script");
			return -EIO;
		}
	}
	return 0;
lost:
	snprintf(err, errlen, "Redis at %s: %s", f->redis,
	    fc->rc->errstr[0] ? fc->rc->errstr : "connection lost");
	return -EIO;
}

int
fleet_entries(struct fleet_conn *fc, const char *fleet, const char *comp, uint64_t *now_ms,
    void (*fn)(const struct fleet_entry *e, void *arg), void *arg, char *err, size_t errlen)
{
	char key[BS_NAME_MAX * 2 + 32];
	const char *argv[2];
	redisReply *r;
	int n = 0;

	argv[0] = "TIME";
	if ((r = run(fc->rc, 1, argv, err, errlen)) == NULL)
		return -EIO;
	if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
	    r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING) {
		freeReplyObject(r);
		snprintf(err, errlen, "malformed reply from Redis to TIME");
		return -EPROTO;
	}
	*now_ms = strtoull(r->element[0]->str, NULL, 10) * 1000 +
	    strtoull(r->element[1]->str, NULL, 10) / 1000;
	freeReplyObject(r);
	fleet_key(fleet, comp, key, sizeof(key));
	argv[0] = "HGETALL";
	argv[1] = key;
	if ((r = run(fc->rc, 2, argv, err, errlen)) == NULL)
		return -EIO;
	if (r->type != REDIS_REPLY_ARRAY) {
		snprintf(err, errlen, "malformed reply from Redis to HGETALL %s", key);
		freeReplyObject(r);
		return -EPROTO;
	}
	for (size_t i = 0; i + 1 < r->elements; i += 2) {
		const redisReply *k = r->element[i], *v = r->element[i + 1];
		unsigned long long x[10], seq;
		double churn = 0;
		const char *tab, *cut;
		struct fleet_entry e;

		if (k->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING ||
		    strncmp(k->str, "h:", 2) != 0)
			continue;
		/* forget and churn are missing from the entries of older agents. */
		if (sscanf(v->str, "%llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %lf", &x[0],
		    &x[1], &x[2], &x[3], &x[4], &x[5], &x[6], &x[7], &seq, &x[8], &x[9], &churn) < 10)
			continue;
		memset(&e, 0, sizeof(e));
		e.churn = churn >= 0 && churn < 1e9 ? churn : 0;
		/* The field is "h:<host>#<token>"; the token is Redis's business. */
		cut = strchr(k->str + 2, '#');
		snprintf(e.host, sizeof(e.host), "%.*s",
		    (int)(cut != NULL ? (size_t)(cut - k->str - 2) : strlen(k->str + 2)), k->str + 2);
		tab = strchr(v->str, '\t');
		e.agent = tab != NULL ? tab + 1 : "";
		e.share = x[0];
		e.applied = x[1];
		e.held = x[2];
		e.want = x[3];
		e.floor = x[4];
		e.ceiling = x[5];
		e.expires = x[6];
		e.seen = x[7];
		e.limit = x[8];
		e.reserved = e.share > e.applied ? e.share : e.applied;
		e.reserved = e.held > e.reserved ? e.held : e.reserved;
		if (e.expires <= *now_ms && e.floor > e.reserved)
			e.reserved = e.floor;
		/* An entry of an agent older than tokens, as fleet.lua counts it. */
		e.old = cut == NULL;
		if (e.old && e.expires <= *now_ms)
			e.reserved = e.floor;
		fn(&e, arg);
		n++;
	}
	freeReplyObject(r);
	return n;
}

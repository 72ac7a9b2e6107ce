/* cli_hosts.c - what each host-name destination of a config resolves to now, for check and status. */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

/* Resolves one host rule into *h. */
static void
resolve_one(const struct bs_config *cfg, const struct rule *r, struct cli_host *h)
{
	struct addrinfo hints, *res = NULL;

	memset(h, 0, sizeof(*h));
	h->comp = cfg->comp[r->comp].name;
	h->host = r->host;
	h->port_lo = r->port_lo;
	h->port_hi = r->port_hi;
	h->line = r->line;
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	h->error = getaddrinfo(r->host, NULL, &hints, &res);
	for (const struct addrinfo *ai = res; ai != NULL && h->naddr < CLI_HOST_ADDRS;
	    ai = ai->ai_next) {
		const void *a = ai->ai_family == AF_INET ?
		    (const void *)&((const struct sockaddr_in *)ai->ai_addr)->sin_addr :
		    (const void *)&((const struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
		bool dup = false;

		if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6)
			continue;
		inet_ntop(ai->ai_family, a, h->addr[h->naddr], sizeof(h->addr[0]));
		for (size_t k = 0; k < h->naddr; k++)
			dup = dup || strcmp(h->addr[k], h->addr[h->naddr]) == 0;
		h->naddr += !dup;
	}
	if (res != NULL)
		freeaddrinfo(res);
	if (h->error == 0 && h->naddr == 0)
		h->error = EAI_NODATA;
}

size_t
cli_resolve_hosts(const struct bs_config *cfg, void (*fn)(const struct cli_host *, void *),
    void *arg)
{
	struct cli_host h;
	size_t bad = 0;

	for (size_t i = 0; i < cfg->nrules; i++) {
		if (cfg->rules[i].kind != RULE_HOST)
			continue;
		resolve_one(cfg, &cfg->rules[i], &h);
		bad += h.error != 0;
		fn(&h, arg);
	}
	return bad;
}

const char *
cli_host_error(const struct cli_host *h)
{
	return h->error == EAI_NODATA ? "no address" : gai_strerror(h->error);
}

struct json_out {
	FILE *f;
	bool first;
};

/* One element of the "hosts" array of status --json. */
static void
json_host(const struct cli_host *h, void *arg)
{
	struct json_out *o = arg;
	FILE *f = o->f;

	fputs(o->first ? "{\"compartment\": " : ", {\"compartment\": ", f);
	o->first = false;
	cli_json_string(f, h->comp);
	fputs(", \"host\": ", f);
	cli_json_string(f, h->host);
	fprintf(f, ", \"port_lo\": %u, \"port_hi\": %u, \"addresses\": [", h->port_lo, h->port_hi);
	for (size_t k = 0; k < h->naddr; k++) {
		fputs(k ? ", " : "", f);
		cli_json_string(f, h->addr[k]);
	}
	fputs("], \"error\": ", f);
	if (h->error != 0)
		cli_json_string(f, cli_host_error(h));
	else
		fputs("null", f);
	fputc('}', f);
}

void
cli_json_hosts(FILE *f, const char *path)
{
	struct json_out o = { f, true };
	struct bs_config cfg;
	char err[BS_ERRLEN];

	fputs(", \"hosts\": [", f);
	if (path[0] != '\0' && cfg_load(path, &cfg, false, err, sizeof(err)) == 0) {
		cli_resolve_hosts(&cfg, json_host, &o);
		cfg_free(&cfg);
	}
	fputc(']', f);
}

/* One line of text status for a host-name destination that gives no address. */
static void
text_host(const struct cli_host *h, void *arg)
{
	FILE *f = arg;

	if (h->error == 0)
		return;
	fprintf(f, "destination %s:%u of compartment %s (line %d of the config) resolves to "
	    "nothing now (%s): connections to it are not limited until it does\n", h->host,
	    h->port_lo, h->comp, h->line, cli_host_error(h));
}

void
cli_text_hosts(FILE *f, const char *path)
{
	struct bs_config cfg;
	char err[BS_ERRLEN];

	if (path[0] == '\0' || cfg_load(path, &cfg, false, err, sizeof(err)) != 0)
		return;
	if (cli_resolve_hosts(&cfg, text_host, f) > 0)
		fputc('\n', f);
	cfg_free(&cfg);
}

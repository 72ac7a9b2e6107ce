/* pg_client.c - the PostgreSQL row's client for `make bench-adaptive`: a thread per query, one connection per query. */
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadgen.h"

/*
 * usage: pg_client CONNINFO QUERY THREADS SECONDS [PAUSE_MS]
 *
 * Each thread connects, runs QUERY, disconnects, and starts again until
 * SECONDS have passed. A connection per query makes the shim's connection
 * limit a limit of queries in flight: the connection's life is the
 * request, which is what an adaptive limit without max_inflight measures.
 * A connection the shim refuses fails in connect() with ECONNREFUSED,
 * which libpq reports as "Connection refused"; that thread then pauses
 * PAUSE_MS (default 50) as legacy_client does. Output: the same JSON list
 * as legacy_client, [end time s, outcome, latency ms] sorted by time, with
 * outcome "ok", "refused", "connect" or "query".
 */

static const char *conninfo, *query;

/* One query on a new connection; its outcome. */
static const char *
one(void)
{
	PGconn *c = PQconnectdb(conninfo);
	const char *what = "ok";
	PGresult *r;

	if (PQstatus(c) != CONNECTION_OK) {
		what = strstr(PQerrorMessage(c), "refused") ? "refused" : "connect";
		PQfinish(c);
		return what;
	}
	r = PQexec(c, query);
	if (PQresultStatus(r) != PGRES_TUPLES_OK)
		what = "query";
	PQclear(r);
	PQfinish(c);
	return what;
}

int
main(int argc, char **argv)
{
	int threads;

	if (argc < 5) {
		fprintf(stderr, "usage: pg_client CONNINFO QUERY THREADS SECONDS [PAUSE_MS]\n");
		return 2;
	}
	conninfo = argv[1];
	query = argv[2];
	threads = atoi(argv[3]);
	if (threads < 1 || threads > 1024)
		return 2;
	return loadgen_run(threads, atof(argv[4]), argc > 5 ? atof(argv[5]) : 50, one);
}

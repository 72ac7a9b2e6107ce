# bench/adaptive.mk - `make bench-adaptive`: every adaptive controller and the best static limit on
# one matrix of rows (overloads, a capacity drop, a latency step, exponential service times and a
# PostgreSQL row). Included by the main Makefile; never part of `make test`. About 40 minutes (each
# configuration runs twice per row, pooled; ADAPTIVE_ARGS=--repeat 1 halves it); writes
# bench/adaptive.md, build/adaptive-ROW.png and the adaptive section of bench/results.md.
# ADAPTIVE_ARGS=--quick for a try of about 3 minutes (three rows, short phases; it writes the same
# files, and says --quick in them).

ADAPTIVE_ARGS ?=

.PHONY: bench-adaptive
bench-adaptive:
	@sh tests/deps.sh gcc make pkg-config libconfig-dev python3 python3-matplotlib curl \
		postgresql libpq-dev
	$(MAKE) --no-print-directory all $(B)/tests/legacy_client $(B)/bench/pg_client
	/usr/bin/python3 bench/adaptive.py --build $(B) $(ADAPTIVE_ARGS)

# The benchmark's client in C: no interpreter in every latency.
$(B)/tests/legacy_client: tests/preload/legacy_client.c tests/preload/loadgen.c \
		tests/preload/loadgen.h | $(B)/tests
	$(CC) $(CFLAGS) -o $@ $< tests/preload/loadgen.c -lpthread

# The PostgreSQL row's client: libpq, one connection per query.
$(B)/bench/pg_client: bench/pg_client.c tests/preload/loadgen.c tests/preload/loadgen.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Itests/preload $$(pkg-config --cflags libpq) -o $@ $< \
		tests/preload/loadgen.c $$(pkg-config --libs libpq) -lpthread

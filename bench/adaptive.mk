# bench/adaptive.mk - `make bench-adaptive`: static limits against the adaptive one on a backend
# of known capacity. Included by the main Makefile; never part of `make test`. About 10 minutes
# (the last 5 are the sustained overload); writes bench/adaptive.md, build/adaptive.png and the
# adaptive section of bench/results.md. ADAPTIVE_ARGS="--long 0 --quick" for a short try.

ADAPTIVE_ARGS ?=

.PHONY: bench-adaptive
bench-adaptive:
	@sh tests/deps.sh gcc make pkg-config libconfig-dev python3 python3-matplotlib curl
	$(MAKE) --no-print-directory all $(B)/tests/legacy_client
	/usr/bin/python3 bench/adaptive.py --build $(B) $(ADAPTIVE_ARGS)

# The benchmark's client in C: no interpreter in every latency.
$(B)/tests/legacy_client: tests/preload/legacy_client.c | $(B)/tests
	$(CC) $(CFLAGS) -o $@ $< -lpthread

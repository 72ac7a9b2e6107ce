# bench/fleet.mk - `make bench-fleet`: a fleet budget against a static split and against one host
# holding the whole budget, same clients, same machine. Included by the main Makefile; never
# part of `make test` (tests/fleet/test_fleet_share.py is its short version). About 5 minutes
# (10 with a baseline); writes bench/fleet.md. FLEET_ARGS="--runs 1 --seconds 6" for a short
# try, FLEET_ARGS="--baseline TREE" to run another built checkout side by side.

FLEET_ARGS ?=

.PHONY: bench-fleet
bench-fleet:
	@sh tests/deps.sh gcc make pkg-config libconfig-dev libhiredis-dev redis-server python3
	$(MAKE) --no-print-directory all
	/usr/bin/python3 bench/fleet.py --build $(B) $(FLEET_ARGS)

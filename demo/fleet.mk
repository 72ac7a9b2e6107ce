# fleet.mk - `make demo-fleet`: per-host limits overrun a database; a fleet budget leased from Redis never does.
#
# Included by the main Makefile; demo-deps (demo.mk) installs what `make test`
# needs, redis-server included, and gnuplot for the picture.

.PHONY: demo-fleet
demo-fleet: demo-deps
	$(MAKE) --no-print-directory all
	python3 demo/fleet_demo.py --build $(B) --out $(B)/demo-fleet

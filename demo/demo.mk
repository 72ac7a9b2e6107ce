# demo.mk - `make demo` (the incident, replayed as a drill without limits and with them, then stranded capacity: static compartments against a pool, static classes against shared ones) and `make demo-test`.
#
# Included by the main Makefile after $(B), $(CC) and $(CFLAGS) are set. The
# programs are demo/DEMO.md's shop, backend and load generator.

DEMO_BIN := $(B)/demo/shop $(B)/demo/backend $(B)/demo/load

.PHONY: demo demo-test demo-bin demo-deps

demo-bin: $(DEMO_BIN)

$(DEMO_BIN): $(B)/demo/%: demo/%.c demo/demo.h | $(B)/demo
	$(CC) $(CFLAGS) -o $@ $< -lpthread

$(B)/demo:
	mkdir -p $@

# What `make test` installs, plus gnuplot for the chart. Without gnuplot the
# demo still runs and prints its table, so a user who is not root only gets
# the command to run.
demo-deps:
	@sh tests/deps.sh
	@if ! command -v gnuplot >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then \
			echo "bulkshim: installing gnuplot-nox"; \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get update -qq && \
			apt-get install -y -qq --no-install-recommends gnuplot-nox >/dev/null || \
			echo "bulkshim: apt-get install gnuplot-nox failed; no chart" >&2; \
		else \
			echo "bulkshim: for the chart run: sudo apt-get install -y gnuplot-nox" >&2; \
		fi; \
	fi

# A second make, as for `make test`, so that pkg-config sees new packages.
demo: demo-deps
	$(MAKE) --no-print-directory all demo-bin
	BULKSHIM_BUILD=$(B) bash demo/demo.sh
	python3 demo/pools.py --build $(B)
	python3 demo/pools.py --build $(B) --level class

# The same scenario, a few seconds each way; fails unless it proves its point.
demo-test: all demo-bin
	BULKSHIM_BUILD=$(B) bash demo/demo.sh --test

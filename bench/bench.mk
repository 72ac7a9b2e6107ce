# bench/bench.mk - `make bench`: what the shim costs per call, at scale, and against an HAProxy hop.
# Included by the main Makefile; never part of `make test`. Writes bench/results.md.

# "Today": the library of this commit, built from git, measured beside the
# tree's own in the issue-13 table (bench/results.md). A fixed commit, so
# that the column means the same in every run.
BENCH_BASE  ?= 43d7058
TODAY_DIR   := $(B)/bench/today-$(BENCH_BASE)
TODAY_LIB   := $(TODAY_DIR)/libbulkshim.so
# The library built without link-time optimisation, so that each function
# of a connect is one of its own in callgrind: the per-step profile of
# bench/results.md ("Where a connect + close goes").
NOLTO_LIB   := $(B)/bench/nolto/libbulkshim.so
BENCH_PROGS := $(B)/bench/client $(B)/bench/backend $(B)/bench/permits \
               $(B)/bench/libstubconnect.so $(TODAY_LIB) $(NOLTO_LIB)
# The makefile that was run (the main one, which includes this file), so
# that the second make below sees these rules too.
BENCH_MAKE  := $(MAKE) --no-print-directory -f $(firstword $(MAKEFILE_LIST))

.PHONY: bench bench-deps bench-build
# Installs what is missing, then builds in a second make so that pkg-config
# sees newly installed packages, then runs the suite (about 4 minutes).
bench: bench-deps
	$(BENCH_MAKE) all
	$(BENCH_MAKE) bench-build
	python3 bench/run.py --build $(B) --out bench/results.md \
		--today $(TODAY_LIB) --today-rev $(BENCH_BASE) --nolto $(NOLTO_LIB)
bench-deps:
	@sh tests/deps.sh gcc make pkg-config libconfig-dev python3 haproxy wrk valgrind
bench-build: $(BENCH_PROGS)

$(B)/bench/client: bench/client.c | $(B)/bench
	$(CC) $(CFLAGS) -Wl,-z,now -o $@ $< -lpthread
$(B)/bench/backend: bench/backend.c | $(B)/bench
	$(CC) $(CFLAGS) -o $@ $<
$(B)/bench/libstubconnect.so: bench/stubconnect.c | $(B)/bench
	$(CC) $(CFLAGS) -shared -o $@ $<
$(B)/bench/permits: bench/permits.c $(COMMON:%=$(B)/cli/%.o) shim/shim.h | $(B)/bench
	$(CC) $(CFLAGS) -Ishim $(PC_CFLAGS) -o $@ $< $(COMMON:%=$(B)/cli/%.o) $(PC_LIBS) -lpthread
$(TODAY_LIB): | $(B)/bench
	rm -rf $(TODAY_DIR) && mkdir -p $(TODAY_DIR)/src
	git archive $(BENCH_BASE) | tar -x -C $(TODAY_DIR)/src
	$(MAKE) --no-print-directory -C $(TODAY_DIR)/src B=build build/libbulkshim.so
	cp $(TODAY_DIR)/src/build/libbulkshim.so $@
$(NOLTO_LIB): FORCE | $(B)/bench
	$(MAKE) --no-print-directory B=$(B)/bench/nolto SHIM_LTO= $@
$(B)/bench:
	mkdir -p $@

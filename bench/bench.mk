# bench/bench.mk - `make bench`: what the shim costs per call, at scale, and against an HAProxy hop.
# Included by the main Makefile; never part of `make test`. Writes bench/results.md.

# "Today": the library of this commit, built from git, measured beside the
# tree's own in the per-call table (bench/results.md). A fixed commit, so
# that the column means the same in every run.
BENCH_BASE  ?= 43d7058
TODAY_DIR   := $(B)/bench/today-$(BENCH_BASE)
TODAY_LIB   := $(TODAY_DIR)/libbulkshim.so
# The library built without link-time optimisation, so that each function
# of a connect is one of its own in callgrind: the per-step profile of
# bench/results.md ("Where a connect + close goes").
NOLTO_LIB   := $(B)/bench/nolto/libbulkshim.so
# "Floor": this tree with bench/floor.patch applied, which leaves of a
# connect + close only the record that keeps the count exact (see the
# patch's header): the least this design can cost, measured beside the
# library make builds. A patch that no longer applies is reported in
# bench/results.md, not an error.
FLOOR_DIR   := $(B)/bench/floor
FLOOR_LIB   := $(FLOOR_DIR)/libbulkshim.so
BENCH_PROGS := $(B)/bench/client $(B)/bench/backend $(B)/bench/permits \
               $(B)/bench/libstubconnect.so $(TODAY_LIB) $(NOLTO_LIB) $(FLOOR_LIB)
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
		--today $(TODAY_LIB) --today-rev $(BENCH_BASE) --nolto $(NOLTO_LIB) \
		--floor $(FLOOR_LIB)
bench-deps:
	@sh tests/deps.sh gcc make pkg-config libconfig-dev python3 haproxy wrk valgrind
bench-build: $(BENCH_PROGS)

$(B)/bench/client: bench/client.c | $(B)/bench
	$(CC) $(CFLAGS) -Wl,-z,now -o $@ $< -lpthread
$(B)/bench/backend: bench/backend.c | $(B)/bench
	$(CC) $(CFLAGS) -o $@ $<
$(B)/bench/libstubconnect.so: bench/stubconnect.c | $(B)/bench
	$(CC) $(CFLAGS) -shared -o $@ $<
$(B)/bench/permits: bench/permits.c $(COMMON:%=$(B)/cli/%.o) $(SHIM_H) | $(B)/bench
	$(CC) $(CFLAGS) -Ishim $(PC_CFLAGS) -o $@ $< $(COMMON:%=$(B)/cli/%.o) $(PC_LIBS) -lpthread
$(TODAY_LIB): | $(B)/bench
	rm -rf $(TODAY_DIR) && mkdir -p $(TODAY_DIR)/src
	git archive $(BENCH_BASE) | tar -x -C $(TODAY_DIR)/src
	$(MAKE) --no-print-directory -C $(TODAY_DIR)/src B=build build/libbulkshim.so
	cp $(TODAY_DIR)/src/build/libbulkshim.so $@
$(NOLTO_LIB): FORCE | $(B)/bench
	$(MAKE) --no-print-directory B=$(B)/bench/nolto SHIM_LTO= $@
# The working tree as it is (git stash create: its tracked files, committed
# or not), so that the floor is of the same code as the library beside it.
$(FLOOR_LIB): FORCE | $(B)/bench
	rm -rf $(FLOOR_DIR) && mkdir -p $(FLOOR_DIR)/src
	rev=$$(git stash create) && git archive $${rev:-HEAD} | tar -x -C $(FLOOR_DIR)/src
	if git apply --directory=$(FLOOR_DIR)/src bench/floor.patch && \
	    $(MAKE) --no-print-directory -C $(FLOOR_DIR)/src B=build \
		CFLAGS='$(CFLAGS) -Wno-unused-function' build/libbulkshim.so; then \
		cp $(FLOOR_DIR)/src/build/libbulkshim.so $@; \
	else \
		echo "bench/floor.patch no longer applies to this tree, or does not build" \
			> $(FLOOR_DIR)/failed; \
	fi
$(B)/bench:
	mkdir -p $@

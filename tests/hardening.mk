# hardening.mk - chaos runs, sanitizer builds and fuzzing.
#
# Included by the main Makefile after $(B), $(CFLAGS), the pkg-config flags
# and the object lists are set. Sanitized objects live in $(B)/asan and
# $(B)/tsan, fuzzers in $(B)/fuzz, so none of them clashes with the normal
# build.
#
#   make chaos           8 processes x 16 threads, kills, forks and execs, 20 s; again
#                        with the three compartments in one pool (-P), adaptive
#                        under every controller (-A -a), with socket and process
#                        tables too small for them (-T), and with children made
#                        by posix_spawn and vfork (-S)
#   make chaos-short     the same for a few seconds (part of `make test`)
#   make check-sanitize  units + integration suite under ASan/UBSan, threaded units under TSan
#   make fuzz            each libFuzzer target for FUZZ_SECONDS (default 60)
#   make fuzz-regress    every stored fuzz input once (crash regressions)

CHAOS_SECONDS ?= 20
CHAOS_SHORT_SECONDS ?= 5
FUZZ_SECONDS ?= 60
FUZZ_CC ?= clang

.PHONY: chaos chaos-short chaos-bin check-sanitize asan-bin tsan-bin fuzz fuzz-bin \
	fuzz-deps fuzz-regress hostile

# ---- chaos ----

CHAOS_BIN := $(B)/tests/chaos $(B)/tests/chaos_worker

chaos-bin: all $(CHAOS_BIN) $(B)/tests/chaos_adclose

$(CHAOS_BIN): $(B)/tests/%: tests/chaos/%.c tests/chaos/chaos.h | $(B)/tests
	$(CC) $(CFLAGS) -o $@ $< -lpthread
# -A's window closer links the shim's shared code, as the CLI does.
$(B)/tests/chaos_adclose: tests/chaos/chaos_adclose.c tests/chaos/chaos.h $(COMMON:%=$(B)/cli/%.o) \
		$(SHIM_H) | $(B)/tests
	$(CC) $(CFLAGS) -Ishim $(PC_CFLAGS) -o $@ $< $(COMMON:%=$(B)/cli/%.o) $(PC_LIBS) -lpthread

chaos: chaos-bin
	$(B)/tests/chaos -b $(B) -t $(CHAOS_SECONDS)
	$(B)/tests/chaos -b $(B) -t $(CHAOS_SECONDS) -P
	$(B)/tests/chaos -b $(B) -t $(CHAOS_SECONDS) -A -P
	$(B)/tests/chaos -b $(B) -t $(CHAOS_SECONDS) -A -P -a vegas,gradient2,aimd
	$(B)/tests/chaos -b $(B) -t $(CHAOS_SECONDS) -A -a envoy,vegas,gradient2
	$(B)/tests/chaos -b $(B) -t $(CHAOS_SECONDS) -T 24,6
	$(B)/tests/chaos -b $(B) -t $(CHAOS_SECONDS) -S
chaos-short: chaos-bin
	$(B)/tests/chaos -b $(B) -t $(CHAOS_SHORT_SECONDS)
	$(B)/tests/chaos -b $(B) -t $(CHAOS_SHORT_SECONDS) -P
	$(B)/tests/chaos -b $(B) -t $(CHAOS_SHORT_SECONDS) -A -a bulkshim,vegas,gradient2
	$(B)/tests/chaos -b $(B) -t $(CHAOS_SHORT_SECONDS) -A -a aimd,envoy,bulkshim
	$(B)/tests/chaos -b $(B) -t $(CHAOS_SHORT_SECONDS) -S

# The hostile-segment and permission tests alone.
hostile: all $(HELPERS)
	@python3 tests/lib/run.py test_hostile test_permissions

# ---- sanitizers ----

SAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
TSAN_FLAGS := -fsanitize=thread -fno-omit-frame-pointer -Wno-tsan
ASAN_RT = $(shell $(CC) -print-file-name=libasan.so)
A := $(B)/asan
T := $(B)/tsan

ASAN_SHIM_O := $(patsubst $(B)/%,$(A)/%,$(SHIM_O))
ASAN_CLI_O := $(patsubst $(B)/%,$(A)/%,$(CLI_O))
ASAN_UNITS := $(patsubst $(B)/%,$(A)/%,$(UNITS))
ASAN_HELPERS := $(patsubst $(B)/%,$(A)/%,$(HELPERS))
TSAN_UNITS := $(T)/tests/test_segment $(T)/tests/test_permit $(T)/tests/test_match

$(A)/shim/%.o: %.c $(SHIM_H) | $(A)/shim
	$(CC) $(CFLAGS) $(SAN_FLAGS) -fvisibility=hidden -Ishim $(PC_CFLAGS) -c -o $@ $<
$(A)/cli/%.o: %.c $(SHIM_H) | $(A)/cli
	$(CC) $(CFLAGS) $(SAN_FLAGS) -Ishim $(PC_CFLAGS) -c -o $@ $<
$(A)/cli/%.o: tools/%.c tools/cli.h $(SHIM_H) | $(A)/cli
	$(CC) $(CFLAGS) $(SAN_FLAGS) -Ishim $(PC_CFLAGS) -DBS_LIBDIR='"$(LIBDIR)/bulkshim"' -c -o $@ $<
$(A)/libbulkshim.so: $(ASAN_SHIM_O)
	$(CC) $(SAN_FLAGS) -shared -o $@ $^ $(PC_LIBS) -ldl -lpthread -Wl,-z,now -Wl,-z,nodelete
$(A)/bulkshim: $(ASAN_CLI_O)
	$(CC) $(SAN_FLAGS) -o $@ $^ $(PC_LIBS) $(HIREDIS_LIBS) $(CURL_LIBS) -lm -lpthread
$(A)/cli/drill_probe.o: override CFLAGS += $(CURL_CFLAGS)
$(A)/tests/%: tests/helpers/%.c | $(A)/tests
	$(CC) $(CFLAGS) $(SAN_FLAGS) -o $@ $< -lpthread
$(A)/tests/test_%: tests/unit/test_%.c $(COMMON:%=$(A)/cli/%.o) $(SHIM_H) | $(A)/tests
	$(CC) $(CFLAGS) $(SAN_FLAGS) -Ishim $(PC_CFLAGS) -o $@ $< \
		$(filter-out $(call unit_includes,$<,$(A)/cli),$(COMMON:%=$(A)/cli/%.o)) $(PC_LIBS) \
		$(CMOCKA_LIBS) -lpthread

$(T)/cli/%.o: %.c $(SHIM_H) | $(T)/cli
	$(CC) $(CFLAGS) $(TSAN_FLAGS) -Ishim $(PC_CFLAGS) -c -o $@ $<
$(T)/tests/test_%: tests/unit/test_%.c $(COMMON:%=$(T)/cli/%.o) $(SHIM_H) | $(T)/tests
	$(CC) $(CFLAGS) $(TSAN_FLAGS) -Ishim $(PC_CFLAGS) -o $@ $< \
		$(filter-out $(call unit_includes,$<,$(T)/cli),$(COMMON:%=$(T)/cli/%.o)) $(PC_LIBS) \
		$(CMOCKA_LIBS) -lpthread

$(A)/shim $(A)/cli $(A)/tests $(T)/cli $(T)/tests:
	mkdir -p $@

# As in the Makefile: the fleet lease unit links the CLI's fleet objects and hiredis.
$(A)/tests/test_fleet_lease: tests/unit/test_fleet_lease.c $(A)/cli/fleet_redis.o \
		$(A)/cli/fleet_script.o tools/fleet.h $(wildcard shim/*.h shim/*/*.h) | $(A)/tests
	$(CC) $(CFLAGS) $(SAN_FLAGS) -Ishim -Itools $(PC_CFLAGS) -o $@ $< $(A)/cli/fleet_redis.o \
		$(A)/cli/fleet_script.o $(HIREDIS_LIBS) $(CMOCKA_LIBS)

# Objects reached only through pattern rules are kept between runs.
.SECONDARY: $(ASAN_SHIM_O) $(ASAN_CLI_O) $(COMMON:%=$(T)/cli/%.o)

asan-bin: $(A)/libbulkshim.so $(A)/bulkshim $(ASAN_UNITS) $(ASAN_HELPERS)
tsan-bin: $(TSAN_UNITS)

# A preloaded ASan library needs the ASan runtime ahead of everything in
# LD_PRELOAD; BULKSHIM_PRELOAD_PREFIX asks the test harness for that.
# Python is not built with ASan, so its own leaks are not ours to report.
SAN_ENV := UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0:abort_on_error=0 \
	BULKSHIM_BUILD=$(A) BULKSHIM_PRELOAD_PREFIX="$(ASAN_RT)" \
	BULKSHIM_SAN_LDFLAGS="$(SAN_FLAGS)"

check-sanitize: all asan-bin tsan-bin
	@echo "== units under ASan+UBSan"
	@UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=detect_leaks=1 \
		sh tests/run-units.sh $(ASAN_UNITS)
	@echo "== units under TSan"
	@TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 sh tests/run-units.sh $(TSAN_UNITS)
	@echo "== integration suite with the ASan+UBSan library"
	@$(SAN_ENV) python3 tests/lib/run.py

# ---- fuzzing ----

F := $(B)/fuzz
FUZZ_FLAGS := -g -O1 -std=gnu11 -D_GNU_SOURCE $(WARN) -fsanitize=fuzzer,address,undefined \
	-fno-sanitize-recover=undefined -fno-omit-frame-pointer -Ishim $(PC_CFLAGS)
FUZZERS := $(F)/fuzz_config $(F)/fuzz_match $(F)/fuzz_segment
FUZZ_OPTS := -rss_limit_mb=2048 -timeout=10 -print_final_stats=1
FUZZ_ENV := LSAN_OPTIONS=suppressions=$(CURDIR)/tests/fuzz/lsan.supp

fuzz-bin: fuzz-deps
	@$(MAKE) --no-print-directory $(FUZZERS)

# clang and its libFuzzer runtime (Debian: clang, libfuzzer-14-dev), installed
# when missing and we are root, as tests/deps.sh does for `make test`.
fuzz-deps: | $(B)
	@printf '%s\n' 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n);' \
		'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }' \
		> $(B)/fuzzprobe.c
	@if ! $(FUZZ_CC) -fsanitize=fuzzer -o $(B)/fuzzprobe $(B)/fuzzprobe.c >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then \
			echo "bulkshim: installing clang libfuzzer-14-dev"; \
			export DEBIAN_FRONTEND=noninteractive; \
			apt-get update -qq && apt-get install -y -qq --no-install-recommends \
				clang libfuzzer-14-dev >/dev/null || exit 1; \
		else \
			echo "bulkshim: fuzzing needs clang with libFuzzer: sudo apt-get install -y" \
				"clang libfuzzer-14-dev" >&2; exit 1; \
		fi; \
	fi
	@rm -f $(B)/fuzzprobe $(B)/fuzzprobe.c

# The config loader, the matcher and the counting core (the segment's
# target), whatever files they are split into.
FUZZ_SRC = $(wildcard shim/config/*.c) $(wildcard shim/admit/*.c) shim/log.c shim/sys.c

$(F)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_SRC) $(SHIM_H) | $(F)
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $@ $< $(FUZZ_SRC) $(PC_LIBS) -lpthread

$(F) $(F)/corpus_config $(F)/corpus_match $(F)/corpus_segment:
	mkdir -p $@

# New inputs go to $(F)/corpus_*, the seeds in tests/fuzz stay as they are;
# crashes are written to $(F)/crash-* and fail the run.
fuzz: fuzz-bin | $(F)/corpus_config $(F)/corpus_match $(F)/corpus_segment
	@for t in config match segment; do \
		echo "== fuzz_$$t for $(FUZZ_SECONDS) s"; \
		$(FUZZ_ENV) $(F)/fuzz_$$t $(FUZZ_OPTS) -max_total_time=$(FUZZ_SECONDS) \
			-artifact_prefix=$(F)/fuzz_$$t- $(F)/corpus_$$t tests/fuzz/corpus_$$t \
			2>$(F)/fuzz_$$t.log; rc=$$?; \
		grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb|^#[0-9]+.*DONE' \
			$(F)/fuzz_$$t.log; \
		if [ $$rc -ne 0 ]; then tail -40 $(F)/fuzz_$$t.log; exit 1; fi; \
	done

# Every seed and every crash input kept in tests/fuzz, run once.
fuzz-regress: fuzz-bin
	@$(FUZZ_ENV) $(F)/fuzz_config -runs=0 tests/fuzz/corpus_config 2>$(F)/regress_config.log || \
		{ tail -40 $(F)/regress_config.log; exit 1; }
	@$(FUZZ_ENV) $(F)/fuzz_match -runs=0 tests/fuzz/corpus_match 2>$(F)/regress_match.log || \
		{ tail -40 $(F)/regress_match.log; exit 1; }
	@echo "fuzz-regress: every stored input ran clean"

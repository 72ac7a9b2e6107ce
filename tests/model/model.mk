# make model: spin checks tests/model/tally.pml, the model of the two-step
# tally (shim/admit/tally.c). A bitstate search bounded in time (MODEL_SECONDS);
# it fails on any assertion (a count that the slots' holds do not explain).
MODEL_SECONDS ?= 300
.PHONY: model
model:
	@sh tests/deps.sh gcc make spin
	rm -rf $(B)/model && mkdir -p $(B)/model && cp tests/model/tally.pml $(B)/model/
	cd $(B)/model && spin -a tally.pml >/dev/null && $(CC) -O2 -DSAFETY -DBITSTATE -o pan pan.c
	cd $(B)/model && { timeout $(MODEL_SECONDS) ./pan -w30 -m100000 > pan.out 2>&1; echo "pan exit $$?" >> pan.out; }
	@cd $(B)/model && if grep -q "assertion violated\|errors: [1-9]" pan.out; then \
		grep -m3 "assertion violated\|errors:" pan.out; spin -t -p tally.pml | tail -40; exit 1; fi; \
	grep -E "States=|states, stored" pan.out | tail -1; \
	echo "make model: no violation (bitstate search, at most $(MODEL_SECONDS) s)"

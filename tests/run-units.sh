#!/bin/sh
# run-units.sh - runs each cmocka unit test binary and fails if any fails.
rc=0
for t in "$@"; do
	"$t" || rc=1
done
exit $rc

#!/usr/bin/env bash
# go test's -exec program (scripts/test.sh): runs one package's test binary
# once per schema in $TEST_SCHEMAS, in order, with GATEWAY_TEST_SCHEMA and
# GATEWAY_SCHEMA naming it, and fails when any run fails. go test builds
# and links each package's tests once for all the schemas (linking the
# ~45 test binaries again cost a second pass ~50 s of the CI machine's two
# cores), and starts it in the package's directory.
#
# The NATS cluster's fault test (test/cluster) runs in the first schema
# only: it is about NATS nodes that die or stop, and the statements it
# runs are the package tests' and test/chaos's, which run in every schema.
set -uo pipefail
bin=$1
shift
rc=0
first=1
runs=0
for schema in ${TEST_SCHEMAS:-fencegate fg_alt}; do
	if [ "$first" = 0 ] && [[ $PWD == */test/cluster ]]; then
		break
	fi
	first=0
	runs=$((runs + 1))
	GATEWAY_TEST_SCHEMA="$schema" GATEWAY_SCHEMA="$schema" "$bin" "$@"
	status=$?
	if [ "$status" != 0 ]; then
		echo "(the run above was in schema $schema)"
		rc=$status
	fi
done
# A TEST_SCHEMAS that names no schema would run nothing and pass: a
# harness that checked nothing fails.
if [ "$runs" = 0 ]; then
	echo "scripts/test-schemas.sh: TEST_SCHEMAS names no schema: no test ran"
	exit 1
fi
exit "$rc"

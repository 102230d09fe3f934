#!/usr/bin/env bash
# The NATS cluster fault test's long form (test/cluster), as `make cluster`
# (and the end of `make chaos`). Its short form runs in `make test`. Works on
# a fresh machine like scripts/test.sh: nats-server is built when missing
# (scripts/tools.sh); the test starts its own PostgreSQL (testdb) unless
# GATEWAY_TEST_DATABASE_URL names one, its 3-node NATS cluster and its
# gateway processes.
#
#   scripts/cluster.sh [LOGDIR]   (LOGDIR: keep the gateway processes' logs)
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== tools"
. scripts/tools.sh # and the Go that builds fencegate
setup_nats

if [ $# -gt 0 ]; then
	mkdir -p "$1"
	export FENCEGATE_CLUSTER_LOGS="$(cd "$1" && pwd)"
fi
echo "== cluster (long form)"
FENCEGATE_CLUSTER_LONG=1 exec go test -count=1 -timeout 30m -run '^TestClusterFaults$' -v ./test/cluster/

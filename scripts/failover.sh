#!/usr/bin/env bash
# The PostgreSQL failover test (test/failover), as `make failover` (and
# part of `make chaos`): a pg_auto_failover formation started from nothing
# (monitor, primary, synchronous secondary), a relay and an adapter process
# and Go and SQL-interface workers on its multi-host URL, while the primary
# is killed, rejoins as a secondary, and the formation is switched over.
# About three minutes; not part of `make test`. Installs Debian's
# postgresql-15-auto-failover when missing (as root).
#
#   scripts/failover.sh [RUNS]   (RUNS: run it that many times in a row, default 1)
#   FENCEGATE_FAILOVER_MUTATION=pinned scripts/failover.sh   (must fail)
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== tools"
. scripts/tools.sh # and the Go that builds fencegate
setup_nats
if ! command -v pg_autoctl >/dev/null 2>&1; then
	apt_install "" postgresql-15-auto-failover || exit 1
fi
echo "pg_autoctl: $(command -v pg_autoctl)"

echo "== failover (pg_auto_failover)"
exec go test -tags failover -count="${1:-1}" -timeout 30m -run '^TestFailover$' -v ./test/failover/

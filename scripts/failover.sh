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
export PATH="/usr/local/go/bin:$PATH"
# The Go that builds and tests fencegate (see scripts/test.sh).
export GOTOOLCHAIN="${GOTOOLCHAIN_FENCEGATE:-go1.27.3}"

echo "== tools"
. scripts/tools.sh
setup_nats
if ! command -v pg_autoctl >/dev/null 2>&1; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "installing pg_auto_failover (once): apt-get install -y postgresql-15-auto-failover"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15-auto-failover >/dev/null 2>&1 ||
			{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15-auto-failover >/dev/null; }
	else
		echo "pg_autoctl is missing and this is not root: apt-get install -y postgresql-15-auto-failover"; exit 1
	fi
fi
echo "pg_autoctl: $(command -v pg_autoctl)"

echo "== failover (pg_auto_failover)"
exec go test -tags failover -count="${1:-1}" -timeout 30m -run '^TestFailover$' -v ./test/failover/

#!/usr/bin/env bash
# The randomized fault run (test/chaos, test/chaos/internal/chaos), as `make chaos`.
# Works on a fresh machine like scripts/test.sh, with the same tool setup
# (scripts/tools.sh): Mailpit and nats-server are built when missing. The
# run starts its own PostgreSQL cluster (fsync on, synchronous_commit off),
# because it kill -9s it; nothing needs to run beforehand.
#
#   scripts/chaos.sh [SEED [DURATION]]   (SEED 0: a random seed, printed)
set -euo pipefail
cd "$(dirname "$0")/.."
seed="${1:-${SEED:-0}}"
duration="${2:-${DURATION:-60s}}"

echo "== tools"
. scripts/tools.sh # and the Go that builds fencegate
setup_mailpit
setup_nats

echo "== chaos (seed $seed, duration $duration)"
exec go test -count=1 -timeout 0 -run '^TestChaos$' -v ./test/chaos/ -chaos.seed="$seed" -chaos.duration="$duration"

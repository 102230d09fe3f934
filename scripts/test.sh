#!/usr/bin/env bash
# The test command. Works on a fresh machine with the PostgreSQL binaries
# installed and nothing running: testenv starts a throwaway PostgreSQL cluster
# (as the postgres user when run as root) and removes it afterwards; tests
# start NATS JetStream (embedded, or a nats-server process built from the
# module) and SMTP servers themselves. With GATEWAY_TEST_DATABASE_URL set,
# the PostgreSQL server there is used instead.
#
# Extra arguments go to `go test` (e.g. scripts/test.sh -run Lease ./lease/).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"

echo "== static checks"
unformatted="$(gofmt -l .)"
if [ -n "$unformatted" ]; then
	echo "gofmt: these files need formatting:"; echo "$unformatted"; exit 1
fi
go vet ./...

echo "== tools"
# Mailpit (a real SMTP server with a search API) for the email tests,
# nats-server for the tests that kill and restart it, and headless Chromium
# for the admin pages' browser test (admin/pages_browser_test.go), which
# fails without it. See scripts/tools.sh.
. scripts/tools.sh
setup_mailpit
setup_versitygw
setup_nats
setup_chromium

echo "== tests"
go build -o bin/testenv ./internal/cmd/testenv
pkgs=("./...")
if [ $# -gt 0 ]; then pkgs=(); fi
exec bin/testenv -- go test -count=1 -timeout 20m "$@" "${pkgs[@]}"

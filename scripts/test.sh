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
# Mailpit, a real SMTP server with a search API, for the email tests. Built
# from the Go module proxy when missing (about 40 s to 2 min, once).
gobin="$(go env GOBIN)"; gobin="${gobin:-$(go env GOPATH)/bin}"
if [ -z "${MAILPIT_BIN:-}" ]; then
	if command -v mailpit >/dev/null 2>&1; then
		MAILPIT_BIN="$(command -v mailpit)"
	else
		if [ ! -x "$gobin/mailpit" ]; then
			echo "building mailpit (once)…"
			(cd /tmp && GOFLAGS=-mod=mod go install github.com/axllent/mailpit@v1.33.1)
		fi
		MAILPIT_BIN="$gobin/mailpit"
	fi
fi
export MAILPIT_BIN
echo "mailpit: $MAILPIT_BIN"

# Headless Chromium for the admin pages' browser test (admin/
# pages_browser_test.go), which fails without it. Installed from Debian's
# packages when missing and running as root (a few minutes, once).
if [ -z "${CHROMIUM_BIN:-}" ]; then
	if ! command -v chromium >/dev/null 2>&1; then
		if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
			echo "installing chromium (once): apt-get update && apt-get install -y chromium"
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null ||
				echo "installing chromium failed"
		else
			echo "chromium is missing and this is not root: install it (apt-get install -y chromium) or set CHROMIUM_BIN"
		fi
	fi
	CHROMIUM_BIN="$(command -v chromium || true)"
fi
export CHROMIUM_BIN
echo "chromium: ${CHROMIUM_BIN:-missing (the browser test will fail)}"

echo "== tests"
go build -o bin/testenv ./internal/cmd/testenv
pkgs=("./...")
if [ $# -gt 0 ]; then pkgs=(); fi
exec bin/testenv -- go test -count=1 -timeout 20m "$@" "${pkgs[@]}"

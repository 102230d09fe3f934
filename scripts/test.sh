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
# The tools' setup (scripts/tools.sh), which also selects the Go that
# builds and tests fencegate.
. scripts/tools.sh
# A section's heading says when it started, in seconds from the start: where
# a slow run spent its time.
section() { echo "== $* (at ${SECONDS}s)"; }

section "static checks"
unformatted="$(gofmt -l .)"
if [ -n "$unformatted" ]; then
	echo "gofmt: these files need formatting:"; echo "$unformatted"; exit 1
fi
go vet ./...

section "tools"
# Mailpit (a real SMTP server with a search API) for the email tests,
# nats-server for the tests that kill and restart it, and headless Chromium
# for the admin pages' browser test (admin/pages_browser_test.go), which
# fails without it. See scripts/tools.sh.
setup_mailpit
setup_versitygw
setup_nats
setup_chromium
setup_python_psycopg
setup_node_pg
setup_java_client
setup_clients
setup_pgbouncer

section "vulnerabilities"
vulncheck

# The deploy files (compose, the Kubernetes base, the Dockerfile's
# environment), in a module of their own so that fencegate's requires no
# Kubernetes libraries: the kustomize library renders the base, every
# object is decoded strictly into its client-go or Prometheus Operator
# type, and each command line and GATEWAY_* variable is run past the
# gateway built from this tree (deploy/validate; a few seconds once built).
# Not in a run restricted to some packages.
if [ $# -eq 0 ]; then
	section "deploy files (deploy/validate)"
	(cd deploy/validate && go vet ./... && go test -count=1 ./...)
fi

go build -o bin/testenv ./internal/testkit/cmd/testenv
pkgs=("./...")
if [ $# -gt 0 ]; then pkgs=(); fi
# The suite runs twice: with fencegate's tables in the default schema
# (fencegate), and in another one (issue 19), each test database holding an
# application's own tables called intents, resources, … in public
# (internal/testkit/testdb): a statement that named a table without its schema, or
# a component that ignored its Schema, fails. TEST_SCHEMAS chooses
# (e.g. TEST_SCHEMAS=fencegate for one run). Each package's test binary is
# built once and run once per schema, one after the other, by
# scripts/test-schemas.sh (go test's -exec), which also says which runs
# the NATS cluster's fault test skips. TEST_SCHEMAS=fg_alt
# scripts/test.sh ./test/cluster/ runs that one in the other schema.
export TEST_SCHEMAS="${TEST_SCHEMAS:-fencegate fg_alt}"
section "tests (schemas $TEST_SCHEMAS)"
# -timeout bounds each schema's run of a package's tests; go test stops a
# package's runs together a minute after it.
bin/testenv -- go test -count=1 -timeout 20m -exec "$PWD/scripts/test-schemas.sh" "$@" "${pkgs[@]}"
section "done"

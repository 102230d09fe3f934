# Tool setup shared by scripts/*.sh (sourced, not run, from the repository's
# root). Works on a fresh machine with nothing installed but Go and the
# PostgreSQL binaries, GOBIN set or not: each tool is found, or built once,
# and its path exported for the tests.
#
#   setup_mailpit   MAILPIT_BIN: $MAILPIT_BIN, mailpit on $PATH, or
#                   $(go env GOBIN) / the first $(go env GOPATH) entry's bin,
#                   built with go install when missing (40 s to 2 min, once)
#   setup_nats      NATS_SERVER_BIN: $NATS_SERVER_BIN, or bin/nats-server
#                   built from the module version in go.mod when missing or
#                   older than go.mod
#   setup_versitygw VERSITYGW_BIN: the S3-compatible server of the s3
#                   adapter's tests: $VERSITYGW_BIN, versitygw on $PATH, or
#                   go install's directory, built with go install when
#                   missing (about a minute, once)
#   setup_chromium  CHROMIUM_BIN for the admin pages' browser test,
#                   installed from Debian's packages as root when missing
#   setup_python_psycopg
#                   PYTHON_BIN: a python3 that imports psycopg (3), for the
#                   SQL interface's Python worker (examples/sql-worker):
#                   $PYTHON_BIN, else /usr/bin/python3 with Debian's
#                   python3-psycopg, installed with apt-get as root when
#                   missing (PyPI is not needed)
#   setup_node_pg   NODE_BIN and the node-postgres module of the Node.js
#                   worker (examples/sql-worker/node), installed there with
#                   npm ci from its package-lock.json when missing
#   vulncheck       govulncheck ./... against the Go vulnerability database
#                   built offline from the golang.org/x/vulndb module (the
#                   module proxy serves it; vuln.go.dev may be unreachable):
#                   bin/govulncheck and bin/indexdb built once (about a
#                   minute), the database in var/vulndb-<version>; fails on a
#                   vulnerable symbol the code calls
#
# Sourcing it also selects the Go that builds and tests fencegate:
# go1.27.3, fetched once from the Go module proxy (76 MB) by the go command
# itself. go1.26.8's standard library has vulnerabilities the gateway calls
# (net/http, html/template, crypto/tls: vulncheck names them); a machine
# starts on its own Go and ignores go.mod's toolchain line, so the scripts
# name it, all of them here. GOTOOLCHAIN_FENCEGATE overrides it.
export PATH="/usr/local/go/bin:$PATH"
export GOTOOLCHAIN="${GOTOOLCHAIN_FENCEGATE:-go1.27.3}"

# apt_install HINT PKG...: installs the Debian packages PKG as root (a
# tool found missing), with apt-get update only when the install fails
# (the package lists may be missing or stale). Not root, or no apt-get:
# says what to install, then HINT (what else to do, or what fails without
# them). Fails when it did not install them.
apt_install() {
	local hint="$1"
	shift
	if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
		echo "$* missing and this is not root: apt-get install -y $*$hint"
		return 1
	fi
	echo "installing $* (once): apt-get install -y $*"
	{ DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null 2>&1 ||
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null; }; } ||
		{ echo "installing $* failed"; return 1; }
}

# go_bin_dir prints where `go install` puts binaries.
go_bin_dir() {
	local gobin gopath
	gobin="$(go env GOBIN)"
	if [ -n "$gobin" ]; then echo "$gobin"; return; fi
	gopath="$(go env GOPATH)"
	echo "${gopath%%:*}/bin"
}

# setup_go_tool VAR NAME MODULE: VAR's value, NAME on $PATH, or go
# install's directory, built there with go install when missing; exported.
setup_go_tool() {
	local var="$1" name="$2" module="$3" path
	path="${!var:-}"
	if [ -z "$path" ]; then
		if command -v "$name" >/dev/null 2>&1; then
			path="$(command -v "$name")"
		else
			local gobin
			gobin="$(go_bin_dir)"
			if [ ! -x "$gobin/$name" ]; then
				echo "building $name (once)…"
				# Outside the module, so the install cannot touch go.mod.
				(cd /tmp && GOFLAGS=-mod=mod go install "$module")
			fi
			path="$gobin/$name"
		fi
	fi
	if [ ! -x "$path" ]; then
		echo "$name: $path is not an executable file"; return 1
	fi
	export "$var=$path"
	echo "$name: $path"
}

setup_mailpit() { setup_go_tool MAILPIT_BIN mailpit github.com/axllent/mailpit@v1.33.1; }

# promtool for make alerts (not make test: it builds for 5-7 minutes).
setup_promtool() { setup_go_tool PROMTOOL_BIN promtool github.com/prometheus/prometheus/cmd/promtool@v0.316.0; }

setup_versitygw() { setup_go_tool VERSITYGW_BIN versitygw github.com/versity/versitygw/cmd/versitygw@v1.8.0; }

setup_nats() {
	if [ -z "${NATS_SERVER_BIN:-}" ]; then
		NATS_SERVER_BIN="$PWD/bin/nats-server"
		if [ ! -x "$NATS_SERVER_BIN" ] || [ go.mod -nt "$NATS_SERVER_BIN" ]; then
			echo "building nats-server from go.mod's version…"
			go build -o "$NATS_SERVER_BIN" github.com/nats-io/nats-server/v2
		fi
	fi
	export NATS_SERVER_BIN
	echo "nats-server: $NATS_SERVER_BIN"
}

setup_python_psycopg() {
	if [ -z "${PYTHON_BIN:-}" ]; then
		PYTHON_BIN=/usr/bin/python3
		if ! "$PYTHON_BIN" -c 'import psycopg' >/dev/null 2>&1; then
			apt_install ", or set PYTHON_BIN" python3-psycopg || true
		fi
	fi
	export PYTHON_BIN
	echo "python (psycopg): $PYTHON_BIN"
}

setup_node_pg() {
	NODE_BIN="${NODE_BIN:-$(command -v node || true)}"
	local dir="$PWD/examples/sql-worker/node"
	if [ -n "$NODE_BIN" ] && [ ! -d "$dir/node_modules/pg" ]; then
		echo "installing node-postgres for examples/sql-worker/node (once): npm ci"
		(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) || echo "npm ci failed"
	fi
	export NODE_BIN
	echo "node: ${NODE_BIN:-missing (the Node.js worker test will fail)}"
}

setup_chromium() {
	if [ -z "${CHROMIUM_BIN:-}" ]; then
		if ! command -v chromium >/dev/null 2>&1; then
			apt_install ", or set CHROMIUM_BIN" chromium || true
		fi
		CHROMIUM_BIN="$(command -v chromium || true)"
	fi
	export CHROMIUM_BIN
	echo "chromium: ${CHROMIUM_BIN:-missing (the browser test will fail)}"
}

# The vulnerability database version: a golang.org/x/vulndb pseudo-version
# (its data/osv holds every Go advisory up to that commit). Pinned so that a
# run is reproducible; raise it (go list -m golang.org/x/vulndb@latest, or
# VULNDB_VERSION=... for one run) to check against newer advisories.
VULNDB_VERSION="${VULNDB_VERSION:-v0.0.0-20261105234957-e22db6528018}"
GOVULNCHECK_MODULE=golang.org/x/vuln/cmd/govulncheck@v1.9.0

# built_with_current_go BIN: BIN exists and was built by the go command in
# use (govulncheck built by an older Go cannot read newer Go's sources).
built_with_current_go() {
	[ -x "$1" ] && [ "$(go version "$1" 2>/dev/null | awk '{print $2}')" = "$(go env GOVERSION)" ]
}

vulncheck() {
	local gv="$PWD/bin/govulncheck" idx="$PWD/bin/indexdb" db="$PWD/var/vulndb-$VULNDB_VERSION"
	if ! built_with_current_go "$gv"; then
		echo "building govulncheck with $(go env GOVERSION) (once)…"
		(cd /tmp && GOFLAGS=-mod=mod GOBIN="$(dirname "$gv")" go install "$GOVULNCHECK_MODULE")
	fi
	if [ ! -f "$db/index/modules.json" ]; then
		if [ ! -x "$idx" ]; then
			echo "building indexdb from golang.org/x/vulndb (once)…"
			(cd /tmp && GOFLAGS=-mod=mod GOBIN="$(dirname "$idx")" go install "golang.org/x/vulndb/cmd/indexdb@$VULNDB_VERSION")
		fi
		local src
		src="$(cd /tmp && go mod download -json "golang.org/x/vulndb@$VULNDB_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
		if [ ! -d "$src/data/osv" ]; then
			echo "vulncheck: golang.org/x/vulndb@$VULNDB_VERSION has no data/osv ($src)"; return 1
		fi
		rm -rf "$db.tmp" && mkdir -p "$(dirname "$db")"
		"$idx" -vulns "$src/data/osv" -out "$db.tmp" && mv "$db.tmp" "$db"
	fi
	# The check itself can fail: a module that calls a known vulnerable
	# symbol (golang.org/x/text v0.3.5's language.Parse, GO-2021-0113) must
	# be reported, with govulncheck's exit status 3. A database or a
	# scanner that sees nothing would otherwise pass every run.
	local out rc=0
	out="$(cd scripts/testdata/vulnerable && GOFLAGS=-mod=mod "$gv" -db "file://$db" ./... 2>&1)" || rc=$?
	if [ "$rc" -ne 3 ] || ! grep -q GO-2021-0113 <<<"$out"; then
		echo "vulncheck: the self-test did not report GO-2021-0113 (exit $rc):"; echo "$out"; return 1
	fi
	echo "govulncheck ($(go env GOVERSION), database golang.org/x/vulndb@$VULNDB_VERSION; self-test reported GO-2021-0113)"
	"$gv" -db "file://$db" ./...
}

# setup_java_client: what clients/java's test (clients/java/java_test.go)
# needs from Debian's packages, installed with apt-get as root when
# missing (Maven Central is not needed): javac (openjdk-17-jdk-headless),
# the PostgreSQL JDBC driver (libpostgresql-jdbc-java:
# /usr/share/java/postgresql.jar), JUnit 4 (junit4, with hamcrest) and
# libfaketime (the paused worker's wall clock is stepped back with it).
setup_java_client() {
	local pkgs=() lib
	command -v javac >/dev/null 2>&1 || [ -n "${JAVA_HOME:-}" ] || pkgs+=(openjdk-17-jdk-headless)
	[ -f /usr/share/java/postgresql.jar ] || [ -n "${FENCEGATE_JDBC_JAR:-}" ] || pkgs+=(libpostgresql-jdbc-java)
	[ -f /usr/share/java/junit4.jar ] || [ -n "${FENCEGATE_JUNIT_CLASSPATH:-}" ] || pkgs+=(junit4)
	lib="$(ls /usr/lib/*/faketime/libfaketimeMT.so.1 2>/dev/null | head -n 1 || true)"
	[ -n "$lib" ] || [ -n "${FENCEGATE_FAKETIME_LIB:-}" ] || pkgs+=(libfaketime)
	if [ ${#pkgs[@]} -gt 0 ]; then
		apt_install " (the Java client's test will fail)" "${pkgs[@]}" || true
	fi
	echo "java client: $(command -v javac || echo "${JAVA_HOME:-no javac}"), $(ls /usr/share/java/postgresql.jar 2>/dev/null || echo "${FENCEGATE_JDBC_JAR:-no JDBC driver}")"
}

# setup_clients: the client packages of clients/ installed as a user
# installs them, made anew each run (a few seconds), for clients/ and
# examples/sql-worker's tests:
#   FENCEGATE_PYTHON        a virtual environment's python (var/clients/venv,
#                           over /usr/bin/python3 with --system-site-packages
#                           for Debian's python3-psycopg) after
#                           `pip install ./clients/python` (offline: the build
#                           uses Debian's setuptools and wheel)
#   FENCEGATE_NODE_PROJECT  a project (var/clients/node) after
#                           `npm install pg ./clients/typescript`
#   FAKETIME_LIB            Debian's libfaketime, which steps a paused
#                           worker's wall clock in the keepers' pause tests
# and npm ci in clients/typescript (the TypeScript compiler, for the test
# that dist/ is the build of src/) and in examples/sql-worker/node. The
# Debian packages are installed with apt-get as root when missing.
setup_clients() {
	local py=/usr/bin/python3 root="$PWD" want=()
	"$py" -c 'import venv, ensurepip' >/dev/null 2>&1 || want+=(python3-venv)
	"$py" -c 'import psycopg' >/dev/null 2>&1 || want+=(python3-psycopg)
	"$py" -c 'import setuptools, wheel' >/dev/null 2>&1 || want+=(python3-setuptools python3-wheel)
	FAKETIME_LIB="${FAKETIME_LIB:-$(ls /usr/lib/*/faketime/libfaketime.so.1 2>/dev/null | head -n1 || true)}"
	[ -n "$FAKETIME_LIB" ] || want+=(libfaketime)
	if [ ${#want[@]} -gt 0 ]; then
		apt_install "" "${want[@]}" || true
		FAKETIME_LIB="${FAKETIME_LIB:-$(ls /usr/lib/*/faketime/libfaketime.so.1 2>/dev/null | head -n1 || true)}"
	fi
	export FAKETIME_LIB
	echo "libfaketime: ${FAKETIME_LIB:-missing: the pause tests of the keepers will fail}"

	FENCEGATE_PYTHON=
	# build/: setuptools builds in the tree; a file removed from src/ must not
	# linger there and be installed.
	rm -rf var/clients/venv clients/python/build && mkdir -p var/clients
	if "$py" -m venv --system-site-packages var/clients/venv &&
		var/clients/venv/bin/pip install --quiet --no-index --no-build-isolation ./clients/python; then
		FENCEGATE_PYTHON="$root/var/clients/venv/bin/python"
	else
		echo "pip install ./clients/python failed"
	fi
	export FENCEGATE_PYTHON
	echo "python client: ${FENCEGATE_PYTHON:-missing}"

	FENCEGATE_NODE_PROJECT=
	if command -v npm >/dev/null 2>&1; then
		local dir="$root/var/clients/node"
		rm -rf "$dir" && mkdir -p "$dir"
		if (cd "$dir" && echo '{"name": "fencegate-client-test", "private": true}' >package.json &&
			npm install --no-audit --no-fund --loglevel=error pg@8.13.1 "$root/clients/typescript" >/dev/null); then
			FENCEGATE_NODE_PROJECT="$dir"
		else
			echo "npm install pg ./clients/typescript failed"
		fi
		local d
		for d in clients/typescript examples/sql-worker/node; do
			if [ ! -d "$d/node_modules" ] || [ "$d/package-lock.json" -nt "$d/node_modules" ] ||
				{ [ "$d" = examples/sql-worker/node ] && [ ! -e "$d/node_modules/@fencegate/client" ]; }; then
				echo "npm ci in $d"
				(cd "$d" && npm ci --no-audit --no-fund --loglevel=error >/dev/null && touch node_modules) || echo "npm ci in $d failed"
			fi
		done
	fi
	export FENCEGATE_NODE_PROJECT
	echo "node client: ${FENCEGATE_NODE_PROJECT:-missing}"
}

# setup_pgbouncer: PGBOUNCER_BIN for the tests that run fencegate through
# PgBouncer in transaction-pooling mode (internal/testkit/pgbouncer):
# $PGBOUNCER_BIN, pgbouncer on $PATH or /usr/sbin/pgbouncer, installed from
# Debian's packages as root when missing (the package's own service is not
# started: the tests start their own bouncers).
setup_pgbouncer() {
	if [ -z "${PGBOUNCER_BIN:-}" ]; then
		PGBOUNCER_BIN="$(command -v pgbouncer || true)"
		[ -z "$PGBOUNCER_BIN" ] && [ -x /usr/sbin/pgbouncer ] && PGBOUNCER_BIN=/usr/sbin/pgbouncer
		if [ -z "$PGBOUNCER_BIN" ]; then
			apt_install ", or set PGBOUNCER_BIN" pgbouncer || true
			[ -x /usr/sbin/pgbouncer ] && PGBOUNCER_BIN=/usr/sbin/pgbouncer
		fi
	fi
	export PGBOUNCER_BIN
	echo "pgbouncer: ${PGBOUNCER_BIN:-missing (the PgBouncer tests will fail)}"
}

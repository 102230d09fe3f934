.PHONY: build test dev clean chaos cluster failover vulncheck alerts

# The Go that builds fencegate (see scripts/test.sh): go1.26.8's standard
# library has vulnerabilities the gateway calls. The go command fetches it
# once from the module proxy.
export GOTOOLCHAIN := go1.27.3

# -buildvcs=auto: stamp the commit (gateway --version, fencegate_build_info)
# whatever GOFLAGS says, where git is there to ask.
build:
	go build -buildvcs=auto -o bin/gateway ./cmd/gateway

# The test command: starts the services the tests need from scratch.
test:
	scripts/test.sh

# govulncheck ./... against the vulnerability database (part of `make test`).
vulncheck:
	bash -c '. scripts/tools.sh && vulncheck'

# The alert rules' unit tests (deploy/prometheus/alerts_test.yml): each
# alert fires on its scenario and stays quiet on a healthy one. Not part of
# `make test`: building promtool takes 5-7 minutes on a 2-core machine.
alerts:
	bash -c '. scripts/tools.sh && setup_promtool && cd deploy/prometheus && "$$PROMTOOL_BIN" check rules alerts.yml && "$$PROMTOOL_BIN" test rules alerts_test.yml'

clean:
	rm -rf bin var

# The randomized fault run (test/chaos, test/chaos/internal/chaos): worker processes,
# gateway processes, nats-server, PostgreSQL and misbehaving SMTP and
# webhook destinations under a seeded nemesis, then the history checker,
# which fails a run that exercised too little. Its short form (20 s, a
# fixed seed) runs in `make test`. Same tool setup as `make test`
# (scripts/tools.sh). SEED=0 picks a random seed (printed; replay with
# it). Then the NATS cluster fault test's long form (`make cluster`).
SEED ?= 0
DURATION ?= 60s
chaos:
	scripts/chaos.sh $(SEED) $(DURATION)
	scripts/cluster.sh
	scripts/failover.sh

# The NATS cluster fault test's long form (test/cluster, about 6 minutes):
# a 3-node JetStream cluster, the stream on 3 replicas, two relay and two
# adapter processes under a steady load while nodes are killed, restarted,
# paused and resumed, four rounds; it prints the relay's stalls. Its short
# form (one round) runs in `make test`. LOGS=dir keeps the gateway logs.
cluster:
	scripts/cluster.sh $(LOGS)

# The PostgreSQL failover test (test/failover, about three minutes): a
# pg_auto_failover formation (monitor, primary, synchronous secondary)
# started from nothing, a relay and an adapter process and Go and
# SQL-interface workers on its multi-host URL while the primary is killed,
# rejoins as a secondary and the formation is switched over; it prints
# each fault's stall. RUNS=3 runs it three times in a row.
RUNS ?= 1
failover:
	scripts/failover.sh $(RUNS)

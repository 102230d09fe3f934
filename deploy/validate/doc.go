// Package validate checks the deploy files (deploy/compose.yaml,
// deploy/kubernetes, the Dockerfile's environment) with the tools that
// understand them: the kustomize library renders the Kubernetes base, each
// object is decoded strictly (unknown fields refused) into its client-go
// type or the Prometheus Operator's, and every GATEWAY_* variable and
// command line is checked against the gateway binary built from this tree
// (gateway run --print-config). It has no code of its own, only tests, and
// is a module of its own so that fencegate's module requires none of the
// Kubernetes libraries. Run: cd deploy/validate && go test ./...
// (scripts/test.sh runs it in the full test run).
package validate

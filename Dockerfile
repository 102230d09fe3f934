# fencegate gateway: a static binary on a distroless base, run as non-root.
#
#   docker build -t fencegate --build-arg VERSION="$(git describe --always --dirty)" .
#   docker run --rm fencegate --version
#
# The build stage needs the Go module proxy (or a vendored tree). Go 1.27.3,
# as the Makefile: go1.26.8's standard library has vulnerabilities the
# gateway calls.
#
# Healthchecks: `gateway probe http://127.0.0.1:9090/healthz` (no curl or
# wget in the image), with --metrics-addr set.
#
# The default command, plain `run`, starts the default adapters (email and
# file), and the email adapter needs a mail policy: give
# GATEWAY_MAIL_FROM_ALLOW (e.g. -e GATEWAY_MAIL_FROM_ALLOW=reports@example.com),
# or another command line (--adapters file, as deploy/compose.yaml), or it
# exits 2 naming mail_from_allow. Database and NATS: GATEWAY_DATABASE_URL,
# GATEWAY_NATS_URL.
FROM golang:1.27.3 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# Static (no cgo). .dockerignore keeps .git (and bin/, var/) out of the
# context, so the VCS stamp is empty: VERSION names the build instead
# (gateway --version, fencegate_build_info), "(devel)" when not given.
ARG VERSION=""
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=auto \
	-ldflags="-s -w -X github.com/fencegate/fencegate/internal/buildinfo.Version=${VERSION}" \
	-o /out/gateway ./cmd/gateway
# The file adapter's root, owned by the non-root user: distroless has no
# shell to mkdir or chown in, and a named volume mounted there starts with
# this directory's owner (compose's files volume).
RUN mkdir -p /out/data/files

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/gateway /usr/local/bin/gateway
COPY --from=build --chown=65532:65532 /out/data /var/lib/fencegate
# 65532: distroless's nonroot user; no shell, no package manager.
USER 65532:65532
WORKDIR /var/lib/fencegate
# The file adapter publishes (files and their epoch manifests, side by
# side) under this directory: mount a volume on it.
ENV GATEWAY_FILE_ROOT=/var/lib/fencegate/files
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/gateway"]
CMD ["run"]

# fencegate gateway: a static binary on a distroless base, run as non-root.
#
#   docker build -t fencegate .
#   docker run --rm fencegate --version
#
# The build stage needs the Go module proxy (or a vendored tree). Go 1.27.3,
# as the Makefile: go1.26.8's standard library has vulnerabilities the
# gateway calls.
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
# Static (no cgo), stamped with the commit when .git is in the context.
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=auto -ldflags="-s -w" -o /out/gateway ./cmd/gateway

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/gateway /usr/local/bin/gateway
# 65532: distroless's nonroot user; no shell, no package manager.
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/gateway"]
CMD ["run"]

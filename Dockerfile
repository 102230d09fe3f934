# fencegate gateway: a static binary on a distroless base, run as non-root.
#
#   docker build -t fencegate .
#   docker run --rm fencegate --version
#
# The build stage needs the Go module proxy (or a vendored tree).
FROM golang:1.26 AS build
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

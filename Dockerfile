# syntax=docker/dockerfile:1
# Build: a static binary, no cgo.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY cmd ./cmd
COPY internal ./internal
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/salesagg ./cmd/salesagg \
 && mkdir -p /out/shared-volume/state_store

# Run: distroless static, non-root (uid 65532). The state lives on the volume
# mounted at /shared-volume; the root filesystem can be read-only.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/salesagg /usr/local/bin/salesagg
COPY --from=build --chown=65532:65532 /out/shared-volume /shared-volume
USER 65532:65532
ENV SALESAGG_STATE_DIR=/shared-volume/state_store \
    SALESAGG_HTTP_ADDR=:8080 \
    SALESAGG_LOG_FORMAT=json
VOLUME ["/shared-volume"]
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/salesagg"]
CMD ["run"]

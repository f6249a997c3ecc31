# salesagg: a static binary on an empty (scratch) image, non-root (uid 65532),
# CA certificates for TLS to Kafka, the state at /shared-volume/state_store.
#
#   docker build -t salesagg .
#   docker build --build-arg GO_IMAGE=golang:1.26.8-bookworm -t salesagg .
#
# GO_IMAGE is the builder: any image with Go 1.26 (as go.mod asks), a POSIX
# shell and /etc/ssl/certs/ca-certificates.crt, and for the fast build a C
# compiler with a static libc (gcc, libc6-dev: scripts/build.sh then links
# with cgo, statically; without, it builds without cgo); test/docker builds
# one locally when no registry is reachable. RUNTIME_IMAGE defaults to scratch: nothing but
# what the build stage copies in (no shell, no package manager), so the image
# needs no registry and carries nothing to patch but the binary.
# GOPROXY (and GOFLAGS, GONOSUMDB, GOPRIVATE) pass through to `go mod download`.
# Plain Dockerfile syntax, no `# syntax=` line: it builds with BuildKit and with
# the legacy builder, and BuildKit does not pull a frontend image.
ARG GO_IMAGE=golang:1.26-bookworm
ARG RUNTIME_IMAGE=scratch

FROM ${GO_IMAGE} AS build
# Few instructions: with the legacy builder each one is a container, which a
# storage driver such as vfs makes by copying the whole builder image.
ARG GOPROXY GOFLAGS GONOSUMDB GOPRIVATE
# The modules first, in a layer of their own (rebuilt only when go.mod or
# go.sum change), then the sources: .dockerignore lets in only go.mod, go.sum,
# cmd/ and internal/ (no tests).
COPY go.mod go.sum /src/
RUN cd /src && go mod download
COPY . /src/
# The runtime's file tree is put together here, so that the last stage needs no
# shell: the binary, CA certificates, passwd/group naming uid 65532, and the
# volume's mount point (owned by 65532 through the COPY --chown below: an empty
# named volume mounted there starts with that owner and mode).
RUN cd /src && LDFLAGS="-s -w" sh scripts/build.sh /out/root/usr/local/bin/salesagg \
 && /out/root/usr/local/bin/salesagg help >/dev/null \
 && mkdir -p /out/root/etc/ssl/certs /out/volume/shared-volume/state_store \
 && cp /etc/ssl/certs/ca-certificates.crt /out/root/etc/ssl/certs/ca-certificates.crt \
 && printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >/out/root/etc/passwd \
 && printf 'root:x:0:\nnonroot:x:65532:\n' >/out/root/etc/group \
 && chmod 0750 /out/volume/shared-volume/state_store

FROM ${RUNTIME_IMAGE}
COPY --from=build /out/root/ /
COPY --from=build --chown=65532:65532 /out/volume/shared-volume /shared-volume
USER 65532:65532
ENV SALESAGG_STATE_DIR=/shared-volume/state_store \
    SALESAGG_HTTP_ADDR=:8080 \
    SALESAGG_LOG_FORMAT=json
VOLUME ["/shared-volume"]
EXPOSE 8080
# /readyz: healthy once every task is restored and running. Exec form: the
# image has no shell. A full restore of a large changelog can take minutes;
# failures in the start period do not count.
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 \
  CMD ["/usr/local/bin/salesagg", "health", "--timeout", "4s"]
ENTRYPOINT ["/usr/local/bin/salesagg"]
CMD ["run"]

#!/bin/sh
# Builds salesagg as it ships: scripts/build.sh OUT [go build flags...].
# make build, make run, the Dockerfile and the benchmarks build through it.
#
# With a C compiler that links a static program, cgo is on and the binary is
# linked statically (netgo, osusergo: Go's own resolver and user lookup, so
# nothing is loaded from libc at run time and the image needs no libc).
# Pebble then allocates its block cache and memtables with the C allocator,
# outside the Go heap: the collector neither scans nor frees them, and
# memory.limit.bytes bounds the heap alone. Without one (or with
# CGO_ENABLED=0 in the environment) the build has no cgo: Pebble's caches
# are then Go heap, every block read into the cache is a Go allocation, and
# at a state that outgrows the block cache an event costs about twice the
# CPU (BENCHMARKS.md, "The shipped binary is built without cgo").
# LDFLAGS (optional) are added to the linker flags, e.g. "-s -w".
set -eu
out=${1:?usage: scripts/build.sh OUT [go build flags...]}
shift
cc=${CC:-cc}

# static_cc reports whether $cc links a static C program (a C compiler and
# a static libc, libc6-dev on Debian).
static_cc() {
  command -v "$cc" >/dev/null 2>&1 || return 1
  dir=$(mktemp -d)
  printf 'int main(void) { return 0; }\n' >"$dir/probe.c"
  if "$cc" -static -o "$dir/probe" "$dir/probe.c" >/dev/null 2>&1; then ok=0; else ok=1; fi
  rm -rf "$dir"
  return $ok
}

if [ "${CGO_ENABLED:-}" != 0 ] && static_cc; then
  CGO_ENABLED=1 exec go build -trimpath -tags netgo,osusergo \
    -ldflags "${LDFLAGS:-} -linkmode external -extldflags -static" "$@" -o "$out" ./cmd/salesagg
fi
if [ "${CGO_ENABLED:-}" != 0 ]; then
  echo "scripts/build.sh: no C compiler linking a static program ($cc): building without cgo, Pebble's caches in the Go heap (README, Memory)" >&2
fi
CGO_ENABLED=0 exec go build -trimpath -ldflags "${LDFLAGS:-}" "$@" -o "$out" ./cmd/salesagg

#!/usr/bin/env bash
# Build the Kafka Streams reference: target/kstreams-reference.jar and its runtime jars in
# target/lib. Same as `run.sh --build-only` but always builds.
set -euo pipefail
DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "${MVN:-mvn}" -q -B -Dstyle.color=never -f "$DIR/pom.xml" package -DskipTests "$@"

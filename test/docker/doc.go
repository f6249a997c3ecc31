// Package docker runs the README's compose walkthrough for real: the image
// built from the Dockerfile, docker-compose.yml with the override
// docker-compose.test.yml, on a Docker engine of the test's own (dockerd with
// vfs, no bridge, no iptables, its data root and socket under the test's temp
// dir) and the project's Apache Kafka test broker (test/kafka/kafka.sh). The
// test is behind the build tag docker and needs root:
//
//	make test-docker    # go test -tags docker -count=1 -timeout 40m -v ./test/docker/
//
// See README.md in this directory.
package docker

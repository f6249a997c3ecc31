// Package e2e is salesagg's end-to-end suite: the real binary against a real
// Kafka broker (test/kafka/kafka.sh, or KAFKA_BOOTSTRAP_SERVERS), and the
// Kafka Streams reference (bench/kstreams-reference) for the migration test.
// The tests are behind the build tag e2e:
//
//	go test -tags e2e -count=1 -timeout 30m ./test/e2e/
//
// See README.md in this directory.
package e2e

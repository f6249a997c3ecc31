// Package harness is what salesagg's process-level tests share, so that
// cmd/salesagg's tests, test/e2e, test/docker and test/k8s start, watch and
// wait the same way:
//
//   - WaitFor (and Expect, Poll): the one way to wait for a condition;
//   - Start and Proc: a child process with its output kept line by line, in
//     memory and in a log file; its JSON log lines, queried (Logs, Restored);
//   - StartService and Service: `salesagg run` on a free loopback port, with
//     its HTTP API (API: readiness, totals, tasks);
//   - Fleet and Member: the instances of one group, for the multi-instance
//     tests and the ownership sampler (test/ownership), and
//     SeveralInstancesOneGroup, the scale scenario run on both brokers;
//   - Event, Producer: sales events and a paced producer that keeps the
//     totals of what the broker acknowledged;
//   - the broker helpers: test/kafka/kafka.sh (Kafka, StartKafka), clients,
//     topics, a topic's committed records (ReadTopic) and a changelog's
//     latest totals (LatestTotals, CheckChangelog);
//   - KafkaCluster (StartKafkaCluster): a multi-node kafka.sh cluster whose
//     nodes a test kills, stops, pauses and restarts, and asks where leaders
//     and coordinators are; FaultProxy and ProxySet: TCP proxies in front of
//     its client listeners that blackhole, drop or delay one client's traffic.
//
// Nothing here is a _test.go file: the packages import it. It calls t.Fatal
// only from the goroutine of the test it is given.
package harness

// SampleTotals are the totals sample_events.txt gives, as the README states
// them.
var SampleTotals = map[string]int64{
	"product1": 9200, "product2": 8150, "product3": 7350, "product4": 11700, "product5": 6000,
	"product6": 8750, "product7": 9150, "product8": 12150, "product9": 7550, "product10": 3450,
}

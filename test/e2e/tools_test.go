//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/test/harness"
)

// Kafka's command-line tools, from the kafka-tools jar that test/kafka/pom.xml
// brings (Kafka 4.x moved them from kafka.admin to org.apache.kafka.tools).
const (
	consumerGroupsClass = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand" // kafka-consumer-groups.sh
	topicsClass         = "org.apache.kafka.tools.TopicCommand"                        // kafka-topics.sh
)

// TestKafkaToolsAgainstTheDevBroker: kafka-consumer-groups --list/--describe and kafka-topics
// --describe (the Java tools of Kafka 4.4) work against the dev broker (`salesagg broker`) after
// a salesagg run processed the sample events: the group is listed, its lag columns are right while
// it runs (LAG 0) and after it stopped and more events came (LAG = the new events of each
// partition), and every partition is described with its leader, replicas, ISR and (empty)
// eligible leader replicas, with no exception.
func TestKafkaToolsAgainstTheDevBroker(t *testing.T) {
	jars := kafkaJars(t)
	dir := t.TempDir()
	brokerAddr := harness.FreeAddr(t)
	broker := harness.Start(t, harness.Spec{Name: "dev-broker", Path: binPath, Dir: repoRoot,
		Args: []string{"broker", "--data-dir", filepath.Join(dir, "broker"), "--listen", brokerAddr, "--log.format", "json"}})
	harness.WaitFor(t, 30*time.Second, "the dev broker to listen", func() error {
		if !broker.Alive() {
			return fmt.Errorf("dev broker exited (%s)", broker.DescribeExit())
		}
		c, err := net.DialTimeout("tcp", brokerAddr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})

	const appID, input = "tools-app", "sales-events-v1"
	svc := harness.StartService(t, harness.ServiceConfig{Bin: binPath, Broker: brokerAddr, Dir: repoRoot,
		AppID: appID, StateDir: filepath.Join(dir, "state"), CommitMs: 100})
	svc.WaitRestored(t, 90*time.Second)

	cl, err := kgo.NewClient(kgo.SeedBrokers(brokerAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	lines := sampleRecords(t, input)
	ends := map[int32]int64{} // log end offset per input partition
	send := func(lines []*kgo.Record) map[int32]int64 {
		recs := make([]*kgo.Record, len(lines))
		for i, l := range lines {
			recs[i] = &kgo.Record{Topic: input, Key: l.Key, Value: l.Value}
		}
		harness.Produce(t, cl, recs...)
		sent := map[int32]int64{}
		for _, r := range recs {
			sent[r.Partition]++
			ends[r.Partition] = max(ends[r.Partition], r.Offset+1)
		}
		return sent
	}
	send(lines)
	harness.WaitFor(t, 60*time.Second, "the sample totals over HTTP", func() error { return svc.CheckTotals(harness.SampleTotals) })

	// The group is listed.
	out := runTool(t, jars, consumerGroupsClass, "--bootstrap-server", brokerAddr, "--list")
	if !containsLine(out, appID) {
		t.Fatalf("kafka-consumer-groups --list does not list %s:\n%s", appID, out)
	}

	// Running and caught up: every input partition has a member and LAG 0 (the last
	// commit is at most commit.interval.ms behind the totals).
	var rows []groupRow
	// Each try starts a JVM (seconds on a loaded machine): a long bound.
	harness.WaitFor(t, 2*time.Minute, "LAG 0 on every input partition", func() error {
		out = runTool(t, jars, consumerGroupsClass, "--bootstrap-server", brokerAddr, "--describe", "--group", appID)
		rows = parseGroupTable(t, out, input)
		return checkLag(rows, ends, map[int32]int64{}, true)
	})
	t.Logf("kafka-consumer-groups --describe, running:\n%s", out)

	// Stopped, then 30 more events: the lag is those events, per partition.
	svc.Terminate(t)
	more := send(lines[:30])
	out = runTool(t, jars, consumerGroupsClass, "--bootstrap-server", brokerAddr, "--describe", "--group", appID)
	if !strings.Contains(out, "has no active members") {
		t.Errorf("describing the stopped group does not say it has no active members:\n%s", out)
	}
	rows = parseGroupTable(t, out, input)
	if err := checkLag(rows, ends, more, false); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("kafka-consumer-groups --describe, stopped, 30 events later:\n%s", out)

	// kafka-topics --describe: one line per partition with leader, replicas, ISR and the
	// eligible leader replicas (empty), the NullPointerException of kfake's answer gone.
	out = runTool(t, jars, topicsClass, "--bootstrap-server", brokerAddr, "--describe", "--topic", input)
	for part := range int32(3) {
		want := fmt.Sprintf("Topic: %s\tPartition: %d\tLeader: 0\tReplicas: 0\tIsr: 0\tElr: \tLastKnownElr: ", input, part)
		if !strings.Contains(out, want) {
			t.Errorf("kafka-topics --describe lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, "PartitionCount: 3") {
		t.Errorf("kafka-topics --describe lacks PartitionCount: 3:\n%s", out)
	}
	all := runTool(t, jars, topicsClass, "--bootstrap-server", brokerAddr, "--describe")
	for _, topic := range []string{input, appID + "-PRODUCT_AGGREGATED_SALES-changelog", appID + "-PRODUCT_AGGREGATED_SALES-repartition", "notifications-events-v1"} {
		if !strings.Contains(all, "Topic: "+topic+"\tTopicId: ") {
			t.Errorf("kafka-topics --describe (all topics) lacks %s:\n%s", topic, all)
		}
	}
	t.Logf("kafka-topics --describe --topic %s:\n%s", input, out)
}

// kafkaJars returns the class path of Kafka's jars (test/kafka/kafka.sh jars).
func kafkaJars(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("java"); err != nil {
		t.Fatal("java is needed to run Kafka's tools (Java 17+)")
	}
	out, err := kafka.Run(10*time.Minute, "jars")
	if err != nil {
		t.Fatalf("kafka.sh jars: %v\n%s", err, out)
	}
	lib := harness.LastLine(out)
	if _, err := os.Stat(filepath.Join(lib, "kafka-tools-"+kafkaVersion()+".jar")); err != nil {
		t.Fatalf("the jar set has no kafka-tools jar (test/kafka/pom.xml): %v", err)
	}
	return filepath.Join(lib, "*")
}

func kafkaVersion() string {
	if v := os.Getenv("KAFKA_VERSION"); v != "" {
		return v
	}
	return "4.4.0"
}

// runTool runs a Kafka tool class and returns its standard output and then
// its standard error (where, e.g., "Consumer group 'g' has no active
// members." goes); it fails the test when the tool exits non-zero or reports
// an exception.
func runTool(t *testing.T, classPath, class string, args ...string) string {
	t.Helper()
	log4j := filepath.Join(t.TempDir(), "log4j2.properties")
	if err := os.WriteFile(log4j, []byte("status = warn\nappender.err.type = Console\nappender.err.name = STDERR\nappender.err.target = SYSTEM_ERR\n"+
		"appender.err.layout.type = PatternLayout\nappender.err.layout.pattern = %p %m (%c)%n\n"+
		"rootLogger.level = WARN\nrootLogger.appenderRef.err.ref = STDERR\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	argv := append([]string{"-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Dlog4j2.configurationFile=" + log4j,
		"-cp", classPath, class}, args...)
	cmd := exec.CommandContext(ctx, "java", argv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	t0 := time.Now()
	err := cmd.Run()
	short := class[strings.LastIndex(class, ".")+1:]
	if err != nil || strings.Contains(stdout.String()+stderr.String(), "Exception") {
		t.Fatalf("%s %s: %v (%s)\nstdout:\n%s\nstderr:\n%s", short, strings.Join(args, " "), err, time.Since(t0).Round(time.Millisecond), stdout.String(), stderr.String())
	}
	return stdout.String() + stderr.String()
}

func containsLine(out, want string) bool {
	for _, l := range strings.Split(out, "\n") {
		if strings.TrimSpace(l) == want {
			return true
		}
	}
	return false
}

// groupRow is one line of kafka-consumer-groups --describe.
type groupRow struct {
	partition              int32
	current, logEnd, lag   string
	consumerID, clientHost string
}

// parseGroupTable returns the rows of topic in the table kafka-consumer-groups
// --describe prints (columns found by the header's names).
func parseGroupTable(t *testing.T, out, topic string) []groupRow {
	t.Helper()
	var header []string
	var rows []groupRow
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if f[0] == "GROUP" {
			header = f
			continue
		}
		if header == nil || len(f) != len(header) {
			continue
		}
		col := map[string]string{}
		for i, h := range header {
			col[h] = f[i]
		}
		if col["TOPIC"] != topic {
			continue
		}
		p, err := strconv.Atoi(col["PARTITION"])
		if err != nil {
			t.Fatalf("PARTITION %q in %q", col["PARTITION"], l)
		}
		rows = append(rows, groupRow{partition: int32(p), current: col["CURRENT-OFFSET"], logEnd: col["LOG-END-OFFSET"], lag: col["LAG"],
			consumerID: col["CONSUMER-ID"], clientHost: col["HOST"]})
	}
	if header == nil {
		t.Fatalf("no GROUP ... header in:\n%s", out)
	}
	for _, h := range []string{"TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID"} {
		if !strings.Contains(strings.Join(header, " "), h) {
			t.Fatalf("no %s column in %v", h, header)
		}
	}
	return rows
}

// checkLag checks one row per partition of ends: LOG-END-OFFSET the end,
// LAG lag[p] (0 when absent), CURRENT-OFFSET the end less the lag, and a
// member holding the partition when running, none ("-") when not.
func checkLag(rows []groupRow, ends, lag map[int32]int64, running bool) error {
	if len(rows) != len(ends) {
		return fmt.Errorf("%d rows for the input topic, want %d", len(rows), len(ends))
	}
	for _, r := range rows {
		end, ok := ends[r.partition]
		if !ok {
			return fmt.Errorf("row for partition %d, which got no event", r.partition)
		}
		want := groupRow{partition: r.partition, current: strconv.FormatInt(end-lag[r.partition], 10), logEnd: strconv.FormatInt(end, 10),
			lag: strconv.FormatInt(lag[r.partition], 10), consumerID: r.consumerID, clientHost: r.clientHost}
		if r != want {
			return fmt.Errorf("partition %d: CURRENT-OFFSET %s LOG-END-OFFSET %s LAG %s, want %s %s %s", r.partition, r.current, r.logEnd, r.lag, want.current, want.logEnd, want.lag)
		}
		if hasMember := r.consumerID != "-"; hasMember != running {
			return fmt.Errorf("partition %d: CONSUMER-ID %q with the service running=%v", r.partition, r.consumerID, running)
		}
		if running && r.clientHost != "/127.0.0.1" {
			return fmt.Errorf("partition %d: HOST %q, want /127.0.0.1 (as Kafka shows a client's address)", r.partition, r.clientHost)
		}
	}
	return nil
}

package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// lookupTimeout bounds each request a KafkaCluster lookup sends to one
// node: a node that does not answer in time (paused, or cut off) is
// skipped for the next.
const lookupTimeout = 3 * time.Second

// KafkaCluster is a cluster of Apache Kafka nodes that test/kafka/kafka.sh
// runs on loopback (KAFKA_NODES), each a combined broker and KRaft
// controller with node id 1..N, with KAFKA_CLIENT_LISTENERS extra client
// listeners for fault proxies (ProxySet). Its methods fault single nodes
// (Kill, Stop, Start, Pause, Resume) and ask the cluster where things are
// (LeaderOf, GroupCoordinator, DescribeTransaction, ...), sending each
// request to the nodes that run, in turn, with short timeouts, so that a
// lookup works while a node is down or paused.
//
// The fields set by UpKafkaCluster are only read after; mu guards the rest.
// Its methods are safe for concurrent use.
type KafkaCluster struct {
	// Kafka runs kafka.sh on the cluster's KAFKA_DIR.
	Kafka Kafka

	nodes     int
	bootstrap string
	addrs     []string           // by node-1
	listeners [][]ClientListener // by listener-1, then node-1
	// lookups is the client that sends the lookups: its seed brokers are
	// the nodes, in node order (SeedBrokers()[n-1] is node n).
	lookups  *kgo.Client
	watchdog *exec.Cmd

	mu     sync.Mutex
	paused map[int32]bool // guarded by mu; the nodes Pause stopped
	down   bool           // guarded by mu; Down ran
}

// ClientListener is one client listener (CLIENTk) of one node: the node
// listens on ListenPort and advertises AdvertisedPort, where a proxy
// forwards to ListenPort.
type ClientListener struct {
	Node                       int32
	Name                       string // CLIENT1, CLIENT2, ...
	ListenPort, AdvertisedPort int
}

// ListenAddr is 127.0.0.1:ListenPort.
func (l ClientListener) ListenAddr() string { return "127.0.0.1:" + strconv.Itoa(l.ListenPort) }

// AdvertisedAddr is 127.0.0.1:AdvertisedPort.
func (l ClientListener) AdvertisedAddr() string {
	return "127.0.0.1:" + strconv.Itoa(l.AdvertisedPort)
}

// StartKafkaCluster starts a cluster of nodes (1 is kafka.sh's single-node
// layout) with clientListeners client listeners, KAFKA_DIR <dir>/kafka, for
// the test: it is taken down when the test ends (paused nodes resumed
// first), and by a watchdog if this process dies first. When the test
// failed, the last lines of each node's log are logged.
func StartKafkaCluster(t testing.TB, root, dir string, nodes, clientListeners int) *KafkaCluster {
	t.Helper()
	t0 := time.Now()
	c, err := UpKafkaCluster(root, dir, nodes, clientListeners)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.Nodes() {
				t.Logf("---- last lines of node %d's broker log (%s, deleted now) ----\n%s", n, c.LogPath(n), clip(Tail(c.LogPath(n), 15), 300))
			}
		}
		if err := c.Down(); err != nil {
			t.Error(err)
		}
	})
	t.Logf("Apache Kafka cluster of %d nodes up at %s in %s (KAFKA_DIR=%s)", nodes, c.Bootstrap(), time.Since(t0).Round(time.Millisecond), c.Kafka.Dir)
	return c
}

// clip cuts each line of s to at most n bytes.
func clip(s string, n int) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if len(l) > n {
			lines[i] = l[:n] + " …"
		}
	}
	return strings.Join(lines, "\n")
}

// UpKafkaCluster is StartKafkaCluster without a test (for a TestMain): the
// caller takes it down with Down.
func UpKafkaCluster(root, dir string, nodes, clientListeners int) (*KafkaCluster, error) {
	if nodes < 1 || clientListeners < 0 {
		return nil, fmt.Errorf("a Kafka cluster of %d nodes with %d client listeners", nodes, clientListeners)
	}
	k := NewKafka(root, filepath.Join(dir, "kafka"))
	k.Env = []string{"KAFKA_NODES=" + strconv.Itoa(nodes), "KAFKA_CLIENT_LISTENERS=" + strconv.Itoa(clientListeners)}
	c := &KafkaCluster{Kafka: k, nodes: nodes, paused: map[int32]bool{}}
	wd, err := k.Watchdog("kafka-cluster-watchdog", "")
	if err != nil {
		return nil, err
	}
	c.watchdog = wd
	if err := c.up(clientListeners); err != nil {
		if derr := c.Down(); derr != nil {
			err = errors.Join(err, derr)
		}
		return nil, err
	}
	return c, nil
}

func (c *KafkaCluster) up(clientListeners int) error {
	out, err := c.Kafka.Run(5*time.Minute, "up")
	if err != nil {
		return fmt.Errorf("kafka.sh up (KAFKA_NODES=%d): %w\n%s", c.nodes, err, out)
	}
	c.bootstrap = LastLine(out)
	b, err := os.ReadFile(filepath.Join(c.Kafka.Dir, "bootstrap"))
	if err != nil {
		return err
	}
	if f := strings.TrimSpace(string(b)); f != c.bootstrap {
		return fmt.Errorf("kafka.sh up printed %q, its bootstrap file says %q", c.bootstrap, f)
	}
	c.addrs = strings.Split(c.bootstrap, ",")
	if len(c.addrs) != c.nodes {
		return fmt.Errorf("kafka.sh up printed %q: %d addresses for %d nodes", c.bootstrap, len(c.addrs), c.nodes)
	}
	if c.listeners, err = readListeners(filepath.Join(c.Kafka.Dir, "listeners"), c.nodes, clientListeners); err != nil {
		return err
	}
	c.lookups, err = kgo.NewClient(kgo.SeedBrokers(c.addrs...),
		kgo.DialTimeout(2*time.Second), kgo.RequestTimeoutOverhead(2*time.Second), kgo.RetryTimeout(lookupTimeout))
	return err
}

// readListeners parses kafka.sh's listeners file: "NODE LISTENER
// LISTEN_PORT ADVERTISED_PORT" lines, one per node and client listener
// (none without client listeners).
func readListeners(path string, nodes, listeners int) ([][]ClientListener, error) {
	out := make([][]ClientListener, listeners)
	if listeners == 0 {
		return out, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) != 4 {
			return nil, fmt.Errorf("%s: line %q: want NODE LISTENER LISTEN_PORT ADVERTISED_PORT", path, line)
		}
		node, err1 := strconv.Atoi(f[0])
		k, err2 := strconv.Atoi(strings.TrimPrefix(f[1], "CLIENT"))
		lp, err3 := strconv.Atoi(f[2])
		ap, err4 := strconv.Atoi(f[3])
		if err := errors.Join(err1, err2, err3, err4); err != nil || k < 1 || k > listeners || node < 1 || node > nodes {
			return nil, fmt.Errorf("%s: line %q: %v", path, line, err)
		}
		out[k-1] = append(out[k-1], ClientListener{Node: int32(node), Name: f[1], ListenPort: lp, AdvertisedPort: ap})
	}
	for k, ls := range out {
		if len(ls) != nodes {
			return nil, fmt.Errorf("%s: CLIENT%d has %d nodes, want %d", path, k+1, len(ls), nodes)
		}
		slices.SortFunc(ls, func(a, b ClientListener) int { return int(a.Node - b.Node) })
	}
	return out, nil
}

// Down resumes the paused nodes, takes the cluster down (kafka.sh down:
// its files are deleted) and ends the watchdog. It is safe to call more
// than once.
func (c *KafkaCluster) Down() error {
	c.mu.Lock()
	if c.down {
		c.mu.Unlock()
		return nil
	}
	c.down = true
	paused := c.pausedNodes()
	c.mu.Unlock()
	var errs []error
	// A test never leaves a stopped JVM: down also continues what it stops.
	for _, n := range paused {
		if err := c.Resume(n); err != nil {
			errs = append(errs, err)
		}
	}
	if c.lookups != nil {
		c.lookups.Close()
	}
	if out, err := c.Kafka.Run(2*time.Minute, "down"); err != nil {
		errs = append(errs, fmt.Errorf("kafka.sh down: %w\n%s", err, out))
	}
	if c.watchdog != nil {
		_ = c.watchdog.Process.Kill()
		_ = c.watchdog.Wait()
	}
	return errors.Join(errs...)
}

// pausedNodes lists the paused nodes; c.mu must be held.
func (c *KafkaCluster) pausedNodes() []int32 {
	var out []int32
	for n, p := range c.paused {
		if p {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// Bootstrap is the direct (PLAINTEXT) address of every node, comma-separated,
// in node order.
func (c *KafkaCluster) Bootstrap() string { return c.bootstrap }

// LiveBootstrap is Bootstrap without the nodes that are down or paused:
// seeds for a client that must not wait on those.
func (c *KafkaCluster) LiveBootstrap() string {
	var addrs []string
	for _, n := range c.liveNodes() {
		addrs = append(addrs, c.Addr(n))
	}
	return strings.Join(addrs, ",")
}

// Nodes is the node ids, 1..N.
func (c *KafkaCluster) Nodes() []int32 {
	out := make([]int32, c.nodes)
	for i := range out {
		out[i] = int32(i + 1)
	}
	return out
}

// Addr is node's direct address, 127.0.0.1:PORT.
func (c *KafkaCluster) Addr(node int32) string {
	c.mustNode(node)
	return c.addrs[node-1]
}

// Listener returns client listener k (1-based, CLIENTk) of every node, in
// node order.
func (c *KafkaCluster) Listener(k int) ([]ClientListener, error) {
	if k < 1 || k > len(c.listeners) {
		return nil, fmt.Errorf("no client listener %d: the cluster has %d (KAFKA_CLIENT_LISTENERS)", k, len(c.listeners))
	}
	return slices.Clone(c.listeners[k-1]), nil
}

// LogPath is node's broker log.
func (c *KafkaCluster) LogPath(node int32) string {
	return filepath.Join(c.nodeDir(node), "broker.log")
}

func (c *KafkaCluster) mustNode(node int32) {
	if node < 1 || int(node) > c.nodes {
		panic(fmt.Sprintf("harness: no node %d in a cluster of %d", node, c.nodes))
	}
}

// nodeDir is where kafka.sh keeps node's files: KAFKA_DIR itself for one
// node, KAFKA_DIR/nodeN in a cluster.
func (c *KafkaCluster) nodeDir(node int32) string {
	c.mustNode(node)
	if c.nodes == 1 {
		return c.Kafka.Dir
	}
	return filepath.Join(c.Kafka.Dir, fmt.Sprintf("node%d", node))
}

// errNotRunning is the error pid gives when node has no process.
var errNotRunning = errors.New("not running")

// pid returns the pid of node's broker from its pid file: errNotRunning
// without one, an error when it names no broker of node (a stale pid).
func (c *KafkaCluster) pid(node int32) (int, error) {
	dir := c.nodeDir(node)
	b, err := os.ReadFile(filepath.Join(dir, "broker.pid"))
	if os.IsNotExist(err) {
		return 0, fmt.Errorf("node %d: %w", node, errNotRunning)
	}
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("node %d: pid file holds %q", node, b)
	}
	// A zombie's cmdline is empty: it runs no more.
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	props := filepath.Join(dir, "server.properties")
	if err != nil || !strings.Contains(string(cmdline), "kafka.Kafka") || !strings.Contains(string(cmdline), props) {
		return 0, fmt.Errorf("node %d: stale pid %d in %s: no broker of %s runs under it", node, pid, filepath.Join(dir, "broker.pid"), props)
	}
	return pid, nil
}

// Running reports whether node's broker process runs (a paused one too).
func (c *KafkaCluster) Running(node int32) bool {
	_, err := c.pid(node)
	return err == nil
}

// Paused reports whether Pause stopped node and Resume has not continued it
// yet.
func (c *KafkaCluster) Paused(node int32) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.paused[node]
}

// liveNodes lists the nodes that run and are not paused.
func (c *KafkaCluster) liveNodes() []int32 {
	var out []int32
	for _, n := range c.Nodes() {
		if c.Running(n) && !c.Paused(n) {
			out = append(out, n)
		}
	}
	return out
}

// Kill sends node's broker SIGKILL and waits until it is gone.
func (c *KafkaCluster) Kill(node int32) error {
	pid, err := c.signal(node, syscall.SIGKILL, "killing")
	if err != nil {
		return err
	}
	c.mu.Lock()
	delete(c.paused, node)
	c.mu.Unlock()
	if err := Poll(10*time.Second, func() error {
		if c.Running(node) {
			return fmt.Errorf("node %d (pid %d) still runs after SIGKILL", node, pid)
		}
		return nil
	}); err != nil {
		return err
	}
	_ = os.Remove(filepath.Join(c.nodeDir(node), "broker.pid"))
	return nil
}

// Stop stops node cleanly (kafka.sh stop N: SIGTERM, SIGKILL after 30 s; a
// paused node is continued to shut down) and returns once it is gone.
func (c *KafkaCluster) Stop(node int32) error {
	c.mustNode(node)
	out, err := c.Kafka.Run(2*time.Minute, "stop", strconv.Itoa(int(node)))
	c.mu.Lock()
	delete(c.paused, node)
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("kafka.sh stop %d: %w\n%s", node, err, out)
	}
	return nil
}

// Start starts node again on its data and ports (kafka.sh start N) and
// returns once it is ready: it logged "Kafka Server started" (it is
// unfenced) and its port accepts connections.
func (c *KafkaCluster) Start(node int32) error {
	c.mustNode(node)
	out, err := c.Kafka.Run(3*time.Minute, "start", strconv.Itoa(int(node)))
	if err != nil {
		return fmt.Errorf("kafka.sh start %d: %w\n%s", node, err, out)
	}
	return nil
}

// Pause stops node's broker with SIGSTOP: it keeps its sockets and answers
// nothing, as a hung process does. Resume (or the test's cleanup)
// continues it.
func (c *KafkaCluster) Pause(node int32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down {
		return fmt.Errorf("pausing node %d: the cluster is down", node)
	}
	if _, err := c.signal(node, syscall.SIGSTOP, "pausing"); err != nil {
		return err
	}
	c.paused[node] = true
	return nil
}

// Resume continues node's broker with SIGCONT.
func (c *KafkaCluster) Resume(node int32) error {
	if _, err := c.signal(node, syscall.SIGCONT, "resuming"); err != nil {
		return err
	}
	c.mu.Lock()
	delete(c.paused, node)
	c.mu.Unlock()
	return nil
}

// signal sends node's broker sig and returns its pid; verb names the
// action in the error ("killing node 2 (pid 123): ...").
func (c *KafkaCluster) signal(node int32, sig syscall.Signal, verb string) (int, error) {
	pid, err := c.pid(node)
	if err != nil {
		return 0, fmt.Errorf("%s node %d: %w", verb, node, err)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return pid, fmt.Errorf("%s node %d (pid %d): %w", verb, node, pid, err)
	}
	return pid, nil
}

// ask sends req to the live nodes in turn, each with lookupTimeout, and
// returns the first answer and the node that gave it.
func (c *KafkaCluster) ask(ctx context.Context, req kmsg.Request) (kmsg.Response, int32, error) {
	live := c.liveNodes()
	if len(live) == 0 {
		return nil, 0, errors.New("no node of the cluster runs")
	}
	var errs []error
	for _, n := range live {
		resp, err := c.askNode(ctx, n, req)
		if err == nil {
			return resp, n, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, 0, errors.Join(errs...)
}

// askNode sends req to node, with lookupTimeout.
func (c *KafkaCluster) askNode(ctx context.Context, node int32, req kmsg.Request) (kmsg.Response, error) {
	c.mustNode(node)
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	seeds := c.lookups.SeedBrokers()
	if len(seeds) != c.nodes {
		return nil, fmt.Errorf("the lookup client has %d seed brokers, want %d", len(seeds), c.nodes)
	}
	resp, err := seeds[node-1].Request(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("node %d: %s: %w", node, kmsg.NameForKey(req.Key()), err)
	}
	return resp, nil
}

// PartitionState is one partition as the cluster's metadata has it.
type PartitionState struct {
	Topic     string
	Partition int32
	// Leader is -1 while the partition has none.
	Leader      int32
	LeaderEpoch int32
	Replicas    []int32
	ISR         []int32
	// Offline lists the replicas on nodes that are down.
	Offline []int32
	// Err is the partition's error code in the metadata, as an error.
	Err error
}

// metadata asks for the metadata of topics (all of them, internal ones
// too, when none), and says which node answered.
func (c *KafkaCluster) metadata(ctx context.Context, node int32, topics ...string) (*kmsg.MetadataResponse, int32, error) {
	req := kmsg.NewPtrMetadataRequest()
	if len(topics) > 0 {
		for _, t := range topics {
			rt := kmsg.NewMetadataRequestTopic()
			rt.Topic = kmsg.StringPtr(t)
			req.Topics = append(req.Topics, rt)
		}
	}
	var resp kmsg.Response
	var err error
	if node > 0 {
		resp, err = c.askNode(ctx, node, req)
	} else {
		resp, node, err = c.ask(ctx, req)
	}
	if err != nil {
		return nil, 0, err
	}
	return resp.(*kmsg.MetadataResponse), node, nil
}

// partitions turns a metadata response into its partitions, by topic;
// topics with an error are left out.
func partitions(m *kmsg.MetadataResponse) map[string][]PartitionState {
	out := map[string][]PartitionState{}
	for _, t := range m.Topics {
		if t.Topic == nil || t.ErrorCode != 0 {
			continue
		}
		for _, p := range t.Partitions {
			ps := PartitionState{
				Topic: *t.Topic, Partition: p.Partition, Leader: p.Leader, LeaderEpoch: p.LeaderEpoch,
				Replicas: slices.Sorted(slices.Values(p.Replicas)), ISR: slices.Sorted(slices.Values(p.ISR)),
				Offline: slices.Sorted(slices.Values(p.OfflineReplicas)), Err: kerr.ErrorForCode(p.ErrorCode),
			}
			out[*t.Topic] = append(out[*t.Topic], ps)
		}
		slices.SortFunc(out[*t.Topic], func(a, b PartitionState) int { return int(a.Partition - b.Partition) })
	}
	return out
}

// Partition returns topic's partition as the metadata of a live node has
// it.
func (c *KafkaCluster) Partition(ctx context.Context, topic string, partition int32) (PartitionState, error) {
	m, node, err := c.metadata(ctx, 0, topic)
	if err != nil {
		return PartitionState{}, err
	}
	for _, t := range m.Topics {
		if t.Topic != nil && *t.Topic == topic && t.ErrorCode != 0 {
			return PartitionState{}, fmt.Errorf("metadata of %s from node %d: %w", topic, node, kerr.ErrorForCode(t.ErrorCode))
		}
	}
	for _, p := range partitions(m)[topic] {
		if p.Partition == partition {
			return p, nil
		}
	}
	return PartitionState{}, fmt.Errorf("metadata from node %d has no partition %s-%d", node, topic, partition)
}

// LeaderOf returns the node that leads topic's partition, from the
// metadata of a live node; an error while it has no leader.
func (c *KafkaCluster) LeaderOf(ctx context.Context, topic string, partition int32) (int32, error) {
	p, err := c.Partition(ctx, topic, partition)
	if err != nil {
		return 0, err
	}
	if p.Leader < 0 {
		return 0, fmt.Errorf("%s-%d has no leader (%v)", topic, partition, p.Err)
	}
	return p.Leader, nil
}

// ISR returns the in-sync replicas of topic's partition, sorted.
func (c *KafkaCluster) ISR(ctx context.Context, topic string, partition int32) ([]int32, error) {
	p, err := c.Partition(ctx, topic, partition)
	if err != nil {
		return nil, err
	}
	return p.ISR, nil
}

// coordinator asks a live node which node coordinates key (keyType 0: a
// group, 1: a transactional id).
func (c *KafkaCluster) coordinator(ctx context.Context, keyType int8, key string) (int32, error) {
	req := kmsg.NewPtrFindCoordinatorRequest()
	req.CoordinatorType = keyType
	req.CoordinatorKey = key
	req.CoordinatorKeys = []string{key}
	resp, node, err := c.ask(ctx, req)
	if err != nil {
		return 0, err
	}
	r := resp.(*kmsg.FindCoordinatorResponse)
	id, code := r.NodeID, r.ErrorCode
	if len(r.Coordinators) > 0 {
		id, code = r.Coordinators[0].NodeID, r.Coordinators[0].ErrorCode
	}
	if err := kerr.ErrorForCode(code); err != nil {
		return 0, fmt.Errorf("finding the coordinator of %q (node %d answered): %w", key, node, err)
	}
	return id, nil
}

// GroupCoordinator returns the node that coordinates group (FindCoordinator).
func (c *KafkaCluster) GroupCoordinator(ctx context.Context, group string) (int32, error) {
	return c.coordinator(ctx, 0, group)
}

// TxnCoordinator returns the node that coordinates transactional id txnID.
func (c *KafkaCluster) TxnCoordinator(ctx context.Context, txnID string) (int32, error) {
	return c.coordinator(ctx, 1, txnID)
}

// TxnDescription is a transactional id's state as its coordinator describes
// it (DescribeTransactions).
type TxnDescription struct {
	ID string
	// State is Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit,
	// CompleteAbort, PrepareEpochFence or Dead.
	State         string
	ProducerID    int64
	ProducerEpoch int16
	Coordinator   int32
	TimeoutMillis int32
	// Started is when the ongoing transaction began (zero when none).
	Started time.Time
	// Partitions are the ongoing transaction's, by topic.
	Partitions map[string][]int32
}

// DescribeTransaction asks txnID's coordinator for its state.
func (c *KafkaCluster) DescribeTransaction(ctx context.Context, txnID string) (TxnDescription, error) {
	coord, err := c.TxnCoordinator(ctx, txnID)
	if err != nil {
		return TxnDescription{}, err
	}
	req := kmsg.NewPtrDescribeTransactionsRequest()
	req.TransactionalIDs = []string{txnID}
	resp, err := c.askNode(ctx, coord, req)
	if err != nil {
		return TxnDescription{}, err
	}
	r := resp.(*kmsg.DescribeTransactionsResponse)
	if len(r.TransactionStates) != 1 {
		return TxnDescription{}, fmt.Errorf("describing transactional id %q: node %d answered %d states", txnID, coord, len(r.TransactionStates))
	}
	s := r.TransactionStates[0]
	if err := kerr.ErrorForCode(s.ErrorCode); err != nil {
		return TxnDescription{}, fmt.Errorf("describing transactional id %q (coordinator node %d): %w", txnID, coord, err)
	}
	d := TxnDescription{
		ID: s.TransactionalID, State: s.State, ProducerID: s.ProducerID, ProducerEpoch: s.ProducerEpoch,
		Coordinator: coord, TimeoutMillis: s.TimeoutMillis, Partitions: map[string][]int32{},
	}
	if s.StartTimestamp > 0 {
		d.Started = time.UnixMilli(s.StartTimestamp)
	}
	for _, t := range s.Topics {
		d.Partitions[t.Topic] = append(d.Partitions[t.Topic], t.Partitions...)
	}
	return d, nil
}

// TxnListing is one transactional id ListTransactions found.
type TxnListing struct {
	ID          string
	ProducerID  int64
	State       string
	Coordinator int32
}

// ListTransactions lists the transactional ids every live node
// coordinates (those of a node that is down or paused are missing), by id.
func (c *KafkaCluster) ListTransactions(ctx context.Context) ([]TxnListing, error) {
	var out []TxnListing
	for _, n := range c.liveNodes() {
		resp, err := c.askNode(ctx, n, kmsg.NewPtrListTransactionsRequest())
		if err != nil {
			return nil, err
		}
		r := resp.(*kmsg.ListTransactionsResponse)
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return nil, fmt.Errorf("listing the transactions of node %d: %w", n, err)
		}
		for _, s := range r.TransactionStates {
			out = append(out, TxnListing{ID: s.TransactionalID, ProducerID: s.ProducerID, State: s.TransactionState, Coordinator: n})
		}
	}
	slices.SortFunc(out, func(a, b TxnListing) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Brokers returns the brokers the cluster has registered (DescribeCluster,
// fenced ones included) and whether each is fenced: a node the controller
// fenced (its heartbeats stopped for broker.session.timeout.ms) leads
// nothing and is in no ISR until it is unfenced again.
func (c *KafkaCluster) Brokers(ctx context.Context) (map[int32]bool, error) {
	return c.brokers(ctx, 0)
}

// Fenced lists the fenced brokers, sorted.
func (c *KafkaCluster) Fenced(ctx context.Context) ([]int32, error) {
	b, err := c.Brokers(ctx)
	if err != nil {
		return nil, err
	}
	var out []int32
	for n, fenced := range b {
		if fenced {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

// brokers is Brokers as node says (node 0: any live node).
func (c *KafkaCluster) brokers(ctx context.Context, node int32) (map[int32]bool, error) {
	req := kmsg.NewPtrDescribeClusterRequest()
	req.IncludeFencedBrokers = true
	var resp kmsg.Response
	var err error
	if node > 0 {
		resp, err = c.askNode(ctx, node, req)
	} else {
		resp, node, err = c.ask(ctx, req)
	}
	if err != nil {
		return nil, err
	}
	r := resp.(*kmsg.DescribeClusterResponse)
	if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
		return nil, fmt.Errorf("describing the cluster (node %d): %w", node, err)
	}
	out := map[int32]bool{}
	for _, b := range r.Brokers {
		out[b.NodeID] = b.IsFenced
	}
	return out, nil
}

// Healthy returns nil when the cluster is whole again after a fault: every
// node runs and is not paused, and every node's view agrees that every
// node is registered and unfenced and that every partition of every topic
// (__consumer_offsets and __transaction_state included) has a leader and
// all of its replicas in sync. Otherwise it says what is not.
func (c *KafkaCluster) Healthy(ctx context.Context) error {
	for _, n := range c.Nodes() {
		if !c.Running(n) {
			return fmt.Errorf("node %d is not running", n)
		}
		if c.Paused(n) {
			return fmt.Errorf("node %d is paused", n)
		}
	}
	for _, n := range c.Nodes() {
		b, err := c.brokers(ctx, n)
		if err != nil {
			return err
		}
		for _, m := range c.Nodes() {
			if fenced, ok := b[m]; !ok || fenced {
				return fmt.Errorf("node %d says broker %d is fenced or not registered (brokers: %v)", n, m, b)
			}
		}
		md, _, err := c.metadata(ctx, n)
		if err != nil {
			return err
		}
		for _, t := range md.Topics {
			if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
				name := "?"
				if t.Topic != nil {
					name = *t.Topic
				}
				return fmt.Errorf("node %d: metadata of topic %s: %w", n, name, err)
			}
		}
		for _, ps := range partitions(md) {
			for _, p := range ps {
				switch {
				case p.Leader < 0:
					return fmt.Errorf("node %d: %s-%d has no leader", n, p.Topic, p.Partition)
				case !slices.Equal(p.ISR, p.Replicas):
					return fmt.Errorf("node %d: %s-%d has ISR %v of replicas %v", n, p.Topic, p.Partition, p.ISR, p.Replicas)
				case p.Err != nil:
					return fmt.Errorf("node %d: %s-%d: %w", n, p.Topic, p.Partition, p.Err)
				}
			}
		}
	}
	return nil
}

// WaitHealthy waits until Healthy holds (what a test waits for after a
// fault, before the next), or returns its last error when ctx ends first.
func (c *KafkaCluster) WaitHealthy(ctx context.Context) error {
	every := 50 * time.Millisecond
	for {
		err := c.Healthy(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the cluster is not healthy: %w", err)
		case <-time.After(every):
		}
		every = min(every*3/2, 250*time.Millisecond)
	}
}

package stream

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/salesagg/salesagg/internal/config"
)

// topicsCluster is a one-broker kfake cluster and a config on it.
func topicsCluster(t *testing.T) (*kfake.Cluster, config.Config) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cfg := config.Default()
	cfg.BootstrapServers = c.ListenAddrs()
	cfg.TopicsCreate = true
	cfg.TopicsCreateInput = true
	return c, cfg
}

func TestMissingInputTopicIsNotCreated(t *testing.T) {
	// Scenario: input.topic names no topic (a typo of one the broker has). Without
	// topics.input.create, ensureTopics creates nothing and fails, not retriably, naming the
	// topic and the nearest existing one; with it, the input topic is created.
	_, cfg := topicsCluster(t)
	cfg.TopicsCreateInput = false
	ctx := context.Background()
	adm := topicsAdmin(t, cfg)
	if _, err := adm.CreateTopic(ctx, 3, 1, nil, "sales-events-v1"); err != nil {
		t.Fatal(err)
	}
	cfg.InputTopic = "sales-event-v1"
	_, err := ensureTopics(ctx, adm, cfg, zap.NewNop())
	if err == nil || !strings.Contains(err.Error(), "input topic sales-event-v1 does not exist") ||
		!strings.Contains(err.Error(), "did you mean sales-events-v1?") || !strings.Contains(err.Error(), "topics.input.create") {
		t.Fatalf("error %v, want one naming the missing input topic, the nearest one and topics.input.create", err)
	}
	if retriable(err) {
		t.Errorf("error %v is retriable: prepareTopics would wait forever", err)
	}
	listed, err := adm.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if listed.Has("sales-event-v1") || listed.Has(cfg.ChangelogTopic()) {
		t.Errorf("topics were created: %v", listed.Names())
	}
	cfg.TopicsCreateInput = true
	if _, err := ensureTopics(ctx, adm, cfg, zap.NewNop()); err != nil {
		t.Fatalf("with topics.input.create: %v", err)
	}
}

// topicsAdmin is an admin client with default kgo options, as the runtime's
// (closed before the cluster: cleanups run last in, first out).
func topicsAdmin(t *testing.T, cfg config.Config) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(cfg.BootstrapServers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

func TestEnsureTopicCreatedMeanwhile(t *testing.T) {
	// Scenario: an instance looks the input topic up and finds it missing (kgo caches that
	// answer for MetadataMinAge, 5 s), another instance creates it, and the first one's
	// CreateTopics says TOPIC_ALREADY_EXISTS: ensure describes it past the cache at once,
	// with the creator's id and partitions, instead of seeing it missing for 5 s.
	_, cfg := topicsCluster(t)
	ctx := context.Background()
	adm := topicsAdmin(t, cfg)
	md, err := adm.Metadata(ctx, cfg.InputTopic)
	if err != nil {
		t.Fatal(err)
	}
	if d := md.Topics[cfg.InputTopic]; !errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
		t.Fatalf("before creating: topic error %v, want UNKNOWN_TOPIC_OR_PARTITION", d.Err)
	}
	created, err := topicsAdmin(t, cfg).CreateTopic(ctx, 5, 1, nil, cfg.InputTopic)
	if err == nil {
		err = created.Err
	}
	if err != nil {
		t.Fatal(err)
	}

	core, logs := observer.New(zapcore.DebugLevel)
	start := time.Now()
	info, err := ensure(ctx, adm, cfg, zap.New(core), cfg.InputTopic, 3, nil)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if took > 2*time.Second {
		t.Errorf("ensure took %v on a topic created meanwhile, want well under a second", took)
	}
	if info.id != created.ID || info.partitions != 5 {
		t.Errorf("ensure = id %s, %d partitions; want the creator's id %s, 5 partitions",
			kadm.TopicID(info.id), info.partitions, created.ID)
	}
	if n := logs.FilterMessage("Created topic").Len(); n != 0 {
		t.Errorf("ensure logged Created topic %d times for a topic another client created", n)
	}
}

func TestEnsureTopicsRacing(t *testing.T) {
	// Scenario: three instances of a new application start together. Every CreateTopics is
	// held until all three have asked for the same topic, so each topic is created by one of
	// them and the other two find it missing first and are answered TOPIC_ALREADY_EXISTS:
	// all three learn the same topology in well under a second, not 5 s a topic.
	const racers = 3
	c, cfg := topicsCluster(t)
	cfg.DLQTopic = "sales-dlq"

	var mu sync.Mutex
	asked := make(map[string]int)
	all := make(map[string]chan struct{})
	c.ControlKey(int16(kmsg.CreateTopics), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.CreateTopicsRequest)
		if len(req.Topics) != 1 {
			return nil, nil, false
		}
		topic := req.Topics[0].Topic
		mu.Lock()
		asked[topic]++
		n := asked[topic]
		ch := all[topic]
		if ch == nil {
			ch = make(chan struct{})
			all[topic] = ch
		}
		if n == racers {
			close(ch)
		}
		mu.Unlock()
		if n < racers {
			c.SleepControl(func() {
				select {
				case <-ch:
				case <-time.After(5 * time.Second): // a racer failed before creating
				}
			})
		}
		return nil, nil, false // the cluster handles it: one creates, the others are told it exists
	})

	adms := make([]*kadm.Client, racers)
	for i := range adms {
		adms[i] = topicsAdmin(t, cfg)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	topos := make([]topology, racers)
	errs := make([]error, racers)
	took := make([]time.Duration, racers)
	var wg sync.WaitGroup
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			start := time.Now()
			topos[i], errs[i] = ensureTopics(ctx, adms[i], cfg, zap.New(core).With(zap.Int("racer", i)))
			took[i] = time.Since(start)
		}()
	}
	wg.Wait()

	for i := range racers {
		if errs[i] != nil {
			t.Fatalf("racer %d: %v", i, errs[i])
		}
		if took[i] > 2*time.Second {
			t.Errorf("racer %d: ensureTopics took %v, want well under a second", i, took[i])
		}
		if !reflect.DeepEqual(topos[i], topos[0]) {
			t.Errorf("racer %d: topology %+v, racer 0: %+v", i, topos[i], topos[0])
		}
	}
	topics := []string{cfg.InputTopic, cfg.ChangelogTopic(), cfg.RepartitionTopic(), cfg.NotificationTopic, cfg.DLQTopic}
	mu.Lock()
	for _, topic := range topics {
		// Not more: told TOPIC_ALREADY_EXISTS, a racer describes the topic, it does not
		// ask again.
		if asked[topic] != racers {
			t.Errorf("CreateTopics for %s: %d, want %d (one per racer)", topic, asked[topic], racers)
		}
	}
	mu.Unlock()
	if n := logs.FilterMessage("Created topic").Len(); n != len(topics) {
		t.Errorf("Created topic logged %d times, want %d (each topic once)", n, len(topics))
	}
	if topos[0].partitions != cfg.TopicsPartitions || topos[0].changelogID == [16]byte{} || topos[0].inputID == [16]byte{} {
		t.Errorf("topology %+v: want %d partitions and the topic ids", topos[0], cfg.TopicsPartitions)
	}
}

func TestCreatedTopicIsDescribedBeforeUse(t *testing.T) {
	// Scenario: the broker has just created the changelog, but its metadata does not describe
	// it for the next few asks (as a broker does a few milliseconds after a creation). ensure
	// returns only once the broker describes it with every partition led: a group client that
	// joined before would miss the topic, rejoin when it learns it, and restart its tasks.
	c, cfg := topicsCluster(t)
	topic := cfg.ChangelogTopic()
	var mu sync.Mutex
	created, hidden := false, 0
	c.ControlKey(int16(kmsg.CreateTopics), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		mu.Lock()
		created = true
		mu.Unlock()
		return nil, nil, false
	})
	c.ControlKey(int16(kmsg.Metadata), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.MetadataRequest)
		mu.Lock()
		defer mu.Unlock()
		if !created || hidden == 3 || len(req.Topics) != 1 || req.Topics[0].Topic == nil || *req.Topics[0].Topic != topic {
			return nil, nil, false
		}
		hidden++
		resp := req.ResponseKind().(*kmsg.MetadataResponse)
		resp.Version = req.Version
		st := kmsg.NewMetadataResponseTopic()
		st.Topic = kmsg.StringPtr(topic)
		st.ErrorCode = kerr.UnknownTopicOrPartition.Code
		resp.Topics = append(resp.Topics, st)
		return resp, nil, true
	})
	core, logs := observer.New(zapcore.DebugLevel)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	info, err := ensure(ctx, topicsAdmin(t, cfg), cfg, zap.New(core), topic, 3, nil)
	if err != nil {
		t.Fatalf("ensure: %v", err)
	}
	if info.partitions != 3 || info.id == [16]byte{} {
		t.Errorf("ensure returned %+v, want 3 partitions and the topic id", info)
	}
	mu.Lock()
	if hidden != 3 {
		t.Errorf("the broker hid the topic from %d asks after its creation, want 3: ensure did not wait for it", hidden)
	}
	mu.Unlock()
	if n := logs.FilterMessageSnippet("created here").FilterMessageSnippet("not described yet").Len(); n != 3 {
		t.Errorf("%d debug lines about waiting for the topic created here, want 3", n)
	}
}

func TestEnsureTopicAlreadyExistsBounded(t *testing.T) {
	// Scenario: CreateTopics says TOPIC_ALREADY_EXISTS but the broker never describes the
	// topic. ensure does not ask again and again (it used to recurse without limit or
	// pause): it retries the description a bounded number of times, logging at debug what
	// it waits for, then fails with a retriable error, so prepareTopics starts over.
	c, cfg := topicsCluster(t)
	var mu sync.Mutex
	creates := 0
	c.ControlKey(int16(kmsg.CreateTopics), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.CreateTopicsRequest)
		mu.Lock()
		creates++
		mu.Unlock()
		resp := req.ResponseKind().(*kmsg.CreateTopicsResponse)
		resp.Version = req.Version
		for _, rt := range req.Topics {
			st := kmsg.NewCreateTopicsResponseTopic()
			st.Topic = rt.Topic
			st.ErrorCode = kerr.TopicAlreadyExists.Code
			st.NumPartitions = -1
			st.ReplicationFactor = -1
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})

	core, logs := observer.New(zapcore.DebugLevel)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	start := time.Now()
	_, err := ensure(ctx, topicsAdmin(t, cfg), cfg, zap.New(core), cfg.InputTopic, 3, nil)
	took := time.Since(start)
	if err == nil {
		t.Fatal("ensure succeeded on a topic the broker never describes")
	}
	if !errors.Is(err, kerr.UnknownTopicOrPartition) || !strings.HasPrefix(err.Error(), "describing topic "+cfg.InputTopic+": ") {
		t.Errorf("error %q: want describing topic %s: ... UNKNOWN_TOPIC_OR_PARTITION", err, cfg.InputTopic)
	}
	if !retriable(err) {
		t.Errorf("error %v is not retriable: prepareTopics would give up", err)
	}
	if took > 5*time.Second {
		t.Errorf("ensure gave up after %v, want about %v", took, 1400*time.Millisecond)
	}
	mu.Lock()
	if creates != 1 {
		t.Errorf("CreateTopics sent %d times, want 1", creates)
	}
	mu.Unlock()
	waits := logs.FilterMessageSnippet("not described yet").FilterField(zap.String("topic", cfg.InputTopic))
	if waits.Len() != alreadyExistsAttempts-1 {
		t.Errorf("%d debug lines about waiting for %s, want %d", waits.Len(), cfg.InputTopic, alreadyExistsAttempts-1)
	}
	for _, e := range waits.All() {
		if e.Level != zapcore.DebugLevel {
			t.Errorf("waiting logged at %v, want debug", e.Level)
		}
	}
}

func TestInputTopicNotYetKnownToTheBrokerAskedIsAskedAgain(t *testing.T) {
	// Scenario: the input topic was created a moment ago: the cluster lists it, but the broker
	// asked for its partitions does not know it yet (its metadata lags, as a broker of a cluster
	// does right after a creation). ensureTopics asks again until it is found, rather than
	// failing the start with "does not exist ... did you mean <the same name>?".
	c, cfg := topicsCluster(t)
	cfg.TopicsCreateInput = false
	ctx := context.Background()
	adm := topicsAdmin(t, cfg)
	if _, err := adm.CreateTopic(ctx, 3, 1, nil, cfg.InputTopic); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	lagging := 3
	c.ControlKey(kmsg.Metadata.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		m := req.(*kmsg.MetadataRequest)
		mu.Lock()
		defer mu.Unlock()
		for i, rt := range m.Topics {
			if rt.Topic != nil && *rt.Topic == cfg.InputTopic && lagging > 0 {
				// This broker does not know the topic yet.
				lagging--
				name := cfg.InputTopic + "-not-yet"
				m.Topics[i].Topic = &name
			}
		}
		return nil, nil, false
	})
	topo, err := ensureTopics(ctx, adm, cfg, zap.NewNop())
	if err != nil {
		t.Fatalf("ensureTopics: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if lagging == 3 {
		t.Fatal("the topic was never hidden: the test tested nothing")
	}
	if topo.partitions != 3 {
		t.Fatalf("found %d partitions, want 3", topo.partitions)
	}
}

func TestStreamsRepartitionTopicIsKafkaStreams(t *testing.T) {
	// Scenario: under group.protocol streams the repartition topic is Kafka Streams'
	// <app>-EMPTY_KEY_BY_PRODUCT-repartition, created with its configs (records kept until
	// purged, never by time); under classic salesagg's own, with the broker's defaults.
	_, cfg := topicsCluster(t)
	cfg.GroupProtocol = config.GroupProtocolStreams
	ctx := context.Background()
	adm := topicsAdmin(t, cfg)
	topo, err := ensureTopics(ctx, adm, cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	if topo.repartitionID == ([16]byte{}) {
		t.Error("the repartition topic's id is not kept")
	}
	rcs, err := adm.DescribeTopicConfigs(ctx, cfg.ApplicationID+"-EMPTY_KEY_BY_PRODUCT-repartition")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := rcs.On(cfg.ApplicationID+"-EMPTY_KEY_BY_PRODUCT-repartition", nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, c := range rc.Configs {
		got[c.Key] = c.MaybeValue()
	}
	for k, v := range map[string]string{"cleanup.policy": "delete", "retention.ms": "-1", "segment.bytes": "52428800"} {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
}

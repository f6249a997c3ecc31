package stream_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/salesagg/salesagg/internal/config"
)

func TestSASLSCRAM(t *testing.T) {
	// Scenario: the broker requires SCRAM-SHA-256; with the right user and password the service
	// processes events, and the password appears nowhere in its logs.
	const password = "s3cret-Pa55word"
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "sales", password))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	h := harnessOn(t, c, c.ListenAddrs()[0])
	h.cfg.Security = config.Security{Protocol: config.ProtocolSASLPlaintext, SASLMechanism: "SCRAM-SHA-256", SASLUsername: "sales", SASLPassword: password}

	auth := kgo.SASL(scram.Auth{User: "sales", Pass: password}.AsSha256Mechanism())
	cl := h.client(auth)
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 3, 1, nil, h.cfg.InputTopic); err != nil {
		t.Fatal(err)
	}
	in := h.start(h.cfg)
	in.waitReady()
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: h.cfg.InputTopic, Key: []byte("p"), Value: []byte(`{"product":"p","value":42}`)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	in.waitTotals(map[string]int64{"p": 42})
	for _, e := range in.logs.All() {
		if line := e.Message + fmt.Sprint(e.ContextMap()); strings.Contains(line, password) {
			t.Fatalf("password in a log line: %s", line)
		}
	}
	if in.logs.Len() == 0 {
		t.Fatal("no log lines captured")
	}
}

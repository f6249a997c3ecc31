package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/bench/kit"
)

func productKey(i int) string { return "product-" + strconv.Itoa(i) }

func eventValue(product string) []byte {
	return []byte(`{"product":"` + product + `","value":1}`)
}

// preload produces products events, one per product product-0 …
// product-<n-1>, with franz-go's default partitioner (murmur2 on the key, as
// the Java client), and returns the input's end offsets.
func preload(ctx context.Context, addr, topic string, n int, adm *kadm.Client) (map[int32]int64, time.Duration, error) {
	cl, err := kit.NewBulkProducer(addr, topic)
	if err != nil {
		return nil, 0, err
	}
	defer cl.Close()
	t0 := time.Now()
	err = kit.ProduceAll(ctx, cl, n, func(i int) *kgo.Record {
		p := productKey(i)
		return &kgo.Record{Key: []byte(p), Value: eventValue(p)}
	}, logf, "the preload to "+topic, 5*time.Minute)
	if err != nil {
		return nil, 0, err
	}
	took := time.Since(t0)
	ends, err := kit.EndOffsets(ctx, adm, topic)
	if err != nil {
		return nil, 0, err
	}
	var sum int64
	for _, o := range ends {
		sum += o
	}
	if len(ends) != partitions || sum != int64(n) {
		return nil, 0, fmt.Errorf("input topic %s holds %d records in %d partitions after the preload, want %d in %d", topic, sum, len(ends), n, partitions)
	}
	return ends, took, nil
}

// startPacer produces events at rate from a goroutine: keys product-<i>
// with i uniform over the preloaded products, value 1.
func startPacer(addr, topic string, rate, products int, seed uint64) (*kit.Pacer, error) {
	cl, err := kit.NewBulkProducer(addr, topic)
	if err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x70616365))
	return kit.StartPacer(cl, rate, func() *kgo.Record {
		k := productKey(rng.IntN(products))
		return &kgo.Record{Key: []byte(k), Value: eventValue(k)}
	}), nil
}

package changelog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/salesagg/salesagg/internal/state"
)

// Report is the outcome of verifying one task's store against its
// changelog partition, as of the store's checkpoint.
type Report struct {
	Task string
	// Checkpoint is the store's checkpoint (-1: none).
	Checkpoint int64
	// Start and End are the partition's log start and last stable offset.
	Start, End int64
	// Products is how many products the store holds.
	Products int
	// Pending is how many changelog records lie past the checkpoint (the
	// next start restores them).
	Pending int
	// Unverified are the products whose records up to the checkpoint were
	// compacted away (only newer ones are left).
	Unverified []string
	// Diffs are the differences found.
	Diffs []string
	// Problems say why the comparison could not be made.
	Problems []string
}

// OK reports whether the store matches its changelog.
func (r Report) OK() bool { return len(r.Problems) == 0 && len(r.Diffs) == 0 }

// Verifier compares stores with their changelog partitions.
type Verifier struct {
	// Client are the options of the clients (brokers, security).
	Client []kgo.Opt
	// Topic is the changelog topic.
	Topic string

	adm     *kadm.Client
	topicID [16]byte
	starts  kadm.ListedOffsets
	ends    kadm.ListedOffsets
}

// Prepare reads the changelog's topic id and every partition's bounds. It
// must be called once before Verify; adm is used for it and kept.
func (v *Verifier) Prepare(ctx context.Context, adm *kadm.Client) error {
	details, err := adm.ListTopics(ctx, v.Topic)
	if err != nil {
		return fmt.Errorf("describing changelog %s: %w", v.Topic, err)
	}
	td, ok := details[v.Topic]
	if !ok || td.Err != nil {
		if td.Err == nil {
			td.Err = errors.New("no such topic")
		}
		return fmt.Errorf("changelog %s: %w", v.Topic, td.Err)
	}
	v.adm, v.topicID = adm, [16]byte(td.ID)
	if v.starts, err = adm.ListStartOffsets(ctx, v.Topic); err != nil {
		return fmt.Errorf("listing start offsets of %s: %w", v.Topic, err)
	}
	// The last stable offset: the end of what read_committed returns.
	if v.ends, err = adm.ListCommittedOffsets(ctx, v.Topic); err != nil {
		return fmt.Errorf("listing end offsets of %s: %w", v.Topic, err)
	}
	return nil
}

// Verify compares the store of task p in dir with its changelog partition,
// key by key, as of the store's checkpoint.
func (v *Verifier) Verify(ctx context.Context, dir *state.Dir, p int32) Report {
	rep := Report{Task: state.TaskName(p), Checkpoint: -1}
	if o, ok := v.starts.Lookup(v.Topic, p); ok {
		rep.Start = o.Offset
	}
	end, ok := v.ends.Lookup(v.Topic, p)
	if !ok || end.Err != nil {
		rep.Problems = append(rep.Problems, fmt.Sprintf("changelog %s has no partition %d", v.Topic, p))
		return rep
	}
	rep.End = end.Offset
	totals, cp, found, err := state.Totals(dir.TaskPath(p))
	if err != nil {
		rep.Problems = append(rep.Problems, err.Error())
		return rep
	}
	rep.Products = len(totals)
	if found {
		rep.Checkpoint = cp.ChangelogOffset
		if cp.ChangelogTopicID != v.topicID {
			rep.Diffs = append(rep.Diffs, fmt.Sprintf("checkpoint: it is of changelog topic id %x, the changelog now is %x (recreated since): the next start wipes the store",
				cp.ChangelogTopicID, v.topicID))
			return rep
		}
		if rep.Checkpoint > rep.End {
			rep.Diffs = append(rep.Diffs, fmt.Sprintf("checkpoint %d is beyond the changelog's end %d", rep.Checkpoint, rep.End))
			return rep
		}
	}
	log, err := v.read(ctx, p, rep.Start, rep.End, max(rep.Checkpoint, 0))
	if err != nil {
		rep.Problems = append(rep.Problems, err.Error())
		return rep
	}
	rep.Pending = log.pending
	rep.Diffs, rep.Unverified = compare(totals, log)
	return rep
}

// value is a product's latest record in a changelog partition up to some
// offset.
type value struct {
	total     int64
	offset    int64
	tombstone bool
	bad       string // an undecodable value
}

// content is what one changelog partition says, split at a store's
// checkpoint.
type content struct {
	// atCheckpoint is each product's latest committed record below the
	// checkpoint.
	atCheckpoint map[string]value
	// later holds the products with a record at or past the checkpoint.
	later   map[string]bool
	pending int
}

func (v *Verifier) read(ctx context.Context, p int32, start, end, checkpoint int64) (content, error) {
	c := content{atCheckpoint: map[string]value{}, later: map[string]bool{}}
	err := Scan(ctx, v.Client, v.Topic, p, start, end, func(r *kgo.Record) {
		key := string(r.Key)
		if r.Offset >= checkpoint {
			c.pending++
			c.later[key] = true
			return
		}
		val := value{offset: r.Offset}
		if u, err := Update(r); err != nil {
			val.bad = err.Error()
		} else {
			val.total, val.tombstone = u.Entry.Total, u.Delete
		}
		c.atCheckpoint[key] = val
	})
	return c, err
}

// compare compares a store's totals with the changelog as of the store's
// checkpoint. It returns the differences, and the products that cannot be
// verified: in the store, with no record below the checkpoint but one past
// it (compaction removed the older ones).
func compare(store map[string]int64, log content) (diffs, unverified []string) {
	keys := map[string]bool{}
	for k := range store {
		keys[k] = true
	}
	for k, v := range log.atCheckpoint {
		if !v.tombstone {
			keys[k] = true
		}
	}
	names := make([]string, 0, len(keys))
	for k := range keys {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		s, inStore := store[k]
		v, inLog := log.atCheckpoint[k]
		switch {
		case inLog && v.bad != "":
			diffs = append(diffs, fmt.Sprintf("%q: the changelog record at offset %d is unreadable: %s", k, v.offset, v.bad))
		case inStore && (!inLog || v.tombstone):
			if !inLog && log.later[k] {
				unverified = append(unverified, strconv.Quote(k))
				continue
			}
			what := "no record"
			if inLog {
				what = fmt.Sprintf("a tombstone at offset %d", v.offset)
			}
			diffs = append(diffs, fmt.Sprintf("%q: store %d, changelog %s below the checkpoint", k, s, what))
		case !inStore:
			diffs = append(diffs, fmt.Sprintf("%q: not in the store, changelog %d at offset %d", k, v.total, v.offset))
		case s != v.total:
			diffs = append(diffs, fmt.Sprintf("%q: store %d, changelog %d at offset %d", k, s, v.total, v.offset))
		}
	}
	return diffs, unverified
}

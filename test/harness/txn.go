package harness

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// PendingTxn is a transaction that committed a group offset and has not
// ended: what a previous owner cut off between its offset commit and its
// EndTxn leaves behind.
type PendingTxn struct {
	cl    *kgo.Client
	ID    string // the transactional id
	PID   int64
	Epoch int16
}

// OpenTxnOffsetCommit opens a transaction of transactional id txnID (with
// its own transaction timeout) on cl that commits offset for topic's
// partition in group (InitProducerID, AddOffsetsToTxn, TxnOffsetCommit
// with generation -1), and leaves it open. topicID names the topic for
// the request versions that name topics by id.
func OpenTxnOffsetCommit(ctx context.Context, cl *kgo.Client, txnID string, timeout time.Duration, group, topic string, topicID [16]byte, partition int32, offset int64) (*PendingTxn, error) {
	txn := &PendingTxn{cl: cl, ID: txnID}
	init := kmsg.NewPtrInitProducerIDRequest()
	init.TransactionalID = &txn.ID
	init.TransactionTimeoutMillis = int32(timeout.Milliseconds())
	initResp, err := init.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(initResp.ErrorCode)
	}
	if err != nil {
		return nil, fmt.Errorf("InitProducerID: %w", err)
	}
	txn.PID, txn.Epoch = initResp.ProducerID, initResp.ProducerEpoch

	add := kmsg.NewPtrAddOffsetsToTxnRequest()
	add.TransactionalID, add.ProducerID, add.ProducerEpoch, add.Group = txn.ID, txn.PID, txn.Epoch, group
	addResp, err := add.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(addResp.ErrorCode)
	}
	if err != nil {
		return nil, fmt.Errorf("AddOffsetsToTxn: %w", err)
	}

	commit := kmsg.NewPtrTxnOffsetCommitRequest()
	commit.TransactionalID, commit.Group, commit.ProducerID, commit.ProducerEpoch = txn.ID, group, txn.PID, txn.Epoch
	commit.Generation = -1
	rt := kmsg.NewTxnOffsetCommitRequestTopic()
	rt.Topic, rt.TopicID = topic, topicID
	rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
	rp.Partition, rp.Offset = partition, offset
	rt.Partitions = append(rt.Partitions, rp)
	commit.Topics = append(commit.Topics, rt)
	commitResp, err := commit.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("TxnOffsetCommit: %w", err)
	}
	for _, rt := range commitResp.Topics {
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				return nil, fmt.Errorf("TxnOffsetCommit of %s-%d: %w", topic, rp.Partition, err)
			}
		}
	}
	return txn, nil
}

// End ends the transaction: commit or abort.
func (txn *PendingTxn) End(ctx context.Context, commit bool) error {
	end := kmsg.NewPtrEndTxnRequest()
	end.TransactionalID, end.ProducerID, end.ProducerEpoch, end.Commit = txn.ID, txn.PID, txn.Epoch, commit
	resp, err := end.RequestWith(ctx, txn.cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		return fmt.Errorf("EndTxn of %s: %w", txn.ID, err)
	}
	return nil
}

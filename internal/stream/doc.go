// Package stream is salesagg's runtime: it joins the consumer group, runs one
// task per assigned input partition, restores each task's store from its
// changelog partition, folds events into it, and commits.
//
// # Tasks
//
// Task 0_p owns partition p of the input topic, of the repartition topic and
// of the changelog topic, and the Pebble store in <state.dir>/<app>/0_p. A
// task goes through the states created → restoring → running → stopping →
// closed; it processes records and answers queries only while running
// (restores of other tasks never hold it back).
//
// # Ownership of a product
//
// A product belongs to the task of partition murmur2(product) mod N, as the
// Java client partitions keys, so salesagg and Kafka Streams agree. An event
// that arrives on another partition (a producer with another partitioner, or
// an empty key whose product decides) is forwarded to the owner through the
// repartition topic; a product therefore has exactly one total.
//
// # Commit cycle (at-least-once)
//
// Every commit.interval.ms a running task: produces the changed totals to its
// changelog partition (each with a header holding the input offsets it
// reflects, per input partition) and the notifications; waits until those and
// every forwarded event are acknowledged; writes the totals and the checkpoint
// in one Pebble batch; and only then hands the input offsets to the
// committer, which commits them for all tasks. A crash between any two steps
// loses nothing and counts nothing twice: the restart restores the changelog
// tail past the checkpoint (with the offsets of each product), and a
// redelivered event whose offset a product already reflects is skipped.
package stream

// Package torture is salesagg's fault torture (build tag torture, make
// test-torture): a three-broker Apache Kafka cluster, four instances with
// one standby each, events flowing at a steady rate, and faults drawn from
// a seed aimed at what matters (the leader of a changelog partition, a
// task's transaction coordinator, the group coordinator during a
// rebalance, a broker paused past its session, rolling restarts, network
// partitions of one instance from one broker or all, a paused instance
// that comes back as a zombie). When the faults stop and the group
// settles, a checker that trusts nothing the service says about itself
// compares what it serves and wrote with the truth computed from the input
// topic, and the run ends with a table per fault kind.
package torture

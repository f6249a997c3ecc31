package salesagg.reference;

import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.CloseOptions;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.TopologyConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Branched;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.KTable;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Named;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.kstream.Repartitioned;
import org.apache.kafka.streams.kstream.Suppressed;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.processor.api.FixedKeyProcessor;
import org.apache.kafka.streams.processor.api.FixedKeyProcessorContext;
import org.apache.kafka.streams.processor.api.FixedKeyRecord;
import org.apache.kafka.streams.processor.StandbyUpdateListener;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.processor.TaskId;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.WindowStore;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The Kafka Streams application that salesagg replaces: sums sales per product into the store
 * {@code PRODUCT_AGGREGATED_SALES} and notifies every update whose total reaches the threshold.
 *
 * <p>Harness markers, one per line on stdout (everything else goes to stderr through SLF4J):
 * <pre>
 * REFERENCE CONFIG key=value ...
 * REFERENCE STARTED
 * REFERENCE STATE &lt;KafkaStreams.State&gt;            (REBALANCING, RUNNING, PENDING_SHUTDOWN, NOT_RUNNING, ...)
 * REFERENCE RESTORE START store=&lt;s&gt; partition=&lt;p&gt; from=&lt;offset&gt; to=&lt;offset&gt;
 * REFERENCE RESTORE END store=&lt;s&gt; partition=&lt;p&gt; records=&lt;n&gt;
 * REFERENCE RESTORE SUSPENDED store=&lt;s&gt; partition=&lt;p&gt; records=&lt;n&gt;
 * REFERENCE RESTORE TOTAL records=&lt;n&gt; ms=&lt;ms&gt;    (just before STATE RUNNING; see RestoreReporter)
 * REFERENCE STANDBY CATCHUP store=&lt;s&gt; partition=&lt;p&gt; from=&lt;offset&gt; behind=&lt;n&gt;   (see StandbyReporter)
 * REFERENCE STANDBY SUSPENDED store=&lt;s&gt; partition=&lt;p&gt; applied=&lt;n&gt; reason=&lt;r&gt;
 * REFERENCE ERROR &lt;exception&gt;
 * REFERENCE STOPPED clean=&lt;true|false&gt; skipped=&lt;n&gt;
 * </pre>
 */
public final class SalesAggregator {
    /** The state store; its changelog topic is {@code <application.id>-PRODUCT_AGGREGATED_SALES-changelog}. */
    public static final String STORE_NAME = "PRODUCT_AGGREGATED_SALES";
    /** Only events with an empty or null key go through {@code <application.id>-EMPTY_KEY_BY_PRODUCT-repartition}. */
    public static final String EMPTY_KEY_REPARTITION = "EMPTY_KEY_BY_PRODUCT";

    private static final Logger log = LoggerFactory.getLogger(SalesAggregator.class);
    private static final AtomicLong skipped = new AtomicLong();

    private SalesAggregator() {}

    /** Prints one marker line on stdout and flushes it, so a harness reading a pipe sees it at once. */
    static void marker(String line) {
        synchronized (System.out) {
            System.out.println("REFERENCE " + line);
            System.out.flush();
        }
    }

    /** The Kafka version on the classpath, from kafka-clients' own version resource. */
    static String kafkaVersion() {
        try (InputStream in = KafkaStreams.class.getResourceAsStream("/kafka/kafka-version.properties")) {
            Properties p = new Properties();
            if (in != null) {
                p.load(in);
            }
            return p.getProperty("version", "unknown");
        } catch (IOException e) {
            return "unknown";
        }
    }

    private static void skip(String why, String key, String value) {
        long n = skipped.incrementAndGet();
        if (n <= 10 || n % 1000 == 0) {
            log.warn("skipping malformed event #{} ({}): key={} value={}", n, why, key, abbreviate(value));
        }
    }

    private static String abbreviate(String s) {
        return s == null || s.length() <= 200 ? s : s.substring(0, 200) + "...";
    }

    private static boolean isEmpty(String s) {
        return s == null || s.isEmpty();
    }

    /**
     * input (String, JSON) → parse, drop malformed → events keyed by the record key, or, when the
     * key is empty or null, by {@code product} (these alone go through a repartition topic so
     * they land on the partition that owns that product) → groupByKey → sum as Long into
     * PRODUCT_AGGREGATED_SALES → updates with total ≥ threshold → {"sku":..,"value":..}.
     */
    static Topology buildTopology(String inputTopic, String notificationTopic, long threshold, Properties props) {
        return buildTopology(inputTopic, notificationTopic, threshold, props, Map.of(), 0, false);
    }

    /**
     * The topology with, for each window size (name → ms), the same sums per tumbling window by
     * record timestamp, {@code windowedBy(TimeWindows.ofSizeAndGrace(size, grace)).aggregate(...)}
     * into the window store {@code PRODUCT_AGGREGATED_SALES-<name>}: the store salesagg keeps
     * beside the totals with windows.sizes, with the same changelog. With finals, each window's
     * total at or above the threshold is notified once it closes ({@code
     * suppress(untilWindowCloses)}), as salesagg's windows.notify final writes it (header
     * salesagg.window: the size).
     */
    static Topology buildTopology(String inputTopic, String notificationTopic, long threshold, Properties props,
            Map<String, Long> windows, long graceMs, boolean finals) {
        // Built with the application's own config, as KafkaStreams will run it.
        StreamsBuilder builder = new StreamsBuilder(new TopologyConfig(new StreamsConfig(props)));

        KStream<String, SalesEvent> events = builder
                .stream(inputTopic, Consumed.with(Serdes.String(), Serdes.String()).withName("sales-events"))
                .mapValues((key, value) -> {
                    SalesEvent e = SalesEvent.parse(value);
                    if (e == null) {
                        skip("not a JSON object with an integer value", key, value);
                    } else if (isEmpty(key) && isEmpty(e.product)) {
                        skip("empty key and no product", key, value);
                        return null;
                    }
                    return e;
                }, Named.as("parse"))
                .filter((key, e) -> e != null, Named.as("drop-malformed"));

        Map<String, KStream<String, SalesEvent>> byKey = events
                .split(Named.as("key-"))
                .branch((key, e) -> !isEmpty(key), Branched.as("present"))
                .defaultBranch(Branched.as("empty"));

        // Non-empty key: the group key is the record key, unchanged, so no repartition.
        KStream<String, Long> keyed = byKey.get("key-present")
                .mapValues(e -> e.value, Named.as("keyed-value"));

        // Empty key: re-key by product and repartition, so the sum lives in the task that owns
        // the product's partition (the one a keyed record for it would reach).
        KStream<String, Long> rekeyed = byKey.get("key-empty")
                .map((key, e) -> KeyValue.pair(e.product, e.value), Named.as("key-by-product"))
                .repartition(Repartitioned.<String, Long>as(EMPTY_KEY_REPARTITION)
                        .withKeySerde(Serdes.String())
                        .withValueSerde(Serdes.Long()));

        KStream<String, Long> merged = keyed.merge(rekeyed, Named.as("merge"));
        for (Map.Entry<String, Long> w : windows.entrySet()) {
            String size = w.getKey();
            KTable<Windowed<String>, Long> sums = merged
                    .groupByKey(Grouped.<String, Long>as("by-product-" + size).withKeySerde(Serdes.String()).withValueSerde(Serdes.Long()))
                    .windowedBy(TimeWindows.ofSizeAndGrace(Duration.ofMillis(w.getValue()), Duration.ofMillis(graceMs)))
                    .aggregate(
                            () -> 0L,
                            (product, value, total) -> total + value,
                            Named.as("sum-" + size),
                            Materialized.<String, Long, WindowStore<Bytes, byte[]>>as(STORE_NAME + "-" + size)
                                    .withKeySerde(Serdes.String())
                                    .withValueSerde(Serdes.Long()));
            if (!finals) {
                continue;
            }
            byte[] header = size.getBytes(StandardCharsets.UTF_8);
            sums.suppress(Suppressed.untilWindowCloses(Suppressed.BufferConfig.unbounded()).withName("final-" + size))
                    .toStream(Named.as("finals-" + size))
                    .filter((window, total) -> total != null && total >= threshold, Named.as("final-at-threshold-" + size))
                    .map((window, total) -> KeyValue.pair(window.key(),
                            SalesEvent.windowFinal(window.key(), total, size, window.window().start(), window.window().end())),
                            Named.as("final-notification-" + size))
                    .processValues(() -> new FixedKeyProcessor<String, String, String>() {
                        private FixedKeyProcessorContext<String, String> context;

                        @Override
                        public void init(FixedKeyProcessorContext<String, String> context) {
                            this.context = context;
                        }

                        @Override
                        public void process(FixedKeyRecord<String, String> record) {
                            record.headers().add("salesagg.window", header);
                            context.forward(record);
                        }
                    }, Named.as("final-header-" + size))
                    .to(notificationTopic, Produced.with(Serdes.String(), Serdes.String()).withName("final-notifications-" + size));
        }
        merged
                .groupByKey(Grouped.with(Serdes.String(), Serdes.Long()))
                .aggregate(
                        () -> 0L,
                        (product, value, total) -> {
                            try {
                                return Math.addExact(total, value);
                            } catch (ArithmeticException overflow) {
                                // Rejected like a bad event; the aggregate API must still return
                                // a value, so the unchanged total is emitted again.
                                skip("sum would overflow int64, total=" + total, product, String.valueOf(value));
                                return total;
                            }
                        },
                        Named.as("sum"),
                        Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as(STORE_NAME)
                                .withKeySerde(Serdes.String())
                                .withValueSerde(Serdes.Long()))
                .toStream(Named.as("updates"))
                .filter((product, total) -> total != null && total >= threshold, Named.as("at-threshold"))
                .mapValues((product, total) -> SalesEvent.notification(product, total), Named.as("notification"))
                .to(notificationTopic, Produced.with(Serdes.String(), Serdes.String()).withName("notifications"));

        return builder.build();
    }

    static Properties streamsProperties(Config cfg) {
        Properties p = new Properties();
        p.put(StreamsConfig.APPLICATION_ID_CONFIG, cfg.get("APPLICATION_ID"));
        p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, cfg.get("BOOTSTRAP_SERVERS"));
        p.put(StreamsConfig.STATE_DIR_CONFIG, cfg.get("STATE_DIR"));
        p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, cfg.get("PROCESSING_GUARANTEE"));
        p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, cfg.numStreamThreads);
        p.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, 1);
        // No global stores here; set only to silence Kafka Streams 4.x's start-up warning about it.
        p.put("processing.exception.handler.global.enabled", true);
        if (cfg.get("COMMIT_INTERVAL_MS") != null) {
            p.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, Long.parseLong(cfg.get("COMMIT_INTERVAL_MS").trim()));
        }
        if (cfg.get("CACHE_MAX_BYTES") != null) {
            p.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, Long.parseLong(cfg.get("CACHE_MAX_BYTES").trim()));
        }
        if (cfg.get("NUM_STANDBY_REPLICAS") != null) {
            p.put(StreamsConfig.NUM_STANDBY_REPLICAS_CONFIG, Integer.parseInt(cfg.get("NUM_STANDBY_REPLICAS").trim()));
        }
        if (cfg.get("INSTANCE_ID") != null) {
            // Static membership: Kafka Streams gives each thread's consumer <id>-<thread index>.
            p.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, cfg.get("INSTANCE_ID"));
        }
        if (cfg.get("HTTP_ADDR") != null) {
            p.put(StreamsConfig.APPLICATION_SERVER_CONFIG, cfg.get("HTTP_ADDR"));
        }
        if (cfg.get("ROCKSDB").equals("tuned")) {
            p.put(StreamsConfig.ROCKSDB_CONFIG_SETTER_CLASS_CONFIG, RocksDBTuning.class);
        }
        if (cfg.get("TRANSACTIONAL_STATE_STORES") != null) {
            p.put(StreamsConfig.TRANSACTIONAL_STATE_STORES_CONFIG, Boolean.parseBoolean(cfg.get("TRANSACTIONAL_STATE_STORES")));
        }
        p.putAll(cfg.extraProps);
        return p;
    }

    public static void main(String[] args) throws InterruptedException {
        Config cfg;
        try {
            cfg = Config.load(System.getenv(), args);
        } catch (IllegalArgumentException e) {
            System.err.println("kstreams-reference: " + e.getMessage());
            System.err.println(Config.USAGE);
            System.exit(2);
            return;
        }
        if (cfg.help) {
            System.out.println(Config.USAGE);
            return;
        }

        Properties props = streamsProperties(cfg);
        Topology topology = buildTopology(cfg.get("INPUT_TOPIC"), cfg.get("NOTIFICATION_TOPIC"), cfg.threshold, props,
                cfg.windows, cfg.windowGraceMs, cfg.windowFinals);
        if (cfg.describeOnly) {
            System.out.println(topology.describe());
            return;
        }
        System.err.println(topology.describe());

        KafkaStreams streams = new KafkaStreams(topology, props);

        CountDownLatch stopped = new CountDownLatch(1);
        AtomicBoolean failed = new AtomicBoolean();
        RestoreReporter restores = new RestoreReporter();
        streams.setStateListener((newState, oldState) -> {
            if (newState == KafkaStreams.State.RUNNING) {
                restores.running();
            }
            marker("STATE " + newState);
            if (newState == KafkaStreams.State.ERROR) {
                failed.set(true);
            }
            if (newState == KafkaStreams.State.NOT_RUNNING || newState == KafkaStreams.State.ERROR) {
                stopped.countDown();
            }
        });
        streams.setGlobalStateRestoreListener(restores);
        streams.setStandbyUpdateListener(new StandbyReporter());
        streams.setUncaughtExceptionHandler(e -> {
            marker("ERROR " + String.valueOf(e).replace('\n', ' '));
            log.error("stream thread failed; shutting down the client", e);
            return StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });

        QueryServer queries = null;
        if (cfg.get("HTTP_ADDR") != null) {
            String name = cfg.get("INSTANCE_ID") != null ? cfg.get("INSTANCE_ID") : cfg.get("HTTP_ADDR");
            try {
                queries = new QueryServer(streams, STORE_NAME, cfg.get("INPUT_TOPIC"), name, cfg.get("HTTP_ADDR"));
            } catch (IOException e) {
                System.err.println("kstreams-reference: HTTP server on " + cfg.get("HTTP_ADDR") + ": " + e);
                System.exit(2);
                return;
            }
        }
        final QueryServer qs = queries;

        AtomicBoolean shuttingDown = new AtomicBoolean();
        Thread hook = new Thread(() -> {
            shuttingDown.set(true);
            if (qs != null) {
                qs.stop();
            }
            boolean clean = close(streams, cfg.leaveGroupOnClose);
            marker("STOPPED clean=" + clean + " skipped=" + skipped.get());
        }, "kstreams-reference-shutdown");
        Runtime.getRuntime().addShutdownHook(hook);

        marker("CONFIG kafka.streams.version=" + kafkaVersion()
                + " application.id=" + cfg.get("APPLICATION_ID")
                + " bootstrap.servers=" + cfg.get("BOOTSTRAP_SERVERS")
                + " state.dir=" + cfg.get("STATE_DIR")
                + " processing.guarantee=" + cfg.get("PROCESSING_GUARANTEE")
                + " input.topic=" + cfg.get("INPUT_TOPIC")
                + " notification.topic=" + cfg.get("NOTIFICATION_TOPIC")
                + " notification.threshold=" + cfg.threshold
                + " num.stream.threads=" + cfg.numStreamThreads
                + " commit.interval.ms=" + (cfg.get("COMMIT_INTERVAL_MS") == null ? "default" : cfg.get("COMMIT_INTERVAL_MS"))
                + " leave.group.on.close=" + cfg.leaveGroupOnClose
                + " num.standby.replicas=" + (cfg.get("NUM_STANDBY_REPLICAS") == null ? "default" : cfg.get("NUM_STANDBY_REPLICAS"))
                + " group.instance.id=" + (cfg.get("INSTANCE_ID") == null ? "none" : cfg.get("INSTANCE_ID"))
                + " application.server=" + (cfg.get("HTTP_ADDR") == null ? "none" : cfg.get("HTTP_ADDR"))
                + " rocksdb=" + cfg.get("ROCKSDB")
                + " transactional.state.stores=" + (cfg.get("TRANSACTIONAL_STATE_STORES") == null ? "default" : cfg.get("TRANSACTIONAL_STATE_STORES"))
                + " extra=" + cfg.extraProps
                + " cache.max.bytes=" + (cfg.get("CACHE_MAX_BYTES") == null ? "default" : cfg.get("CACHE_MAX_BYTES")));
        marker("STARTED");
        streams.start();
        if (qs != null) {
            qs.start();
        }

        stopped.await();
        if (shuttingDown.get()) {
            return; // SIGTERM: the shutdown hook closes and reports
        }
        // Stopped on its own (a fatal error): close, report and exit non-zero.
        Runtime.getRuntime().removeShutdownHook(hook);
        boolean clean = close(streams, cfg.leaveGroupOnClose);
        marker("STOPPED clean=" + clean + " skipped=" + skipped.get());
        System.exit(failed.get() ? 1 : 0);
    }

    /**
     * Closes within 30 s. By default exactly {@code streams.close(Duration.ofSeconds(30))}: the
     * member stays in the consumer group until session.timeout.ms (45 s) expires, so a restart
     * within that time waits for it before getting its tasks. With leaveGroup it sends a
     * LeaveGroup first, so a restart is assigned at once.
     */
    static boolean close(KafkaStreams streams, boolean leaveGroup) {
        if (!leaveGroup) {
            return streams.close(Duration.ofSeconds(30));
        }
        return streams.close(CloseOptions.groupMembershipOperation(CloseOptions.GroupMembershipOperation.LEAVE_GROUP)
                .withTimeout(Duration.ofSeconds(30)));
    }

    /**
     * Prints one line per restored changelog partition and, when the client reaches RUNNING, the
     * total of the restoration that preceded it: records restored, and ms from the first
     * partition's start to the last one's end. Kafka Streams reaches RUNNING only once every
     * active task has restored, and calls the listener even for an empty changelog (from=0 to=0),
     * in as many rounds as the state updater picks up tasks, so per-partition "all done" is not a
     * reliable end; RUNNING is. The first RUNNING always prints a total (0 when nothing was
     * restored); a later RUNNING (after a rebalance) prints one only if something was restored.
     * Called from the state-updater thread(s) and the state listener, hence synchronized.
     */
    static final class RestoreReporter implements StateRestoreListener {
        private final Set<String> restoring = new HashSet<>();
        private boolean roundHasRestore;
        private long roundStartNanos;
        private long roundEndNanos;
        private long roundRecords;
        private boolean reportedFirst;

        @Override
        public synchronized void onRestoreStart(TopicPartition tp, String store, long startingOffset, long endingOffset) {
            if (!roundHasRestore) {
                roundHasRestore = true;
                roundStartNanos = System.nanoTime();
                roundEndNanos = roundStartNanos;
                roundRecords = 0;
            }
            restoring.add(store + "\u0000" + tp);
            marker("RESTORE START store=" + store + " partition=" + tp.partition()
                    + " from=" + startingOffset + " to=" + endingOffset);
        }

        @Override
        public void onBatchRestored(TopicPartition tp, String store, long batchEndOffset, long numRestored) {}

        @Override
        public synchronized void onRestoreEnd(TopicPartition tp, String store, long totalRestored) {
            marker("RESTORE END store=" + store + " partition=" + tp.partition() + " records=" + totalRestored);
            finish(tp, store, totalRestored);
        }

        @Override
        public synchronized void onRestoreSuspended(TopicPartition tp, String store, long totalRestored) {
            marker("RESTORE SUSPENDED store=" + store + " partition=" + tp.partition() + " records=" + totalRestored);
            finish(tp, store, totalRestored);
        }

        private void finish(TopicPartition tp, String store, long records) {
            restoring.remove(store + "\u0000" + tp);
            roundRecords += records;
            roundEndNanos = System.nanoTime();
        }

        /** Called on each transition to RUNNING, before its STATE line is printed. */
        synchronized void running() {
            if (roundHasRestore || !reportedFirst) {
                long ms = roundHasRestore ? (roundEndNanos - roundStartNanos) / 1_000_000 : 0;
                if (!restoring.isEmpty()) {
                    log.warn("RUNNING while restores are still open: {}", restoring);
                }
                marker("RESTORE TOTAL records=" + roundRecords + " ms=" + ms);
            }
            reportedFirst = true;
            roundHasRestore = false;
            roundRecords = 0;
        }
    }

    /**
     * Standby (and warm-up: Kafka Streams runs both as standby tasks) copies tailing a changelog:
     * at the first non-empty batch after a copy starts, how far behind the changelog end it
     * started ({@code CATCHUP}: end offset then − the offset it started from); when the copy is
     * suspended (promoted, migrated, closed), how many records it applied since it started.
     */
    static final class StandbyReporter implements StandbyUpdateListener {
        /** Per changelog partition: start offset, records applied, catch-up reported (0/1). */
        private final Map<TopicPartition, long[]> open = new HashMap<>();

        @Override
        public synchronized void onUpdateStart(TopicPartition tp, String store, long startingOffset) {
            open.put(tp, new long[] {startingOffset, 0, 0});
        }

        @Override
        public synchronized void onBatchLoaded(TopicPartition tp, String store, TaskId taskId, long batchEndOffset,
                long batchSize, long currentEndOffset) {
            long[] s = open.computeIfAbsent(tp, k -> new long[] {-1, 0, 0});
            if (s[2] == 0 && batchSize > 0) {
                s[2] = 1;
                long from = s[0] >= 0 ? s[0] : Math.max(0, batchEndOffset - batchSize);
                marker("STANDBY CATCHUP store=" + store + " partition=" + tp.partition() + " from=" + from
                        + " behind=" + Math.max(0, currentEndOffset - from));
            }
            s[1] += batchSize;
        }

        @Override
        public synchronized void onUpdateSuspended(TopicPartition tp, String store, long storeOffset, long currentEndOffset,
                SuspendReason reason) {
            long[] s = open.remove(tp);
            marker("STANDBY SUSPENDED store=" + store + " partition=" + tp.partition() + " applied=" + (s == null ? 0 : s[1])
                    + " reason=" + reason);
        }
    }
}

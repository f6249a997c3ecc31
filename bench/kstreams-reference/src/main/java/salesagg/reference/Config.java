package salesagg.reference;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * Settings from environment variables, overridden by command-line arguments.
 *
 * <p>Each setting has an environment variable name ({@code BOOTSTRAP_SERVERS}); the matching
 * argument is {@code --bootstrap-servers=VALUE} or {@code --bootstrap-servers VALUE} (case, dashes,
 * dots and underscores are interchangeable, so {@code --BOOTSTRAP_SERVERS=...} and
 * {@code --bootstrap.servers=...} work too). {@code --prop key=value} (repeatable) passes any
 * other Kafka Streams / client property through unchanged.
 */
final class Config {
    /** Environment variable name → default (null: optional, unset). */
    static final Map<String, String> DEFAULTS = new LinkedHashMap<>();

    static {
        DEFAULTS.put("BOOTSTRAP_SERVERS", "localhost:9092");
        DEFAULTS.put("APPLICATION_ID", "sales-aggregator");
        DEFAULTS.put("STATE_DIR", "/tmp/kstreams-reference");
        DEFAULTS.put("PROCESSING_GUARANTEE", "exactly_once_v2");
        DEFAULTS.put("INPUT_TOPIC", "sales-events-v1");
        DEFAULTS.put("NOTIFICATION_TOPIC", "notifications-events-v1");
        DEFAULTS.put("NOTIFICATION_THRESHOLD", "2000");
        DEFAULTS.put("NUM_STREAM_THREADS", "1");
        DEFAULTS.put("COMMIT_INTERVAL_MS", null);
        DEFAULTS.put("CACHE_MAX_BYTES", null);
        DEFAULTS.put("LEAVE_GROUP_ON_CLOSE", "false");
        DEFAULTS.put("NUM_STANDBY_REPLICAS", null);
        DEFAULTS.put("INSTANCE_ID", null);
        DEFAULTS.put("HTTP_ADDR", null);
        DEFAULTS.put("ROCKSDB", "default");
        DEFAULTS.put("TRANSACTIONAL_STATE_STORES", null);
        DEFAULTS.put("WINDOWS", null);
        DEFAULTS.put("WINDOWS_GRACE_MS", "0");
        DEFAULTS.put("WINDOWS_NOTIFY", null);
    }

    /** Short argument spellings. */
    private static final Map<String, String> ALIASES = Map.of(
            "BOOTSTRAP", "BOOTSTRAP_SERVERS",
            "THRESHOLD", "NOTIFICATION_THRESHOLD",
            "GUARANTEE", "PROCESSING_GUARANTEE");

    static final String USAGE = String.join("\n",
            "usage: SalesAggregator [--describe] [--help] [--name=value | --name value]... [--prop key=value]...",
            "settings (argument --lower-case-with-dashes, or environment variable):",
            "  --bootstrap-servers      BOOTSTRAP_SERVERS       default localhost:9092 (alias --bootstrap)",
            "  --application-id         APPLICATION_ID          default sales-aggregator",
            "  --state-dir              STATE_DIR               default /tmp/kstreams-reference",
            "  --processing-guarantee   PROCESSING_GUARANTEE    at_least_once | exactly_once_v2 (default)",
            "  --input-topic            INPUT_TOPIC             default sales-events-v1",
            "  --notification-topic     NOTIFICATION_TOPIC      default notifications-events-v1",
            "  --notification-threshold NOTIFICATION_THRESHOLD  default 2000 (alias --threshold)",
            "  --num-stream-threads     NUM_STREAM_THREADS      default 1",
            "  --commit-interval-ms     COMMIT_INTERVAL_MS      default Kafka Streams' (100 exactly-once, 30000 at-least-once)",
            "  --cache-max-bytes        CACHE_MAX_BYTES         statestore.cache.max.bytes, default Kafka Streams' (10 MiB); 0 emits every update",
            "  --leave-group-on-close   LEAVE_GROUP_ON_CLOSE    true | false (default, as KafkaStreams.close(timeout)): leave the",
            "                                                   consumer group on SIGTERM, so a restart need not wait for session.timeout.ms",
            "  --num-standby-replicas   NUM_STANDBY_REPLICAS    num.standby.replicas, default Kafka Streams' (0)",
            "  --instance-id            INSTANCE_ID             group.instance.id (static membership; Kafka Streams appends -<thread>); unset: dynamic",
            "  --http-addr              HTTP_ADDR               host:port: serve interactive queries there (GET /v1/products/<p>, /v1/instances,",
            "                                                   /readyz) and announce it as application.server; unset: no HTTP server",
            "  --rocksdb                ROCKSDB                 default | tuned (rocksdb.config.setter = salesagg.reference.RocksDBTuning)",
            "  --transactional-state-stores TRANSACTIONAL_STATE_STORES  true | false: enable.transactional.statestores (KIP-892); default Kafka Streams' (false)",
            "  --windows                WINDOWS                 tumbling window sizes, comma separated (1h,24h; units ms, s, m, h): each a",
            "                                                   windowed aggregation into the store PRODUCT_AGGREGATED_SALES-<size>; unset: none",
            "  --windows-grace-ms       WINDOWS_GRACE_MS        the windows' grace period, default 0 (TimeWindows.ofSizeAndGrace)",
            "  --windows-notify         WINDOWS_NOTIFY          final: each window's final total at or above the threshold, once, when it",
            "                                                   closes (suppress(untilWindowCloses)), as salesagg's windows.notify final; unset: none",
            "  --prop key=value         any other Kafka Streams or client property (repeatable)",
            "  --describe               print the topology and exit (no broker needed)");

    final Map<String, String> values = new LinkedHashMap<>();
    final Map<String, String> extraProps = new LinkedHashMap<>();
    boolean describeOnly;
    boolean help;

    final long threshold;
    /** The window sizes as given (they name the stores), in milliseconds. */
    final Map<String, Long> windows = new LinkedHashMap<>();
    final long windowGraceMs;
    /** Whether each window's final total is notified once it closes (WINDOWS_NOTIFY final). */
    final boolean windowFinals;
    final boolean leaveGroupOnClose;
    final int numStreamThreads;

    private Config(Map<String, String> env, String[] args) {
        for (Map.Entry<String, String> d : DEFAULTS.entrySet()) {
            String v = env.get(d.getKey());
            values.put(d.getKey(), v != null && !v.isEmpty() ? v : d.getValue());
        }
        List<String> errors = new ArrayList<>();
        for (int i = 0; i < args.length; i++) {
            String arg = args[i];
            if (!arg.startsWith("--")) {
                errors.add("unexpected argument " + arg);
                continue;
            }
            String name = arg.substring(2);
            String value = null;
            int eq = name.indexOf('=');
            if (eq >= 0) {
                value = name.substring(eq + 1);
                name = name.substring(0, eq);
            }
            String key = name.toUpperCase(Locale.ROOT).replace('-', '_').replace('.', '_');
            if (key.equals("HELP") || key.equals("H")) {
                help = true;
                continue;
            }
            if (key.equals("DESCRIBE")) {
                describeOnly = true;
                continue;
            }
            key = ALIASES.getOrDefault(key, key);
            if (!key.equals("PROP") && !DEFAULTS.containsKey(key)) {
                errors.add("unknown option --" + name);
                continue;
            }
            if (value == null) {
                if (i + 1 >= args.length) {
                    errors.add("option --" + name + " needs a value");
                    continue;
                }
                value = args[++i];
            }
            if (key.equals("PROP")) {
                int peq = value.indexOf('=');
                if (peq <= 0) {
                    errors.add("--prop needs key=value, got " + value);
                } else {
                    extraProps.put(value.substring(0, peq), value.substring(peq + 1));
                }
            } else {
                values.put(key, value.isEmpty() ? DEFAULTS.get(key) : value);
            }
        }

        String guarantee = values.get("PROCESSING_GUARANTEE");
        if (!guarantee.equals("at_least_once") && !guarantee.equals("exactly_once_v2")) {
            errors.add("PROCESSING_GUARANTEE must be at_least_once or exactly_once_v2, got " + guarantee);
        }
        String leave = values.get("LEAVE_GROUP_ON_CLOSE");
        if (!leave.equals("true") && !leave.equals("false")) {
            errors.add("LEAVE_GROUP_ON_CLOSE must be true or false, got " + leave);
        }
        leaveGroupOnClose = leave.equals("true");
        String rocks = values.get("ROCKSDB");
        if (!rocks.equals("default") && !rocks.equals("tuned")) {
            errors.add("ROCKSDB must be default or tuned, got " + rocks);
        }
        String txn = values.get("TRANSACTIONAL_STATE_STORES");
        if (txn != null && !txn.equals("true") && !txn.equals("false")) {
            errors.add("TRANSACTIONAL_STATE_STORES must be true or false, got " + txn);
        }
        if (values.get("NUM_STANDBY_REPLICAS") != null) {
            parseLong("NUM_STANDBY_REPLICAS", errors, 0);
        }
        String http = values.get("HTTP_ADDR");
        if (http != null && (http.lastIndexOf(':') <= 0 || http.endsWith(":"))) {
            errors.add("HTTP_ADDR must be host:port, got " + http);
        }
        threshold = parseLong("NOTIFICATION_THRESHOLD", errors, Long.MIN_VALUE);
        numStreamThreads = (int) parseLong("NUM_STREAM_THREADS", errors, 1);
        if (values.get("COMMIT_INTERVAL_MS") != null) {
            parseLong("COMMIT_INTERVAL_MS", errors, 0);
        }
        if (values.get("CACHE_MAX_BYTES") != null) {
            parseLong("CACHE_MAX_BYTES", errors, 0);
        }
        windowGraceMs = parseLong("WINDOWS_GRACE_MS", errors, 0);
        if (values.get("WINDOWS") != null) {
            for (String size : values.get("WINDOWS").split(",")) {
                size = size.trim();
                if (size.isEmpty()) {
                    continue;
                }
                Long ms = windowSizeMs(size);
                if (ms == null) {
                    errors.add("WINDOWS: " + size + " is not a size such as 1h, 15m, 90s or 1500ms");
                } else {
                    windows.put(size, ms);
                }
            }
        }
        String notify = values.get("WINDOWS_NOTIFY");
        windowFinals = "final".equals(notify);
        if (notify != null && !windowFinals) {
            errors.add("WINDOWS_NOTIFY must be final or unset, got " + notify);
        }
        for (String k : new String[] {"BOOTSTRAP_SERVERS", "APPLICATION_ID", "STATE_DIR", "INPUT_TOPIC", "NOTIFICATION_TOPIC"}) {
            if (values.get(k).isBlank()) {
                errors.add(k + " must not be empty");
            }
        }
        if (!errors.isEmpty() && !help) {
            throw new IllegalArgumentException(String.join("; ", errors));
        }
    }

    static Config load(Map<String, String> env, String[] args) {
        return new Config(env, args);
    }

    /** Reads a window size written as salesagg writes it: a whole number of ms, s, m or h. */
    static Long windowSizeMs(String s) {
        java.util.regex.Matcher m = java.util.regex.Pattern.compile("(\\d+)(ms|s|m|h)").matcher(s);
        if (!m.matches()) {
            return null;
        }
        long n = Long.parseLong(m.group(1));
        switch (m.group(2)) {
            case "h": return n * 3_600_000L;
            case "m": return n * 60_000L;
            case "s": return n * 1_000L;
            default: return n;
        }
    }

    String get(String key) {
        return values.get(key);
    }

    private long parseLong(String key, List<String> errors, long min) {
        String v = values.get(key);
        try {
            long n = Long.parseLong(v.trim());
            if (n < min) {
                errors.add(key + " must be at least " + min + ", got " + v);
            }
            return n;
        } catch (NumberFormatException e) {
            errors.add(key + " must be an integer, got " + v);
            return 0;
        }
    }
}

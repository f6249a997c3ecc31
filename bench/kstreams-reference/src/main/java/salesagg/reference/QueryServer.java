package salesagg.reference;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.HttpURLConnection;
import java.net.InetSocketAddress;
import java.net.URI;
import java.net.URL;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import java.util.concurrent.Executors;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyQueryMetadata;
import org.apache.kafka.streams.LagInfo;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsMetadata;
import org.apache.kafka.streams.errors.InvalidStateStoreException;
import org.apache.kafka.streams.state.HostInfo;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;

/**
 * Interactive queries over HTTP (the JDK's com.sun.net.httpserver), in the shape of salesagg's
 * API so one harness can ask both:
 * <ul>
 *   <li>{@code GET /readyz}: 200 while the client is RUNNING and the store of every partition
 *       assigned to it as active is queryable (restored), else 503 with the reason.</li>
 *   <li>{@code GET /v1/products/<p>}: the product's total. The key's partition and owner come from
 *       {@code queryMetadataForKey}; the active owner answers from its store (this instance, or
 *       the request is forwarded to its {@code application.server} with {@code ?local=1}). When
 *       the active owner cannot answer (down, rebalancing), a standby of that partition answers
 *       from its stale store ({@code enableStaleStores}), locally or forwarded with
 *       {@code ?local=1&stale=1}. Answer: 200 {@code {"product":..,"total":..}}, 404 for a product
 *       the store does not hold, 503 when no copy can answer. Header
 *       {@code X-Served-By: <instance>; task=0_<partition>[; standby]}, and for a standby
 *       {@code X-Salesagg-Standby-Lag} (its store's offset lag, from
 *       {@code allLocalStorePartitionLags}).</li>
 *   <li>{@code GET /v1/instances}: every client of the group from {@code metadataForAllStreamsClients}:
 *       {@code {"instances":[{"instance":..,"server":"host:port","tasks":["0_0"],"standby_tasks":[..],"self":..}]}};
 *       {@code instance} is known for this instance only (Kafka Streams' metadata carries the
 *       application.server, not group.instance.id), else empty.</li>
 * </ul>
 */
final class QueryServer {
    private final KafkaStreams streams;
    private final String store;
    private final String inputTopic;
    private final String name;
    private final HostInfo self;
    private final HttpServer server;

    QueryServer(KafkaStreams streams, String store, String inputTopic, String name, String addr) throws IOException {
        this.streams = streams;
        this.store = store;
        this.inputTopic = inputTopic;
        this.name = name;
        int colon = addr.lastIndexOf(':');
        this.self = new HostInfo(addr.substring(0, colon), Integer.parseInt(addr.substring(colon + 1)));
        server = HttpServer.create(new InetSocketAddress(self.host(), self.port()), 64);
        server.setExecutor(Executors.newFixedThreadPool(8, r -> {
            Thread t = new Thread(r, "query-http");
            t.setDaemon(true);
            return t;
        }));
        server.createContext("/", this::handle);
    }

    void start() {
        server.start();
    }

    void stop() {
        server.stop(0);
    }

    private void handle(HttpExchange ex) throws IOException {
        try {
            String path = ex.getRequestURI().getPath();
            if (!ex.getRequestMethod().equals("GET")) {
                send(ex, 405, "{\"error\":\"GET only\"}");
            } else if (path.equals("/readyz")) {
                KafkaStreams.State st = streams.state();
                String notReady = st == KafkaStreams.State.RUNNING ? unqueryable() : "state " + st;
                if (notReady == null) {
                    send(ex, 200, "{\"ready\":true}");
                } else {
                    send(ex, 503, "{\"ready\":false,\"reason\":" + json(notReady) + "}");
                }
            } else if (path.equals("/v1/instances")) {
                instances(ex);
            } else if (path.startsWith("/v1/products/")) {
                String product = URLDecoder.decode(path.substring("/v1/products/".length()), StandardCharsets.UTF_8);
                String q = ex.getRequestURI().getRawQuery();
                boolean local = q != null && q.contains("local=1");
                boolean stale = q != null && q.contains("stale=1");
                product(ex, product, local, stale);
            } else {
                send(ex, 404, "{\"error\":\"not found\"}");
            }
        } catch (RuntimeException e) {
            send(ex, 503, "{\"error\":" + json(String.valueOf(e)) + "}");
        } finally {
            ex.close();
        }
    }

    /**
     * Null when the store of every input partition assigned to this instance as active answers
     * queries, else which one does not. A client is RUNNING while its state updater still restores
     * tasks, so RUNNING alone does not mean every assigned task serves (salesagg's /readyz does).
     */
    private String unqueryable() {
        for (StreamsMetadata md : streams.metadataForAllStreamsClients()) {
            if (!md.hostInfo().equals(self)) {
                continue;
            }
            for (TopicPartition tp : md.topicPartitions()) {
                if (!tp.topic().equals(inputTopic)) {
                    continue;
                }
                try {
                    streams.store(StoreQueryParameters
                            .fromNameAndType(store, QueryableStoreTypes.<String, Long>keyValueStore())
                            .withPartition(tp.partition()));
                } catch (InvalidStateStoreException e) {
                    return "task 0_" + tp.partition() + " not queryable yet (restoring)";
                }
            }
        }
        return null;
    }

    private void instances(HttpExchange ex) throws IOException {
        Collection<StreamsMetadata> all = streams.metadataForAllStreamsClients();
        StringBuilder sb = new StringBuilder("{\"instances\":[");
        boolean first = true;
        for (StreamsMetadata md : all) {
            if (!first) {
                sb.append(',');
            }
            first = false;
            boolean isSelf = md.hostInfo().equals(self);
            sb.append("{\"instance\":").append(json(isSelf ? name : ""))
                    .append(",\"server\":").append(json(md.host() + ":" + md.port()))
                    .append(",\"tasks\":").append(tasks(md.topicPartitions()))
                    .append(",\"standby_tasks\":").append(tasks(md.standbyTopicPartitions()))
                    .append(",\"self\":").append(isSelf).append('}');
        }
        sb.append("]}");
        send(ex, 200, sb.toString());
    }

    private String tasks(Collection<TopicPartition> tps) {
        TreeSet<String> ts = new TreeSet<>();
        for (TopicPartition tp : tps) {
            if (tp.topic().equals(inputTopic)) {
                ts.add("\"0_" + tp.partition() + "\"");
            }
        }
        return "[" + String.join(",", ts) + "]";
    }

    private void product(HttpExchange ex, String product, boolean local, boolean stale) throws IOException {
        KeyQueryMetadata md = streams.queryMetadataForKey(store, product, Serdes.String().serializer());
        if (md == null || md == KeyQueryMetadata.NOT_AVAILABLE) {
            send(ex, 503, "{\"error\":\"no metadata for the key (rebalancing)\"}");
            return;
        }
        int partition = md.partition();
        if (local) {
            if (!answerLocal(ex, product, partition, stale && !self.equals(md.activeHost()))) {
                send(ex, 503, "{\"error\":\"store of partition " + partition + " not queryable here\"}");
            }
            return;
        }
        List<String> tried = new ArrayList<>();
        if (self.equals(md.activeHost())) {
            if (answerLocal(ex, product, partition, false)) {
                return;
            }
        } else if (forward(ex, md.activeHost(), product, false, tried)) {
            return;
        }
        tried.add("active " + md.activeHost().host() + ":" + md.activeHost().port());
        for (HostInfo h : md.standbyHosts()) {
            if (h.equals(self)) {
                if (answerLocal(ex, product, partition, true)) {
                    return;
                }
            } else if (forward(ex, h, product, true, tried)) {
                return;
            }
            tried.add("standby " + h.host() + ":" + h.port());
        }
        send(ex, 503, "{\"error\":" + json("no copy of partition " + partition + " answered: " + String.join(", ", tried)) + "}");
    }

    /** Answers from this instance's store; false (nothing sent) when the store is not queryable. */
    private boolean answerLocal(HttpExchange ex, String product, int partition, boolean standby) throws IOException {
        Long total;
        try {
            StoreQueryParameters<ReadOnlyKeyValueStore<String, Long>> p = StoreQueryParameters
                    .fromNameAndType(store, QueryableStoreTypes.<String, Long>keyValueStore())
                    .withPartition(partition);
            if (standby) {
                p = p.enableStaleStores();
            }
            total = streams.store(p).get(product);
        } catch (InvalidStateStoreException e) {
            return false;
        }
        String servedBy = name + "; task=0_" + partition + (standby ? "; standby" : "");
        ex.getResponseHeaders().set("X-Served-By", servedBy);
        if (standby) {
            Map<Integer, LagInfo> lags = streams.allLocalStorePartitionLags().get(store);
            LagInfo lag = lags == null ? null : lags.get(partition);
            if (lag != null) {
                ex.getResponseHeaders().set("X-Salesagg-Standby-Lag", Long.toString(lag.offsetLag()));
            }
        }
        if (total == null) {
            send(ex, 404, "{\"error\":\"unknown product\",\"product\":" + json(product) + "}");
        } else {
            send(ex, 200, "{\"product\":" + json(product) + ",\"total\":" + total + "}");
        }
        return true;
    }

    /** Forwards to another instance; false (nothing sent) when it does not answer 200 or 404. */
    private boolean forward(HttpExchange ex, HostInfo to, String product, boolean stale, List<String> tried) throws IOException {
        HttpURLConnection c = null;
        try {
            String path = "/v1/products/" + URLEncoderPath.encode(product) + "?local=1" + (stale ? "&stale=1" : "");
            URL url = URI.create("http://" + to.host() + ":" + to.port() + path).toURL();
            c = (HttpURLConnection) url.openConnection(java.net.Proxy.NO_PROXY);
            c.setConnectTimeout(300);
            c.setReadTimeout(600);
            int code = c.getResponseCode();
            if (code != 200 && code != 404) {
                return false;
            }
            byte[] body;
            try (InputStream in = code == 200 ? c.getInputStream() : c.getErrorStream()) {
                body = in == null ? new byte[0] : in.readAllBytes();
            }
            for (String h : new String[] {"X-Served-By", "X-Salesagg-Standby-Lag"}) {
                String v = c.getHeaderField(h);
                if (v != null) {
                    ex.getResponseHeaders().set(h, v);
                }
            }
            send(ex, code, new String(body, StandardCharsets.UTF_8));
            return true;
        } catch (IOException | IllegalArgumentException e) {
            return false;
        } finally {
            if (c != null) {
                c.disconnect();
            }
        }
    }

    private static void send(HttpExchange ex, int code, String body) throws IOException {
        byte[] b = body.getBytes(StandardCharsets.UTF_8);
        ex.getResponseHeaders().set("Content-Type", "application/json");
        ex.sendResponseHeaders(code, b.length);
        try (OutputStream out = ex.getResponseBody()) {
            out.write(b);
        }
    }

    private static String json(String s) {
        StringBuilder sb = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c == '"' || c == '\\') {
                sb.append('\\').append(c);
            } else if (c < 0x20) {
                sb.append(String.format("\\u%04x", (int) c));
            } else {
                sb.append(c);
            }
        }
        return sb.append('"').toString();
    }

    /** Percent-encodes a path segment. */
    static final class URLEncoderPath {
        static String encode(String s) {
            return java.net.URLEncoder.encode(s, StandardCharsets.UTF_8).replace("+", "%20");
        }
    }
}

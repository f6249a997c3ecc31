package salesagg.reference;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * One sales event, decoded from the input value {@code {"product": "p1", "value": 1000}}, and the
 * notification encoding {@code {"sku":"p1","value":2500}}.
 *
 * <p>Decoding is strict RFC 8259 JSON with a small hand-written parser (Jackson is only on
 * kafka-streams' runtime classpath, not its API, so we do not compile against it). An event is
 * malformed, and {@link #parse} returns null, when:
 * <ul>
 *   <li>the value is not one complete JSON document, or its top level is not an object;</li>
 *   <li>{@code value} is missing or null, not a number, has a fraction or exponent part
 *       ({@code 1000.0}, {@code 1e3}), or does not fit a signed 64-bit integer;</li>
 *   <li>{@code product} is present and neither a string nor null.</li>
 * </ul>
 * Field names match case-sensitively; for a repeated field the last occurrence wins. Other fields
 * are ignored. Whether a missing or empty {@code product} is acceptable depends on the record key,
 * which the topology decides.
 */
final class SalesEvent {
    /** The {@code product} field, or null when absent or JSON null. */
    final String product;
    /** The {@code value} field. */
    final long value;

    SalesEvent(String product, long value) {
        this.product = product;
        this.value = value;
    }

    /** Decodes an input value, or returns null when it is malformed. */
    static SalesEvent parse(String json) {
        if (json == null) {
            return null;
        }
        Object doc;
        try {
            Parser p = new Parser(json);
            doc = p.document();
        } catch (Malformed e) {
            return null;
        }
        if (!(doc instanceof Map)) {
            return null;
        }
        Map<?, ?> obj = (Map<?, ?>) doc;
        Object value = obj.get("value");
        if (!(value instanceof Long)) {
            return null; // missing, null, non-integer, out of range, or not a number
        }
        Object product = obj.get("product");
        if (product != null && product != Parser.NULL && !(product instanceof String)) {
            return null;
        }
        return new SalesEvent(product instanceof String ? (String) product : null, (Long) value);
    }

    /** Encodes a notification: {@code {"sku":"<product>","value":<total>}}. */
    static String notification(String product, long total) {
        StringBuilder sb = new StringBuilder(product.length() + 32);
        sb.append("{\"sku\":");
        quote(sb, product);
        sb.append(",\"value\":").append(total).append('}');
        return sb.toString();
    }

    /** A window's final notification, as salesagg writes it with windows.notify final. */
    static String windowFinal(String product, long total, String size, long start, long end) {
        StringBuilder sb = new StringBuilder(product.length() + 96);
        sb.append("{\"sku\":");
        quote(sb, product);
        sb.append(",\"value\":").append(total);
        sb.append(",\"window\":");
        quote(sb, size);
        sb.append(",\"start\":").append(start).append(",\"end\":").append(end).append(",\"final\":true}");
        return sb.toString();
    }

    private static void quote(StringBuilder sb, String s) {
        sb.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': sb.append("\\\""); break;
                case '\\': sb.append("\\\\"); break;
                case '\n': sb.append("\\n"); break;
                case '\r': sb.append("\\r"); break;
                case '\t': sb.append("\\t"); break;
                case '\b': sb.append("\\b"); break;
                case '\f': sb.append("\\f"); break;
                default:
                    if (c < 0x20) {
                        sb.append(String.format("\\u%04x", (int) c));
                    } else {
                        sb.append(c);
                    }
            }
        }
        sb.append('"');
    }

    private static final class Malformed extends Exception {
        Malformed() {
            super(null, null, false, false); // no stack trace: this is the normal path for bad input
        }
    }

    /**
     * Recursive-descent JSON parser. Objects become maps, arrays lists, strings strings, integer
     * literals that fit a long become Long; any other number becomes {@link #NON_INTEGER}.
     */
    private static final class Parser {
        static final Object NULL = new Object();
        static final Object NON_INTEGER = new Object();
        private static final int MAX_DEPTH = 512;
        private static final Malformed MALFORMED = new Malformed();

        private final String s;
        private int pos;
        private int depth;

        Parser(String s) {
            this.s = s;
        }

        Object document() throws Malformed {
            skipWhitespace();
            Object v = value();
            skipWhitespace();
            if (pos != s.length()) {
                throw MALFORMED; // trailing data
            }
            return v;
        }

        private Object value() throws Malformed {
            if (pos >= s.length()) {
                throw MALFORMED;
            }
            char c = s.charAt(pos);
            switch (c) {
                case '{': return object();
                case '[': return array();
                case '"': return string();
                case 't': literal("true"); return Boolean.TRUE;
                case 'f': literal("false"); return Boolean.FALSE;
                case 'n': literal("null"); return NULL;
                default:
                    if (c == '-' || (c >= '0' && c <= '9')) {
                        return number();
                    }
                    throw MALFORMED;
            }
        }

        private Map<String, Object> object() throws Malformed {
            enter();
            pos++; // '{'
            Map<String, Object> m = new HashMap<>();
            skipWhitespace();
            if (peek() == '}') {
                pos++;
                depth--;
                return m;
            }
            while (true) {
                skipWhitespace();
                if (peek() != '"') {
                    throw MALFORMED;
                }
                String key = string();
                skipWhitespace();
                expect(':');
                skipWhitespace();
                m.put(key, value());
                skipWhitespace();
                char c = next();
                if (c == '}') {
                    depth--;
                    return m;
                }
                if (c != ',') {
                    throw MALFORMED;
                }
            }
        }

        private List<Object> array() throws Malformed {
            enter();
            pos++; // '['
            List<Object> l = new ArrayList<>();
            skipWhitespace();
            if (peek() == ']') {
                pos++;
                depth--;
                return l;
            }
            while (true) {
                skipWhitespace();
                l.add(value());
                skipWhitespace();
                char c = next();
                if (c == ']') {
                    depth--;
                    return l;
                }
                if (c != ',') {
                    throw MALFORMED;
                }
            }
        }

        private String string() throws Malformed {
            pos++; // opening quote
            StringBuilder sb = null;
            int start = pos;
            while (true) {
                char c = next();
                if (c == '"') {
                    return sb == null ? s.substring(start, pos - 1) : sb.toString();
                }
                if (c < 0x20) {
                    throw MALFORMED; // unescaped control character
                }
                if (c != '\\') {
                    if (sb != null) {
                        sb.append(c);
                    }
                    continue;
                }
                if (sb == null) {
                    sb = new StringBuilder(s.substring(start, pos - 1));
                }
                char e = next();
                switch (e) {
                    case '"': sb.append('"'); break;
                    case '\\': sb.append('\\'); break;
                    case '/': sb.append('/'); break;
                    case 'b': sb.append('\b'); break;
                    case 'f': sb.append('\f'); break;
                    case 'n': sb.append('\n'); break;
                    case 'r': sb.append('\r'); break;
                    case 't': sb.append('\t'); break;
                    case 'u':
                        if (pos + 4 > s.length()) {
                            throw MALFORMED;
                        }
                        int cp = 0;
                        for (int i = 0; i < 4; i++) {
                            int d = Character.digit(s.charAt(pos++), 16);
                            if (d < 0) {
                                throw MALFORMED;
                            }
                            cp = cp * 16 + d;
                        }
                        sb.append((char) cp);
                        break;
                    default:
                        throw MALFORMED;
                }
            }
        }

        private Object number() throws Malformed {
            int start = pos;
            boolean integer = true;
            if (peek() == '-') {
                pos++;
            }
            if (peek() == '0') {
                pos++;
            } else if (isDigit(peek())) {
                while (isDigit(peek())) {
                    pos++;
                }
            } else {
                throw MALFORMED;
            }
            if (peek() == '.') {
                integer = false;
                pos++;
                if (!isDigit(peek())) {
                    throw MALFORMED;
                }
                while (isDigit(peek())) {
                    pos++;
                }
            }
            if (peek() == 'e' || peek() == 'E') {
                integer = false;
                pos++;
                if (peek() == '+' || peek() == '-') {
                    pos++;
                }
                if (!isDigit(peek())) {
                    throw MALFORMED;
                }
                while (isDigit(peek())) {
                    pos++;
                }
            }
            if (!integer) {
                return NON_INTEGER;
            }
            try {
                return Long.parseLong(s.substring(start, pos));
            } catch (NumberFormatException e) {
                return NON_INTEGER; // a valid JSON integer outside the int64 range
            }
        }

        private void literal(String word) throws Malformed {
            if (!s.startsWith(word, pos)) {
                throw MALFORMED;
            }
            pos += word.length();
        }

        private void enter() throws Malformed {
            if (++depth > MAX_DEPTH) {
                throw MALFORMED;
            }
        }

        private void skipWhitespace() {
            while (pos < s.length()) {
                char c = s.charAt(pos);
                if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
                    return;
                }
                pos++;
            }
        }

        private void expect(char c) throws Malformed {
            if (next() != c) {
                throw MALFORMED;
            }
        }

        private char peek() {
            return pos < s.length() ? s.charAt(pos) : '\0';
        }

        private char next() throws Malformed {
            if (pos >= s.length()) {
                throw MALFORMED;
            }
            return s.charAt(pos++);
        }

        private static boolean isDigit(char c) {
            return c >= '0' && c <= '9';
        }
    }
}

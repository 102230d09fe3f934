package dev.fencegate;

import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Just enough JSON for the SQL interface, so that the client needs nothing
 * but a JDBC driver: {@link #write} encodes a payload, {@link #parse} reads
 * the JSON object in the DETAIL of the interface's errors. A program with a
 * JSON library of its own passes its text to {@link Intent#of(String, long,
 * String, String, String)} instead.
 */
public final class Json {
    private Json() {}

    /**
     * Encodes value as JSON text: a {@link Map} with string keys (an object,
     * in the map's order), a {@link Collection} or an {@code Object[]} (an
     * array), a {@link CharSequence}, a {@link Number} (finite), a
     * {@link Boolean} or null.
     *
     * @throws IllegalArgumentException for anything else (naming its type and
     *     where it is: {@code "payload.to[1]"})
     */
    public static String write(Object value) {
        StringBuilder b = new StringBuilder();
        write(b, value, "payload");
        return b.toString();
    }

    private static void write(StringBuilder b, Object v, String path) {
        if (v == null) {
            b.append("null");
        } else if (v instanceof CharSequence s) {
            quote(b, s);
        } else if (v instanceof Boolean) {
            b.append(v);
        } else if (v instanceof Number n) {
            if (n instanceof Double d && (d.isNaN() || d.isInfinite())
                    || n instanceof Float f && (f.isNaN() || f.isInfinite())) {
                throw new IllegalArgumentException(path + ": " + n + " is not a JSON number");
            }
            b.append(n);
        } else if (v instanceof Map<?, ?> m) {
            b.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : m.entrySet()) {
                if (!(e.getKey() instanceof String k)) {
                    throw new IllegalArgumentException(path + ": a key of type "
                            + (e.getKey() == null ? "null" : e.getKey().getClass().getName()) + ", not a String");
                }
                if (!first) {
                    b.append(',');
                }
                first = false;
                quote(b, k);
                b.append(':');
                write(b, e.getValue(), path + "." + k);
            }
            b.append('}');
        } else if (v instanceof Collection<?> c) {
            writeArray(b, c, path);
        } else if (v instanceof Object[] a) {
            writeArray(b, List.of(a), path);
        } else {
            throw new IllegalArgumentException(path + ": a " + v.getClass().getName()
                    + " has no JSON form here (use a Map, a Collection, a String, a Number, a Boolean or null)");
        }
    }

    private static void writeArray(StringBuilder b, Collection<?> c, String path) {
        b.append('[');
        int i = 0;
        for (Object e : c) {
            if (i > 0) {
                b.append(',');
            }
            write(b, e, path + "[" + i + "]");
            i++;
        }
        b.append(']');
    }

    private static void quote(StringBuilder b, CharSequence s) {
        b.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\n' -> b.append("\\n");
                case '\r' -> b.append("\\r");
                case '\t' -> b.append("\\t");
                default -> {
                    // A lone surrogate escaped: Fencegate.enqueue refuses it
                    // naming where (written as it is, the driver sends "?").
                    if (c < 0x20 || Character.isSurrogate(c) && !paired(s, i)) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
                }
            }
        }
        b.append('"');
    }

    /** Whether the surrogate at i is half of a pair. */
    private static boolean paired(CharSequence s, int i) {
        char c = s.charAt(i);
        return Character.isHighSurrogate(c) ? i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1))
                : i > 0 && Character.isHighSurrogate(s.charAt(i - 1));
    }

    /**
     * Parses JSON text: objects become {@link LinkedHashMap}s, arrays
     * {@link ArrayList}s, integers {@link Long}s, other numbers
     * {@link Double}s.
     *
     * @throws IllegalArgumentException on text that is not JSON
     */
    static Object parse(String text) {
        Parser p = new Parser(text);
        p.space();
        Object v = p.value();
        p.space();
        if (p.i != text.length()) {
            throw p.error("trailing text");
        }
        return v;
    }

    private static final class Parser {
        final String s;
        int i;

        Parser(String s) {
            this.s = s;
        }

        IllegalArgumentException error(String what) {
            return new IllegalArgumentException("JSON: " + what + " at offset " + i);
        }

        void space() {
            while (i < s.length() && " \t\r\n".indexOf(s.charAt(i)) >= 0) {
                i++;
            }
        }

        Object value() {
            if (i >= s.length()) {
                throw error("unexpected end");
            }
            char c = s.charAt(i);
            switch (c) {
                case '{':
                    return object();
                case '[':
                    return array();
                case '"':
                    return string();
                case 't':
                    return literal("true", Boolean.TRUE);
                case 'f':
                    return literal("false", Boolean.FALSE);
                case 'n':
                    return literal("null", null);
                default:
                    if (c == '-' || c >= '0' && c <= '9') {
                        return number();
                    }
                    throw error("unexpected character '" + c + "'");
            }
        }

        Object literal(String word, Object v) {
            if (!s.startsWith(word, i)) {
                throw error("expected " + word);
            }
            i += word.length();
            return v;
        }

        Map<String, Object> object() {
            Map<String, Object> m = new LinkedHashMap<>();
            if (!empty('}')) {
                do {
                    space();
                    if (i >= s.length() || s.charAt(i) != '"') {
                        throw error("expected a key");
                    }
                    String k = string();
                    space();
                    expect(':');
                    space();
                    m.put(k, value());
                    space();
                } while (skip(','));
                expect('}');
            }
            return m;
        }

        List<Object> array() {
            List<Object> l = new ArrayList<>();
            if (!empty(']')) {
                do {
                    space();
                    l.add(value());
                    space();
                } while (skip(','));
                expect(']');
            }
            return l;
        }

        /**
         * Steps over an object's or an array's opening bracket and the
         * space after it, and over close if that follows: says whether it
         * is empty.
         */
        boolean empty(char close) {
            i++;
            space();
            return skip(close);
        }

        /** Steps over c when it is the next character; says whether it was. */
        boolean skip(char c) {
            if (i < s.length() && s.charAt(i) == c) {
                i++;
                return true;
            }
            return false;
        }

        void expect(char c) {
            if (!skip(c)) {
                throw error("expected '" + c + "'");
            }
        }

        String string() {
            StringBuilder b = new StringBuilder();
            i++;
            while (true) {
                if (i >= s.length()) {
                    throw error("unterminated string");
                }
                char c = s.charAt(i++);
                if (c == '"') {
                    return b.toString();
                }
                if (c != '\\') {
                    b.append(c);
                    continue;
                }
                if (i >= s.length()) {
                    throw error("unterminated escape");
                }
                char e = s.charAt(i++);
                switch (e) {
                    case '"', '\\', '/' -> b.append(e);
                    case 'b' -> b.append('\b');
                    case 'f' -> b.append('\f');
                    case 'n' -> b.append('\n');
                    case 'r' -> b.append('\r');
                    case 't' -> b.append('\t');
                    case 'u' -> {
                        if (i + 4 > s.length()) {
                            throw error("short \\u escape");
                        }
                        try {
                            b.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                        } catch (NumberFormatException x) {
                            throw error("bad \\u escape");
                        }
                        i += 4;
                    }
                    default -> throw error("bad escape \\" + e);
                }
            }
        }

        Object number() {
            int start = i;
            if (s.charAt(i) == '-') {
                i++;
            }
            boolean integral = true;
            while (i < s.length()) {
                char c = s.charAt(i);
                if (c >= '0' && c <= '9') {
                    i++;
                } else if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
                    integral = false;
                    i++;
                } else {
                    break;
                }
            }
            String n = s.substring(start, i);
            try {
                if (integral) {
                    try {
                        return Long.parseLong(n);
                    } catch (NumberFormatException tooLarge) {
                        return Double.parseDouble(n);
                    }
                }
                return Double.parseDouble(n);
            } catch (NumberFormatException x) {
                throw error("bad number " + n);
            }
        }
    }
}

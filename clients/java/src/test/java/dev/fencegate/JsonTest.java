package dev.fencegate;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertSame;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.sql.SQLException;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import org.junit.Test;

/** The JSON of payloads and DETAILs, without a database. */
public class JsonTest {
    @Test
    public void writesPayloads() {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("to", List.of("a@example.com", "b@example.com"));
        m.put("subject", "Line\n\"quoted\" \\ \u0001 ünï");
        m.put("n", 42L);
        m.put("ok", true);
        m.put("none", null);
        m.put("arr", new Object[] {1, 2.5});
        String s = Json.write(m);
        assertEquals("{\"to\":[\"a@example.com\",\"b@example.com\"],\"subject\":\"Line\\n\\\"quoted\\\" \\\\ \\u0001 ünï\","
                + "\"n\":42,\"ok\":true,\"none\":null,\"arr\":[1,2.5]}", s);
        assertEquals(m.get("subject"), ((Map<?, ?>) Json.parse(s)).get("subject"));
    }

    @Test
    public void refusesWhatHasNoJsonForm() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> Json.write(Map.of("to", Arrays.asList("a@example.com", new Object()))));
        assertTrue(e.getMessage(), e.getMessage().startsWith("payload.to[1]: "));
        e = assertThrows(IllegalArgumentException.class, () -> Json.write(Map.of("x", Double.NaN)));
        assertTrue(e.getMessage(), e.getMessage().startsWith("payload.x: "));
    }

    @Test
    public void parsesDetails() {
        Object v = Json.parse(" {\"code\": \"stale_epoch\", \"resource\": \"a\\u00e9\\\"b\", \"supplied_epoch\": 3,"
                + " \"current_epoch\": 9007199254740992, \"reason\": null, \"x\": [1.5e3, false, {}], \"y\": [ ]} ");
        Map<?, ?> m = (Map<?, ?>) v;
        assertEquals("stale_epoch", m.get("code"));
        assertEquals("a\u00e9\"b", m.get("resource"));
        assertEquals(3L, m.get("supplied_epoch"));
        assertEquals(9007199254740992L, m.get("current_epoch"));
        assertTrue(m.containsKey("reason"));
        assertEquals(List.of(1500.0, false, Map.of()), m.get("x"));
        assertEquals(List.of(), m.get("y"));
        for (String bad : new String[] {"", "{", "{\"a\" 1}", "[1,]", "\"x", "{} x", "tru"}) {
            assertThrows(bad, IllegalArgumentException.class, () -> Json.parse(bad));
        }
    }

    @Test
    public void otherErrorsStayAsTheyAre() {
        SQLException e = new SQLException("relation does not exist", "42P01");
        assertSame(e, FencegateException.translate(e));
        // A ZF code without the server's message (another driver): typed all the same.
        SQLException t = FencegateException.translate(new SQLException("stale", "ZF002"));
        assertTrue(t.getClass().getName(), t instanceof StaleEpochException);
        assertEquals("ZF002", t.getSQLState());
    }
}

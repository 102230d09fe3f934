package dev.fencegate;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.time.Duration;
import java.util.Map;

import org.junit.After;
import org.junit.Before;
import org.junit.Test;
import org.junit.function.ThrowingRunnable;

/**
 * The client against the real PostgreSQL of the test run, as a role granted
 * only docs/sql.md's interface: the business row and the intent commit
 * together, a lost response retried is a duplicate, and each refusal is its
 * typed exception with the DETAIL's fields.
 */
public class ClientTest {
    private static final Duration TTL = Duration.ofMinutes(1);

    /** Each test's resource of its own, and a worker's connection and client. */
    private String r;
    private Connection c;
    private Fencegate fg;

    @Before
    public void open() throws SQLException {
        r = TestEnv.resource("invoices");
        c = TestEnv.worker();
        fg = TestEnv.client(c);
    }

    @After
    public void close() throws SQLException {
        c.close();
    }

    private static void invoice(Connection c, long id, String email) throws SQLException {
        try (PreparedStatement st = c.prepareStatement("INSERT INTO invoices (id, email) VALUES (?, ?) ON CONFLICT (id) DO NOTHING")) {
            st.setLong(1, id);
            st.setString(2, email);
            st.executeUpdate();
        }
    }

    /** An acquire, committed (a grant that rolls back was never made). */
    private static Lease acquire(Fencegate fg, Connection c, String resource, String holder) throws SQLException {
        Lease l = fg.acquire(c, resource, holder, TTL);
        c.commit();
        return l;
    }

    /**
     * Runs call, which the interface must refuse with type, SQLSTATE state
     * and DETAIL code, and rolls back the transaction the refusal aborted.
     */
    private static <T extends FencegateException> T refused(Connection c, Class<T> type, String state, String code,
            ThrowingRunnable call) throws SQLException {
        T e = assertThrows(type, call);
        c.rollback();
        assertEquals(state, e.getSQLState());
        assertEquals(code, e.code());
        return e;
    }

    @Test
    public void connectChecksTheInterfaceVersion() throws Exception {
        assertEquals(TestEnv.schema(), Fencegate.connect(c, TestEnv.schema()).schema());
        c.commit();
        InterfaceVersionException e = assertThrows(InterfaceVersionException.class, () -> Fencegate.connect(c, "no_such_schema"));
        assertEquals(0, e.found());
        assertTrue(e.getMessage(), e.getMessage().contains("gateway migrate --schema no_such_schema"));
        // The server's SQLSTATE, as every FencegateException carries (it was null).
        assertEquals("3F000", e.getSQLState());
        c.rollback();
        IllegalArgumentException bad = assertThrows(IllegalArgumentException.class, () -> Fencegate.connect(c, "Billing\"; DROP"));
        assertTrue(bad.getMessage(), bad.getMessage().startsWith("schema: "));
    }

    @Test
    public void theBusinessRowAndTheIntentCommitTogether() throws Exception {
        Lease l = acquire(fg, c, r, "worker-a");
        invoice(c, 5001, "alice@example.com");
        EnqueueResult res = fg.enqueue(c, Intent.of(r, l.epoch(), "invoice-5001", "email",
                TestEnv.email("alice@example.com", "Invoice 5001")));
        assertEquals(EnqueueResult.Outcome.CREATED, res.outcome());
        assertEquals("pending", res.status());
        assertEquals(l.epoch(), res.currentEpoch());
        assertEquals("not committed yet", 0, TestEnv.count("SELECT count(*) FROM fencegate.intents WHERE intent_id = ?", res.intentId()));
        c.commit();
        assertEquals(1, TestEnv.count("SELECT count(*) FROM fencegate.intents WHERE intent_id = ? AND resource_id = ? AND epoch = ?"
                + " AND idempotency_key = ?", res.intentId(), r, l.epoch(), r + "/invoice-5001"));
        assertEquals(1, TestEnv.count("SELECT count(*) FROM invoices WHERE id = 5001"));

        // Rolled back after the enqueue: neither the invoice nor the intent.
        invoice(c, 5002, "bob@example.com");
        EnqueueResult gone = fg.enqueue(c, Intent.of(r, l.epoch(), "invoice-5002", "email",
                TestEnv.email("bob@example.com", "Invoice 5002")).withKey("invoice-5002-mail").withFence("commit"));
        assertEquals(EnqueueResult.Outcome.CREATED, gone.outcome());
        c.rollback();
        assertEquals(0, TestEnv.count("SELECT count(*) FROM invoices WHERE id = 5002")
                + TestEnv.count("SELECT count(*) FROM fencegate.intents WHERE operation_id = 'invoice-5002'"));
    }

    @Test
    public void aLostResponseRetriedIsADuplicateNotASecondIntent() throws Exception {
        String payload = TestEnv.email("carol@example.com", "Invoice 5003");
        Lease l = acquire(fg, c, r, "worker-a");
        invoice(c, 5003, "carol@example.com");
        long first = fg.enqueue(c, Intent.of(r, l.epoch(), "invoice-5003", "email", payload)).intentId();
        c.commit();
        // The answer to this COMMIT never reached the worker: it cannot
        // know the intent is stored, and runs the whole transaction again
        // (here on a new connection, as after a reconnect).
        c.close();
        c = TestEnv.worker();
        fg = TestEnv.client(c);
        invoice(c, 5003, "carol@example.com");
        EnqueueResult again = fg.enqueue(c, Intent.of(r, l.epoch(), "invoice-5003", "email", payload));
        c.commit();
        assertEquals(EnqueueResult.Outcome.DUPLICATE, again.outcome());
        assertTrue(again.duplicate());
        assertEquals(first, again.intentId());
        assertEquals(1, TestEnv.count("SELECT count(*) FROM fencegate.intents WHERE resource_id = ? AND operation_id = 'invoice-5003'", r));

        // Also after a takeover: a committed intent is not taken back.
        Lease newer = acquire(fg, c, r, "worker-a");
        assertTrue(newer.epoch() > l.epoch());
        EnqueueResult late = fg.enqueue(c, Intent.of(r, l.epoch(), "invoice-5003", "email", payload));
        c.commit();
        assertEquals(EnqueueResult.Outcome.DUPLICATE, late.outcome());
        assertEquals(first, late.intentId());
        assertEquals(newer.epoch(), late.currentEpoch());
    }

    @Test
    public void aStaleEpochIsRefusedAndNothingOfTheTransactionIsStored() throws Exception {
        Lease old = acquire(fg, c, r, "worker-a");
        Lease current = acquire(fg, c, r, "worker-a"); // a new grant: the first epoch is fenced
        invoice(c, 5004, "dave@example.com");
        StaleEpochException e = refused(c, StaleEpochException.class, "ZF002", "stale_epoch",
                () -> fg.enqueue(c, Intent.of(r, old.epoch(), "invoice-5004", "email", TestEnv.email("dave@example.com", "Invoice 5004"))));
        assertEquals(r, e.resource());
        assertEquals(old.epoch(), e.suppliedEpoch());
        assertEquals(current.epoch(), e.currentEpoch());
        assertNull(e.reason());
        assertTrue(e.getMessage(), e.getMessage().startsWith("stale epoch: resource \"" + r + "\" is at epoch " + current.epoch()));
        assertTrue(e instanceof SQLException);
        assertEquals(0, TestEnv.count("SELECT count(*) FROM invoices WHERE id = 5004")
                + TestEnv.count("SELECT count(*) FROM fencegate.intents WHERE resource_id = ?", r));

        // renew and release of a lost lease: ZF002 with the reason.
        StaleEpochException renew = assertThrows(StaleEpochException.class, () -> fg.renew(c, old));
        c.rollback();
        assertEquals(current.epoch(), renew.currentEpoch());
        fg.release(c, current);
        c.commit();
        StaleEpochException released = assertThrows(StaleEpochException.class, () -> fg.renew(c, current));
        c.rollback();
        assertEquals("the lease was released", released.reason());
        assertEquals(current.epoch(), released.suppliedEpoch());
        fg.release(c, current); // again: succeeds
        c.commit();
    }

    @Test
    public void aConflictNamesTheIntent() throws Exception {
        Lease l = acquire(fg, c, r, "worker-a");
        long id = fg.enqueue(c, Intent.of(r, l.epoch(), "invoice-5005", "email", TestEnv.email("erin@example.com", "Invoice 5005"))).intentId();
        c.commit();
        ConflictException e = refused(c, ConflictException.class, "ZF003", "conflict",
                () -> fg.enqueue(c, Intent.of(r, l.epoch(), "invoice-5005", "email", TestEnv.email("erin@example.com", "Another subject"))));
        assertEquals(id, e.intentId());
        assertEquals("invoice-5005", e.operationId());
        assertEquals(r, e.resource());
    }

    @Test
    public void invalidInputNamesTheField() throws Exception {
        Lease l = acquire(fg, c, r, "worker-a");
        Map<String, Intent> cases = Map.of(
                "payload.to[0]", Intent.of(r, l.epoch(), "op-1", "email", TestEnv.email("not an address", "x")),
                "epoch", Intent.of(r, 0, "op-2", "email", TestEnv.email("a@example.com", "x")),
                "payload", Intent.of(r, l.epoch(), "op-3", "email", (String) null),
                "fence", Intent.of(r, l.epoch(), "op-4", "email", TestEnv.email("a@example.com", "x")).withFence("later"),
                "operation_id", Intent.of(r, l.epoch(), "op\u202e5", "email", TestEnv.email("a@example.com", "x")));
        for (Map.Entry<String, Intent> k : cases.entrySet()) {
            InvalidInputException e = assertThrows(k.getKey(), InvalidInputException.class, () -> fg.enqueue(c, k.getValue()));
            c.rollback();
            assertEquals("ZF004", e.getSQLState());
            assertEquals("invalid_input", e.code());
            assertEquals(e.getMessage(), k.getKey(), e.field());
        }
        InvalidInputException ttl = assertThrows(InvalidInputException.class,
                () -> fg.acquire(c, r, "worker-a", Duration.ofMillis(1)));
        c.rollback();
        assertEquals("ttl", ttl.field());
        InvalidInputException huge = assertThrows(InvalidInputException.class,
                () -> fg.acquire(c, r, "worker-a", Duration.ofDays(365_000_000L)));
        c.rollback();
        assertEquals("ttl", huge.field());
        assertEquals(0, TestEnv.count("SELECT count(*) FROM fencegate.intents WHERE resource_id = ?", r));
    }

    @Test
    public void aLiveLeaseOfAnotherHolderIsHeld() throws Exception {
        Lease a = acquire(fg, c, r, "worker-a");
        LeaseHeldException e = refused(c, LeaseHeldException.class, "ZF005", "lease_held",
                () -> fg.acquire(c, r, "worker-b", TTL));
        assertEquals(r, e.resource());
        assertEquals("worker-a", e.holder());
        assertEquals(a.epoch(), e.currentEpoch());
        assertEquals(a.expiresAt(), e.expiresAt());
    }

    @Test
    public void underARuleSetTheRoleMustBeAllowed() throws Exception {
        // Connections of two other roles, in a database with a rule set.
        try (Connection c = TestEnv.mapped()) {
            Fencegate fg = TestEnv.client(c);
            String r = TestEnv.resource("invoices");
            Lease l = acquire(fg, c, r, "worker-a"); // within its principal's scope
            ForbiddenException res = refused(c, ForbiddenException.class, "ZF007", "forbidden",
                    () -> fg.acquire(c, TestEnv.resource("reports"), "worker-a", TTL));
            assertEquals("resource", res.field());
            assertEquals("billing", res.principal());
            ForbiddenException kind = assertThrows(ForbiddenException.class, () -> fg.enqueue(c, Intent.of(r, l.epoch(), "hook-1",
                    "webhook", Map.of("url", "https://hooks.example.com/x", "body", Map.of()))));
            c.rollback();
            assertEquals("kind", kind.field());
        }
        try (Connection c = TestEnv.unmapped()) {
            Fencegate fg = TestEnv.client(c);
            NoPrincipalException e = refused(c, NoPrincipalException.class, "ZF006", "no_principal",
                    () -> fg.acquire(c, TestEnv.resource("invoices"), "worker-a", TTL));
            assertEquals("role", e.field());
            assertTrue(e.detail().toString(), e.detail().get("role") instanceof String);
        }
    }

    /**
     * A lone surrogate (half of a pair, as cutting a string at a UTF-16
     * index through an emoji leaves) is refused naming the field, nothing
     * sent: the driver sent it as "?", so "a" + U+D800 and "a" + U+D801 were one
     * operation id and the second was answered DUPLICATE, its effect
     * dropped; in a payload it was stored as "?".
     */
    @Test
    public void aLoneSurrogateIsRefusedNamingTheField() throws Exception {
        Lease l = acquire(fg, c, r, "worker-a");
        String email = TestEnv.email("a@example.com", "x");
        Map<String, ThrowingRunnable> cases = new java.util.LinkedHashMap<>();
        cases.put("operation_id", () -> fg.enqueue(c, Intent.of(r, l.epoch(), "a\ud800", "email", email)));
        cases.put("resource", () -> fg.enqueue(c, Intent.of(r + "\udc00", l.epoch(), "op", "email", email)));
        cases.put("key", () -> fg.enqueue(c, Intent.of(r, l.epoch(), "op", "email", email).withKey("k\ud83d")));
        cases.put("payload.text", () -> fg.enqueue(c, Intent.of(r, l.epoch(), "op", "email",
                Map.of("to", "a@example.com", "from", "b@example.com", "subject", "s", "text", "a\ud800b"))));
        cases.put("payload.subject", () -> fg.enqueue(c, Intent.of(r, l.epoch(), "op", "email",
                "{\"to\": \"a@example.com\", \"from\": \"b@example.com\", \"subject\": \"\\udc00\", \"text\": \"t\"}")));
        cases.put("holder", () -> fg.acquire(c, r, "w\ud800", TTL));
        for (Map.Entry<String, ThrowingRunnable> k : cases.entrySet()) {
            InvalidInputException e = assertThrows(k.getKey(), InvalidInputException.class, k.getValue());
            assertEquals(k.getKey(), k.getKey(), e.field());
            assertEquals("ZF004", e.getSQLState());
            assertNull("refused before anything was sent", e.getCause());
        }
        c.commit(); // nothing was sent: the transaction is not aborted
        assertEquals(0, TestEnv.count("SELECT count(*) FROM fencegate.intents WHERE resource_id LIKE ?", r + "%"));
        // A pair is text.
        EnqueueResult ok = fg.enqueue(c, Intent.of(r, l.epoch(), "a\ud83d\ude00", "email",
                Map.of("to", "a@example.com", "from", "b@example.com", "subject", "\ud83d\ude00", "text", "t")));
        c.commit();
        assertEquals(EnqueueResult.Outcome.CREATED, ok.outcome());
        assertEquals(1, TestEnv.count("SELECT count(*) FROM fencegate.intents WHERE operation_id = ?", "a\ud83d\ude00"));
    }
}

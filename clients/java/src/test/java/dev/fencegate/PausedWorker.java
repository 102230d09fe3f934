package dev.fencegate;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.SQLException;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * The article's worker, for clients/java/java_test.go, which pauses it
 * (SIGSTOP) past its lease's TTL, lets another worker take over, steps the
 * wall clock this JVM sees back by an hour (libfaketime), and resumes it
 * (SIGCONT). Arguments: resource, holder, TTL in milliseconds. It prints
 * one JSON object per step:
 *
 * <ol>
 * <li>holding: the lease, its keeper, and a first invoice and its email
 *     committed with the epoch; then it waits for a line on stdin (the
 *     pause comes here);
 * <li>resumed: what its keeper says the moment it runs again;
 * <li>write: the write it makes anyway with the old epoch, as a worker
 *     paused between its check and its write would: the invoice and the
 *     email in one transaction, refused by the epoch, nothing stored.
 * </ol>
 */
public final class PausedWorker {
    private PausedWorker() {}

    public static void main(String[] args) throws Exception {
        String resource = args[0];
        String holder = args[1];
        Duration ttl = Duration.ofMillis(Long.parseLong(args[2]));
        String url = TestEnv.env("FENCEGATE_TEST_WORKER_URL");
        try (Connection conn = DriverManager.getConnection(url)) {
            conn.setAutoCommit(false);
            Fencegate fg = Fencegate.connect(conn, TestEnv.schema());
            conn.commit();
            // The keeper renews on connections of its own, as from a pool.
            long holdStart = System.nanoTime();
            try (Keeper keeper = Keeper.hold(fg, () -> DriverManager.getConnection(url), resource, holder, KeeperConfig.of(ttl))) {
                long epoch = keeper.epoch();
                EnqueueResult first = send(conn, fg, resource, epoch, 1001);
                print("state", "holding", "epoch", epoch, "outcome", first.outcome().toString(), "still_valid", keeper.stillValid(),
                        "first_write_ms", (System.nanoTime() - holdStart) / 1_000_000, "wall_ms", System.currentTimeMillis());

                BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
                if (in.readLine() == null) {
                    throw new IllegalStateException("stdin closed before the resume line");
                }
                // Resumed: the first thing a worker does before it writes.
                boolean valid = keeper.stillValid();
                Exception why = keeper.err();
                print("state", "resumed", "still_valid", valid, "reason", why == null ? null : why.toString(),
                        "wall_ms", System.currentTimeMillis());

                Map<String, Object> out = new LinkedHashMap<>();
                out.put("state", "write");
                try {
                    EnqueueResult late = send(conn, fg, resource, epoch, 1002);
                    out.put("outcome", late.outcome().toString());
                } catch (StaleEpochException e) {
                    conn.rollback();
                    out.put("exception", e.getClass().getSimpleName());
                    out.put("sqlstate", e.getSQLState());
                    out.put("supplied_epoch", e.suppliedEpoch());
                    out.put("current_epoch", e.currentEpoch());
                } catch (SQLException e) {
                    conn.rollback();
                    out.put("exception", e.getClass().getName());
                    out.put("sqlstate", e.getSQLState());
                    out.put("message", e.getMessage());
                }
                Exception done = keeper.done().get(20, TimeUnit.SECONDS);
                out.put("done", done.getClass().getSimpleName() + ": " + done.getMessage());
                print(out);
            }
        }
    }

    /** The invoice and its email, in one transaction, with epoch. */
    private static EnqueueResult send(Connection conn, Fencegate fg, String resource, long epoch, long invoice)
            throws SQLException {
        try (PreparedStatement st = conn.prepareStatement("INSERT INTO invoices (id, email) VALUES (?, ?)")) {
            st.setLong(1, invoice);
            st.setString(2, "alice@example.com");
            st.executeUpdate();
        }
        EnqueueResult r = fg.enqueue(conn, Intent.of(resource, epoch, "invoice-" + invoice, "email",
                TestEnv.email("alice@example.com", "Invoice " + invoice)));
        conn.commit();
        return r;
    }

    private static void print(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < kv.length; i += 2) {
            m.put((String) kv[i], kv[i + 1]);
        }
        print(m);
    }

    private static void print(Map<String, Object> m) {
        System.out.println(Json.write(m));
        System.out.flush();
    }
}

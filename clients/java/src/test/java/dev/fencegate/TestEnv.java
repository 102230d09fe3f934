package dev.fencegate;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.UUID;

/**
 * The database of the test run, from clients/java/java_test.go: JDBC URLs
 * of a worker role granted only docs/sql.md's interface (and its own
 * invoices table), of the database's owner (to count what was stored),
 * and of two roles of a second database where a rule set is in force.
 */
final class TestEnv {
    private TestEnv() {}

    static String env(String name) {
        String v = System.getenv(name);
        if (v == null || v.isEmpty()) {
            throw new IllegalStateException(name + " is not set: run these tests with go test ./clients/java/ (scripts/test.sh)");
        }
        return v;
    }

    static String schema() {
        return env("FENCEGATE_TEST_SCHEMA");
    }

    /** A connection as the worker role, auto-commit off. */
    static Connection worker() throws SQLException {
        return open("FENCEGATE_TEST_WORKER_URL");
    }

    /** A connection as the role mapped to principal "billing" (resources invoices*, kind email). */
    static Connection mapped() throws SQLException {
        return open("FENCEGATE_TEST_MAPPED_URL");
    }

    /** A connection as a role granted the interface but mapped to no principal. */
    static Connection unmapped() throws SQLException {
        return open("FENCEGATE_TEST_UNMAPPED_URL");
    }

    static Connection open(String var) throws SQLException {
        Connection c = DriverManager.getConnection(env(var));
        c.setAutoCommit(false);
        return c;
    }

    static Fencegate client(Connection c) throws SQLException {
        Fencegate fg = Fencegate.connect(c, schema());
        c.commit();
        return fg;
    }

    /** A resource of this test's own. */
    static String resource(String prefix) {
        return prefix + "-" + UUID.randomUUID().toString().substring(0, 8);
    }

    /** count(*) of query (written for schema fencegate), as the database's owner. */
    static long count(String query, Object... args) throws SQLException {
        String q = query.replace("fencegate.", "\"" + schema() + "\".");
        try (Connection c = DriverManager.getConnection(env("FENCEGATE_TEST_ADMIN_URL"));
                PreparedStatement st = c.prepareStatement(q)) {
            for (int i = 0; i < args.length; i++) {
                st.setObject(i + 1, args[i]);
            }
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                return rs.getLong(1);
            }
        }
    }

    static String email(String to, String subject) {
        return Json.write(java.util.Map.of("to", to, "from", "billing@example.com", "subject", subject,
                "text", "Your invoice is ready."));
    }
}

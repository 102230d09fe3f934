package dev.fencegate;

import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Types;
import java.time.Duration;
import java.time.Instant;
import java.time.OffsetDateTime;
import java.util.regex.Pattern;

/**
 * fencegate's SQL interface, version 1 (docs/sql.md), for JDBC: enqueue an
 * intent fenced by a lease's epoch, and acquire, renew and release leases.
 *
 * <p>Each call runs one statement on the connection it is given, in that
 * connection's transaction: with auto-commit off, the caller's own writes
 * (the business row) and the intent commit or roll back together, and the
 * caller commits. A refusal throws the {@link FencegateException} of its
 * SQLSTATE; like any error it aborts the transaction, which the caller
 * rolls back. The object holds no connection and is safe to share between
 * threads.
 *
 * <pre>{@code
 * Fencegate fg = Fencegate.connect(conn);            // checks interface_version() = 1
 * conn.setAutoCommit(false);
 * ... INSERT INTO invoices ...
 * fg.enqueue(conn, Intent.of("invoices", keeper.epoch(), "invoice-1001", "email", payload));
 * conn.commit();
 * }</pre>
 */
public final class Fencegate {
    /** The schema {@code gateway migrate} installs into by default. */
    public static final String DEFAULT_SCHEMA = "fencegate";
    /** The major version of the SQL interface this client speaks. */
    public static final int INTERFACE_VERSION = 1;

    /** A schema name as {@code gateway migrate --schema} takes it. */
    private static final Pattern SCHEMA = Pattern.compile("[a-z_][a-z0-9_]*");
    private static final int SCHEMA_MAX = 40;

    private final String schema;
    private final String enqueueSql;
    private final String acquireSql;
    private final String renewSql;
    private final String releaseSql;

    private Fencegate(String schema) {
        if (schema == null || !SCHEMA.matcher(schema).matches()
                || schema.getBytes(StandardCharsets.UTF_8).length > SCHEMA_MAX) {
            throw new IllegalArgumentException("schema: must be a lower-case identifier of at most " + SCHEMA_MAX
                    + " bytes ([a-z_][a-z0-9_]*), got " + (schema == null ? "null" : "\"" + schema + "\""));
        }
        this.schema = schema;
        // Quoted, and checked above: the name goes into the statements' text.
        String s = "\"" + schema + "\".";
        // Named arguments, as docs/sql.md advises: new optional parameters
        // may be added at the end of a major version.
        enqueueSql = "SELECT outcome, intent_id, status, current_epoch FROM " + s + "enqueue(resource => ?, epoch => ?,"
                + " operation_id => ?, kind => ?, payload => ?::jsonb, key => ?, fence => ?)";
        acquireSql = "SELECT epoch, expires_at FROM " + s + "acquire(resource => ?, holder => ?,"
                + " ttl => ?::bigint * interval '1 microsecond', failover_epoch_jump => ?)";
        renewSql = "SELECT " + s + "renew(resource => ?, holder => ?, epoch => ?, ttl => ?::bigint * interval '1 microsecond')";
        releaseSql = "SELECT " + s + "release(resource => ?, holder => ?, epoch => ?)";
    }

    /** {@link #connect(Connection, String)} for the default schema, {@code fencegate}. */
    public static Fencegate connect(Connection conn) throws SQLException {
        return connect(conn, DEFAULT_SCHEMA);
    }

    /**
     * A client of the SQL interface in schema ({@code gateway migrate
     * --schema}), after checking on conn that the schema's
     * {@code interface_version()} is {@value #INTERFACE_VERSION}. The check
     * is one SELECT in conn's transaction; conn is not kept.
     *
     * @throws IllegalArgumentException when schema is not a schema name
     * @throws InterfaceVersionException when the schema has no SQL interface,
     *     or another version of it
     * @throws SQLException when the database cannot be asked (a role without
     *     USAGE on the schema is refused here)
     */
    public static Fencegate connect(Connection conn, String schema) throws SQLException {
        Fencegate fg = new Fencegate(schema);
        int version;
        try (PreparedStatement st = conn.prepareStatement("SELECT \"" + schema + "\".interface_version()");
                ResultSet rs = st.executeQuery()) {
            rs.next();
            version = rs.getInt(1);
        } catch (SQLException e) {
            // undefined_function, invalid_schema_name: nothing migrated there.
            if ("42883".equals(e.getSQLState()) || "3F000".equals(e.getSQLState())) {
                throw new InterfaceVersionException("schema " + schema + " has no fencegate SQL interface ("
                        + e.getMessage() + "): run gateway migrate --schema " + schema + ", or pass the schema it used", 0, e);
            }
            throw e;
        }
        if (version != INTERFACE_VERSION) {
            throw new InterfaceVersionException("schema " + schema + " has version " + version
                    + " of fencegate's SQL interface; this client speaks version " + INTERFACE_VERSION, version, null);
        }
        return fg;
    }

    /** The schema of fencegate's tables and functions. */
    public String schema() {
        return schema;
    }

    /**
     * Enqueues intent in conn's transaction ({@code fencegate.enqueue}):
     * created, or a duplicate of the operation id committed before with the
     * same content. The resource's control row stays locked until that
     * transaction ends: keep it short.
     *
     * @throws StaleEpochException (ZF002) the epoch is not the resource's
     *     current one: roll back, nothing of the transaction may commit
     * @throws ConflictException (ZF003) the operation id was used with other content
     * @throws InvalidInputException (ZF004) a field is missing or invalid
     * @throws ForbiddenException (ZF007), {@link NoPrincipalException} (ZF006) under a rule set
     * @throws SQLException any other error of the database or the driver
     */
    public EnqueueResult enqueue(Connection conn, Intent intent) throws SQLException {
        text("resource", intent.resource());
        text("operation_id", intent.operationId());
        text("kind", intent.kind());
        payload(intent.payload());
        text("key", intent.key());
        text("fence", intent.fence());
        try (PreparedStatement st = conn.prepareStatement(enqueueSql)) {
            st.setString(1, intent.resource());
            st.setLong(2, intent.epoch());
            st.setString(3, intent.operationId());
            st.setString(4, intent.kind());
            setText(st, 5, intent.payload());
            setText(st, 6, intent.key());
            setText(st, 7, intent.fence());
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                return new EnqueueResult(EnqueueResult.Outcome.of(rs.getString(1)), rs.getLong(2), rs.getString(3),
                        rs.getLong(4));
            }
        } catch (SQLException e) {
            throw FencegateException.translate(e);
        }
    }

    /** {@link #acquire(Connection, String, String, Duration, long)} with the default failover epoch jump, 1000000. */
    public Lease acquire(Connection conn, String resource, String holder, Duration ttl) throws SQLException {
        return acquire(conn, resource, holder, ttl, 1_000_000L);
    }

    /**
     * Grants holder a lease of ttl on resource, with a new, higher epoch
     * ({@code fencegate.acquire}). Commit conn's transaction before using the
     * epoch: a grant that rolls back was never made. {@link Keeper#hold}
     * does both and keeps the lease.
     *
     * @param failoverEpochJump the gateway's {@code --failover-epoch-jump}, if changed
     * @throws LeaseHeldException (ZF005) another holder's lease is live
     * @throws InvalidInputException (ZF004) ttl is not between 10ms and 24h, or an id is invalid
     * @throws EpochAuthorityException (ZF001) the database is not the epoch authority on record
     * @throws SQLException SQLSTATE 55P03 when the control row stayed locked 5 s (retry), or any other error
     */
    public Lease acquire(Connection conn, String resource, String holder, Duration ttl, long failoverEpochJump)
            throws SQLException {
        text("resource", resource);
        text("holder", holder);
        try (PreparedStatement st = conn.prepareStatement(acquireSql)) {
            st.setString(1, resource);
            st.setString(2, holder);
            setMicros(st, 3, ttl);
            st.setLong(4, failoverEpochJump);
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                return new Lease(resource, holder, rs.getLong(1), instant(rs, 2), ttl);
            }
        } catch (SQLException e) {
            throw FencegateException.translate(e);
        }
    }

    /**
     * Extends holder's lease by ttl from now, keeping its epoch
     * ({@code fencegate.renew}); returns the new expiry. In conn's transaction:
     * it counts once committed.
     *
     * @throws StaleEpochException (ZF002) the epoch is no longer holder's
     *     ({@link StaleEpochException#reason()} says why)
     */
    public Instant renew(Connection conn, String resource, String holder, long epoch, Duration ttl) throws SQLException {
        return renew(conn, resource, holder, epoch, ttl, null);
    }

    /** A look at a statement before it runs: a Keeper's, to bound and cancel its renewal. */
    interface StatementHook {
        void before(PreparedStatement st) throws SQLException;
    }

    Instant renew(Connection conn, String resource, String holder, long epoch, Duration ttl, StatementHook hook)
            throws SQLException {
        text("resource", resource);
        text("holder", holder);
        try (PreparedStatement st = conn.prepareStatement(renewSql)) {
            if (hook != null) {
                hook.before(st);
            }
            st.setString(1, resource);
            st.setString(2, holder);
            st.setLong(3, epoch);
            setMicros(st, 4, ttl);
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
                return instant(rs, 1);
            }
        } catch (SQLException e) {
            throw FencegateException.translate(e);
        }
    }

    /** Renews lease with its ttl; returns it with the new expiry. */
    public Lease renew(Connection conn, Lease lease) throws SQLException {
        Instant exp = renew(conn, lease.resource(), lease.holder(), lease.epoch(), lease.ttl());
        return new Lease(lease.resource(), lease.holder(), lease.epoch(), exp, lease.ttl());
    }

    /**
     * Frees holder's lease ({@code fencegate.release}); the epoch stays, so
     * the next acquire gets a higher one. Releasing a lease of the current
     * epoch that was released already succeeds.
     *
     * @throws StaleEpochException (ZF002) the epoch is no longer current
     */
    public void release(Connection conn, String resource, String holder, long epoch) throws SQLException {
        text("resource", resource);
        text("holder", holder);
        try (PreparedStatement st = conn.prepareStatement(releaseSql)) {
            st.setString(1, resource);
            st.setString(2, holder);
            st.setLong(3, epoch);
            try (ResultSet rs = st.executeQuery()) {
                rs.next();
            }
        } catch (SQLException e) {
            throw FencegateException.translate(e);
        }
    }

    /** Releases lease. */
    public void release(Connection conn, Lease lease) throws SQLException {
        release(conn, lease.resource(), lease.holder(), lease.epoch());
    }

    /**
     * Refuses a string with a lone surrogate (half of a pair, as cutting a
     * string at a UTF-16 index through an emoji leaves), naming field: the
     * driver would send it as {@code ?}, so that two operation ids became
     * one and the second was answered "duplicate". Nothing is sent.
     */
    static void text(String field, String v) throws InvalidInputException {
        int i = loneSurrogate(v);
        if (i >= 0) {
            throw invalid(field, String.format("a lone surrogate (U+%04X) at index %d is not text", (int) v.charAt(i), i));
        }
    }

    /** The index of the first lone surrogate of v, or -1. */
    static int loneSurrogate(CharSequence v) {
        if (v == null) {
            return -1;
        }
        for (int i = 0; i < v.length(); i++) {
            char c = v.charAt(i);
            if (Character.isHighSurrogate(c) && i + 1 < v.length() && Character.isLowSurrogate(v.charAt(i + 1))) {
                i++;
            } else if (Character.isSurrogate(c)) {
                return i;
            }
        }
        return -1;
    }

    /**
     * Refuses a payload whose text, or a string in it (written as a JSON
     * escape too), has a lone surrogate, naming where
     * ({@code payload.text}). JSON text that does not parse is left to the
     * database (22P02).
     */
    static void payload(String json) throws InvalidInputException {
        if (json == null) {
            return;
        }
        boolean suspect = false;
        for (int i = 0; i < json.length() && !suspect; i++) {
            char c = json.charAt(i);
            suspect = Character.isSurrogate(c)
                    || c == '\\' && i + 2 < json.length() && json.charAt(i + 1) == 'u' && (json.charAt(i + 2) | 0x20) == 'd';
        }
        if (!suspect) {
            return;
        }
        Object v;
        try {
            v = Json.parse(json);
        } catch (IllegalArgumentException notJson) {
            text("payload", json);
            return;
        }
        walk(v, "payload");
    }

    private static void walk(Object v, String path) throws InvalidInputException {
        if (v instanceof String s) {
            text(path, s);
        } else if (v instanceof java.util.Map<?, ?> m) {
            for (java.util.Map.Entry<?, ?> e : m.entrySet()) {
                text(path, (String) e.getKey());
                walk(e.getValue(), path + "." + e.getKey());
            }
        } else if (v instanceof java.util.List<?> l) {
            for (int i = 0; i < l.size(); i++) {
                walk(l.get(i), path + "[" + i + "]");
            }
        }
    }

    static InvalidInputException invalid(String field, String why) {
        return new InvalidInputException("invalid input: " + field + ": " + why, field,
                java.util.Map.of("code", "invalid_input", "field", field), null);
    }

    private static void setText(PreparedStatement st, int i, String v) throws SQLException {
        if (v == null) {
            st.setNull(i, Types.VARCHAR);
        } else {
            st.setString(i, v);
        }
    }

    /**
     * d in microseconds; null stays NULL, for the database to refuse naming
     * ttl.
     */
    private static void setMicros(PreparedStatement st, int i, Duration d) throws SQLException {
        if (d == null) {
            st.setNull(i, Types.BIGINT);
            return;
        }
        // Clamped to about 31 years either way, which the database refuses
        // as out of range naming ttl (an interval of Long.MAX_VALUE
        // microseconds would fail as an overflow instead).
        long bound = 1_000_000_000_000_000L;
        long secs = Math.max(-bound / 1_000_000L, Math.min(bound / 1_000_000L, d.getSeconds()));
        st.setLong(i, secs * 1_000_000L + d.getNano() / 1000);
    }

    private static Instant instant(ResultSet rs, int i) throws SQLException {
        OffsetDateTime t = rs.getObject(i, OffsetDateTime.class);
        return t == null ? null : t.toInstant();
    }
}

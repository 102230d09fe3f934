package dev.fencegate;

import java.sql.SQLException;
import java.time.Instant;
import java.time.OffsetDateTime;
import java.time.format.DateTimeParseException;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;

import org.postgresql.util.PSQLException;
import org.postgresql.util.ServerErrorMessage;

/**
 * The base of this library's errors. A refusal of the SQL interface (a
 * SQLSTATE of class ZF, docs/sql.md) arrives as one of its subclasses, one
 * per code, carrying the fields of the error's DETAIL; an unknown ZF code
 * as a plain FencegateException. It is an {@link SQLException} (its
 * {@link #getSQLState()} is the server's), so that code which rolls back
 * on any SQLException keeps doing so: whatever the interface refuses, the
 * caller's transaction is aborted and nothing of it is stored.
 */
public class FencegateException extends SQLException {
    private static final long serialVersionUID = 1L;

    private final String field;
    private final Map<String, Object> detail;

    FencegateException(String message, String sqlState, String field, Map<String, Object> detail, Throwable cause) {
        super(message, sqlState, cause);
        this.field = field;
        this.detail = detail == null ? Map.of() : Collections.unmodifiableMap(new LinkedHashMap<>(detail));
    }

    /**
     * The field the error names (the server error's COLUMN, else the
     * DETAIL's {@code field}): {@code "payload.to[1]"}, {@code "epoch"},
     * {@code "resource"}; null when it names none.
     */
    public String field() {
        return field;
    }

    /** The DETAIL's {@code code}: {@code "stale_epoch"}, {@code "conflict"}, …; null when absent. */
    public String code() {
        Object c = detail.get("code");
        return c instanceof String s ? s : null;
    }

    /** The error's DETAIL, parsed (empty when it had none or it was not a JSON object). */
    public Map<String, Object> detail() {
        return detail;
    }

    String text(String key) {
        Object v = detail.get(key);
        return v instanceof String s ? s : null;
    }

    long number(String key) {
        Object v = detail.get(key);
        return v instanceof Number n ? n.longValue() : 0;
    }

    Instant instant(String key) {
        String s = text(key);
        if (s == null) {
            return null;
        }
        try {
            return OffsetDateTime.parse(s).toInstant();
        } catch (DateTimeParseException e) {
            return null;
        }
    }

    /**
     * Returns e as the typed exception of its SQLSTATE when it is a
     * refusal of the SQL interface (class ZF), else e itself.
     */
    static SQLException translate(SQLException e) {
        if (e instanceof FencegateException) {
            return e;
        }
        ServerErrorMessage m = serverMessage(e);
        String state = m != null ? m.getSQLState() : e.getSQLState();
        if (state == null || !state.startsWith("ZF")) {
            return e;
        }
        String message = m != null && m.getMessage() != null ? m.getMessage() : e.getMessage();
        Map<String, Object> detail = Map.of();
        if (m != null && m.getDetail() != null) {
            try {
                if (Json.parse(m.getDetail()) instanceof Map<?, ?> d) {
                    @SuppressWarnings("unchecked")
                    Map<String, Object> dd = (Map<String, Object>) d;
                    detail = dd;
                }
            } catch (IllegalArgumentException notJson) {
                // A DETAIL for people (ZF001's): no fields to carry.
            }
        }
        String field = m != null ? m.getColumn() : null;
        if (field == null && detail.get("field") instanceof String f) {
            field = f;
        }
        return switch (state) {
            case "ZF001" -> new EpochAuthorityException(message, field, detail, e);
            case "ZF002" -> new StaleEpochException(message, field, detail, e);
            case "ZF003" -> new ConflictException(message, field, detail, e);
            case "ZF004" -> new InvalidInputException(message, field, detail, e);
            case "ZF005" -> new LeaseHeldException(message, field, detail, e);
            case "ZF006" -> new NoPrincipalException(message, field, detail, e);
            case "ZF007" -> new ForbiddenException(message, field, detail, e);
            default -> new FencegateException(message, state, field, detail, e);
        };
    }

    /** The server's error of e or of one of its causes (a pool may wrap the driver's). */
    private static ServerErrorMessage serverMessage(Throwable e) {
        for (Throwable t = e; t != null; t = t.getCause()) {
            if (t instanceof PSQLException p && p.getServerErrorMessage() != null) {
                return p.getServerErrorMessage();
            }
            if (t.getCause() == t) {
                break;
            }
        }
        return null;
    }
}

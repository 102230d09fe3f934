package dev.fencegate;

import java.sql.SQLException;

/**
 * The schema has no SQL interface this client speaks: none at all (not
 * migrated, or another schema name), or another major version.
 */
public class InterfaceVersionException extends FencegateException {
    private static final long serialVersionUID = 1L;

    private final int found;

    InterfaceVersionException(String message, int found, Throwable cause) {
        // The server's SQLSTATE when the server refused the version query
        // (3F000 no such schema, 42883 no such function); null otherwise.
        super(message, cause instanceof SQLException s ? s.getSQLState() : null, null, null, cause);
        this.found = found;
    }

    /** The version the schema has; 0 when it has none. */
    public int found() {
        return found;
    }
}

package dev.fencegate;

/**
 * The schema has no SQL interface this client speaks: none at all (not
 * migrated, or another schema name), or another major version.
 */
public class InterfaceVersionException extends FencegateException {
    private static final long serialVersionUID = 1L;

    private final int found;

    InterfaceVersionException(String message, int found, Throwable cause) {
        super(message, null, null, null, cause);
        this.found = found;
    }

    /** The version the schema has; 0 when it has none. */
    public int found() {
        return found;
    }
}

package dev.fencegate;

import java.time.Instant;
import java.util.Map;

/**
 * SQLSTATE ZF005, {@code lease_held}: {@code acquire} while another
 * holder's lease is live. Nothing was granted; try again after
 * {@link #expiresAt()}.
 */
public class LeaseHeldException extends FencegateException {
    private static final long serialVersionUID = 1L;

    LeaseHeldException(String message, String field, Map<String, Object> detail, Throwable cause) {
        super(message, "ZF005", field, detail, cause);
    }

    /** The resource. */
    public String resource() {
        return text("resource");
    }

    /** Who holds the lease. */
    public String holder() {
        return text("holder");
    }

    /** The holder's epoch. */
    public long currentEpoch() {
        return number("current_epoch");
    }

    /** When the holder's lease expires unless renewed, by the database's clock; null if absent. */
    public Instant expiresAt() {
        return instant("expires_at");
    }
}

package dev.fencegate;

import java.util.Map;

/**
 * SQLSTATE ZF002, {@code stale_epoch}: the epoch given is not the
 * resource's current one. Authority moved on (a takeover, an advance):
 * the caller's transaction is aborted and nothing of it may commit. From
 * {@code renew} and {@code release}, {@link #reason()} says why.
 */
public class StaleEpochException extends FencegateException {
    private static final long serialVersionUID = 1L;

    StaleEpochException(String message, String field, Map<String, Object> detail, Throwable cause) {
        super(message, "ZF002", field, detail, cause);
    }

    /** The resource. */
    public String resource() {
        return text("resource");
    }

    /** The epoch the caller gave. */
    public long suppliedEpoch() {
        return number("supplied_epoch");
    }

    /** The resource's current epoch (0: none was ever issued). */
    public long currentEpoch() {
        return number("current_epoch");
    }

    /**
     * Why a renew or release matched nothing ("the lease was released",
     * "the lease is held by \"worker-b\"", …); null when the epoch alone
     * says it, and for enqueue.
     */
    public String reason() {
        return text("reason");
    }
}

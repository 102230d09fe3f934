package dev.fencegate;

/**
 * A {@link Keeper}'s lease can no longer be trusted: no renewal succeeded
 * within TTL − margin of the start of the last one, on the keeper's
 * monotonic clock, or a renewal was refused (the cause is then the
 * {@link StaleEpochException}). Stop acting for the resource; a write
 * already under way is still fenced by its epoch.
 */
public class LeaseLostException extends FencegateException {
    private static final long serialVersionUID = 1L;

    LeaseLostException(String message, Throwable cause) {
        super(message, null, null, null, cause);
    }
}

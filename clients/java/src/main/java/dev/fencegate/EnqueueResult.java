package dev.fencegate;

/**
 * What {@link Fencegate#enqueue} did.
 *
 * @param outcome {@link Outcome#CREATED} or {@link Outcome#DUPLICATE}
 * @param intentId the intent's id (the same one for a duplicate)
 * @param status the intent's status: {@code pending} when created; a
 *     duplicate's status now
 * @param currentEpoch the resource's current epoch
 */
public record EnqueueResult(Outcome outcome, long intentId, String status, long currentEpoch) {

    /** The outcomes of an enqueue. */
    public enum Outcome {
        /** A new intent, relayed once the caller's transaction commits. */
        CREATED,
        /**
         * The operation id was committed before with the same content (a
         * retry after a lost response): the same intent, whatever the
         * epoch is now.
         */
        DUPLICATE;

        static Outcome of(String s) {
            return switch (s) {
                case "created" -> CREATED;
                case "duplicate" -> DUPLICATE;
                default -> throw new IllegalStateException("enqueue answered outcome " + s + ", unknown to this client");
            };
        }
    }

    /** Whether this was a retry of an operation committed before. */
    public boolean duplicate() {
        return outcome == Outcome.DUPLICATE;
    }
}

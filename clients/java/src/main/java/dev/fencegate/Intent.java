package dev.fencegate;

import java.util.Map;

/**
 * One side effect to enqueue: {@code fencegate.enqueue}'s arguments
 * (docs/sql.md). The database checks every field (a refusal is an
 * {@link InvalidInputException} naming it); this record checks nothing.
 *
 * @param resource the resource whose lease the caller holds
 * @param epoch the lease's epoch (the fencing token)
 * @param operationId the caller's id for this operation, the same on a
 *     retry: a retry with the same content is answered
 *     {@link EnqueueResult.Outcome#DUPLICATE} with the same intent
 * @param kind {@code email}, {@code file}, {@code webhook} or {@code s3}
 * @param payload the kind's payload, JSON text of an object
 * @param key the business idempotency key; null: {@code <resource>/<operationId>}
 * @param fence {@code commit} or {@code execute}; null: the kind's default
 */
public record Intent(String resource, long epoch, String operationId, String kind, String payload, String key,
        String fence) {

    /** An intent with payload given as JSON text, the default key and fence. */
    public static Intent of(String resource, long epoch, String operationId, String kind, String payloadJson) {
        return new Intent(resource, epoch, operationId, kind, payloadJson, null, null);
    }

    /** An intent with payload encoded by {@link Json#write}, the default key and fence. */
    public static Intent of(String resource, long epoch, String operationId, String kind, Map<String, ?> payload) {
        return of(resource, epoch, operationId, kind, Json.write(payload));
    }

    /** This intent with business idempotency key {@code key}. */
    public Intent withKey(String key) {
        return new Intent(resource, epoch, operationId, kind, payload, key, fence);
    }

    /** This intent with fence {@code commit} or {@code execute}. */
    public Intent withFence(String fence) {
        return new Intent(resource, epoch, operationId, kind, payload, key, fence);
    }
}

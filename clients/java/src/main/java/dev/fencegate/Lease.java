package dev.fencegate;

import java.time.Duration;
import java.time.Instant;

/**
 * A lease on a resource: its holder and epoch, as granted or last renewed.
 *
 * @param resource the resource
 * @param holder the holder's id
 * @param epoch the fencing token to pass with every write
 * @param expiresAt when it expires unless renewed, by the database's clock
 *     (only the database's clock decides; a worker measures its own trust
 *     with a {@link Keeper})
 * @param ttl the time to live it was granted or renewed with
 */
public record Lease(String resource, String holder, long epoch, Instant expiresAt, Duration ttl) {
}

package dev.fencegate;

import java.util.Map;

/**
 * SQLSTATE ZF001: {@code acquire} found that the database is not the epoch
 * authority on record (a restore, a copy, an older timeline: docs/guarantees.md,
 * "After a failover"). Nothing was granted.
 */
public class EpochAuthorityException extends FencegateException {
    private static final long serialVersionUID = 1L;

    EpochAuthorityException(String message, String field, Map<String, Object> detail, Throwable cause) {
        super(message, "ZF001", field, detail, cause);
    }
}

package dev.fencegate;

import java.util.Map;

/**
 * SQLSTATE ZF003, {@code conflict}: the operation id was used before, for
 * the intent {@link #intentId()}, with different content. A retry must
 * send the same content; new content needs a new operation id.
 */
public class ConflictException extends FencegateException {
    private static final long serialVersionUID = 1L;

    ConflictException(String message, String field, Map<String, Object> detail, Throwable cause) {
        super(message, "ZF003", field, detail, cause);
    }

    /** The resource. */
    public String resource() {
        return text("resource");
    }

    /** The operation id. */
    public String operationId() {
        return text("operation_id");
    }

    /** The intent the operation id belongs to. */
    public long intentId() {
        return number("intent_id");
    }
}

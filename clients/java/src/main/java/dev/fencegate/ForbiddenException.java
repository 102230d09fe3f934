package dev.fencegate;

import java.util.Map;

/**
 * SQLSTATE ZF007, {@code forbidden}: the role's principal may not do this:
 * {@link #field()} says what ({@code "resource"}, {@code "kind"},
 * {@code "role"}, …), {@link #principal()} who.
 */
public class ForbiddenException extends FencegateException {
    private static final long serialVersionUID = 1L;

    ForbiddenException(String message, String field, Map<String, Object> detail, Throwable cause) {
        super(message, "ZF007", field, detail, cause);
    }

    /** The principal the calling role is mapped to. */
    public String principal() {
        return text("principal");
    }
}

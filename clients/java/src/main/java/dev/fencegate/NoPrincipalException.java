package dev.fencegate;

import java.util.Map;

/**
 * SQLSTATE ZF006, {@code no_principal}: a rule set is in force
 * (docs/policy.md) and the calling role is mapped to no principal.
 */
public class NoPrincipalException extends FencegateException {
    private static final long serialVersionUID = 1L;

    NoPrincipalException(String message, String field, Map<String, Object> detail, Throwable cause) {
        super(message, "ZF006", field, detail, cause);
    }
}

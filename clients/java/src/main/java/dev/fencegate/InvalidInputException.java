package dev.fencegate;

import java.util.Map;

/**
 * SQLSTATE ZF004, {@code invalid_input}: an argument or a payload field is
 * missing or invalid; {@link #field()} names it ({@code "epoch"},
 * {@code "payload.to[1]"}). Nothing was stored.
 */
public class InvalidInputException extends FencegateException {
    private static final long serialVersionUID = 1L;

    InvalidInputException(String message, String field, Map<String, Object> detail, Throwable cause) {
        super(message, "ZF004", field, detail, cause);
    }
}

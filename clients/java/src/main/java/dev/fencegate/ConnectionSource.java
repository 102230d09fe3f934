package dev.fencegate;

import java.sql.Connection;
import java.sql.SQLException;

import javax.sql.DataSource;

/**
 * Where a {@link Keeper} gets the connection for each renewal: a pool's
 * {@code dataSource::getConnection}. The keeper closes each connection it
 * got when the renewal is done (a pool takes it back).
 */
@FunctionalInterface
public interface ConnectionSource {
    /** A connection for one call; the caller closes it. */
    Connection get() throws SQLException;

    /** The connections of ds. */
    static ConnectionSource of(DataSource ds) {
        return ds::getConnection;
    }
}

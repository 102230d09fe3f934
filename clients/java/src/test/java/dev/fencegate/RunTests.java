package dev.fencegate;

import org.junit.runner.Description;
import org.junit.runner.JUnitCore;
import org.junit.runner.Result;
import org.junit.runner.notification.Failure;
import org.junit.runner.notification.RunListener;

/**
 * Runs the client's JUnit tests in one JVM (clients/java/java_test.go
 * starts it): prints each test and how many ran, and exits non-zero on a
 * failure or when none ran.
 */
public final class RunTests {
    private RunTests() {}

    public static void main(String[] args) {
        JUnitCore core = new JUnitCore();
        core.addListener(new RunListener() {
            @Override
            public void testFinished(Description d) {
                System.out.println("ran " + d.getDisplayName());
            }

            @Override
            public void testFailure(Failure f) {
                System.out.println("FAIL " + f.getTestHeader() + ": " + f.getMessage());
                System.out.println(f.getTrace());
            }
        });
        Result r = core.run(JsonTest.class, ClientTest.class, KeeperTest.class);
        System.out.printf("java client: %d checks ran, %d failed, %d ignored, in %d ms%n", r.getRunCount(),
                r.getFailureCount(), r.getIgnoreCount(), r.getRunTime());
        System.exit(r.wasSuccessful() && r.getRunCount() > 0 && r.getIgnoreCount() == 0 ? 0 : 1);
    }
}

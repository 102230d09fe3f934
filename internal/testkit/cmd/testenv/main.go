// Command testenv runs a command with the services fencegate's tests need:
// a throwaway PostgreSQL cluster (unless GATEWAY_TEST_DATABASE_URL already
// names a running server). It exports GATEWAY_TEST_DATABASE_URL to the
// command, forwards SIGINT/SIGTERM to it, stops what it started, and exits
// with the command's exit code.
//
// Usage: testenv -- go test ./...
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/fencegate/fencegate/internal/testkit/pgcluster"
)

func main() { os.Exit(run()) }

func run() int {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: testenv -- COMMAND [ARGS...]")
		return 2
	}
	ctx := context.Background()
	env := os.Environ()
	if os.Getenv("GATEWAY_TEST_DATABASE_URL") == "" {
		c, err := pgcluster.Start(ctx, pgcluster.Options{Settings: map[string]string{"max_connections": "500"}})
		if err != nil {
			fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
			return 1
		}
		defer func() {
			if err := c.Stop(); err != nil {
				fmt.Fprintf(os.Stderr, "testenv: stop PostgreSQL: %v\n", err)
			}
		}()
		fmt.Fprintf(os.Stderr, "testenv: PostgreSQL %s (pid %d)\n", c.URL("postgres"), c.PID())
		// This throwaway cluster runs with fsync=off for speed, which the
		// gateway refuses unless told: the tests' `gateway run`, `migrate`
		// and `dev` processes inherit the override. Tests that make claims
		// about crashes start clusters of their own with fsync on.
		// GATEWAY_TEST_POSTMASTER_PID names the cluster's postmaster, for
		// the tests that find a server's processes by other means and check
		// against it (the bench's budget on a given server).
		env = append(env, "GATEWAY_TEST_DATABASE_URL="+c.URL("postgres"), "GATEWAY_ALLOW_FSYNC_OFF=true",
			"GATEWAY_TEST_POSTMASTER_PID="+strconv.Itoa(c.PID()))
	} else {
		fmt.Fprintln(os.Stderr, "testenv: using the PostgreSQL server at $GATEWAY_TEST_DATABASE_URL")
	}

	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		return 1
	}
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	err := cmd.Wait()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		if exit.ExitCode() < 0 {
			return 1
		}
		return exit.ExitCode()
	default:
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		return 1
	}
}

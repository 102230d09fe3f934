package pgcluster

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
)

// StartStandby starts a hot standby of primary: a new cluster in a new
// temporary directory (removed by Stop), copied with pg_basebackup and kept
// up to date by streaming replication. It returns once the standby accepts
// read-only connections.
//
// The primary must allow replication connections, which a cluster started
// by Start does (initdb's trust rules cover replication from 127.0.0.1, and
// PostgreSQL's defaults are wal_level=replica, max_wal_senders=10). The
// standby gets the primary's Settings, so settings a standby needs at least
// as large as the primary's (max_connections, …) match.
func StartStandby(ctx context.Context, primary *Cluster) (*Cluster, error) {
	c := &Cluster{opts: Options{Settings: maps.Clone(primary.opts.Settings)}, bin: primary.bin,
		cred: primary.cred, uid: primary.uid, gid: primary.gid, ownDir: true}
	c.opts.Settings = cmpSettings(c.opts.Settings, map[string]string{"hot_standby": "on"})
	var err error
	c.dir, err = os.MkdirTemp("", "fencegate-pg-standby-")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if c.cred != nil {
		if err := os.Chown(c.dir, c.uid, c.gid); err != nil {
			c.cleanup()
			return nil, fmt.Errorf("pgcluster: chown %s: %w", c.dir, err)
		}
	}
	c.dataDir = filepath.Join(c.dir, "data")
	// -R writes standby.signal and primary_conninfo; -X stream copies the
	// WAL written during the backup over a second connection, so the copy
	// is consistent without archiving; a fast checkpoint starts it now.
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, "pg_basebackup"),
		"-D", c.dataDir, "-R", "-X", "stream", "--checkpoint=fast", "--no-sync",
		"-h", "127.0.0.1", "-p", strconv.Itoa(primary.port), "-U", "postgres")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	cmd.Dir = c.dir
	if out, err := cmd.CombinedOutput(); err != nil {
		c.cleanup()
		return nil, fmt.Errorf("pgcluster: pg_basebackup: %w: %s", err, lastLines(string(out), 5))
	}
	return c.serve(ctx, 0)
}

// cmpSettings returns base with every key of defaults it lacks added.
func cmpSettings(base, defaults map[string]string) map[string]string {
	if base == nil {
		base = map[string]string{}
	}
	for k, v := range defaults {
		if _, ok := base[k]; !ok {
			base[k] = v
		}
	}
	return base
}

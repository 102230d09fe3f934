// Package failpoint lets fault tests stop a gateway process at named points
// of its code: pause it (the process stops itself with SIGSTOP until a test
// sends SIGCONT), crash it (SIGKILL on itself: no deferred code, no
// flushing, like kill -9), or delay it.
//
// The points are compiled in only with the build tag `failpoints`
// (go build -tags failpoints ./cmd/gateway). Without the tag, Inject is an
// empty function the compiler inlines away: the production binary has no
// failpoints and pays nothing for the call sites.
//
// With the tag, failpoints are armed by the environment variable
// GATEWAY_FAILPOINTS, read once:
//
//	GATEWAY_FAILPOINTS="after_effect_before_record=crash,after_lease_acquire=pause"
//
// Actions: pause, crash, sleep(DURATION) (e.g. sleep(3s)). An action may be
// prefixed by a count, N*action, to fire only on the first N hits (then the
// point is inert): 1*crash. Before acting, the process writes one line
// "failpoint: NAME: ACTION pid=PID" to stderr, so a test can tell which
// point fired.
//
// The point between the epoch check and the insert lies inside the SQL
// function fencegate_enqueue: see BetweenCheckAndInsert.
package failpoint

import "strconv"

// Names of the failpoints.
const (
	// AfterLeaseAcquire: `gateway lease acquire` got its epoch and has not
	// printed it yet.
	AfterLeaseAcquire = "after_lease_acquire"
	// AfterCommitBeforeAnswer: `gateway enqueue` committed the intent and
	// has not printed the answer yet (a lost response).
	AfterCommitBeforeAnswer = "after_commit_before_answer"
	// AfterPublishBeforeMark: the dispatcher got the PubAcks of a batch
	// and has not marked its intents relayed yet.
	AfterPublishBeforeMark = "after_publish_before_mark"
	// AfterEffectBeforeRecord: an adapter's executor returned (the
	// external effect happened) and the runtime has not recorded the
	// outcome yet.
	AfterEffectBeforeRecord = "after_effect_before_record"
	// AfterRenameBeforeRecord: the file adapter renamed the staged content
	// over the target and has not marked its manifest published, nor
	// returned, yet.
	AfterRenameBeforeRecord = "after_rename_before_record"
	// InsideGroupBegin: the idempotency store's group commit wrote a
	// shared Begin of two or more attempts (keys created, attempts
	// counted) and has not committed it yet.
	InsideGroupBegin = "inside_group_begin"
	// InsideGroupComplete: the group commit wrote a shared Complete of two
	// or more outcomes (keys and intents) and has not committed it yet.
	InsideGroupComplete = "inside_group_complete"

	// BetweenCheckAndInsert is the failpoint inside the version of
	// fencegate_enqueue migration 00010 created (migration 00015 took it
	// out of production; the fault test installs it again in its own
	// database), after the epoch check passed and before the
	// insert, with the resource's control row locked. It is armed per
	// session by the setting fencegate.failpoint = 'between_check_and_insert'
	// (e.g. the connection URL parameter
	// fencegate.failpoint=between_check_and_insert); the function then
	// takes and releases the transaction-scoped advisory lock
	// BetweenCheckAndInsertLock, so a test that holds that lock pauses the
	// enqueue exactly there. Any build of the binary can be paused this
	// way: the setting is a database session's, not the binary's.
	BetweenCheckAndInsert = "between_check_and_insert"
)

// BetweenCheckAndInsertLock is the advisory lock key the
// between_check_and_insert failpoint waits for (advisory locks are per
// database, so parallel tests on their own databases do not interfere).
const BetweenCheckAndInsertLock int64 = 0x66656e6365 // "fence"

// EnvVar is the environment variable that arms failpoints (failpoints
// builds only).
const EnvVar = "GATEWAY_FAILPOINTS"

// EnvReleaseDir names a directory where a paused process looks for its
// release: a pause ends only once the file ReleaseFile(dir, pid) exists
// (then a SIGCONT wakes it); a SIGCONT without it stops the process again.
// Unset: any SIGCONT continues it.
const EnvReleaseDir = "GATEWAY_FAILPOINTS_RELEASE_DIR"

// ReleaseFile is the file that releases process pid's pause (EnvReleaseDir).
func ReleaseFile(dir string, pid int) string {
	return dir + "/" + strconv.Itoa(pid) + ".continue"
}

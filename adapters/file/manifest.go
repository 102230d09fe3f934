package file

import (
	"time"
)

// manifestVersion is the manifest format written and understood.
const manifestVersion = 1

// State is the state of a manifest's current publication.
type State string

// Manifest states.
const (
	// StatePending: the manifest was written ahead of the content rename.
	// The epoch is accepted either way; the publication happened exactly
	// when the target's content has the recorded sha256.
	StatePending State = "pending"
	// StatePublished: the content was renamed into place.
	StatePublished State = "published"
)

// Publication is one publication of a target, as recorded at the
// destination.
type Publication struct {
	// Target is the target as the intent named it.
	Target string `json:"target"`
	// Epoch is the intent's fencing epoch.
	Epoch int64 `json:"epoch"`
	// IntentID is the intent that published.
	IntentID int64 `json:"intent_id"`
	// IdempotencyKey is the intent's business key.
	IdempotencyKey string `json:"idempotency_key"`
	// SHA256 is the hex sha256 of the content.
	SHA256 string `json:"sha256"`
	// Bytes is the content's length.
	Bytes int64 `json:"bytes"`
	// PublishedAt is when the publication was decided (UTC, microseconds).
	PublishedAt time.Time `json:"published_at"`
}

func (p Publication) result() Result {
	return Result{
		Path:           p.Target,
		Epoch:          p.Epoch,
		SHA256:         p.SHA256,
		Bytes:          p.Bytes,
		IntentID:       p.IntentID,
		IdempotencyKey: p.IdempotencyKey,
		PublishedAt:    p.PublishedAt,
	}
}

// Manifest is the destination's durable record of a target, stored as JSON
// in <dir>/.<name>.fencegate.json and replaced atomically (temp file,
// fsync, rename, directory fsync), only under the target's lock.
//
// The embedded Publication is the newest accepted one; its Epoch is the
// target's fence: an intent with an older epoch is rejected.
type Manifest struct {
	// Version is the format version, 1.
	Version int `json:"version"`
	// Resource is the fenced resource whose epochs guard the target.
	Resource string `json:"resource"`
	Publication
	// State says whether the current publication's content is known to
	// be in place.
	State State `json:"state"`
	// History holds earlier publications, oldest first, at most
	// Config.HistoryLimit.
	History []Publication `json:"history,omitempty"`
}

// find returns the publication of key: the current one if applied says its
// content is in place, else the newest in History.
func (m Manifest) find(key string, applied bool) (Publication, bool) {
	if applied && m.IdempotencyKey == key {
		return m.Publication, true
	}
	for i := len(m.History) - 1; i >= 0; i-- {
		if m.History[i].IdempotencyKey == key {
			return m.History[i], true
		}
	}
	return Publication{}, false
}

// nextHistory returns the history for the manifest that replaces m: m's
// history plus m's current publication if it was applied (a pending one
// that never reached the file is dropped: it did not happen), trimmed to
// the newest limit entries. A new slice, m is not changed.
func (m Manifest) nextHistory(appendCurrent bool, limit int) []Publication {
	h := make([]Publication, 0, min(len(m.History)+1, limit))
	all := m.History
	if appendCurrent {
		all = append(all[:len(all):len(all)], m.Publication)
	}
	if len(all) > limit {
		all = all[len(all)-limit:]
	}
	return append(h, all...)
}

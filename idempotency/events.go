package idempotency

// Actions of the history events (intent_events) the adapter runtime writes.
const (
	// EventOutcomeNotRecorded: an attempt's outcome could not be recorded on
	// its intent because the intent already had a final status (an
	// operator's cancel, or another path recorded first); the note says
	// which outcome was dropped.
	EventOutcomeNotRecorded = "outcome_not_recorded"
	// EventEffectAfterLostOwnership: an attempt performed the effect after
	// it had lost its idempotency key (its lock expired and another attempt
	// took over).
	EventEffectAfterLostOwnership = "effect_after_lost_ownership"
	// EventWaitingForProof: a lookup found nothing while a negative lookup
	// is not yet proof; the intent waits (see the note for until when).
	EventWaitingForProof = "waiting_for_proof"
)

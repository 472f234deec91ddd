"""Training: a run from its set-up to its last step."""

"""The run's records on disk."""

"""raygate reconciler."""

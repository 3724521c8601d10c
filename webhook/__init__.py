"""raygate webhook."""

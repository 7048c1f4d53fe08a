"""releases."""

"""What results.json and verdict.json hold: one frozen record per part, read back by ``Results.load``."""

"""What results.json and verdict.json hold: one frozen record per part, read back by ``Results.load``; and
the workers' records they are made from, read typed with a path in every error (records)."""

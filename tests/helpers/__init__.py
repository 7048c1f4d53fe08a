"""What the tests share, in one place: records a stack's worker would write (stack_records), how a
report's readers see it (readers: Chromium, JUnit), and real runs of the tool (runs, sample_project).

Nothing here is a test; the test modules import from here, never from each other."""

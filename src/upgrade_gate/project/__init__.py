"""The team's own project in every stack: its tests run in a venv of their own (session), their JUnit
read (_junit) and diffed per test (_diff), all of it gathered for the gates (gather)."""

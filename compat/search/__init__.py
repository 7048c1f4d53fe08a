"""What the diagnose phases share with the adapters: the culprit search (``culprit.py``), where an export
breaks (``localize.py``, with ``export_errors.py``), a reproducer's ``ISSUE.md`` and ``program.py``
(``issue_text.py``, ``program_source.py``) and how a foreign text goes into a generated file (``quoting.py``).
They import nothing of the diagnose phases, nor an adapter."""

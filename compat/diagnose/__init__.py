"""The diagnose phases, each its own entry that the worker picks by the job's search: ``diagnose_phase.py``
(the operators behind an artifact that departs from eager, with ``blocks.py``, ``diagnose_reproducer.py`` and
``remedy_choice.py``), ``quantized_lowering_phase.py``, ``precision_phase.py`` (with ``precision.py``),
``export_remedy_phase.py`` and ``latency_phase.py``; ``remedy_trial.py``, a remedy tried as a team would.
They import the worker's modules above and the searches beside them (``search/``), never an adapter."""

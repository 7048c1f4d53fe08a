"""TEMPORARY until the settings split lands (helper branch `settings`)."""

from upgrade_gate.config import EXPORT_STAGES, MEASURE_STAGES, RUNTIME_STAGES  # noqa: F401
from upgrade_gate.records import DIAGNOSTIC_STAGES, STAGE_STATUSES  # noqa: F401

"""TEMPORARY shim until the settings split lands (helper branch `settings`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from upgrade_gate.config import GateSettings, Settings


def _to_dict(self: Settings) -> dict[str, Any]:
    return {"threads": list(self.threads), "export-jobs": self.export_jobs, "warmup": self.warmup,
            "iterations": self.iterations, "time-budget": self.time_budget_s, "rounds": self.rounds,
            "memory-limit": self.memory_limit_bytes, "gates": self.gates.to_dict()}


def _from_dict(cls: type, data: dict[str, Any], *, path: Path) -> Settings:
    return Settings(config_path=path, envs_dir=path.parent, baseline="legacy", suite="default", project_models=(),
                    extra_requirements=(), out_dir=path.parent, cache_dir=path.parent, fresh=False, remeasure=False,
                    threads=tuple(data.get("threads", (1, 2))), export_jobs=data.get("export-jobs", 2),
                    warmup=data.get("warmup", 10), iterations=data.get("iterations", 50),
                    time_budget_s=data.get("time-budget", 2.0), rounds=data.get("rounds", 7), timeouts_s=(),
                    memory_limit_bytes=data.get("memory-limit", 1), gates=GateSettings())


Settings.to_dict = _to_dict  # type: ignore[attr-defined]
Settings.from_dict = classmethod(_from_dict)  # type: ignore[attr-defined]
__all__ = ["Settings", "dataclasses"]

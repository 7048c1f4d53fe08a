"""The Way out from the diagnose phase's records (compat/diagnose_phase.py writes them; the real stacks'
runs are tests/test_diagnose.py): what each finding's rows say, including the bad cases a real run
rarely shows — a search the budget stopped, and a remedy that does not work as written."""

from __future__ import annotations

from upgrade_gate.judge.records import Stage
from upgrade_gate.report._way_out_section import _method_blocks
from upgrade_gate.report.render import to_markdown
from upgrade_gate.schema.results import ModelResults
from upgrade_gate.schema.stack import Diagnosis

CULPRIT = {"operator": "aten.gelu.default(approximate='tanh')", "backend": "XNNPACK delegate", "share": 0.99,
           "rel_l2_without": 3e-7, "rel_l2_alone": 2e-4,
           "calls": [{"key": "gelu", "module": "blocks.0.act", "source": "m.py:7 in forward: return self.act(x)"}]}


def diagnosis(search: dict, remedy: dict | None) -> Diagnosis:
    stages = [Stage(stage="build", status="ok", duration_s=1.0, details={"methods": ["forward", "decode"]}),
              Stage(stage="search", status="ok", duration_s=9.0, details={"methods": search})]
    if remedy is not None:
        stages.append(Stage(stage="remedy", status="ok", duration_s=2.0, details={"methods": remedy}))
    return Diagnosis(record_dir="stacks/candidate/models/m/diagnose", stages=tuple(stages))


def markdown(found: Diagnosis, method: str) -> str:
    """The rows the section writes for one method of model ``m`` in the candidate."""
    model = ModelResults(name="m", factory="f:m", description="", source="built-in", variant="fp32",
                         task_kind="generic", stacks={}, comparisons=(), ratios=(), contention={})
    finding = next(f for f in found.findings if f.method == method)
    return to_markdown(_method_blocks(model, "candidate", found, finding, "/venv/bin/python", shipped_bytes=1000))


def test_a_remedy_that_does_not_work_as_written_is_its_methods_row_and_fails():
    found = diagnosis({"forward": {"status": "found", "rel_l2": 2e-4, "culprits": [CULPRIT], "tried": [{}, {}]}},
                      {"forward": {"code": "partitioner = None\n", "passes": False,
                                   "error": "lowering: RuntimeError: the partitioner is None"}})
    (forward, decode) = found.findings
    assert forward.remedy_error == "lowering: RuntimeError: the partitioner is None" and forward.remedy_passes is False
    text = markdown(found, "forward")
    assert ("The change that should avoid it [FAILED] does not work as written: lowering: RuntimeError: the "
            "partitioner is None.") in text
    assert "partitioner = None" in text and "against the shipped artifact" not in text
    # A method the search did not reach says so, with the stage that stopped it (none here).
    assert (decode.method, decode.status) == ("decode", "not searched")


def test_a_search_the_budget_stopped_claims_nothing():
    found = diagnosis({"forward": {"status": "stopped at budget", "rel_l2": 2e-4, "tried": [{}, {}, {}],
                                   "reason": "stopped at budget (300 s) before trying every aten.mm.default"}}, None)
    text = markdown(found, "forward")
    assert text.startswith("### `m` · `forward` in candidate")
    assert ("[incomplete] stopped at the budget: nothing claimed: stopped at budget (300 s) before trying every "
            "aten.mm.default (3 lowerings tried;") in text
    assert "Reproducer" not in text and "The change" not in text

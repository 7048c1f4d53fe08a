"""The Way out from the diagnose phase's records (compat/diagnose/diagnose_phase.py writes them; the real stacks'
runs are tests/test_diagnose.py): what each finding's rows say, including the bad cases a real run
rarely shows — a search the budget stopped, and a remedy that does not work as written."""

from __future__ import annotations

from dataclasses import replace

from upgrade_gate.report._method_section import method_blocks
from upgrade_gate.report._way_out_section import decides_first
from upgrade_gate.report.render import to_markdown
from upgrade_gate.schema.diagnosis import CacheUse, Diagnosis
from upgrade_gate.schema.records import Stage
from upgrade_gate.schema.results import ModelResults
from upgrade_gate.schema.verdict import GateResult, GateStatus, Remedy, Severity, Verdict, VerdictRecord

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
    return to_markdown(method_blocks(model, "candidate", found, finding, "/venv/bin/python", shipped_bytes=1000))


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


def test_a_method_the_budget_stopped_says_so_and_judges_the_remedy_another_method_found():
    """The prefill's search stopped at budget; the decode's found the linears and a remedy that acts on the whole
    program, which the phase tried on the prefill as written (compat/search/culprit.py carried_over): the prefill's entry
    still claims no culprit, and says which method's change it ran, with its own check."""
    culprit = {**CULPRIT, "operator": "aten.linear.default"}
    found = diagnosis({"forward": {"status": "stopped at budget", "rel_l2": 0.9, "tried": [{}],
                                   "reason": "stopped at budget (150 s) before trying every aten.linear.default"},
                       "decode": {"status": "found", "rel_l2": 0.9, "culprits": [culprit], "tried": [{}, {}]}},
                      {"decode": {"remedy": "kept out of the delegate", "code": "partitioner = P()\n", "passes": True,
                                  "rel_l2": 1e-3},
                       "forward": {"remedy": "kept out of the delegate", "code": "partitioner = P()\n",
                                   "passes": True, "rel_l2": 2e-3, "found_in": "decode"}})
    forward = next(f for f in found.findings if f.method == "forward")
    assert (forward.remedy_found_in, forward.remedy_passes, forward.culprits) == ("decode", True, ())
    text = markdown(found, "forward")
    assert "[incomplete] stopped at the budget: nothing claimed: stopped at budget (150 s)" in text
    assert ("The change found for `decode` (kept out of the delegate) acts on the whole program; tried on this method "
            "as written, checked: the whole method lowered with the same lines gives rel. L2 2.00e-03 against eager "
            "— [passed] passes;") in text
    # Not found here: no culprit, no reproducer of its own.
    assert "Reproducer" not in text and "The operator" not in text
    assert "found for" not in markdown(found, "decode")


def test_a_failure_no_part_explains_says_so_with_the_whole_method_as_its_reproducer():
    found = diagnosis({"forward": {"status": "not pinned", "rel_l2": 2e-4, "tried": [{}] * 5,
                                   "reason": "every part kept out, the method still departs (rel. L2 1.9e-4)"}}, None)
    found = Diagnosis(record_dir=found.record_dir, stages=(*found.stages, Stage(
        stage="reproducer", status="ok", duration_s=3.0, details={"methods": {"forward": {
            "folder": "repro/forward", "operator": None, "scope": "method",
            "reason": "not pinned: no part kept out brings it within the threshold"}}})))
    text = markdown(found, "forward")
    assert ("[incomplete] not pinned to operators: every part kept out, the method still departs (rel. L2 1.9e-4) "
            "(5 lowerings tried;") in text
    assert ("Reproducer, to hand upstream: `stacks/candidate/models/m/diagnose/repro/forward/` (the whole method and "
            "its real inputs, the smallest program found to fail;") in text
    assert "`/venv/bin/python stacks/candidate/models/m/diagnose/repro/forward/repro.py` exits 1 as lowered" in text
    assert "The change" not in text


def test_a_quantized_variants_layers_in_float_and_a_failed_steps_options_are_their_own_rows():
    def searched(kind: str, search: dict, remedy: dict) -> Diagnosis:
        plain = diagnosis(search, remedy)
        build = Stage(stage="build", status="ok", duration_s=1.0, details={"methods": ["forward"], "search": kind})
        return Diagnosis(record_dir=plain.record_dir, stages=(build, *plain.stages[1:]))

    kept = searched("keep-float", {"forward": {
        "status": "found", "rel_l2": 0.2, "layers": 3, "units": ["up", "proj", "down"], "tried": [{}] * 6,
        "culprits": [{"operator": "proj", "share": 0.999, "rel_l2_alone": 0.2, "rel_l2_without": 0.0075, "calls": []}]}},
        {"forward": {"code": "KEEP_FLOAT = {'proj'}\n", "rel_l2": 0.007, "cosine": 0.99997, "passes": True}})
    text = markdown(kept, "forward")
    assert ("Left in float, 1 of the 3 layers the recipe quantizes brings the variant within its gate, quantized in "
            "eager mode: SNR 14.0 dB → 42.5 dB against the float model (found in 6 quantizations):") in text
    assert "- **`proj`**: quantized alone, SNR 14.0 dB; 99.9% of the quantization noise the layers add" in text
    assert "gives SNR 43.1 dB, cosine 0.99997 against the float model — [passed] passes" in text
    # Found for one method while another has no answer: no remedy is lowered, and the row says why.
    alone = Diagnosis(record_dir=kept.record_dir, stages=(*kept.stages[:2], Stage(
        stage="remedy", status="skipped", duration_s=0.0,
        reason="no set of layers for decode (spread): a remedy of the other methods alone leaves the variant "
               "below its gate, so none is lowered")))
    text = markdown(alone, "forward")
    assert "- **`proj`**: quantized alone" in text and "The change" not in text
    assert "No remedy lowered: no set of layers for decode (spread): a remedy of the other methods alone" in text

    exported = searched("export", {"forward": {
        "status": "found", "option": "draft_export", "assumed": ["data dependent error at line 3, `if x.sum() > 0:`"],
        "tried": [{"option": "as configured", "ok": False, "step": "export", "error": "UserError: guard"},
                  {"option": "draft_export", "ok": True}]}},
        {"forward": {"code": "program = torch.export.draft_export(model, example_inputs)\n", "rel_l2": 1e-7,
                     "passes": True, "latency": {"status": "not timed", "reason": "no artifact shipped"}}})
    text = markdown(exported, "forward")
    assert "It does not export as configured; `draft_export` exports it (options tried in order: 2):" in text
    assert "- [FAILED] as configured: export: UserError: guard" in text
    assert "- data dependent error at line 3, `if x.sum() > 0:`" in text
    assert "gives rel. L2 1.00e-07 against eager on the example inputs — [passed] passes; not timed" in text

    # A recipe that raised: the capture's options, the remedy measured by the quantized gates; none where no capture
    # the recipe quantizes lowers (RoBERTa's float indices raise under no_grad too).
    recaptured = searched("quantize", {"forward": {
        "status": "found", "option": "under torch.no_grad()", "assumed": [],
        "tried": [{"option": "as configured", "ok": False, "step": "quantize", "error": "Exception: DuplicateDQPass"},
                  {"option": "under torch.no_grad()", "ok": True}]}},
        {"forward": {"code": "with torch.no_grad():\n    captured = capture(module, inputs)\n", "rel_l2": 0.01,
                     "cosine": 0.9999, "passes": True, "latency": {"status": "not timed", "reason": "none shipped"}}})
    text = markdown(recaptured, "forward")
    assert "It does not quantize as configured; `under torch.no_grad()` quantizes it (options tried in order: 2):" in text
    assert "- [FAILED] as configured: quantize: Exception: DuplicateDQPass" in text
    assert ("the method captured with these lines, quantized by the recipe, lowered, saved, loaded and run as an "
            "artifact is gives SNR 40.0 dB against the float model, as the quantized gates measure it — [passed] "
            "passes") in text
    unanswered = searched("quantize", {"forward": {
        "status": "not pinned", "reason": "no capture the recipe quantizes lowers: …",
        "tried": [{"option": name, "ok": False, "step": "quantize", "error": "RuntimeError: Expected tensor for "
                   "argument #1 'indices'"} for name in ("as configured", "under torch.no_grad()")]}}, {})
    text = markdown(unanswered, "forward")
    assert "[incomplete] No capture option quantizes it:" in text
    assert "- [FAILED] under torch.no_grad(): quantize: RuntimeError: Expected tensor for argument #1" in text


def test_a_quantized_variants_reproducer_is_for_the_team_and_says_what_its_runs_showed():
    """A kept-float search's reproducer (compat/diagnose/precision_phase.py): the recipe's rounding, not a bug to
    file — no issue text; exit 1 as found, and with the layers found kept in float exit 0 — or, where no set of
    layers is a remedy, what --with-remedy does instead."""
    def kept(status: str, runs: list) -> Diagnosis:
        found = {"status": status, "rel_l2": 0.2, "layers": 3, "units": ["up", "proj", "down"], "tried": [{}] * 2,
                 "reason": "with every quantized layer in float the variant still fails (SNR 16.2 dB)"}
        if status == "found":
            found["culprits"] = [{"operator": "proj", "share": 1.0, "rel_l2_alone": 0.2, "rel_l2_without": 0.0075,
                                  "calls": []}]
        stages = (Stage(stage="build", status="ok", duration_s=1.0, details={"methods": ["forward"],
                                                                              "search": "keep-float"}),
                  Stage(stage="search", status="ok", duration_s=9.0, details={"methods": {"forward": found}}),
                  Stage(stage="reproducer", status="ok", duration_s=3.0, details={"methods": {"forward": {
                      "status": "written", "folder": "repro/forward", "scope": "quantized", "issue": None,
                      "runs": runs}}}))
        return Diagnosis(record_dir="stacks/candidate/models/m/diagnose", stages=stages)

    found = kept("found", [{"args": [], "exit": 1, "said": "SNR 14.0 dB"},
                           {"args": ["--with-remedy"], "exit": 0, "said": "SNR 42.5 dB"}])
    (finding,) = found.findings
    assert finding.reproducer == "repro/forward" and finding.issue is None
    text = markdown(found, "forward")
    assert ("Reproducer, to hand on: `stacks/candidate/models/m/diagnose/repro/forward/` (the float program as the "
            "recipe captures it") in text and "ISSUE.md" not in text
    assert ("`/venv/bin/python stacks/candidate/models/m/diagnose/repro/forward/repro.py` exits 1 while the variant is "
            "below its gate, 0 with `--with-remedy` (the layers above left in float). Run here as written: `repro.py` "
            "exit 1; `repro.py --with-remedy` exit 0.") in text
    text = markdown(kept("not pinned", [{"args": [], "exit": 1, "said": "SNR 10.2 dB"}]), "forward")
    assert "[incomplete] not pinned to operators: with every quantized layer in float" in text
    assert ("exits 1 while the variant is below its gate, and `--with-remedy` leaves in float what the search last "
            "held there, which does not make a remedy (not pinned). Run here as written: `repro.py` exit 1.") in text
    assert "exits 1 as lowered" not in text
    # An LLM's float program is not carried: the search's figures are the evidence, and the entry says so.
    big = kept("spread", [])
    stages = (*big.stages[:2], Stage(stage="reproducer", status="ok", duration_s=0.1, details={"methods": {"forward": {
        "status": "not written", "reason": "its float weights are 517 MiB, more than the 256 MiB a reproducer carries"}}}))
    text = markdown(Diagnosis(record_dir=big.record_dir, stages=stages), "forward")
    assert "No reproducer: its float weights are 517 MiB, more than the 256 MiB a reproducer carries." in text
    assert "Reproducer, to hand on" not in text


def test_the_entries_come_in_the_order_they_weigh_on_the_verdict():
    """Issue 39, item 9: the hard failures' findings first (the one whose remedy the headline counts before
    one with none), then soft, then the rest, then the baseline's own."""
    def failed(model: str, severity: Severity) -> GateResult:
        return GateResult(gate="numerics" if severity is Severity.HARD else "quantized-numerics", stack="candidate",
                          model=model, severity=severity, status=GateStatus.FAILED, metric="rel_l2")

    passed = GateResult(gate="latency", stack="candidate", model="quiet", severity=Severity.SOFT,
                        status=GateStatus.PASSED, metric="ratio")
    remedied = Remedy(stack="candidate", model="vlm", gate="numerics", methods=("forward",), operators=("op",),
                      passes=True, rel_l2=1e-7, threshold=1e-4)
    record = VerdictRecord(tool_version="0", generated_at="t", verdict=Verdict.NO_GO, baseline="legacy",
                           candidates={"candidate": Verdict.NO_GO},
                           gates=(failed("vlm", Severity.HARD), failed("llm", Severity.HARD),
                                  failed("llm@int8", Severity.SOFT), passed), remedies=(remedied,))
    # As the suite lists them: the baseline's MobileNet first, the decisive finding last.
    entries = [("mobilenet", "legacy"), ("quiet", "candidate"), ("llm@int8", "candidate"), ("llm", "candidate"),
               ("vlm", "candidate")]
    ordered = sorted(entries, key=lambda entry: decides_first(record, entry[0], entry[1]))
    assert ordered == [("vlm", "candidate"), ("llm", "candidate"), ("llm@int8", "candidate"), ("quiet", "candidate"),
                       ("mobilenet", "legacy")]


def test_every_remedy_tried_is_a_row_and_the_reproducer_claims_only_what_was_judged():
    """Issue 39, items 3 and 7: the rows of the remedies tried beside the one printed; a reproducer whose remedy
    was judged failing does not say it exits 0 with it."""
    rounds = [{"remedied": [1.3, 1.3, 1.3], "shipped": [1.0, 1.0, 1.0]}] * 6
    rewritten = {"remedy": "rewritten into operators the delegate takes", "code": "program = f(program)\n",
                 "rel_l2": 3e-7, "passes": True, "file": "remedy/forward.pte", "bytes": 1010,
                 "latency": {"status": "ok", "threads": 1, "rounds": rounds}}
    kept_out = {"remedy": "kept out of the delegate", "code": "partitioner = P()\n", "rel_l2": 2e-7, "passes": True,
                "file": "remedy/forward-1.pte", "bytes": 1000,
                "latency": {"status": "ok", "threads": 1, "rounds": [{"remedied": [4.0], "shipped": [1.0]}] * 6}}
    broken = {"remedy": "a backend setting", "code": "x\n", "passes": False, "error": "lowering: RuntimeError: no"}
    found = diagnosis({"forward": {"status": "found", "rel_l2": 2e-4, "culprits": [CULPRIT], "tried": [{}, {}]}},
                      {"forward": {**rewritten, "tried": [rewritten, kept_out, broken]}})
    repro = Stage(stage="reproducer", status="ok", duration_s=1.0, details={"methods": {"forward": {
        "folder": "repro/forward", "operator": CULPRIT["operator"], "scope": "operator", "issue": "ISSUE.md",
        "runs": [{"args": [], "exit": 1, "said": "error 2e-4"}, {"args": ["--with-remedy"], "exit": 0, "said": "3e-7"}]}}})
    found = Diagnosis(record_dir=found.record_dir, stages=(*found.stages, repro))
    text = markdown(found, "forward")
    assert "The change that avoids it (rewritten into operators the delegate takes), checked:" in text
    assert "program = f(program)" in text and "partitioner = P()" not in text  # the code printed is the chosen one's
    assert ("Remedies tried (3 of 3, expected cheapest first; each lowered, saved, loaded and run as the artifact "
            "is;") in text
    assert ("- [passed] rewritten into operators the delegate takes: rel. L2 3.00e-07 against eager, latency ×1.300 "
            "[1.300, 1.300], size ×1.010 — printed above") in text
    assert ("- [passed] kept out of the delegate: rel. L2 2.00e-07 against eager, latency ×4.000 [4.000, 4.000], "
            "size ×1.000\n") in text + "\n"
    assert "- [FAILED] a backend setting: lowering: RuntimeError: no" in text
    assert ("exits 1 as lowered, 0 with `--with-remedy`. Run here as written: `repro.py` exit 1; "
            "`repro.py --with-remedy` exit 0.") in text
    assert ", with `ISSUE.md`, the issue text to file (versions, CPU, what it printed here)." in text
    # A remedy that passes within the latency gate ends the tries: the options after it are rows, not lowered.
    cheap = {**rewritten, "latency": {"status": "ok", "threads": 1,
                                      "rounds": [{"remedied": [1.01], "shipped": [1.0]}] * 6}}
    reason = '"rewritten into operators the delegate takes" passes at ×1.010 the shipped artifact\'s latency, within …'
    found = diagnosis({"forward": {"status": "found", "rel_l2": 2e-4, "culprits": [CULPRIT], "tried": [{}, {}]}},
                      {"forward": {**cheap, "tried": [cheap],
                                   "not_tried": [{"remedy": "kept out of the delegate", "reason": reason}]}})
    text = markdown(Diagnosis(record_dir=found.record_dir, stages=(*found.stages, repro)), "forward")
    assert "Remedies tried (1 of 2, expected cheapest first;" in text
    assert f"- not tried: kept out of the delegate ({reason})" in text
    # The remedy printed judged failing: the reproducer is not said to pass with it.
    failing = {**kept_out, "rel_l2": 3e-4, "passes": False, "latency": {"status": "not timed"}}
    found = diagnosis({"forward": {"status": "found", "rel_l2": 2e-4, "culprits": [CULPRIT], "tried": [{}]}},
                      {"forward": {**failing, "tried": [failing]}})
    text = markdown(Diagnosis(record_dir=found.record_dir, stages=(*found.stages, repro)), "forward")
    assert "0 with `--with-remedy`" not in text and "Remedies tried" not in text
    assert "exits 1 as lowered, and 1 with `--with-remedy` too: the remedy below does not bring it within" in text


def test_a_latency_gate_that_fails_says_where_the_candidates_time_goes():
    """Issue 39, item 6 (its first half): a failed or undecided latency gate's entry names the portable kernels —
    outside the delegate — that take the candidate's time, with their share and calls, what the export left
    undelegated, and what a team would try; the baseline's time beside it."""
    from upgrade_gate.report._way_out_section import latency_blocks
    from upgrade_gate.schema.stack import StackResults
    from upgrade_gate.schema.verdict import Quantity, Unit

    def profiled(operators: list[dict], export: dict | None = None) -> StackResults:
        stages = [Stage(stage="profile", status="ok", duration_s=1.0,
                        details={"methods": {"forward": {"operators": operators}}})]
        if export is not None:
            stages.append(Stage(stage="export", status="ok", duration_s=1.0, details={"methods": {"forward": export}}))
        return StackResults(record_dir="r", stages=tuple(stages), measured={})

    candidate = profiled(
        [{"name": "aten::_native_batch_norm_legit_no_training.out", "calls": 48, "total_ms": 6.39, "share": 0.639},
         {"name": "XNNPACK delegate", "calls": 1, "total_ms": 3.0, "share": 0.3},
         {"name": "aten::add.out", "calls": 4, "total_ms": 0.41, "share": 0.041},
         {"name": "executorch interpreter (dispatch, copies)", "calls": 0, "total_ms": 0.2, "share": 0.02}],
        export={"delegate": "XnnpackBackend", "delegate_partitions": 9, "delegated_nodes": 120, "portable_nodes": 52,
                "portable_ops": {"aten._native_batch_norm_legit_no_training.default": 48, "aten.add.Tensor": 4}})
    legacy = profiled([{"name": "prepacked::conv2d_clamp_run", "calls": 40, "total_ms": 4.5, "share": 0.9},
                       {"name": "aten::add", "calls": 4, "total_ms": 0.5, "share": 0.1}])
    model = ModelResults(name="levit", factory="f:m", description="", source="built-in", variant="fp32",
                         task_kind="classification", stacks={"legacy": legacy, "candidate": candidate}, comparisons=())
    gate = GateResult(gate="latency", stack="candidate", model="levit", severity=Severity.SOFT,
                      status=GateStatus.FAILED, metric="ratio", op="≤", threshold=Quantity(value=1.05, unit=Unit.RATIO),
                      measured=Quantity(value=2.067, unit=Unit.RATIO, low=2.042, high=2.106), note="1 thread(s)")
    text = to_markdown(latency_blocks(model, gate, "legacy", searched=False))
    assert "### `levit` · latency in candidate" in text
    assert "[FAILED] The latency gate fails: ratio = 2.067" in text and "; ratio ≤ 1.050." in text
    assert "candidate's profile: 68.0% of its time in ExecuTorch's portable kernels, outside the delegate:" in text
    assert ("- `aten::_native_batch_norm_legit_no_training.out`: 63.9%, 6.390 ms over 48 call(s) per call — fold the "
            "batch norm into the convolution or linear that precedes it, before export") in text
    assert "- `aten::add.out`: 4.1%, 0.410 ms over 4 call(s) per call\n" in text
    assert ("- left out of the delegate at export: aten._native_batch_norm_legit_no_training.default ×48, "
            "aten.add.Tensor ×4") in text
    assert "XNNPACK delegate" not in text.split("outside the delegate:")[1]  # the delegate's own time is not a fallback
    assert "- legacy's most time: `prepacked::conv2d_clamp_run` 90.0%, `aten::add` 10.0%" in text
    assert "No remedy was lowered and timed for it: a latency search runs where a portable batch norm takes" in text
    # Without the candidate's profile there is nothing to say where the time goes, and the entry says so.
    bare = ModelResults(name="levit", factory="f:m", description="", source="built-in", variant="fp32",
                        task_kind="classification", comparisons=(),
                        stacks={"legacy": legacy, "candidate": StackResults(record_dir="r", stages=(), measured={})})
    assert "No per-operator profile of candidate" in to_markdown(latency_blocks(bare, gate, "legacy", searched=False))
    # Issue 63, item 2: a profile the result cache gave back is said to be an earlier run's, beside this run's figure.
    cached = replace(candidate, cache={"export": CacheUse(key="e", reused_from="/cache/e"),
                                       "runtime": CacheUse(key="k", reused_from="/cache/k")})
    reused = to_markdown(latency_blocks(replace(model, stacks={"legacy": legacy, "candidate": cached}), gate, "legacy",
                                        searched=False))
    assert ("candidate's profile (profiled by an earlier run, its runtime phase reused from the result cache: "
            "`--fresh` profiles again): 68.0% of its time") in reused
    assert "earlier run" not in text  # this run's own profile says nothing of the kind


def test_a_latency_remedy_is_judged_by_the_latency_gate_and_an_unjudged_one_is_provisional():
    """Issue 63, item 2: a busy machine left the gate incomplete, and the remedy's judgement read "[FAILED] the
    latency gate still fails … (threshold 1.00e-04, against the reference)": the numerics threshold, and a status
    it did not have. It says the latency gate's own status and rule, against the baseline and against what ships,
    the numerics apart, and why it is provisional."""
    from upgrade_gate.report._way_out_section import _judged
    from upgrade_gate.schema.measured import RatioEstimate
    from upgrade_gate.schema.verdict import Quantity, Unit

    def timed(status: GateStatus, measured: Quantity | None, note: str) -> GateResult:
        return GateResult(gate="latency", stack="candidate+remedy", model="levit", severity=Severity.SOFT,
                          status=status, metric="ratio", op="≤", threshold=Quantity(value=1.05, unit=Unit.RATIO),
                          measured=measured, note=note)

    busy = "1 thread(s): machine busy: 3 of 12 rounds quiet; an interval needs 6 quiet rounds"
    shipped = RatioEstimate(median=0.3, low=0.29, high=0.31, confidence=0.95, level=0.96, per_round=(0.3,) * 6)
    remedy = Remedy(stack="candidate", model="levit", gate="latency", methods=("forward",), operators=("batch_norm",),
                    passes=False, rel_l2=2e-7, threshold=1e-4, latency_ratio=shipped, threads=1,
                    gates=(timed(GateStatus.INCOMPLETE, None, busy),), note="the latency gate with the remedy: …",
                    provisional=f"the latency gate was not judged: {busy}")
    text = to_markdown([_judged(remedy)])
    assert ("[incomplete] the latency gate was not judged with the remedy, against the baseline: "
            f"{busy}; ratio ≤ 1.050; against the shipped artifact, ×0.3 (timed in turns in the diagnose phase).") in text
    assert "Its outputs are within the numerics threshold (rel. L2 2.00e-07, threshold 1.00e-04" in text
    assert f"Provisional: the latency gate was not judged: {busy}." in text
    assert "still fails" not in text and "FAILED" not in text
    judged = replace(remedy, passes=True, provisional="", gates=(timed(
        GateStatus.PASSED, Quantity(value=0.62, unit=Unit.RATIO, low=0.6, high=0.64, level=0.95), "1 thread(s)"),))
    text = to_markdown([_judged(judged)])
    assert "[passed] the latency gate passes with the remedy, against the baseline: ratio = 0.620" in text, text
    assert "Provisional" not in text


def test_a_slowdown_says_whether_its_portable_kernels_can_account_for_it_and_quotes_its_reproducer():
    """Issue 63, item 6: were its portable kernels free, a method 2.0x slower with 1.8% of its time in them would
    still take 2.0 x 0.982 = 1.964x the baseline's time — over the gate's 1.05, so the gap is inside the delegate,
    whose calls are named; with 60% in them, 0.8x — within it, so they can account for it. The measure session's
    reproducer is quoted with what its run answered, or why none was written."""
    from upgrade_gate.report._way_out_section import latency_blocks
    from upgrade_gate.schema.measured import LatencyRatio, LatencyReproducer, RatioEstimate
    from upgrade_gate.schema.stack import StackResults
    from upgrade_gate.schema.verdict import Quantity, Unit

    def profiled(portable_share: float) -> StackResults:
        operators = [{"name": "DELEGATE_CALL:XnnpackBackend", "calls": 42, "total_ms": 90.0, "share": 0.9},
                     {"name": "aten::native_layer_norm.out", "calls": 9, "total_ms": 1.8, "share": portable_share}]
        return StackResults(record_dir="r", measured={}, stages=(
            Stage(stage="profile", status="ok", duration_s=1.0, details={"methods": {"forward": {"operators": operators}}}),))

    ratio = LatencyRatio(stack="candidate", threads=1, method="forward",
                         estimate=RatioEstimate(median=2.0, low=1.9, high=2.1, per_round=(2.0,) * 6))
    reproducer = LatencyReproducer(stack="candidate", threads=1, method="forward", found_ratio=1.98765, threshold=1.05,
                                   script="measurements/vit/repro/repro.py", exit_code=1,
                                   said="vit (forward, 1 thread(s)): the candidate takes x1.990 …: slower, as found")
    gate = GateResult(gate="latency", stack="candidate", model="vit", severity=Severity.SOFT,
                      status=GateStatus.FAILED, metric="ratio", op="≤", threshold=Quantity(value=1.05, unit=Unit.RATIO),
                      measured=Quantity(value=2.0, unit=Unit.RATIO, low=1.9, high=2.1), note="1 thread(s)")

    def entry(portable_share: float, found: LatencyReproducer) -> str:
        model = ModelResults(name="vit", factory="f:m", description="", source="built-in", variant="fp32",
                             task_kind="generic", comparisons=(), ratios=(ratio,), latency_reproducer=found,
                             stacks={"legacy": profiled(0.0), "candidate": profiled(portable_share)})
        return to_markdown(latency_blocks(model, gate, "legacy", searched=False))

    text = entry(0.018, reproducer)
    assert ("Were its portable kernels free, it would still take ×1.964 the baseline's time (×2.000 now, less their "
            "1.8%), over ×1.05: most of the slowdown is inside the delegate (`DELEGATE_CALL:XnnpackBackend` 90.0% over "
            "42 call(s))") in text
    assert ("Reproducer (`forward` at 1 thread(s), ×1.988 in the rounds): `measurements/vit/repro/repro.py` times both "
            "stacks' artifacts of the method in alternating rounds") in text
    assert "Run here: exit 1, reproduces — `vit (forward, 1 thread(s)): the candidate takes x1.990 …: slower, as " \
           "found`." in text
    # Written where the rounds found the machine too busy to time, and not run: nothing it said would count.
    busy = replace(reproducer, exit_code=None, said="not run here: the machine was too busy in the rounds to time")
    assert "0 when it does not. Run here: not run: the machine was too busy in the rounds to time." in entry(0.018, busy)
    text = entry(0.6, replace(reproducer, script="", exit_code=None, said="", reason="its artifacts are 900 MiB"))
    assert "it would still take ×0.800 the baseline's time (×2.000 now, less their 60.0%): within ×1.05, so they " \
           "can account for the slowdown." in text
    assert "No reproducer of the slowdown (`forward` at 1 thread(s), ×1.988 in the rounds): its artifacts are 900 MiB." \
           in text


def test_a_reproducer_that_aborts_its_python_is_an_exit_status_not_the_workers_end(tmp_path):
    """Issue 63: mobileone's call alone made the runtime assert, which took the diagnose worker down with it. Run
    isolated, a reproducer's abort is its exit status (the signal's, negative) with its last words on stderr."""
    from compat.search.issue_text import run_reproducer

    (tmp_path / "repro.py").write_text(
        "import os, sys\nprint('loading', flush=True)\nprint('aten_bridge.cpp: ETensor must have valid sizes array', "
        "file=sys.stderr, flush=True)\nos.abort()\n")
    run = run_reproducer(tmp_path, isolated=True)
    assert run == {"args": [], "exit": -6, "said": "aborted by SIGABRT: aten_bridge.cpp: ETensor must have valid sizes "
                                                    "array"}
    (tmp_path / "repro.py").write_text("import sys\nprint('fails as found: 0x1')\nsys.exit(1)\n")
    assert run_reproducer(tmp_path, "--with-remedy", isolated=True) == {
        "args": ["--with-remedy"], "exit": 1, "said": "fails as found: 0x1"}

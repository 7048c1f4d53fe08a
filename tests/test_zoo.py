"""The zoo's table (tests/benchmarks/zoo.py), from a report the zoo wrote: three of its rows, trimmed to what the table
reads (tests/data/zoo/results.json: hf-bert and levit-128s, and efficientnet-b0, hf-bert and yolov8n quantized, at
623aee1; their rounds dropped, which the table does not read: the gates judged from them stay)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import zoo

from upgrade_gate.schema.results import Results

REPORT = Path(__file__).parent / "data" / "zoo" / "results.json"
# deit-tiny's row of a zoo run of the eight latency failures with `profile = true` (2026-12-07, its stages' details
# as written): its gate failed at ratio 1.271, the candidate's profile 94.9% in XNNPACK's delegate calls, 4.8% in
# portable kernels; the measure session's reproducer exited 1.
LATENCY = Path(__file__).parent / "data" / "zoo" / "latency.json"


def test_each_candidate_failure_has_its_class_and_what_its_way_out_did():
    rows = {(row.model, row.variant): row for row in zoo.table_rows(Results.load(REPORT))}
    assert rows["hf-bert", "fp32"].failures == () and rows["hf-bert", "fp32"].candidate == "ok"
    # The export stage raised from executorch's code: the lowering's failure, its operator named, reproduced, remedied.
    bert = rows["hf-bert", "int8-dynamic"]
    assert bert.family == "transformers" and bert.candidate == "✗ lower (failed)"
    (failure,) = bert.failures
    assert (failure.kind, failure.entry, failure.found, failure.reproduces, failure.remedy) == (
        "lower", "named", "aten.linear.default", True, True)
    assert failure.said == "export failed: builtins.RuntimeError: Weight and Input should both be quantized"
    # A program that lowers and fails to load: the load search's entry (issue 63, item 1) — the concatenation named,
    # its reproducer reproducing, its remedy passing; the baseline's own FX quantize fails.
    yolo = rows["yolov8n", "int8"]
    assert yolo.baseline == "✗ quantize (failed)"
    (failure,) = yolo.failures
    assert (failure.kind, failure.entry, failure.found, failure.reproduces, failure.remedy) == (
        "load", "named", "aten.cat.default (3 inputs)", True, True)
    assert "Failed to create cat3 node" in failure.said
    # A quantized variant below its gate whose layers, all kept in float, still fail it: why not, no remedy.
    (failure,) = rows["efficientnet-b0", "int8"].failures
    assert (failure.kind, failure.entry, failure.remedy) == ("numerics", "why not", None)
    assert failure.found.startswith("forward: not pinned — with every quantized layer in float the variant still fails")
    # A latency failure no search took up: the entry the report gives it, here why it names nothing.
    (failure,) = rows["levit-128s", "fp32"].failures
    assert (failure.kind, failure.entry, failure.reproduces, failure.remedy) == ("latency", "why not", None, None)
    assert failure.found == "no per-operator profile of candidate (profile = false): nothing says where its time goes"
    assert failure.said.startswith("ratio = 2.755, 96.9% interval")


def test_a_latency_failure_whose_time_is_the_delegates_says_so_and_counts_its_reproducer():
    """Issue 63, item 6: were its portable kernels free, deit-tiny would still take 1.271 x (1 - 0.048) = 1.21 times
    the baseline's time, over the gate's 1.05: its entry says why it names no operator (the delegate's own are not
    in the profile), and the measure session's reproducer, which exited 1, counts as reproducing."""
    (row,) = zoo.table_rows(Results.load(LATENCY))
    (failure,) = row.failures
    assert (failure.kind, failure.entry, failure.reproduces, failure.remedy) == ("latency", "why not", True, None)
    assert failure.found == "its time is the delegate's: ×1.21 were its portable kernels free " \
                            "(DELEGATE_CALL:XnnpackBackend 95%)"


def test_the_totals_count_the_failures_by_class_and_the_way_outs():
    counted = zoo.totals(zoo.table_rows(Results.load(REPORT)))
    assert counted["models"] == 4 and counted["rows"] == 5 and counted["finished"] == 5
    assert counted["candidate_failures"] == 4
    assert counted["by_class"] == {"lower": 1, "load": 1, "numerics": 1, "latency": 1}
    assert (counted["entry_named"], counted["entry_why_not"], counted["no_entry"]) == (2, 2, 0)
    assert (counted["reproduces"], counted["remedy_passes"], counted["baseline_failed"]) == (2, 2, 1)
    # Issue 63's measure counts a failure once both hold: bert's and yolov8n's; efficientnet-b0's and levit's have an
    # entry and no reproducer.
    assert counted["answered"] == 2
    assert "**2 of 4** (50%) have both an entry and a reproducer that reproduces." in zoo.markdown(
        zoo.table_rows(Results.load(REPORT)), [], Results.load(REPORT))


def test_the_section_is_replaced_on_each_run_and_appended_the_first_time():
    results = Results.load(REPORT)
    runs = [{"seconds": 724.0, "exit": 3, "cores": 2, "memory_bytes": 24 * 2**30}]
    section = zoo.markdown(zoo.table_rows(results), runs, results)
    assert section.startswith(zoo.START) and section.rstrip().endswith(zoo.END)
    assert "`nox -s benchmark -- zoo`" in section and "Wall time: **12 min 4 s**" in section
    assert "| hf-bert | int8-dynamic | transformers | ok | ✗ lower (failed) |" in section
    document = zoo.replace_section("# Benchmarks\n\ntoday's table\n", section)
    assert document.startswith("# Benchmarks\n\ntoday's table\n\n" + zoo.START)
    again = zoo.replace_section(document + "\nafter\n", section.replace("12 min 4 s", "1 min 0 s"))
    assert again.count(zoo.START) == 1 and "1 min 0 s" in again and "12 min 4 s" not in again
    assert again.endswith("\nafter\n")

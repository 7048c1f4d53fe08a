"""``stop-early`` and ``most-rounds`` (benchmark.py says what each measures): a finished run's own rounds
replayed through the measure session's loop."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks import scripted
from upgrade_gate._atomic import write_json_atomic, write_text_atomic
from upgrade_gate.schema.measured import RoundsEnded
from upgrade_gate.schema.results import Results
from upgrade_gate.stats import (
    interval_confidence,
)


def stop_early(report: Path, out: Path, log: Any) -> int:
    """Each measurement of ``report`` made with fixed rounds, replayed with stop-early on its own
    rounds: the quiet round it would have stopped after (the rule the measure session applies, with
    the report's latency threshold), and the seconds of the rounds tried after it (every stack's
    part, as the contention record timed it) against the seconds of all its rounds."""
    results = Results.load(report)
    rows: list[dict[str, Any]] = []
    for path, data in _measurements(report):
        replayed, tried = _replay(results, data, past_planned=False), data.get("rounds") or []
        seconds = _round_seconds(tried)
        decided = replayed.ended is RoundsEnded.DECIDED
        rows.append({"measurement": path.relative_to(report).as_posix(), "rounds": len(tried),
                     "stopped_after": sum(not entry["disturbed"] for entry in replayed.tried) if decided else None,
                     "rounds_s": sum(seconds), "saved_s": sum(seconds[len(replayed.tried):]) if decided else 0.0})
    total, saved = sum(r["rounds_s"] for r in rows), sum(r["saved_s"] for r in rows)
    lines = [f"# stop-early replayed on {report}: {saved:.0f} s of {total:.0f} s of rounds saved "
             f"({saved / total if total else 0:.1%}), {sum(r['stopped_after'] is not None for r in rows)} of "
             f"{len(rows)} measurements stopped early", "",
             "| measurement | rounds tried | stopped after | rounds s | saved s |", "|---|---|---|---|---|"]
    lines += [f"| {r['measurement']} | {r['rounds']} | {r['stopped_after'] or '—'} | {r['rounds_s']:.1f} | "
              f"{r['saved_s']:.1f} |" for r in rows]
    write_json_atomic(out / "stop-early.json", {"benchmark": "stop-early", "report": str(report), "rows": rows,
                                                "rounds_s": total, "saved_s": saved})
    write_text_atomic(out / "stop-early.md", "\n".join(lines) + "\n")
    log("\n".join(lines))
    return 0


NO_RATIO = "no ratio"  # most-rounds: a model's gate the run could not judge, whatever its rounds


def past_planned(report: Path, out: Path, log: Any) -> int:
    """The latency gates a finished run (``report``, made with ``most-rounds`` past ``rounds``) decided with the
    rounds past the planned ones, counted on its own rounds: each measurement replayed (scripted.replay) with the
    planned rounds only and with the most-rounds it was made with. The looks up to the planned rounds are the
    same in both designs (stats.looks_past), so the first replay is how this run would have ended without the
    rounds past them: the same samples, one run, no run-to-run noise. The second must stop where the run did
    (else exit 1: the replay is not the run's) and judge each gate as verdict.json does."""
    results = Results.load(report)
    verdict = json.loads((report / "verdict.json").read_text(encoding="utf-8"))
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    rounds_s: dict[Path, float] = {}  # each measurement's rounds, whichever candidate is judged
    for candidate in [stack.name for stack in results.candidates]:
        judged = {g["model"]: g["status"] for g in verdict["gates"]
                  if g["gate"] == "latency" and g["stack"] == candidate}
        for path, data in _measurements(report):
            planned_only, as_run = (_replay(results, data, past_planned=past, candidate=candidate)
                                    for past in (False, True))
            model, tried = path.parent.name, data.get("rounds") or []
            seconds = _round_seconds(tried)
            rounds_s[path] = sum(seconds)
            row = rows.setdefault((model, candidate), {
                "model": model, "candidate": candidate, "verdict": judged.get(model, "no gate"),
                "planned": int(data["settings"]["rounds"]), "rounds": {}, "past_planned_s": 0.0, "replayed_as_run": True,
                "measurements": {"planned": [], "as_run": []}})
            row["rounds"][int(data["threads"])] = len(tried)
            row["past_planned_s"] += sum(seconds[len(planned_only.tried):])
            row["replayed_as_run"] &= len(as_run.tried) == len(tried)
            row["measurements"]["planned"].append(planned_only)
            row["measurements"]["as_run"].append(as_run)
    for row in rows.values():
        measurements = row.pop("measurements")
        # A variant one stack has, or a stack whose artifact did not load: no ratio, no gate to count.
        ratio = any(m.outcomes for m in measurements["as_run"])
        row["at_planned"], row["as_run"] = (scripted.gate(measurements[design]) if ratio else NO_RATIO
                                            for design in ("planned", "as_run"))
    table = sorted(rows.values(), key=lambda r: (r["model"], r["candidate"]))
    inconclusive = {design: sum(r[design] == "inconclusive" for r in table) for design in ("at_planned", "as_run")}
    past_s, all_s = sum(r["past_planned_s"] for r in table), sum(rounds_s.values())
    decided = [r for r in table if r["at_planned"] == "inconclusive" != r["as_run"]]
    mismatched = [r for r in table
                  if not r["replayed_as_run"] or (r["as_run"] != NO_RATIO and r["as_run"] != r["verdict"])]
    lines = [f"# rounds past the planned ones, replayed on {report}: latency gates inconclusive "
             f"{inconclusive['at_planned']} at the planned rounds, {inconclusive['as_run']} as run "
             f"({len(decided)} decided by the rounds past them: "
             f"{', '.join(r['model'] + ' ' + r['as_run'] for r in decided) or 'none'}); "
             f"{past_s:.0f} s of {all_s:.0f} s of rounds were past them", "",
             "| model | candidate | at the planned rounds | as run | rounds tried per thread count | s past planned | "
             "verdict.json |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['candidate']} | {r['at_planned']} | {r['as_run']} | "
              f"{', '.join(f'{t}: {n}' for t, n in sorted(r['rounds'].items()))} | {r['past_planned_s']:.1f} | "
              f"{r['verdict']}{'' if r['replayed_as_run'] else ' (the replay did not stop where the run did)'} |"
              for r in table]
    if mismatched:
        lines += ["", f"The replay is not this run's for {', '.join(r['model'] for r in mismatched)}: its rounds or "
                      f"its gate differ from what the run recorded."]
    write_json_atomic(out / "most-rounds.json", {"benchmark": "most-rounds", "report": str(report), "rows": table,
                                                 "inconclusive": inconclusive, "past_planned_s": past_s,
                                                 "rounds_s": all_s})
    write_text_atomic(out / "most-rounds.md", "\n".join(lines) + "\n")
    log("\n".join(lines))
    return 1 if mismatched else 0


def _round_seconds(tried: list[dict[str, Any]]) -> list[float]:
    """Each round's seconds, as tried: every stack's part, as the contention record timed it."""
    return [sum(load["seconds"] for load in entry["load"].values() if load) for entry in tried]


def _measurements(report: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Each measurement file of ``report``, read."""
    for path in sorted((report / "measurements").glob("*/threads-*.json")):
        yield path, json.loads(path.read_text(encoding="utf-8"))


def _replay(results: Results, data: dict[str, Any], *, past_planned: bool,
            candidate: str | None = None) -> scripted.Measurement:
    """A measurement file's rounds replayed with stop-early (scripted.replay), the report's latency threshold and
    the file's planned rounds; ``past_planned``: up to the most-rounds it was made with, else never past the
    planned ones. Judged for ``candidate`` (default: the first)."""
    gate = results.settings.gates["latency"]
    baseline, stacks = results.baseline.name, [stack.name for stack in results.candidates]
    how = data["settings"]
    planned = int(how["rounds"])
    methods = {method for stack in data["stacks"].values() if stack.get("status") == "ok"
               for entry in stack.get("rounds") or () for method in entry["samples_ms"]}
    confidence = interval_confidence(int(how.get("intervals") or len(results.settings.threads) * len(methods)))
    # The rounds went on until the remedied sides were decided too (rounds.measure_model).
    candidates = [*stacks, *(data.get("remedied") or {})]
    return scripted.replay(data, baseline=baseline, candidates=candidates, candidate=candidate or stacks[0],
                           threshold=gate.threshold, min_delta_ms=gate["min-delta-ms"], confidence=confidence,
                           planned=planned, most=int(how.get("most_rounds") or planned) if past_planned else planned)

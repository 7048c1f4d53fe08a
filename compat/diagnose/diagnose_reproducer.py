"""The diagnose phase's reproducer stage (compat/diagnose/diagnose_phase.py): for each method's culprit, the smallest
program known to fail — the operator alone, the fused pair, the block the search ran on or the whole method — as
a standalone script, run here as written, and the ISSUE.md that quotes what it printed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..phases import StageSkipped
from ..search import culprit, issue_text, program_source
from ..search.quoting import markdown_code

REPRO_DIR = "repro"


class Reproducers:
    """The reproducer stage of DiagnosePhase, which it inherits: it reads the phase's stage results
    (``self.log.results``), its blocks, thresholds and chosen remedies."""

    # What DiagnosePhase defines, which these methods read.
    adapter: Any
    job: dict[str, Any]
    log: Any
    model_dir: Path
    blocks: dict[str, Any]
    fusions: dict[str, dict[str, Any]]
    output_thresholds: dict[str, dict[str, float]]
    PROGRAM: str
    MADE: str
    FAILS_AT = "lower"  # the step a program that fails as found fails at: "load" for one that lowers and does not load

    def load_failure_said(self, method: str) -> str:
        return ""

    def threshold_of(self, method: str) -> float:
        raise NotImplementedError

    def search_threshold(self, method: str) -> float:
        raise NotImplementedError

    def limits_of(self, method: str, outputs: int) -> list[float]:
        raise NotImplementedError

    def remedy_code(self, method: str) -> str:
        raise NotImplementedError

    def searched(self, method: str) -> tuple[tuple[Any, ...], list[Any]]:
        raise NotImplementedError

    def reproducer(self):
        """For each method's first culprit: the operator alone on its real inputs, when that fails alone;
        else the method's block the search ran on, or the whole method, as the lowering starts from it (the smallest
        program known to fail)."""
        import torch

        written = {}
        for method, finding in self.log.results["search"].items():
            culprits = finding.get("culprits") or []
            if not culprits:  # not pinned, or the budget stopped the search: the whole method is what fails
                if finding.get("status") in culprit.CARRIED_TO:
                    written[method] = self.unpinned_reproducer(method, finding["status"])
                continue
            kind = culprit.named(culprits[0])
            folder = self.model_dir / REPRO_DIR / method
            folder.mkdir(parents=True, exist_ok=True)
            remedy = self.remedy_code(method)
            found_in = f"{self.job['model']}'s {method}:\n{where(culprits[0])}" + self.block_said(method) + "."
            # A fused pair that fails alone is the reproducer, as an operator that fails alone is.
            alone = self.fusions.get(method) or self.log.results["alone"].get(method, {}).get(culprits[0]["operator"])
            threshold = self.search_threshold(method)
            if alone is not None and alone["rel_l2"] > threshold:
                torch.save(tuple(alone["tensors"]), folder / "inputs.pt")
                source = self.adapter.reproducer_source(
                    kind=kind, call=alone["code"], arguments=len(alone["tensors"]), threshold=threshold,
                    remedy=remedy, found_in=found_in)
                (folder / "repro.py").write_text(source, encoding="utf-8")
                scope, note = "fusion" if method in self.fusions else "operator", ""
            else:
                exported, _ = self.log.results["parts"][method]
                self.method_reproducer(method, exported, folder, kind=kind, remedy=remedy, found_in=found_in,
                                       fails_with=failed_as_found(finding))
                scope = "block" if method in self.blocks else "method"
                note = (f"{kind} alone on its real inputs is within the threshold (rel. L2 {alone['rel_l2']:.3g})"
                        if alone else f"{kind} is not run alone") + self.block_said(method, ": the reproducer is ")
            runs = [issue_text.run_reproducer(folder), issue_text.run_reproducer(folder, "--with-remedy")]
            runs += program_source.checked(folder, runs[0])
            self.write_issue(folder, method, markdown_code(kind), culprits[0]["backend"], scope, runs,
                             failed_as_found(finding))
            written[method] = self.written(folder, runs, operator=kind, scope=scope, reason=note,
                                           rel_l2=alone["rel_l2"] if alone else None)
        if not written:
            raise StageSkipped("no culprit found")
        return written, {"methods": written}

    def unpinned_reproducer(self, method: str, status: str) -> dict[str, Any]:
        """A failure no part kept out explains, or one whose search the budget stopped: the smallest program known
        to fail is what the search lowered (the method's block, or the whole method), lowered as the artifact was;
        its ``--with-remedy`` lowers it the same way."""
        exported, _ = self.log.results["parts"][method]
        folder = self.model_dir / REPRO_DIR / method
        folder.mkdir(parents=True, exist_ok=True)
        why = ("no part kept out of the lowering, alone or together, brings it within the threshold"
               if status == "not pinned" else "the search stopped at its budget before it pinned an operator")
        block = self.blocks.get(method)
        program = block.said() if block else "the whole method"
        found_in = f"{self.job['model']}'s {method}: {why}, so this is {program} (no remedy found)"
        self.method_reproducer(method, exported, folder, kind="not pinned to an operator",
                               remedy=self.adapter.remedy_options(exported, [])[-1][1], found_in=found_in)
        runs = [issue_text.run_reproducer(folder)]  # there is no remedy to run it with
        runs += program_source.checked(folder, runs[0])
        backend = next((p["backend"] for p in self.log.results["parts"][method][1]), "the lowering")
        scope = "block" if block else "method"
        unpinned = f"{markdown_code(block.path) if block else 'the whole method'} (not pinned to an operator)"
        self.write_issue(folder, method, unpinned, backend, scope, runs)
        return self.written(folder, runs, operator=None, scope=scope, rel_l2=None,
                            reason=f"{status}: {why}" + self.block_said(method, "; the reproducer is "))

    def method_reproducer(self, method: str, exported: Any, folder: Path, **written: Any) -> None:
        """The adapter's whole-program reproducer of what the search lowered: the method's block, on the real
        tensors that reached it, or the whole method on its inputs."""
        block = self.blocks.get(method)
        if block is not None:
            written["program"] = block.said()
        self.adapter.method_reproducer(exported, self.searched(method)[0], folder,
                                       threshold=self.reproducer_limit(method), **written)

    def block_said(self, method: str, lead: str = ", searched in ") -> str:
        """Where the search ran on the method's block: ``lead`` and the block, as the texts say it."""
        block = self.blocks.get(method)
        return f"{lead}{block.said()}" if block else ""

    def written(self, folder: Path, runs: list[dict[str, Any]], **found: Any) -> dict[str, Any]:
        """A reproducer's record: where it is, what it found (``found``), its runs here and its files' size."""
        return {"status": "written", "folder": str(folder.relative_to(self.model_dir)), "issue": issue_text.ISSUE,
                **found, "runs": runs, "bytes": sum(f.stat().st_size for f in folder.iterdir())}

    def write_issue(self, folder: Path, method: str, named: str, backend: str, scope: str,
                    runs: list[dict[str, Any]], fails_with: str = "") -> None:
        """ISSUE.md beside the reproducer, quoting what it printed here (compat/search/issue_text.py); ``named``: the
        culprit as Markdown, ``fails_with``: the lowering's error, where the method did not lower at all. Every
        name and message the model or the lowering gave is a code span (compat/search/quoting.py)."""
        remedy = (self.log.results.get("remedy") or {}).get(method)
        if remedy is None:
            judged, code = "No remedy was found to bring it within the threshold.", ""
        else:
            what = remedy.get("remedy", "the remedy")
            found = (f"gives rel. L2 {remedy['rel_l2']:.3g} against eager — "
                     f"{'passes' if remedy.get('passes') else 'still fails'}" if "rel_l2" in remedy
                     else f"does not work as written ({markdown_code(remedy.get('error', ''))})")
            judged, code = f"{what[:1].upper()}{what[1:]}: the whole method lowered with these lines {found}.", \
                remedy["code"]
        operator = {"operator": "the operator alone on the real tensors that reached its first call",
                    "fusion": "the two operators alone, as the delegate fuses them, on the real tensors that reached "
                              "them (each on its own is within the threshold)",
                    "method": "the whole method on its real inputs",
                    "block": f"{self.block_named(method)}, on the real tensors that reached it"}[scope]
        machine = issue_text.environment(("torch", "executorch"))
        found_in = f"Found in {markdown_code(self.job['model'])}'s {markdown_code(method)}."
        if fails_with and self.FAILS_AT == "load":
            title = f"[{backend}] {self.PROGRAM} lowers and does not load: {markdown_code(fails_with)} ({machine[0]})"
            what = (f"Lowering {operator} through the {backend} succeeds ({self.PROGRAM}{self.MADE}); loading it in "
                    f"the runtime raises {markdown_code(fails_with)}, and the runtime says why on stderr: "
                    f"{markdown_code(self.load_failure_said(method))}. {found_in}")
        elif fails_with:
            title = f"[{backend}] {self.PROGRAM} does not lower: {markdown_code(fails_with)} ({machine[0]})"
            what = (f"Lowering {operator} through the {backend} raises {markdown_code(fails_with)} ({self.PROGRAM}"
                    f"{self.MADE}); with {named} kept out of the delegate it lowers and runs. {found_in}")
        else:
            title = f"[{backend}] {named} differs from eager when lowered ({machine[0]})"
            what = (f"Lowered through the {backend}, {operator}, gives outputs that differ from eager PyTorch on the "
                    f"same inputs ({self.PROGRAM}{self.MADE}). {found_in}")
        within = (f"each within its own relative L2 of eager's on the same inputs ({self.said_limits(method)})."
                  if self.by_output(method) else
                  f"within relative L2 {self.search_threshold(method):.3g} of eager's on the same inputs.")
        issue_text.write_issue(
            folder, title=title, what=what,
            expected=f"The method {self.FAILS_AT}s, its outputs {within}" if fails_with else
            f"The lowered program's outputs {within}",
            runs=runs, remedy=code, remedy_judged=judged, machine=machine)

    def block_named(self, method: str) -> str:
        """The method's block the search ran on, as Markdown (its path a code span)."""
        block = self.blocks.get(method)
        if block is None:
            return "a block of the method"
        return f"{markdown_code(block.path)} (one of the method's {block.of} blocks) as a program of its own"

    def reproducer_limit(self, method: str) -> float | list[float]:
        """What the whole-program reproducer holds the lowering to: each output's allowance, where they differ (a
        block's outputs are no method's: the method's threshold)."""
        if not self.by_output(method):
            return self.search_threshold(method)
        return self.limits_of(method, len(self.log.results["eager"][method]))

    def by_output(self, method: str) -> bool:
        """Whether the method's outputs each have an allowance of their own where the search compares them."""
        return method in self.output_thresholds and method not in self.blocks

    def said_limits(self, method: str) -> str:
        return ", ".join(f"output {i}: {limit:.3g}" for i, limit in enumerate(self.limits_of(
            method, len(self.log.results["eager"][method]))))


def failed_as_found(finding: dict[str, Any]) -> str:
    """The lowering's error where the method as found did not lower at all (the search's first try), the
    message its reproducer matches; empty where it lowered."""
    first = (finding.get("tried") or [{}])[0]
    error = str(first.get("error") or "")
    return error.partition(": ")[2][:120] if error else ""


def where(found: dict[str, Any]) -> str:
    call = found["calls"][0]
    if not call.get("module") and not call.get("source"):
        return f"the whole method ({found['backend']} {found['operator']})"
    return f"{call.get('module') or 'the model itself'}, at {call.get('source') or 'a line torch did not record'}"

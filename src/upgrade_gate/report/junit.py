"""The verdict for CI systems: JUnit XML and the Markdown step summary GitHub Actions shows, from the verdict
record alone, so that a merged sharded run gives the same files as a single one.
"""

from __future__ import annotations

import os
import re
import socket
import xml.etree.ElementTree as ET
from pathlib import Path

from upgrade_gate.report.render import markdown_table
from upgrade_gate.schema.verdict import GateResult, GateStatus, VerdictRecord

STEP_SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
# Outcomes that are neither a pass nor a failure of the candidate.
SKIPPED = (GateStatus.INCONCLUSIVE, GateStatus.NOT_COMPARABLE, GateStatus.BLOCKED)


def junit_xml(verdict: VerdictRecord) -> str:
    """One <testsuite> per candidate stack, one <testcase> per gate and model: failed is a <failure>, incomplete an
    <error> (as a test runner's own error is), inconclusive, not comparable or blocked <skipped>: no CI counts them
    as passed."""
    suites = ET.Element("testsuites", name=f"upgrade-gate: {verdict.verdict}")
    for stack, stack_verdict in verdict.candidates.items():
        own = verdict.of(stack)
        failures = sum(1 for g in own if g.status is GateStatus.FAILED)
        errors = sum(1 for g in own if g.status is GateStatus.INCOMPLETE)
        skipped = sum(1 for g in own if g.status in SKIPPED)
        suite = ET.SubElement(suites, "testsuite", {
            "name": f"{stack} vs {verdict.baseline}", "tests": str(len(own)), "failures": str(failures),
            "errors": str(errors), "skipped": str(skipped), "time": "0", "timestamp": verdict.generated_at,
            "hostname": socket.gethostname(),
        })
        properties = ET.SubElement(suite, "properties")
        for name, value in (("verdict", str(stack_verdict)), ("overall-verdict", str(verdict.verdict)),
                            ("tool-version", verdict.tool_version)):
            ET.SubElement(properties, "property", name=name, value=value)
        for gate in own:
            _case(suite, stack, gate)
    every = [g for stack in verdict.candidates for g in verdict.of(stack)]
    suites.set("tests", str(len(every)))
    suites.set("failures", str(sum(g.status is GateStatus.FAILED for g in every)))
    suites.set("errors", str(sum(g.status is GateStatus.INCOMPLETE for g in every)))
    suites.set("time", "0")
    ET.indent(suites)
    text = '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
    # ElementTree escapes markup, not the characters XML 1.0 has no place for (an exception's colour codes, a
    # bell): each written as its escape, or no CI could read the file.
    return _NOT_XML.sub(lambda found: repr(found[0])[1:-1], text)


_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _case(suite: ET.Element, stack: str, gate: GateResult) -> None:
    case = ET.SubElement(suite, "testcase", name=gate.gate, classname=f"{stack}.{gate.model}", time="0")
    text = (f"measured: {gate.measured_text}\nthreshold: {gate.threshold_text}\n"
            f"severity: {gate.severity}\nevidence: {gate.evidence}")
    if gate.status is GateStatus.FAILED:
        failure = ET.SubElement(case, "failure", type=f"{gate.severity} gate",
                                message=f"{gate.measured_text} (threshold {gate.threshold_text})")
        failure.text = text
    elif gate.status is GateStatus.INCOMPLETE:
        ET.SubElement(case, "error", type="incomplete evidence", message=gate.measured_text).text = text
    elif gate.status in SKIPPED:
        ET.SubElement(case, "skipped", message=f"{gate.status}: {gate.measured_text}").text = text
    else:
        ET.SubElement(case, "system-out").text = text


def step_summary(verdict: VerdictRecord, report_dir: Path) -> str:
    """The verdict, the gates that did not pass, and where the full report is."""
    lines = [f"## upgrade-gate: {verdict.verdict}", ""]
    lines += [f"- **{stack}** vs {verdict.baseline}: {value}" for stack, value in verdict.candidates.items()]
    lines.append("")
    if verdict.incomplete:
        lines += ["The evidence was not all gathered (not the candidate's failings):", ""]
        lines += [f"- {reason}" for reason in verdict.incomplete] + [""]
    problems = verdict.not_passed
    if problems:
        lines += markdown_table(["status", "severity", "stack", "model", "gate", "measured", "threshold"], [
            [g.status.label, str(g.severity), g.stack, g.model, g.gate, g.measured_text, g.threshold_text]
            for g in problems])
    else:
        lines.append(f"All {len(verdict.gates)} gates passed.")
    lines += ["", f"Full report: `{report_dir / 'report.html'}` (and report.md, results.json, junit.xml).", ""]
    return "\n".join(lines)


def append_to_step_summary(text: str) -> Path | None:
    """Append Markdown to $GITHUB_STEP_SUMMARY when a GitHub Actions step set it."""
    target = os.environ.get(STEP_SUMMARY_ENV)
    if not target:
        return None
    with open(target, "a", encoding="utf-8") as summary:
        summary.write(text)
    return Path(target)

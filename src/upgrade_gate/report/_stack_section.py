"""The stacks in the report: each one's spec and what was installed, and the packages that differ."""

from __future__ import annotations

from upgrade_gate.report.render import Block, Heading, Paragraph, Table, bullets
from upgrade_gate.schema.project import Differences
from upgrade_gate.schema.results import ExtraRequirement, StackInfo

FOLD_PACKAGES = 12  # a longer list of differing packages is folded on the page
NOT_INSTALLED = "—"  # how the table writes a package one stack does not have


def stack_blocks(info: StackInfo) -> list[Block]:
    blocks: list[Block] = [Heading(3, f"{info.name} ({info.role}) — {info.description}")]
    lines = [f"spec: `envs/{info.file}`; requirements: `{'`, `'.join(info.requirements)}`",
             f"exporter: {info.exporter}", f"runtime: {info.runtime}"]
    if info.installed:
        installed = info.installed
        versions = ", ".join(f"{k} {v}" for k, v in installed.distributions.items())
        lines += [f"installed: {versions}; torch.__version__ {installed.torch_version}",
                  f"Python {installed.python} on {installed.platform}; CPU {installed.cpu} "
                  f"({installed.cpu_count} cores)"]
    else:
        lines.append("installed versions unknown: the stack was not built for this report")
    if info.extra_requirements:
        lines.append("extra requirements ([tool.upgrade-gate.extra-requirements]): " + ", ".join(
            f"`{extra.requirement}` ({_extra_version(info, extra)})" for extra in info.extra_requirements))
    return blocks + [bullets(*lines)]


def _extra_version(info: StackInfo, extra: ExtraRequirement) -> str:
    version = info.version_of(extra)
    if version is not None:
        return f"{extra.distribution} {version}"
    if extra.distribution is None:
        return "version unknown: not a requirement upgrade-gate can name"
    return f"{extra.distribution} not installed" if info.packages else "version unknown: not recorded"


def package_blocks(differences: Differences, stacks: list[str], title: str) -> list[Block]:
    """A table of the packages whose versions differ, one column per stack; nothing when none do."""
    if not differences:
        return []
    return [Paragraph(f"{title}: {len(differences)}"),
            Table(["Package", *stacks], [[name, *(versions.get(stack) or NOT_INSTALLED for stack in stacks)]
                                         for name, versions in differences.items()],
                  folded=f"{len(differences)} packages" if len(differences) > FOLD_PACKAGES else None)]

"""``upgrade-gate``: the nox sessions of an installed upgrade-gate, in a team's repository.

Words before the first option are sessions; everything from it on goes to nox as written, which runs in this
process: its exit status is the command's. The venvs go to .nox/ beside the nearest pyproject.toml.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from upgrade_gate import __version__
from upgrade_gate.config.settings import CONFIG_ENV_VAR
from upgrade_gate.errors import EXIT_USAGE
from upgrade_gate.invocation import CLI, COMMAND_ENV_VAR, command
from upgrade_gate.layout import NOXFILE

USAGE = f"""\
usage: {CLI} COMMAND [NOX_OPTION ...] [-- OPTION ...]

Judge a move from one PyTorch stack to another in this repository: both stacks built in .nox/,
the same models run through each, the verdict in report/.

commands:
  compare             build every stack, run the models through each, write the verdict
  compat              the project's own tests in every stack, diffed, and the API scan
  "project(<stack>)"  the project's tests in one stack alone: {CLI} "project(candidate)"
  scan                the API scan of the project's source alone (report/project/scan.json)
  report              judge a report folder again (-- SHARD_DIR ... merges shard folders)
  diff                what changed between two reports: {CLI} diff -- OLD NEW
  releases            which ExecuTorch release to move to: {CLI} releases -- --from 0.7.0 --to 1.0.1
  bundle              the report's artifacts as a phone or board runs them: {CLI} bundle -- --out report
  device-results      a device's rounds read into the report: {CLI} device-results FILE --out report
  targets             latency on [tool.upgrade-gate.targets] over ssh (compare runs it after measure)
  -l                  every command, with the stacks' own ("run(<stack>)", "project(<stack>)", ...)

Options after `--` go to the command, e.g. {CLI} compare -- --out DIR --suite none --models my-model
(--suite smoke|default|full|none, --models a,b, --out DIR, --fresh; README.md has them all).
The configuration is [tool.upgrade-gate] in the nearest pyproject.toml above this folder.

exit status: 0 GO (releases: a release is recommended), 1 NO-GO, 2 bad input, 3 INCOMPLETE
"""

LIST_OPTIONS = ("-l", "--list", "--list-sessions")


def find_config(start: Path) -> Path | None:
    """The nearest pyproject.toml from ``start`` up, as pytest and ruff find theirs."""
    for folder in (start, *start.parents):
        if (folder / "pyproject.toml").is_file():
            return folder / "pyproject.toml"
    return None


# Commands whose words after their name are all their own (a file first), not sessions or nox's options.
OWN_WORDS = ("device-results",)


def nox_arguments(argv: list[str], config: Path) -> list[str]:
    """``compare report -- --out X`` → nox's own command line, with upgrade-gate's noxfile; ``device-results FILE
    --out X`` → ``--sessions device-results -- FILE --out X``."""
    if argv and argv[0] in OWN_WORDS:
        words = argv[1:]
        sessions, rest = argv[:1], ["--", *(words[1:] if words[:1] == ["--"] else words)]
    else:
        sessions = requested_sessions(argv)
        rest = argv[len(sessions):]
    # Given first, so that a user's own --envdir (nox takes the last) still wins.
    return ["--noxfile", str(NOXFILE), "--envdir", str(config.parent / ".nox"),
            *(["--sessions", *sessions] if sessions else []), *rest]


def requested_sessions(argv: list[str]) -> list[str]:
    """The words before the first option."""
    sessions = []
    for word in argv:
        if word.startswith("-"):
            break
        sessions.append(word)
    return sessions


def unknown_sessions(wanted: list[str], known: list[tuple[str, list[str]]]) -> str | None:
    """The message for sessions nox does not have (``known``: each session's name and signatures), or None."""
    accepted = {"".join(name.split()) for base, signatures in known for name in (base, *signatures)}
    missing = [name for name in wanted if "".join(name.split()) not in accepted]
    if not missing:
        return None
    listed = ", ".join(dict.fromkeys(signatures[0] if signatures else base for base, signatures in known))
    return (f"{CLI}: error: no command {missing[0]!r}; the commands: {listed} "
            f"(`{CLI} --help` says what each does)")


def _checking_sessions(filter_manifest: Callable[..., Any]) -> Callable[..., Any]:
    """nox's filter_manifest, but an unknown session is a usage error (exit 2) that lists them: nox's own exits 3,
    which upgrade-gate's exit codes call INCOMPLETE."""
    def checked(manifest: Any, global_config: Any) -> Any:
        wanted = list(global_config.sessions or [])
        known = [(session.name, list(session.signatures)) for session, _ in manifest.list_all_sessions()]
        message = unknown_sessions(wanted, known) if wanted and not global_config.keywords else None
        if message:
            print(message, file=sys.stderr, flush=True)
            return EXIT_USAGE
        return filter_manifest(manifest, global_config)
    return checked


def command_list(sessions: list[tuple[str, str]]) -> str:
    """``-l``: every session (name, description) as this command runs it — `upgrade-gate "run(legacy)"`, not
    nox's listing, whose noxfile docstring and `nox -s` lines a team does not type."""
    commands = [(command(name), description) for name, description in sessions]
    width = max(len(text) for text, _ in commands)
    lines = [f"  {text:<{width}}  {description}".rstrip() for text, description in commands]
    return (f"The commands of {CLI} (options after `--`: `{CLI} COMMAND -- --help`; README.md has them all):\n\n"
            + "\n".join(lines) + "\n")


def _listing_commands(honor_list_request: Callable[..., Any]) -> Callable[..., Any]:
    """nox's honor_list_request, but ``-l`` lists the sessions as this command's (``--json`` stays nox's)."""
    def listed(manifest: Any, global_config: Any) -> Any:
        if not global_config.list_sessions or global_config.json:
            return honor_list_request(manifest, global_config)
        print(command_list([(session.friendly_name, session.description or "")
                            for session, _ in manifest.list_all_sessions()]), end="")
        return 0
    return listed


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv in (["--version"], ["-V"]):
        print(f"{CLI} {__version__}")
        return
    before_options = argv[:argv.index("--")] if "--" in argv else argv
    if {"--help", "-h"} & set(before_options):  # `upgrade-gate compare -h` too: nox's help is not this command's
        print(USAGE, end="")
        return
    if not argv:  # a bare command asks for nothing: it must not start a run, and 0 would read as GO
        print(USAGE, end="", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    listing = bool(set(argv) & set(LIST_OPTIONS))
    with tempfile.TemporaryDirectory(prefix="upgrade-gate-") as empty:
        if os.environ.get(CONFIG_ENV_VAR):
            config = Path(os.environ[CONFIG_ENV_VAR]).resolve()
        else:
            found = find_config(Path.cwd())
            if found is None and listing:  # the sessions, with the built-in stacks: no configuration needed
                found = Path(empty) / "pyproject.toml"
                found.write_text("[tool.upgrade-gate]\n")
            if found is None:
                print(f"{CLI}: error: no pyproject.toml in {Path.cwd()} or any folder above it; run from your "
                      "repository, or create one (a [tool.upgrade-gate] table in it is optional: see the README)",
                      file=sys.stderr)
                raise SystemExit(EXIT_USAGE)
            config = found
        # Nox changes into the noxfile's folder (inside the package): the sessions read this instead.
        os.environ[CONFIG_ENV_VAR] = str(config)
        os.environ[COMMAND_ENV_VAR] = CLI  # advice names `upgrade-gate compare`, not `nox -s compare`
        import nox.tasks
        from nox.__main__ import main as nox_main

        nox.tasks.filter_manifest = _checking_sessions(nox.tasks.filter_manifest)
        nox.tasks.honor_list_request = _listing_commands(nox.tasks.honor_list_request)
        sys.argv = [CLI, *nox_arguments(argv, config)]
        nox_main()


if __name__ == "__main__":
    main()

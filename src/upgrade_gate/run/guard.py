"""Every session's end is an exit status and one message (docs/report.md), never a traceback:
0 GO or GO-WITH-CONDITIONS, 1 NO-GO, 2 a bad configuration or command line (naming the file and
key), 3 INCOMPLETE — the tool or the machine could not gather the evidence (an interrupted run, a
damaged report folder, a full disk, a fault of the tool, whose traceback goes to a log file the
message names). Nothing finished is deleted; running the same command again resumes."""

from __future__ import annotations

import errno
import functools
import os
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import nox.command

from upgrade_gate import layout
from upgrade_gate.errors import EXIT_INCOMPLETE, EXIT_USAGE, ConfigError, RunIncomplete
from upgrade_gate.run import _folder_lock, cache_folder, supervisor
from upgrade_gate.text import size


def fail_usage(error: Exception | str) -> NoReturn:
    """Print one message and exit 2: as SystemExit, which nox lets through (any other exception is its exit 1)."""
    print(f"upgrade-gate: error: {error}", file=sys.stderr, flush=True)
    _folder_lock.release_if_unused()
    raise SystemExit(EXIT_USAGE)


def fail_incomplete(message: str) -> NoReturn:
    """Print one message and exit 3: the evidence could not be gathered, and that is not the candidate's doing."""
    print(f"upgrade-gate: incomplete: {message}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_INCOMPLETE)


# -- every session's outcome: a verdict, a usage error, or INCOMPLETE -----------------------


def guarded(session: Callable[..., Any]) -> Callable[..., Any]:
    """A nox session whose every end is an exit status and one message, never a traceback. A usage error and
    nox's own control flow (session.error, skip) pass through."""
    @functools.wraps(session)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return session(*args, **kwargs)
        except ConfigError as error:  # bad input met during the run: a planted link, a name (exit 2)
            stop_writers()
            fail_usage(error)
        except RunIncomplete as error:  # not the candidate's doing, nor the tool's: said as it is
            stop_writers()
            fail_incomplete(str(error))
        except KeyboardInterrupt:
            stop_writers()
            fail_incomplete("the run was stopped (Ctrl-C or SIGTERM); what finished is kept: run the same command "
                            "again and it resumes")
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.EDQUOT):
                stop_writers()
                fail_incomplete(disk_full(error))
            fail_incomplete(_fault())
        except nox.command.CommandFailed:
            fail_incomplete("a command the session ran failed (its output is above); this is the tool's or the "
                            "machine's failure, not the candidate's")
        except Exception as error:  # noqa: BLE001 - any other fault: one message, the traceback in a file
            if type(error).__module__.startswith("nox"):
                raise  # session.error() and session.skip(): nox's own way out
            fail_incomplete(_fault())
    return run


def stop_writers() -> None:
    """Stop every worker, and remove the hidden ``.<name>.partial…`` files they left half-written in the report
    folders this run holds (only a finished write renames one to its name)."""
    supervisor.stop_all()
    for folder in _folder_lock.HELD:
        for leftover in folder.rglob(".*.partial*"):
            leftover.unlink(missing_ok=True)


def stop_on_sigterm() -> None:
    """SIGTERM (a CI job cancelled, `kill`) ends a session as Ctrl-C does: workers stopped, stages recorded."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupt)


def _fault() -> str:
    """The traceback of the exception being handled, into a log file; the message that names it. The file is in the
    report folder the run holds, else in the result cache it uses, else in the default one: never outside them."""
    folder = next(iter(_folder_lock.HELD), None) or next(iter(cache_folder.USING), None) or layout.cache_root()
    log = folder / FAULT_LOG
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8") as stream:
            stream.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(sys.argv)}\n{traceback.format_exc()}\n")
    except OSError:
        return f"upgrade-gate failed ({traceback.format_exc(limit=0).strip()}); the traceback could not be written"
    return (f"upgrade-gate failed ({traceback.format_exc(limit=0).strip().splitlines()[-1]}); the traceback is in "
            f"{log} — please report it. What finished is kept: running the same command again resumes")


# Where a fault's traceback goes (_fault).
FAULT_LOG = "upgrade-gate-error.log"


def disk_full(error: OSError) -> str:
    """No room left: which disk, how much it has, and what to do."""
    if isinstance(error.filename2, (str, Path)):  # a copy (shutil's): the target filled, not the source
        path = Path(error.filename2)
    elif isinstance(error.filename, (str, Path)):
        path = Path(error.filename)
    else:
        # A write that ran out (write, sendfile) names no file: of the places this run writes to, the fullest.
        writes_to = [*_folder_lock.HELD, layout.cache_root(), Path.cwd()]
        path = min(writes_to, key=lambda p: shutil.disk_usage(_existing(p)).free)
    existing = _existing(path)
    mount = next((p for p in (existing, *existing.parents) if os.path.ismount(p)), Path("/"))
    usage = shutil.disk_usage(existing)
    free = size(usage.free) if usage.free else "0 B"
    return (f"no space left on the disk that holds {path} (mounted at {mount}: {free} free of "
            f"{size(usage.total)}); a default-suite run writes about {DEFAULT_RUN_WRITES_GB} GB into the report "
            f"folder and as much into the result cache: free that much, or give --out or UPGRADE_GATE_CACHE on "
            "another disk, then run the same command again: it resumes")


def _existing(path: Path) -> Path:
    return next((p for p in (path, *path.parents) if p.exists()), Path("/"))


# What a cold run of the default suite writes into its report folder, and again into the cache
# (docs/benchmarks-log.md): the space a full disk needs back.
DEFAULT_RUN_WRITES_GB = 10

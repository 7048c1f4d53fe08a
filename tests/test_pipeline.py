"""The report folder's lock, with a real second process holding it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from upgrade_gate import pipeline

SRC = Path(__file__).resolve().parents[1] / "src"


def test_a_folder_another_run_holds_is_refused_naming_the_holder(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(SRC)!r}); from upgrade_gate import pipeline; "
         f"from pathlib import Path; pipeline.lock_out_dir(Path({str(tmp_path)!r})); print('held', flush=True); "
         "sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(pipeline.FolderBusy) as busy:
            pipeline.lock_out_dir(tmp_path)
        message = str(busy.value)
        assert message.startswith(f"{tmp_path}: another upgrade-gate run is writing this report folder "
                                  f"(pid {holder.pid} since ")
        assert message.endswith("; wait for it to finish, or choose another folder with --out DIR")
    finally:
        holder.kill()
        holder.wait()
    # A holder that died (even by SIGKILL) leaves the folder free.
    deadline = time.monotonic() + 5
    while True:
        try:
            pipeline.lock_out_dir(tmp_path)
            break
        except pipeline.FolderBusy:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    pipeline.lock_out_dir(tmp_path)  # again from the same process: already ours

"""Per-stack adapters and the worker that runs inside each stack's venv.

Every module here except ``worker`` is an adapter named by a stack spec's
``adapter`` key (``envs/*.toml``). An adapter exposes:

* ``SUFFIX`` — the artifact's file suffix (``.ptl``, ``.pte``)
* ``lower(module, inputs) -> (lowered, details)`` — the exported program in
  memory, and what to record about it (operators, delegate partitions)
* ``save(lowered, path, keep=False)`` — write the artifact; with ``keep`` the
  lowered program must stay usable afterwards (for ``save_program``); may
  return details to record (ExecuTorch: each method's planned memory)
* ``load(path)`` — load the artifact in the stack's mobile runtime
* ``run(program, inputs) -> outputs``
* ``set_threads(n)`` — the runtime's intra-op thread count
* optionally ``QUANTIZATIONS`` ({variant: recipe}) and ``quantize(module,
  inputs, variant) -> (module, details)`` — a module ``lower`` takes like any
  other, calibrated on ``inputs``
* optionally ``profile(path, inputs, runs)`` — time per operator of one call
  (``{"source", "total_ms", "operators": [{name, calls, total_ms, share}]}``);
  ``profiler_missing() -> str | None`` says what the machine lacks for it
* optionally ``OTHER_BACKENDS``, ``backend_unavailable(backend) -> str | None`` and
  ``export_only(backend, module, inputs)`` — export-only tries of the runtime's
  other backends (ExecuTorch: executorch_backends)
* optionally ``save_program({method: lowered}, path)`` and
  ``run_method(program, name, inputs)`` — every method of a model in one
  artifact (ExecuTorch's multi-method .pte)

``localize`` (where an export breaks), ``executorch_profile`` and
``executorch_backends`` are not adapters: the worker and the ExecuTorch adapter
use them. ``scan`` (with its rules, ``migration_rules.toml``) is not either: it
runs in the scan venv of `nox -s scan` (TorchFix, libcst) over the team's source.
Nothing in this package is imported by the parent process.
"""

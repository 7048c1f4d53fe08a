"""Per-stack adapters and the worker that runs inside each stack's venv.

Every module here except ``worker`` is an adapter named by a stack spec's
``adapter`` key (``envs/*.toml``). An adapter exposes:

* ``SUFFIX`` — the artifact's file suffix (``.ptl``, ``.pte``)
* ``export(module, inputs, path) -> dict`` — write the artifact, return details
* ``load(path)`` — load the artifact in the stack's mobile runtime
* ``run(program, inputs) -> outputs``
* ``set_threads(n)`` — the runtime's intra-op thread count

Nothing in this package is imported by the parent process.
"""

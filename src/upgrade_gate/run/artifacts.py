"""Artifacts (``.pte``, ``.ptl``) kept once: in the result cache, referenced by digest from the report folder.

They are most of a run's bytes (the default suite's 9.5 GB): a folder that carries them is too big for a CI
artifact, and the export's cache entry already holds each one. An artifact that entry holds leaves the folder
when the report is written, listed under ``released`` in ``export.cache.json``; a step that needs it again
restores it from the entry, verified, or says how to get it back. One no entry holds always stays.
"""

from __future__ import annotations

from pathlib import Path

from upgrade_gate import layout
from upgrade_gate._atomic import write_json_atomic
from upgrade_gate._confined import remove_file
from upgrade_gate.config.plan import Plan
from upgrade_gate.invocation import command
from upgrade_gate.run import cache
from upgrade_gate.schema.records import RELEASED, RecordError, load_stack_model, read_key_record


def artifact_files(out: Path, stack: str, model: str) -> list[str]:
    """The artifacts the export saved: one per method, or the multi-method program they are all in."""
    try:
        record = load_stack_model(out, stack, model)
    except RecordError:
        return []
    return list(record.saved_files)


def release(plan: Plan) -> int:
    """Every artifact of the report folder that its export's cache entry holds leaves the folder; the bytes freed."""
    out, store = plan.settings.out_dir, cache.ResultCache(plan.settings.cache_dir)
    freed = 0
    for spec in plan.stacks:
        for model in plan.models:
            model_dir = layout.model_dir(out, spec.name, model.name)
            record = read_key_record(model_dir, "export")
            if not record or not record.get("stored") or not record.get("key"):
                continue
            manifest = store.entry_dir(spec.name, model.name, "export", record["key"]) / cache.MANIFEST
            held = cache.read_manifest_files(manifest)
            files = record.get("files") or {}
            leaving = [name for name in artifact_files(out, spec.name, model.name)
                       if (model_dir / name).is_file() and name in held and name in files
                       and held[name].get("sha256") == files[name].get("sha256")]
            if not leaving:
                continue
            # The record first: a folder never lacks a file its record does not account for.
            write_json_atomic(layout.key_record_file(model_dir, "export"),
                              {**record, RELEASED: sorted(set(record.get(RELEASED) or ()) | set(leaving))})
            for name in leaving:
                freed += (model_dir / name).stat().st_size
                remove_file(model_dir / name, within=model_dir)  # a name a damaged record gives stays inside
    return freed


def restore(plan: Plan, stack: str, model: str) -> str | None:
    """The model's released artifacts copied back from the result cache, verified; None, or what is
    missing and how to get it back."""
    out = plan.settings.out_dir
    model_dir = layout.model_dir(out, stack, model)
    record = read_key_record(model_dir, "export") or {}
    names = sorted(set(record.get(RELEASED) or ()))
    if not names:
        return None
    hit, _ = cache.ResultCache(plan.settings.cache_dir).lookup(stack, model, "export", str(record.get("key")))
    missing = [name for name in names if hit is None or name not in hit.files]
    if missing:
        where = model_dir.relative_to(out).as_posix()
        return (f"{where}/{missing[0]} was left in the result cache by digest (not kept in the report folder) and "
                f"{plan.settings.cache_dir} no longer holds it: run `{command('compare', f'--out {out}')}` to "
                "export it again, or keep artifacts in the folder with --keep-artifacts")
    assert hit is not None
    for name in names:
        cache.copy_file(hit.path / name, model_dir / name)
    write_json_atomic(layout.key_record_file(model_dir, "export"),
                      {k: v for k, v in record.items() if k != RELEASED})
    return None

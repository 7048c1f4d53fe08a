"""One codec for the results schema's records: a dataclass's fields drive both directions.

A record is a frozen dataclass that mixes in ``Record``. ``to_dict`` writes each field under
its name, in the order the fields are declared; ``from_reader`` reads each back by the field's
type (``typing.get_type_hints``: every annotated type is imported at runtime in its module).
An error names the JSON path, as ``reader.Reader``'s do: ``Missing key 'model' in
'results.json.models[0]'``, ``Unexpected type str (expected int) in '….rounds.forward'``.

Types: str, int, float (JSON's "inf", "-inf", "nan" too), bool, Any (as it is), ``X | None``,
an Enum (written as its value; an unknown one is named with the allowed values), a record
(anything with ``to_dict`` and ``from_reader``: a Record, or a class that keeps its own pair),
a ``Text`` (written as its str, read with its ``parse``), ``tuple[T, ...]`` and ``tuple[T, T]``
(JSON lists), ``dict[str, T]`` and ``dict[int, T]`` (JSON objects; int keys written as text).

A field with a default may be absent from the JSON (a file older than the field), and reads
as its default when absent or null (unless it may be None); a field without one is required.
The irregular cases are field metadata (below), combined with ``|``; values written for the
file's readers and not read back are the class attribute ``DERIVED``.
"""

from __future__ import annotations

import dataclasses
import enum
import operator
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Self

from upgrade_gate.errors import RecordError
from upgrade_gate.schema.reader import NON_FINITE, Reader

START = ""  # derived(…, after=START): written first

Write = Callable[[Any], Any]
Read = Callable[[Reader, str], Any]


# -- field metadata ------------------------------------------------------------------


def key(name: str) -> dict[str, Any]:
    """The field's JSON key, where it is not the field's name."""
    return {"codec.key": name}


def group(name: str) -> dict[str, Any]:
    """The field is written inside the nested object ``name``, where the group's first field is."""
    return {"codec.group": name}


def absent(value: Any) -> dict[str, Any]:
    """What the field reads as when its key is missing or null."""
    return {"codec.absent": value}


def custom(write: Write | None = None, read: Read | None = None) -> dict[str, Any]:
    """``write(record)`` gives the field's JSON value; ``read(reader, key)`` its value back; either may be left
    to the codec."""
    found: dict[str, Any] = {}
    if write is not None:
        found["codec.write"] = write
    if read is not None:
        found["codec.read"] = read
    return found


def spread(read: Read | None = None) -> dict[str, Any]:
    """The field (a record, or a dict) is written into the enclosing object, and read from it:
    by the record's ``from_reader``, or by ``read(reader, key)``."""
    return {"codec.spread": True, **custom(read=read)}


def omitted() -> dict[str, Any]:
    """The field is not written while it has its default value (a key some records have and others lack)."""
    return {"codec.omit": True}


@dataclasses.dataclass(frozen=True)
class Derived:
    """A value written for the file's readers, not read back."""

    key: str
    get: Write
    after: str | None  # the JSON key it follows; START: first; None: last


def derived(key: str, get: Write | None = None, *, after: str | None = None) -> Derived:
    """``get(record)`` (by default the record's attribute ``key``) written under ``key``."""
    return Derived(key=key, get=get or operator.attrgetter(key), after=after)


# -- the plan of one class -----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    key: str
    kind: Any
    group: str | None
    default: Callable[[], Any] | None  # None: required
    write: Write | None
    read: Read | None
    spread: bool
    omit: bool

    @property
    def optional(self) -> bool:
        return _optional(self.kind) is not None


@dataclasses.dataclass(frozen=True)
class _Plan:
    fields: tuple[_Field, ...]
    # What to_dict writes, in order: a field, a group's name with its fields, or a derived value.
    layout: tuple[_Field | tuple[str, tuple[_Field, ...]] | Derived, ...]


_PLANS: dict[type, _Plan] = {}


def _plan(cls: type) -> _Plan:
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = _make_plan(cls)
    return plan


def _make_plan(cls: type) -> _Plan:
    hints = typing.get_type_hints(cls)
    found = tuple(_field(f, hints[f.name]) for f in dataclasses.fields(cls))
    extra: tuple[Derived, ...] = getattr(cls, "DERIVED", ())
    layout: list[_Field | tuple[str, tuple[_Field, ...]] | Derived] = []

    def follow(after: str | None) -> None:
        for entry in extra:
            if entry.after == after:
                layout.append(entry)
                follow(entry.key)

    follow(START)
    written: set[str] = set()
    for f in found:
        if f.group is None:
            layout.append(f)
            follow(f.key)
        elif f.group not in written:
            written.add(f.group)
            layout.append((f.group, tuple(g for g in found if g.group == f.group)))
            follow(f.group)
    follow(None)
    missing = {entry.key for entry in extra} - {entry.key for entry in layout if isinstance(entry, Derived)}
    if missing:
        raise TypeError(f"{cls.__name__}.DERIVED: {sorted(missing)} follow no key it writes")
    return _Plan(fields=found, layout=tuple(layout))


def _field(f: dataclasses.Field[Any], kind: Any) -> _Field:
    meta: Mapping[str, Any] = f.metadata
    default: Callable[[], Any] | None = None
    if "codec.absent" in meta:
        default = _constant(meta["codec.absent"])
    elif f.default is not dataclasses.MISSING:
        default = _constant(f.default)
    elif f.default_factory is not dataclasses.MISSING:
        default = f.default_factory
    return _Field(name=f.name, key=meta.get("codec.key", f.name), kind=kind, group=meta.get("codec.group"),
                  default=default, write=meta.get("codec.write"), read=meta.get("codec.read"),
                  spread=meta.get("codec.spread", False), omit=meta.get("codec.omit", False))


def _constant(value: Any) -> Callable[[], Any]:
    return lambda: value


def _optional(kind: Any) -> Any:
    """X of ``X | None``; None if the type is not optional."""
    if typing.get_origin(kind) in (types.UnionType, typing.Union) and type(None) in typing.get_args(kind):
        inner = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"the codec reads one type or None, not {kind!r}")
        return inner[0]
    return None


# -- the mixins ----------------------------------------------------------------------


class Record:
    """A frozen dataclass's ``to_dict`` and ``from_reader``, driven by its fields."""

    __slots__ = ()
    DERIVED: ClassVar[tuple[Derived, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for entry in _plan(type(self)).layout:
            if isinstance(entry, Derived):
                data[entry.key] = entry.get(self)
            elif isinstance(entry, _Field):
                if entry.omit and entry.default is not None and getattr(self, entry.name) == entry.default():
                    continue
                value = entry.write(self) if entry.write else encode(getattr(self, entry.name))
                if entry.spread:
                    data.update(value)
                else:
                    data[entry.key] = value
            else:
                name, members = entry
                data[name] = {f.key: f.write(self) if f.write else encode(getattr(self, f.name)) for f in members}
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Self:
        """The record of ``data``, an error naming its path from ``where``."""
        return cls.from_reader(Reader(data, where))

    @classmethod
    def from_reader(cls, r: Reader) -> Self:
        _expect(r.data, dict, r.where, "object")
        groups: dict[str, Reader] = {}
        values = {}
        for f in _plan(cls).fields:
            source = r
            if f.group is not None:
                if f.group not in groups:
                    groups[f.group] = _group(r, f.group, cls)
                source = groups[f.group]
            values[f.name] = _read_field(source, f)
        return cls(**values)


def _group(r: Reader, name: str, cls: type) -> Reader:
    if any(f.group == name and f.default is None for f in _plan(cls).fields):
        return r.required_child(name)
    return r.child(name) or Reader({}, f"{r.where}.{name}")


class Text:
    """A value written as its str and read back with ``parse`` (a ValueError names the path)."""

    __slots__ = ()

    @classmethod
    def parse(cls, shown: str) -> Self:
        raise NotImplementedError


# -- writing -------------------------------------------------------------------------


def encode(value: Any) -> Any:
    """A field's value as JSON: enums by value, records by ``to_dict``, texts by str, tuples as lists."""
    if value is None or isinstance(value, bool | int | float | str) and not isinstance(value, enum.Enum):
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Text):
        return str(value)
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, tuple | list):
        return [encode(item) for item in value]
    if isinstance(value, dict):
        return {name if isinstance(name, str) else str(name): encode(item) for name, item in value.items()}
    return value


# -- reading -------------------------------------------------------------------------


def _read_field(r: Reader, f: _Field) -> Any:
    if f.read is not None:
        return f.read(r, f.key)
    if f.spread:
        return f.kind.from_reader(r)
    if f.key not in r.data:
        if f.default is None:
            raise RecordError(f"Missing key {f.key!r} in {r.where!r}")
        return f.default()
    value = r.data[f.key]
    if value is None and not f.optional and f.default is not None:
        return f.default()
    return decode(value, f.kind, f"{r.where}.{f.key}", f.key)


def decode(value: Any, kind: Any, where: str, name: str) -> Any:
    """``value`` read as ``kind``; ``where`` is its path, ``name`` its key (for an enum's error)."""
    inner = _optional(kind)
    if inner is not None:
        return None if value is None else decode(value, inner, where, name)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is tuple:
        items = _expect(value, list, where)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(decode(item, args[0], f"{where}[{i}]", name) for i, item in enumerate(items))
        if len(items) != len(args):
            raise RecordError(f"Expected {len(args)} items in '{where}', got {items!r}")
        return tuple(decode(item, arg, f"{where}[{i}]", name) for i, (item, arg) in enumerate(zip(items, args)))
    if origin is dict:
        table = _expect(value, dict, where)
        return {_key(k, args[0], where): decode(item, args[1], f"{where}.{k}", k) for k, item in table.items()}
    if kind is Any:
        return value
    if not isinstance(kind, type):
        raise TypeError(f"the codec has no rule for {kind!r} (in '{where}')")
    return _scalar(value, kind, where, name)


def _scalar(value: Any, kind: type, where: str, name: str) -> Any:
    if issubclass(kind, enum.Enum):
        shown = _expect(value, str, where)
        try:
            return kind(shown)
        except ValueError:
            raise RecordError(f"Unknown {name} {shown!r} in '{where}'; expected one of "
                              f"{', '.join(str(member.value) for member in kind)}") from None
    if issubclass(kind, Text):
        try:
            return kind.parse(_expect(value, str, where))
        except RecordError:
            raise
        except ValueError as error:
            raise RecordError(f"{error} in '{where}'") from None
    if hasattr(kind, "from_reader"):
        return kind.from_reader(Reader(_expect(value, dict, where), where))
    if kind is float:
        return float(value) if value in NON_FINITE else float(_expect(value, (int, float), where))
    if kind in (str, int, bool):
        return _expect(value, kind, where)
    raise TypeError(f"the codec has no rule for {kind.__name__} (in '{where}')")


def _key(shown: str, kind: Any, where: str) -> Any:
    if kind is int:
        if not shown.isdigit():
            raise RecordError(f"Unexpected key {shown!r} (expected a whole number) in '{where}'")
        return int(shown)
    return shown


def _expect(value: Any, kind: type | tuple[type, ...], where: str, shown: str | None = None) -> Any:
    """``value``, if it is of ``kind`` (a bool is no int); else Reader's error."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        expected = shown or " or ".join(k.__name__ for k in kinds)
        raise RecordError(f"Unexpected type {type(value).__name__} (expected {expected}) in '{where}'")
    return value

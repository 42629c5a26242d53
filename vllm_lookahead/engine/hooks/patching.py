"""How the plugin replaces a vLLM symbol: checked, logged, reversible.

The table of *what* is replaced (and why) is :mod:`vllm_lookahead.engine.hooks.patches`;
this module is the mechanism, also used by the benchmark's step timers
(:mod:`benchmarks.driver`) so nothing in the project patches vLLM any
other way.  Applying a :class:`Patch`:

1. resolves ``"module:Owner.name"`` to the class (or module) that holds the symbol
   and takes the original from the owner's own ``__dict__`` (never an inherited one);
2. checks the original's parameter names against the ones the patch was written
   for, so a vLLM release that changed the method fails at start-up with a message
   naming the symbol instead of misbehaving later;
3. refuses to stack on a replacement made by another plugin (a function whose code
   lives outside vLLM's package and is not ours): two plugins rewriting the same
   runner method cannot both be right;
4. installs ``make(original)`` (original kept as ``__wrapped__``), logs the symbol and
   the reason at DEBUG, and returns an :class:`Applied` that :meth:`PatchSet.undo` can revert.

An :class:`AddedField` -- a field the plugin declares on a vLLM dataclass so that data of its
own rides where vLLM carries that dataclass -- goes through the same steps: the class must be a
dataclass defined by vLLM without a field of that name (one vLLM or another plugin added is
refused), the field is declared with the default None, logged, and removed by the undo.

:meth:`PatchSet.apply` logs one INFO line per call for what it newly installed.  vLLM loads
the plugin in each of its processes (API server, engine core, every worker) and the table
applies in each, so a per-patch INFO list would repeat in every process's log;
``python -m vllm_lookahead.engine.hooks.patches`` prints the table with the reasons.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("vllm.lookahead")  # under vLLM's logger: same handlers and format

MARK = "__vllm_lookahead_patch__"  # attribute on every replacement: the Applied record


class PatchError(RuntimeError):
    """A vLLM symbol cannot be patched safely (missing, changed signature, patched by someone else)."""


class _Target:
    target: str

    @property
    def owner_path(self) -> tuple[str, str]:
        module, _, qualname = self.target.partition(":")
        return module, qualname


@dataclass(frozen=True)
class Patch(_Target):
    """One replaced vLLM symbol.

    ``target``: ``"package.module:Owner.name"`` (a method of a class) or
    ``"package.module:name"`` (a module-level function, replaced in that module's
    namespace, which is where the module's own code looks it up);
    ``params``: the original's parameter names in the vLLM release line we support;
    ``reason``: why vLLM's own code cannot be used as is (logged, and listed in the docs);
    ``make``: ``original -> replacement``.
    """

    target: str
    params: tuple[str, ...]
    reason: str
    make: Callable[[Callable], Callable] = field(compare=False, repr=False)
    tag: str = "lookahead"  # who applies it: "lookahead" (the plugin) or "bench-timer"


@dataclass(frozen=True)
class AddedField(_Target):
    """One field declared on a vLLM dataclass (default None).

    ``target``: ``"package.module:Class.field"``; ``type``: the field's annotation;
    ``reason``: why the data cannot travel in a field vLLM declares (logged, and listed in the docs).
    vLLM's generated ``__init__`` does not take the field: instances read the default until
    the plugin sets the attribute.
    """

    target: str
    type: Any
    reason: str
    tag: str = "lookahead"


@dataclass
class Applied:
    """An installed patch: enough to check it and to put the original back."""

    patch: Patch | AddedField
    owner: Any
    name: str
    original: Callable
    replacement: Callable


def resolve(patch: Patch) -> tuple[Any, str]:
    """(owner object, attribute name) of ``patch.target``; raises :class:`PatchError` if absent."""
    owner, name = _owner(patch)
    if name not in vars(owner):
        raise PatchError(
            f"vllm-lookahead: {patch.target} does not exist in the installed vLLM; "
            "this vLLM release is not supported by this version of the plugin"
        )
    return owner, name


def _owner(patch: Patch | AddedField) -> tuple[Any, str]:
    """(object that holds the target, attribute name), the attribute itself not looked up."""
    module_name, qualname = patch.owner_path
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise PatchError(f"vllm-lookahead: cannot import {module_name} to patch {patch.target}: {exc}") from exc
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            raise PatchError(f"vllm-lookahead: {patch.target}: {module_name} has no {'.'.join(path)}")
    return owner, name


def applied_record(fn: Any) -> Applied | None:
    """The :class:`Applied` record of a replacement we installed, else None."""
    return getattr(fn, MARK, None)


def vllm_original(fn: Any) -> Any:
    """Follow our own replacements (e.g. a timer over a lookahead patch) down to what vLLM defined."""
    record = applied_record(fn)
    while record is not None:
        fn = record.original
        record = applied_record(fn)
    return fn


def _function(obj: Any) -> Any:
    return obj.__func__ if isinstance(obj, (staticmethod, classmethod)) else obj


@functools.lru_cache(maxsize=1)
def _vllm_root() -> str:
    import vllm

    return os.path.realpath(os.path.dirname(vllm.__file__)) + os.sep


@functools.lru_cache(maxsize=1)
def _decorator_roots() -> tuple[str, ...]:
    """Where the code of decorators vLLM itself applies lives (``torch.inference_mode()``,
    ``functools``/``contextlib`` wrappers): a wrapper from there is followed to what it wraps."""
    import torch

    return (
        os.path.realpath(os.path.dirname(torch.__file__)) + os.sep,
        os.path.realpath(os.path.dirname(functools.__file__)) + os.sep,
    )


def defined_by_vllm(fn: Any) -> bool:
    """Whether ``fn`` is vLLM's own code, possibly under library decorators vLLM applies
    (``@torch.inference_mode()``).  A wrapper made elsewhere -- another plugin's, even with
    ``functools.wraps`` -- is not."""
    for _ in range(16):
        fn = _function(fn)
        code = getattr(fn, "__code__", None)
        if code is None:  # a builtin or a C extension: trust its module name
            return str(getattr(fn, "__module__", "")).startswith("vllm")
        filename = os.path.realpath(code.co_filename)
        if filename.startswith(_vllm_root()):
            return True
        inner = getattr(fn, "__wrapped__", None)
        if inner is None or not filename.startswith(_decorator_roots()):
            return False
        fn = inner
    return False


def check_signature(patch: Patch, original: Callable) -> None:
    """Raise :class:`PatchError` unless vLLM's original takes exactly ``patch.params``."""
    try:
        found = tuple(inspect.signature(_function(vllm_original(original))).parameters)
    except (TypeError, ValueError) as exc:
        raise PatchError(f"vllm-lookahead: cannot read the signature of {patch.target}: {exc}") from exc
    if found != patch.params:
        raise PatchError(
            f"vllm-lookahead: {patch.target} takes ({', '.join(found)}) in the installed vLLM, but the plugin "
            f"was written for ({', '.join(patch.params)}); this vLLM release is not supported"
        )


def apply(patch: Patch) -> Applied:
    """Install ``patch`` (see the module docstring); a second call returns the first install."""
    return _install(patch)[0]


def _install(patch: Patch) -> tuple[Applied, bool]:
    """:func:`apply`, and whether this call installed it (False: it was installed already)."""
    owner, name = resolve(patch)
    current = vars(owner)[name]
    record = applied_record(current)
    if record is not None and record.patch.target == patch.target and record.patch.tag == patch.tag:
        return record, False  # already installed in this process
    if record is None and not defined_by_vllm(current):
        fn = _function(current)
        where = getattr(getattr(fn, "__code__", None), "co_filename", "?")
        raise PatchError(
            f"vllm-lookahead: {patch.target} has already been replaced by another plugin "
            f"({getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')} in {where}); "
            "lookahead rewrites the same step and cannot run beside it. Load only one of them "
            "(vLLM's VLLM_PLUGINS environment variable selects the general plugins it loads)."
        )
    check_signature(patch, current)
    replacement = patch.make(current)
    functools.update_wrapper(replacement, _function(current))
    replacement.__wrapped__ = current  # type: ignore[attr-defined]
    applied = Applied(patch, owner, name, current, replacement)
    setattr(replacement, MARK, applied)
    setattr(owner, name, replacement)
    logger.debug("vllm-lookahead: patched %s: %s", patch.target, _short_reason(patch))
    return applied, True


def _add_field(added: AddedField) -> tuple[Applied, bool]:
    """Declare ``added`` on its vLLM dataclass; whether this call declared it (False: it was
    declared already, by this plugin)."""
    cls, name = _owner(added)
    declared = getattr(cls, "__dataclass_fields__", None)
    if not isinstance(cls, type) or declared is None:
        raise PatchError(
            f"vllm-lookahead: {added.target}: {cls!r} is not a dataclass in the installed vLLM; "
            "this vLLM release is not supported by this version of the plugin"
        )
    if not _class_file(cls).startswith(_vllm_root()):
        raise PatchError(
            f"vllm-lookahead: {added.target}: {cls.__module__}.{cls.__qualname__} is not vLLM's class "
            f"(defined in {_class_file(cls)}); lookahead cannot declare a field on it"
        )
    existing = declared.get(name)
    record = existing.metadata.get(MARK) if existing is not None else None
    if record is not None and record.patch == added:
        return record, False  # declared already in this process
    if existing is not None or name in vars(cls):
        raise PatchError(
            f"vllm-lookahead: {added.target} is already declared (by the installed vLLM or another plugin); "
            "lookahead would overwrite it. Load only one plugin that uses it (VLLM_PLUGINS), or a vLLM "
            "release this version of the plugin supports."
        )
    meta: dict[str, Applied] = {}
    new = dataclasses.field(default=None, metadata=meta)
    new.name, new.type = name, added.type
    new._field_type = dataclasses._FIELD  # type: ignore[attr-defined]  # what @dataclass sets on its fields
    applied = Applied(added, cls, name, _ABSENT, new)
    meta[MARK] = applied
    declared[name] = new
    cls.__annotations__[name] = added.type
    setattr(cls, name, None)
    logger.debug("vllm-lookahead: declared %s: %s", added.target, _short_reason(added))
    return applied, True


def _remove_field(a: Applied) -> None:
    """Undo :func:`_add_field`."""
    declared = a.owner.__dataclass_fields__
    if a.name not in declared:
        return  # removed already (the same field was applied twice in this set)
    if declared[a.name] is not a.replacement:
        raise PatchError(f"vllm-lookahead: cannot undo {a.patch.target}: something declared it over ours since")
    del declared[a.name]
    a.owner.__annotations__.pop(a.name, None)
    delattr(a.owner, a.name)


_ABSENT = object()  # the "original" of a field the plugin declared


def _class_file(cls: type) -> str:
    try:
        return os.path.realpath(inspect.getfile(cls))
    except TypeError:  # a builtin class
        return "?"


def _short_reason(patch: Patch | AddedField) -> str:
    """The reason up to its first parenthesis or semicolon."""
    return re.split(r" \(|;", patch.reason, maxsplit=1)[0]


def summary(patches: list[Patch | AddedField]) -> str:
    """One line for patches installed together: the single symbol, or how many (and where the list is)."""
    tags = ", ".join(sorted({p.tag for p in patches}))
    if len(patches) == 1:
        return f"vllm-lookahead: patched {patches[0].target}: {_short_reason(patches[0])}"
    return (
        f"vllm-lookahead: patched {len(patches)} vLLM symbols ({tags}); VLLM_LOGGING_LEVEL=DEBUG logs each "
        "with its reason (the plugin's table: python -m vllm_lookahead.engine.hooks.patches)"
    )


class PatchSet:
    """Patches applied together and undone together, last applied first."""

    def __init__(self) -> None:
        self.applied: list[Applied] = []

    def apply(self, patches: list[Patch | AddedField] | tuple[Patch | AddedField, ...]) -> PatchSet:
        """Install ``patches`` in order; one INFO line (:func:`summary`) for those not installed before."""
        new = []
        for patch in patches:
            applied, installed = _add_field(patch) if isinstance(patch, AddedField) else _install(patch)
            self.applied.append(applied)
            if installed:
                new.append(patch)
        if new:
            logger.info("%s", summary(new))
        return self

    def undo(self) -> None:
        """Put the originals back; refuses if a later patch was stacked on one of ours."""
        while self.applied:
            a = self.applied.pop()
            if isinstance(a.patch, AddedField):
                _remove_field(a)
                continue
            current = vars(a.owner).get(a.name)
            if current is a.original:
                continue  # undone already (the same patch was applied twice in this set)
            if current is not a.replacement:
                raise PatchError(f"vllm-lookahead: cannot undo {a.patch.target}: something was patched over it since")
            setattr(a.owner, a.name, a.original)

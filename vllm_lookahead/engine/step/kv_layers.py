"""Start-up checks of the engine's attention layers and KV cache, once the cache exists: every
layer must be one the tree path reproduces, and the cache is pinned as the tree path reads it
(:class:`.kv.PagedKV`).  Each refusal is one line naming what is not supported, raised before
the first request rather than at the first tree step."""

from __future__ import annotations

from typing import Any

import torch

from vllm_lookahead.engine.step.attention import unsupported_feature
from vllm_lookahead.engine.step.kv import SUPPORTED_BACKENDS, SUPPORTED_CPU_ISAS, PagedKV, kv_views


def paged_kv_of(runner: Any) -> PagedKV:
    """The runner's KV cache as the tree path reads it, after checking the engine's layout: one
    full-attention cache group, a supported backend, no FULL CUDA graphs, every layer's features
    and (CPU) ISA, blocks the size the block table counts."""
    groups = runner.kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise NotImplementedError(
            f"lookahead: models with {len(groups)} KV cache groups (hybrid/sliding-window "
            "mixes) are not supported; only a single full-attention group is"
        )
    backend = runner.attn_groups[0][0].backend.get_name()
    if backend not in SUPPORTED_BACKENDS:
        raise NotImplementedError(
            f"lookahead: attention backend {backend} is not supported ({', '.join(SUPPORTED_BACKENDS)} are)"
        )
    mode = getattr(runner.compilation_config, "cudagraph_mode", None)
    if mode is not None and mode.has_full_cudagraphs():
        raise NotImplementedError(
            f"lookahead: cudagraph_mode {mode.name} captures attention in FULL CUDA graphs, which cannot "
            "run the eager tree-attention pass; use -cc.cudagraph_mode=PIECEWISE (what the plugin sets "
            "when it builds the engine config) or NONE"
        )
    caches = _layer_caches(runner, groups[0].layer_names, backend)
    block_size = kv_views(caches[0], backend)[0].shape[2]
    table_block_size = runner.input_batch.block_table[0].block_size
    if block_size != table_block_size:
        raise NotImplementedError(
            f"lookahead: the KV cache blocks hold {block_size} tokens but the block table counts "
            f"{table_block_size} (kernel block splitting); not supported"
        )
    kv = PagedKV(backend, caches, block_size)
    for cache in caches:  # refused here rather than at the first tree step
        kv.row_layout(cache)
    return kv


def _layer_caches(runner: Any, layer_names: list[str], backend: str) -> list[torch.Tensor]:
    """Each attention layer's cache tensor, after checking the layer is one tree attention
    reproduces (and, on CPU_ATTN, packs its cache in a layout the tree path reads)."""
    ctx = runner.compilation_config.static_forward_context
    caches = []
    for name in layer_names:
        layer = ctx[name]
        reason = unsupported_feature(layer.impl)
        if reason is not None:
            raise NotImplementedError(f"lookahead: layer {name} uses {reason}, which tree attention does not implement")
        isa = getattr(layer, "isa", None)
        if backend == "CPU_ATTN" and isa not in SUPPORTED_CPU_ISAS:
            raise NotImplementedError(
                f"lookahead: CPU attention ISA {isa!r} packs its KV cache in a layout the tree "
                f"path does not read yet (supported: {', '.join(SUPPORTED_CPU_ISAS)})"
            )
        kv = layer.kv_cache
        caches.append(kv[0] if isinstance(kv, (list, tuple)) else kv)
    return caches

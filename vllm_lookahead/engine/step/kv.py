"""Paged KV cache access for tree attention and for compaction of the accepted path.

vLLM's scheduler believes the KV of the first ``a`` draft slots after the root is
valid once ``a`` drafts are accepted (``num_computed_tokens += 1 + a``).  The
accepted path of a tree is not, in general, the first ``a`` rows, so after
verification :func:`move_slots` copies each accepted node's K/V (already
rotated with its tree depth = its final position) from its own slot to slot
``root + depth``.  Everything else the tree wrote is left behind as garbage in
slots vLLM considers free.  :meth:`PagedKV.move` does it for every layer in one
Triton launch on CUDA (:mod:`vllm_lookahead.kernels.kv_compaction`), with the torch
:func:`move_slots` layer by layer elsewhere.

vLLM 0.32 hands every attention backend one tensor per layer with the *logical*
shape ``[num_blocks, num_kv_heads, block_size, C]``; its *physical* order is one
of :class:`vllm.v1.kv_cache_layout.KVCacheLayout` (head-major or token-major
blocks, layers outermost or interleaved per block), expressed as strides, so
every view below is built by indexing, never by ``.view`` on the raw storage.
What ``C`` holds depends on the backend:

* ``CPU_ATTN`` (ISAs ``vec``/``vec16``, x86 without AMX): per block and head,
  ``2*head_size*block_size`` values = K transposed (``[head_size, block_size]``)
  then V (``[block_size, head_size]``) -- read off ``ops.cpu_attn_reshape_and_cache``
  (tests/unit/test_kv_layout.py); its only layout is head-major (LBHNC);
* ``FLASH_ATTN``, ``TRITON_ATTN``, ``FLASHINFER``: ``C = 2*head_size``, K in
  ``[..., :head_size]`` and V in ``[..., head_size:]`` of each token's row -- the
  split their own ``do_kv_cache_update`` makes (``kv_cache.transpose(1, 2).split(
  head_size, -1)``), in any KVCacheLayout.  Checked on CPU against vLLM's own
  stride computation for every layout (tests/unit/test_gpu_kv_layouts.py); never
  run on a GPU here.

Either way :func:`kv_views` yields K and V as ``[num_blocks, num_kv_heads,
block_size, head_size]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vllm_lookahead.kernels import use_kernel

# Backend name (AttentionBackend.get_name()) -> how C splits into K and V.
SPLIT_LAST_DIM = ("FLASH_ATTN", "TRITON_ATTN", "FLASHINFER")
SUPPORTED_BACKENDS = ("CPU_ATTN", *SPLIT_LAST_DIM)
# CPU attention kernels whose cache layout is the one read here (AMX/NEON/... pack K differently).
SUPPORTED_CPU_ISAS = ("vec", "vec16")


@dataclass
class PagedKV:
    """The paged KV cache of one worker, as the tree path reads and compacts it."""

    backend: str
    layer_caches: list[torch.Tensor]  # one logical [blocks, kv_heads, block_size, C] tensor per layer
    block_size: int  # tokens per block of the block table the runner hands to attention
    layout_checked: bool = field(default=False)  # set once the first tree step read back its own keys
    _layouts: dict = field(default_factory=dict, repr=False)
    _addressings: dict = field(default_factory=dict, repr=False)
    _offsets: list = field(default_factory=list, repr=False)  # [layer offsets or None], once known

    def addressing(self, kv_cache: torch.Tensor):
        """How the Triton kernels address ``kv_cache``
        (:class:`~vllm_lookahead.kernels.tree_attention.CacheAddressing`)."""
        from vllm_lookahead.kernels.tree_attention import CacheAddressing

        signature = (tuple(kv_cache.shape), kv_cache.stride())
        found = self._addressings.get(signature)
        if found is None:
            found = self._addressings[signature] = CacheAddressing.of(kv_cache, self.backend == "CPU_ATTN")
        return found

    def move(self, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
        """Copy K/V of ``src_slots`` to ``dst_slots`` in every layer (int64 slots on the cache's
        device; per request ascending by destination, as verification lists them): one Triton
        launch for all layers where :func:`~vllm_lookahead.kernels.use_kernel` says so
        and every layer's cache is alike, else :func:`move_slots` layer by layer."""
        if src_slots.numel() == 0:
            return
        if not use_kernel(src_slots) or self._layer_offsets() is None:
            move_slots(self.layer_caches, self.backend, src_slots, dst_slots)
            return
        from vllm_lookahead.kernels import kv_compaction

        first = self.layer_caches[0]
        kv_compaction.move_slots(first, self._layer_offsets(), self.addressing(first), src_slots, dst_slots)

    def _layer_offsets(self) -> torch.Tensor | None:
        """Element offsets of the distinct layer caches from the first (None: caches differ)."""
        if not self._offsets:
            from vllm_lookahead.kernels.kv_compaction import layer_offsets

            try:
                self._offsets.append(layer_offsets(self.layer_caches))
            except ValueError:  # e.g. hybrid models: layers of other shapes
                self._offsets.append(None)
        return self._offsets[0]

    def row_layout(self, kv_cache: torch.Tensor) -> RowLayout:
        """How the tree pass reads ``kv_cache`` (one of :attr:`layer_caches`) by rows."""
        signature = (tuple(kv_cache.shape), kv_cache.stride())
        layout = self._layouts.get(signature)
        if layout is None:
            layout = RowLayout.of(kv_cache, self.backend)
            if layout is None:
                raise NotImplementedError(
                    f"lookahead: the {self.backend} KV cache with shape {tuple(kv_cache.shape)} and strides "
                    f"{kv_cache.stride()} cannot be read by rows; not supported"
                )
            self._layouts[signature] = layout
        return layout


def kv_views(kv_cache: torch.Tensor, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V views ``[num_blocks, num_kv_heads, block_size, head_size]`` of one layer's cache."""
    if backend == "CPU_ATTN":
        nb, hkv, bs, two_d = kv_cache.shape
        halves = kv_cache.view(nb, hkv, 2, bs * two_d // 2)
        k = halves[:, :, 0].view(nb, hkv, two_d // 2, bs).transpose(2, 3)
        v = halves[:, :, 1].view(nb, hkv, bs, two_d // 2)
        return k, v
    if backend in SPLIT_LAST_DIM:
        head_size = kv_cache.shape[-1] // 2
        return kv_cache[..., :head_size], kv_cache[..., head_size:]
    raise NotImplementedError(
        f"lookahead tree attention does not know the KV cache layout of attention backend "
        f"{backend!r}; supported: {', '.join(SUPPORTED_BACKENDS)}"
    )


def gather_sequence(view: torch.Tensor, block_ids: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` positions of one sequence: ``[num_kv_heads, length, head_size]``."""
    bs = view.shape[2]
    nb = -(-length // bs)
    blocks = view.index_select(0, block_ids[:nb].to(torch.long))  # [nb, H, bs, D]
    return blocks.permute(1, 0, 2, 3).reshape(view.shape[1], nb * bs, view.shape[3])[:, :length]


def _extent(x: torch.Tensor) -> int:
    """Values from ``x``'s first to its last element (its span in the storage)."""
    return 1 + sum((n - 1) * s for n, s in zip(x.shape, x.stride()))


def row_view(x: torch.Tensor, width: int) -> torch.Tensor | None:
    """``x``'s storage as a matrix of ``width``-value rows starting at ``x``'s first value, or None.

    Possible when ``x``'s last dimension is contiguous and every other stride is a multiple
    of ``width``: then element ``(i, j, ..., c)`` is value ``c % width`` of row
    ``(i*s0 + j*s1 + ... + c) // width`` (``c < width`` or a multiple of it).  One
    ``index_select`` on such a view gathers any rows in any order (the tree pass gathers
    keys, values, queries and writes outputs this way).
    """
    if x.stride(-1) != 1 or any(s % width for s in x.stride()[:-1]) or x.shape[-1] % width:
        return None
    return torch.as_strided(x, (_extent(x) // width, width), (width, 1))


@dataclass(frozen=True)
class RowLayout:
    """Where a layer's keys and values lie as rows of its cache (:func:`row_view`), so that
    the tree pass fetches a request's K and V with one ``index_select`` each.

    ``keys_transposed``: CPU_ATTN stores each block's K transposed, so a key row is one
    head dimension over the block's slots (``block_size`` values) and what is gathered is
    K^T, ``[dims, positions]``; the GPU backends store a token's K and V side by side, so a
    key row is one token's key (``head_size`` values).  Strides are the logical
    ``[blocks, kv_heads, block_size, C]`` tensor's, the same for every layer of one engine.
    """

    backend: str
    head_size: int
    block_size: int
    num_kv_heads: int
    strides: tuple[int, int, int]  # elements between blocks, heads, slots

    @property
    def keys_transposed(self) -> bool:
        return self.backend == "CPU_ATTN"

    @property
    def key_width(self) -> int:
        return self.block_size if self.keys_transposed else self.head_size

    @classmethod
    def of(cls, kv_cache: torch.Tensor, backend: str) -> RowLayout | None:
        """The layout of ``kv_cache`` (a layer's logical cache), or None if it cannot be read by rows."""
        nb, hkv, bs, c = kv_cache.shape
        d = c // 2
        s_block, s_head, s_slot = kv_cache.stride()[:3]
        if kv_cache.stride(3) != 1:
            return None
        if backend == "CPU_ATTN":  # per block and head: K^T [d, bs] then V [bs, d], one contiguous run
            if s_slot != c or any(s % bs or s % d for s in (s_block, s_head)):
                return None
        elif backend in SPLIT_LAST_DIM:  # per token: K then V, d values each
            if any(s % d for s in (s_block, s_head, s_slot)):
                return None
        else:
            return None
        return cls(backend, d, bs, hkv, (s_block, s_head, s_slot))

    def key_rows(self, kv_cache: torch.Tensor) -> torch.Tensor:
        """The rows :meth:`indices` addresses for keys (``key_width`` values each)."""
        w = self.key_width
        return torch.as_strided(kv_cache, (_extent(kv_cache) // w, w), (w, 1))

    def value_rows(self, kv_cache: torch.Tensor) -> torch.Tensor:
        """The rows :meth:`indices` addresses for values (``head_size`` values each)."""
        d = self.head_size
        return torch.as_strided(kv_cache, (_extent(kv_cache) // d, d), (d, 1))

    def indices(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Row indices of K (K^T on CPU_ATTN) and V for ``blocks`` ``[R, NB]`` (long).

        Gathered, K is ``[R * kv_heads, head_size, NB * block_size]`` (transposed) or
        ``[R * kv_heads, NB * block_size, head_size]``, and V ``[R * kv_heads, NB * block_size,
        head_size]``: request-major, then head, then position (block by block).
        """
        d, bs, hkv = self.head_size, self.block_size, self.num_kv_heads
        s_block, s_head, s_slot = self.strides
        R, NB = blocks.shape
        dev = blocks.device
        heads = torch.arange(hkv, device=dev).view(1, hkv, 1, 1)
        slots = torch.arange(bs, device=dev).view(1, 1, 1, bs)
        base = blocks.view(R, 1, NB, 1) * s_block + heads * s_head  # [R, hkv, NB, 1] element offsets
        if self.keys_transposed:  # K^T rows (r, head, dim, block) of bs values; V rows after K^T
            dims = torch.arange(d, device=dev).view(1, 1, d, 1)
            keys = base.view(R, hkv, 1, NB) // bs + dims
            values = (base + bs * d) // d + slots
        else:
            keys = (base + slots * s_slot) // d
            values = keys + 1
        return keys.reshape(-1), values.reshape(-1)


def move_slots(kv_caches: list[torch.Tensor], backend: str, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
    """Copy K/V of ``src_slots`` to ``dst_slots`` in every layer (sources read before writes)."""
    if src_slots.numel() == 0:
        return
    seen: set[int] = set()
    for cache in kv_caches:
        if cache.data_ptr() in seen:  # layers sharing one cache tensor
            continue
        seen.add(cache.data_ptr())
        for view in kv_views(cache, backend):
            bs = view.shape[2]
            sb, so = src_slots // bs, src_slots % bs
            db, do = dst_slots // bs, dst_slots % bs
            rows = view[sb, :, so].clone()  # [m, H, D]
            view[db, :, do] = rows

"""Device memory of the paged KV cache: ONE region per device, carved into per-layer key and value
caches of fixed-size blocks.

:func:`allocate_kv_region` is the only place that allocates it (the memory pool will take it over);
everything else sees :class:`KvCache` views.  Per layer the region holds ``[2, NB, BS, Hkv, D]``
float32: keys, then values.  Viewed as rows ``[2 * NB * BS * Hkv, D]`` it is the ``var`` of the
``scatter_update`` that writes a step's new keys and values (row ``(slot * Hkv + h)`` for keys, the
same plus ``NB * BS * Hkv`` for values; row 0, in the null block, takes what must go nowhere)."""
from __future__ import annotations

from dataclasses import dataclass

from devices.kernel import TensorDesc


def allocate_kv_region(dev, nbytes: int):
    """The KV cache's device memory on ``dev`` (a :class:`runtime.api.Tensor` of ``nbytes`` bytes,
    host-synchronous; raises the device's out-of-memory error)."""
    return dev.empty((int(nbytes),), "uint8")


def kv_bytes_per_block(n_layers: int, block_size: int, kv_heads: int, head_dim: int) -> int:
    return n_layers * 2 * block_size * kv_heads * head_dim * 4


@dataclass(frozen=True)
class LayerCache:
    rows: TensorDesc        #: [2 * NB * BS * Hkv, D]: the scatter target
    keys: TensorDesc        #: [NB, BS, Hkv, D]
    values: TensorDesc      #: [NB, BS, Hkv, D]


class KvCache:
    """Per-layer views of one device's KV region."""

    def __init__(self, dev, n_layers: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int):
        self.num_blocks, self.block_size, self.kv_heads, self.head_dim = num_blocks, block_size, kv_heads, head_dim
        self.region = allocate_kv_region(dev, kv_bytes_per_block(n_layers, block_size, kv_heads, head_dim) * num_blocks)
        half = num_blocks * block_size * kv_heads * head_dim * 4
        shape = (num_blocks, block_size, kv_heads, head_dim)
        base = self.region.ptr
        self.layers = [LayerCache(TensorDesc(base + 2 * i * half, (2 * num_blocks * block_size * kv_heads, head_dim),
                                             "float32"),
                                  TensorDesc(base + 2 * i * half, shape, "float32"),
                                  TensorDesc(base + (2 * i + 1) * half, shape, "float32"))
                       for i in range(n_layers)]

    @property
    def value_row0(self) -> int:
        """Row of the first value in a layer's scatter view."""
        return self.num_blocks * self.block_size * self.kv_heads

    def free(self) -> None:
        self.region.free()

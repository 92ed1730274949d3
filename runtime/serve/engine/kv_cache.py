"""Device memory of the paged KV cache: ONE region per device, carved into per-layer key and value
caches of fixed-size blocks.

:func:`allocate_kv_region` is the only place that allocates it (from the caching pool, long-lived: it
is packed with the weights at the top of HBM); everything else sees :class:`KvCache` views, rebuilt
after a defragmentation moved the region.  Per layer the region holds ``[2, NB, BS, Hkv, D]``
float32: keys, then values.  Viewed as rows ``[2 * NB * BS * Hkv, D]`` it is the ``var`` of the
``scatter_update`` that writes a step's new keys and values (row ``(slot * Hkv + h)`` for keys, the
same plus ``NB * BS * Hkv`` for values; row 0, in the null block, takes what must go nowhere)."""
from __future__ import annotations

from dataclasses import dataclass

from devices.kernel import TensorDesc
from runtime.models.common import DescCache


def allocate_kv_region(dev, nbytes: int):
    """The KV cache's device memory on ``dev`` (a :class:`runtime.api.Tensor` of ``nbytes`` bytes,
    host-synchronous; raises the device's out-of-memory error)."""
    return dev.empty((int(nbytes),), "uint8", lifetime="long")


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
        self.n_layers = n_layers
        self.region = allocate_kv_region(dev, kv_bytes_per_block(n_layers, block_size, kv_heads, head_dim) * num_blocks)
        self._layers = DescCache(dev, self._build)

    def _build(self) -> list[LayerCache]:
        nb, bs, hkv, dh = self.num_blocks, self.block_size, self.kv_heads, self.head_dim
        half = nb * bs * hkv * dh * 4
        shape = (nb, bs, hkv, dh)
        base = self.region.ptr
        return [LayerCache(TensorDesc(base + 2 * i * half, (2 * nb * bs * hkv, dh), "float32"),
                           TensorDesc(base + 2 * i * half, shape, "float32"),
                           TensorDesc(base + (2 * i + 1) * half, shape, "float32"))
                for i in range(self.n_layers)]

    @property
    def layers(self) -> list[LayerCache]:
        """Per-layer launch arguments (built again after a defragmentation moved the region)."""
        return self._layers.get()

    @property
    def value_row0(self) -> int:
        """Row of the first value in a layer's scatter view."""
        return self.num_blocks * self.block_size * self.kv_heads

    def free(self) -> None:
        self.region.free()

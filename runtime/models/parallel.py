"""Which device counts a model can be split over, from its shape alone (no weights loaded).

Tensor parallel puts a slice of every split dimension on each device, so its degree must divide them all
(a decoder's KV heads, heads and FFN width; an encoder's heads and FFN width); pipeline parallel puts whole
layers on each device, so it has at most one stage per layer.  The jobs refuse any other count with
``InvalidParamError`` (:meth:`Splits.problem`); ``vnpu run`` and ``vnpu serve`` check the same before they
start a cluster or load weights, and name the counts that work (:meth:`Splits.tp_degrees`).

Values only: nothing here blocks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Splits:
    """What a model's parallel modes split: ``dims`` the dimensions a tensor parallel degree must divide
    (``("KV heads", 3)``, ...), ``layers`` the most pipeline stages (None: no pipeline mode)."""
    model: str
    dims: tuple[tuple[str, int], ...]
    layers: int | None = None

    def tp_degrees(self) -> list[int]:
        """Every tensor parallel degree above 1 that divides all the split dimensions."""
        g = math.gcd(*(size for _, size in self.dims))
        return [d for d in range(2, g + 1) if g % d == 0]

    def problem(self, parallel: str, n: int) -> str | None:
        """Why ``n`` devices cannot run ``parallel`` (``tp``, ``pp``, ``none``/``dp``: anything else is
        not split), None when they can."""
        if parallel == "tp" and n > 1:
            bad = [(what, size) for what, size in self.dims if size % n]
            if bad:
                what, size = bad[0]
                return (f"tensor parallel degree {n} does not divide the {size} {what} of {self.model} "
                        f"(each device takes an equal slice of {', '.join(w for w, _ in self.dims)})")
        if parallel == "pp" and self.layers is not None and n > self.layers:
            return f"{n} pipeline stages for the {self.layers} layers of {self.model} (one layer per stage at least)"
        if parallel == "none" and n != 1:
            return f"parallel 'none' runs on one device, not {n}"
        return None


def decoder_splits(model: str, cfg) -> Splits:
    """A llama decoder's (:class:`runtime.models.weights.LlamaConfig`): KV heads, heads, FFN width; layers."""
    return Splits(model, (("KV heads", cfg.n_kv_heads), ("heads", cfg.n_heads), ("FFN columns", cfg.d_ff)),
                  cfg.n_layers)


def encoder_splits(model: str, cfg) -> Splits:
    """A BERT encoder's (:class:`runtime.models.bert.BertConfig`): heads, FFN width; no pipeline mode."""
    return Splits(model, (("heads", cfg.heads), ("FFN columns", cfg.ff)))


__all__ = ["Splits", "decoder_splits", "encoder_splits"]

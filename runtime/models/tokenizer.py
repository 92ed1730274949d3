"""Tokenizers, all on the ``tokenizers`` package.

- MiniLM (L6 and L3): the WordPiece ``tokenizer.json`` shipped with the L6 package (the L3 ONNX package
  has none; both models share the uncased BERT vocabulary).  Padding to the longest sequence of a batch,
  truncation at the model's maximum length.
- SmolLM2: the byte-level BPE rebuilt from the GGUF metadata (``tokenizer.ggml.tokens``/``merges``/
  ``token_type``), with llama.cpp's "smollm" pre-tokenizer (single digits, then the GPT-2 regex) and the
  control tokens (``<|im_start|>`` ...) as special tokens.  The chat template is the GGUF's ChatML
  template, rendered here without jinja2 (see :func:`render_chat`).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from devices.errors import InvalidParamError

from .weights import load_gguf_cached, minilm_l6_dir


# ---------------------------------------------------------------------------------------------- MiniLM
class BertTokenizer:
    def __init__(self, path: str | Path | None = None, max_length: int = 256):
        from tokenizers import Tokenizer
        path = Path(path) if path else minilm_l6_dir() / "tokenizer.json"
        self.tok = Tokenizer.from_file(str(path))
        self.max_length = max_length
        self.tok.enable_truncation(max_length=max_length)
        self.tok.no_padding()
        self.pad_id = 0

    def encode_batch(self, texts: list[str], cut: list[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids [B, S] int64, mask [B, S] int64), right-padded to the longest text.  Texts longer than
        ``max_length`` tokens are truncated to it; their indices are appended to ``cut`` when given."""
        encs = self.tok.encode_batch(list(texts))
        if cut is not None:
            cut.extend(i for i, e in enumerate(encs) if e.overflowing)
        s = max(len(e.ids) for e in encs)
        ids = np.full((len(encs), s), self.pad_id, np.int64)
        mask = np.zeros((len(encs), s), np.int64)
        for i, e in enumerate(encs):
            ids[i, :len(e.ids)] = e.ids
            mask[i, :len(e.ids)] = 1
        return ids, mask

    def lengths(self, texts: list[str]) -> list[int]:
        """Token counts (``encode_batch``: the work runs without the GIL)."""
        return [len(e.ids) for e in self.tok.encode_batch(list(texts))]

    def min_tokens(self, text: str, cap: int, chars: int | None = None) -> int:
        """A lower bound on ``text``'s token count, at most ``cap``, without tokenizing: [CLS] and [SEP]
        plus one token per whitespace-separated piece holding a letter or digit (the BERT normalizer keeps
        those; its pre-tokenizer splits at least there), among the first ``chars`` characters only (a piece
        cut there is still a piece of the whole text).  Costs O(``chars``) at most."""
        n = 2
        for m in _BERT_PIECE.finditer(text if chars is None or chars >= len(text) else text[:chars]):
            if n >= cap:
                break
            if _ALNUM.search(m.group()):
                n += 1
        return min(n, cap)


#: BERT's whitespace (tab, newline, carriage return, the Zs spaces): a piece between two of these is at least
#: one pre-token; Python's ``\s`` also matches control characters the normalizer deletes, so it is not used
_BERT_PIECE = re.compile("[^\t\n\r \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]+")
_ALNUM = re.compile(r"[^\W_]")


@functools.lru_cache(maxsize=4)
def bert_tokenizer(max_length: int = 256) -> BertTokenizer:
    return BertTokenizer(max_length=max_length)


# ---------------------------------------------------------------------------------------------- SmolLM2
#: llama.cpp's pre-tokenizer regexes by ``tokenizer.ggml.pre`` (those that differ from plain GPT-2)
_GPT2_RE = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_DIGIT_FIRST = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}


@dataclass
class ChatMessage:
    role: str
    content: str


DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


class GgufBpeTokenizer:
    """Byte-level BPE from GGUF metadata."""

    def __init__(self, meta: dict):
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
        model = meta.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise InvalidParamError(f"GGUF tokenizer model {model!r} is not supported (byte-level BPE 'gpt2')")
        tokens = list(meta["tokenizer.ggml.tokens"])
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
        types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
        vocab = {t: i for i, t in enumerate(tokens)}
        bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
        tok = Tokenizer(bpe)
        pre = meta.get("tokenizer.ggml.pre", "gpt2")
        steps = []
        if pre in _DIGIT_FIRST:
            steps.append(pre_tokenizers.Digits(individual_digits=True))
        steps.append(pre_tokenizers.Split(Regex(_GPT2_RE), behavior="isolated"))
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
        tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
        tok.decoder = decoders.ByteLevel()
        specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty in (3, 4)]
        tok.add_special_tokens(specials)
        self.tok = tok
        self.tokens = tokens
        self.special_ids = {i for i, ty in enumerate(types) if ty in (3, 4)}
        self.bos_id = int(meta.get("tokenizer.ggml.bos_token_id", 1))
        self.eos_id = int(meta.get("tokenizer.ggml.eos_token_id", 2))
        self.pad_id = int(meta.get("tokenizer.ggml.padding_token_id", self.eos_id))
        self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
        self.chat_template = meta.get("tokenizer.chat_template")
        self.vocab_size = len(tokens)
        #: the most characters of text one token stands for (byte-level: one vocabulary character per byte,
        #: and a text character is at least one byte; control tokens match their own text)
        self.max_token_chars = max(len(t) for t in tokens)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (``encode_batch``: the work runs without the GIL, so a long text does not
        hold up the caller's other threads -- the server's event loop among them)."""
        ids = self.tok.encode_batch([text], add_special_tokens=False)[0].ids
        return ([self.bos_id] + ids) if self.add_bos else ids

    def min_tokens(self, text: str) -> int:
        """A lower bound on ``len(encode(text))`` without tokenizing (O(1))."""
        return int(self.add_bos) + -(-len(text) // self.max_token_chars)

    def decode(self, ids, skip_special: bool = True) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def render_chat(self, messages: list[ChatMessage | dict], add_generation_prompt: bool = True) -> str:
        """The GGUF's ChatML template: a default system message when the first message is not one,
        ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message, then ``<|im_start|>assistant\\n``."""
        msgs = [m if isinstance(m, ChatMessage) else ChatMessage(m["role"], m["content"]) for m in messages]
        out = []
        tmpl = self.chat_template or ""
        if msgs and msgs[0].role != "system" and "helpful AI assistant named SmolLM" in tmpl:
            out.append(f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n")
        for m in msgs:
            out.append(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n")
        if add_generation_prompt:
            out.append("<|im_start|>assistant\n")
        return "".join(out)

    def chat_prompt(self, user_text: str) -> list[int]:
        return self.encode(self.render_chat([ChatMessage("user", user_text)]))


@functools.lru_cache(maxsize=2)
def gguf_tokenizer(path: str) -> GgufBpeTokenizer:
    return GgufBpeTokenizer(load_gguf_cached(str(path)).meta)

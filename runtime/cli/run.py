"""``vnpu run``: inference jobs on real models (see ``runtime.models``).

    vnpu run embed --model minilm-l6 --devices 2 --parallel dp --input sentences.txt --output emb.npy
    vnpu run generate --model smollm2 --devices 3 --parallel tp --prompt "What is an NPU?" --max-new-tokens 32

The runtime is the running (or an embedded) vnpu cluster; ``VNPU_BACKEND=local`` runs the devices
in this process instead (no Ray).  Errors print one line on stderr and exit with code 2.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import numpy as np

from devices.errors import AclError
from runtime.cli.preflight import check_device_count, check_split
from runtime.cliargs import (fail, int_at_least, nonneg_float, nonneg_int, positive_int, probability, text_lines,
                             writable_file)


@contextlib.contextmanager
def job_runtime(devices: int, device_restarts: int = 0):
    """The runtime a job runs on: the cluster backend, or in-process devices with VNPU_BACKEND=local
    (``VNPU_DEVICES`` of them, default 4: asking for more is an error, as on a cluster).  An embedded
    cluster's device actors are restarted by Ray ``device_restarts`` times (-1: always)."""
    from runtime.stages import STARTING_DEVICES, stage
    with contextlib.ExitStack() as stack:
        if os.environ.get("VNPU_BACKEND", "") == "local":
            from runtime.api import Runtime, runtime_scope
            from runtime.backend import LocalBackend
            with stage(STARTING_DEVICES, f"{os.environ.get('VNPU_DEVICES', '4')} in-process devices"):
                rt = stack.enter_context(runtime_scope(Runtime(LocalBackend())))  # VNPU_DEVICES (default 4)
        else:
            from runtime.cluster import cluster_runtime
            with stage(STARTING_DEVICES, f"{devices} device(s): the running cluster, or an embedded one"):
                rt = stack.enter_context(cluster_runtime(devices=devices, device_restarts=device_restarts))
        yield rt


@contextlib.contextmanager
def job_runtime_shown(devices: int, prog: str):
    """:func:`job_runtime` with the startup stages shown on stderr (:mod:`runtime.cli.stages`); yields the
    runtime and ``startup_done()``, which the command calls once its job is built (weights loaded and
    uploaded: stages too) -- the display ends there, before the job's output starts."""
    from runtime import stages
    from runtime.cli.console import stderr_console
    from runtime.cli.stages import StageProgress
    progress = StageProgress(prog, stderr_console())
    before = stages.set_sink(progress)

    def startup_done() -> None:
        stages.set_sink(before)
        progress.close()
    try:
        with job_runtime(devices) as rt:
            yield rt, startup_done
    finally:
        startup_done()


def _fail(msg: str) -> int:
    print(f"vnpu: error: {msg}", file=sys.stderr)
    return 2


def _device_lines(stats) -> list[str]:
    return [f"  npu{d.device}: wall {d.wall_ms:.1f} ms, modeled device time {d.modeled_ms:.3f} ms"
            for d in stats.devices]


# ---------------------------------------------------------------------------------------------- embed
def _npy_file(s: str) -> str:
    """``type=``: where ``np.save`` writes ``s`` (``.npy`` appended when missing), checked now."""
    return writable_file(s if s.endswith(".npy") else s + ".npy")


def _cmd_embed(a) -> int:
    texts = list(a.texts or [])
    if a.input:
        texts += a.input                                   # the lines of --input (read and checked by argparse)
    elif not texts:
        try:
            texts = text_lines("-")
        except argparse.ArgumentTypeError as e:
            fail(f"stdin: {e}", "vnpu run embed")
    bad = [i for i, t in enumerate(texts) if not t.strip()]
    if bad:
        fail(f"text {bad[0]} is empty", "vnpu run embed")
    check_split(a.model, a.parallel, a.devices, "vnpu run embed", ("dp", "tp"))
    check_device_count(a.devices, "vnpu run embed")
    from runtime.models import EmbedJob
    with job_runtime_shown(a.devices, "vnpu run embed") as (rt, startup_done):
        try:
            job = EmbedJob(rt, a.model, devices=a.devices, parallel=a.parallel, batch_size=a.batch_size)
        finally:
            startup_done()
        try:
            emb = job.embed(texts)
        finally:
            job.close()
        st = job.last_stats
    if st.truncated:
        print(f"vnpu run embed: {st.truncated} of {len(texts)} inputs were longer than {a.model}'s context and "
              f"were cut to {st.context} tokens", file=sys.stderr)
    if a.output:
        try:
            np.save(a.output, emb)
        except OSError as e:
            return _fail(f"cannot write {a.output}: {e.strerror or e}")
    if a.json:
        doc = {"model": a.model, "parallel": a.parallel, "devices": a.devices, "count": int(emb.shape[0]),
               "dim": int(emb.shape[1]), "truncated": st.truncated, "context": st.context,
               "sentences_per_s": round(st.items_per_s, 2), "stats": st.as_dict()}
        if a.output:
            doc["output"] = a.output
        else:
            doc["embeddings"] = emb.tolist()
        print(json.dumps(doc))
        return 0
    print(f"embedded {emb.shape[0]} sentence(s) with {a.model} on {a.devices} device(s) ({a.parallel}): "
          f"dim {emb.shape[1]}, {st.wall_s * 1e3:.1f} ms, {st.items_per_s:.1f} sentences/s, "
          f"{st.launches} launches")
    for ln in _device_lines(st):
        print(ln)
    if a.output:
        print(f"saved {a.output}")
    else:
        for t, v in list(zip(texts, emb))[:5]:
            print(f"  {t[:40]!r}: [{', '.join(f'{x:+.4f}' for x in v[:4])}, ...]")
    return 0


# ---------------------------------------------------------------------------------------------- generate
class Progress:
    """A progress bar on stderr (tokens done / expected, rate, elapsed) drawn by ``rich.progress``; on a
    non-terminal stderr nothing is redrawn, only a final line is written.  Its clock (``clock``, seconds)
    starts when it is made: the command makes it when generation starts, after the startup stages."""

    def __init__(self, total: int, clock=None):
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress as Bar, TaskProgressColumn, TextColumn,
                                   TimeElapsedColumn)
        from runtime.cli.console import stderr_console
        import time
        self._time = clock or time.perf_counter
        self.total, self.n, self.t0 = total, 0, self._time()
        self.console = stderr_console()
        self.tty = self.console.is_terminal
        self.bar = Bar(TextColumn("tokens"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
                       TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), console=self.console,
                       transient=True, disable=not self.tty)
        self.task = self.bar.add_task("generate", total=total, rate="")
        self.bar.start()

    def _rate(self) -> float:
        return self.n / max(1e-9, self._time() - self.t0)

    def step(self) -> None:
        self.n += 1
        self.bar.update(self.task, advance=1, rate=f"{self._rate():.1f} tok/s")

    def done(self) -> None:
        self.bar.stop()
        sys.stderr.write(f"{self.n}/{self.total} tokens {self._rate():.1f} tok/s\n")
        sys.stderr.flush()


def _cmd_generate(a) -> int:
    prompts: list[str] = []
    if a.prompt is not None:
        prompts.append(a.prompt)
    if a.prompts:
        prompts += a.prompts                               # the lines of --prompts (read and checked by argparse)
    if not prompts:
        fail("give --prompt TEXT or --prompts FILE", "vnpu run generate")
    if not all(p.strip() for p in prompts):
        fail("argument --prompt: empty prompt", "vnpu run generate")
    parallel = a.parallel or ("none" if a.devices == 1 else "tp")
    check_split(a.model, parallel, a.devices, "vnpu run generate", ("tp", "pp"))
    check_device_count(a.devices, "vnpu run generate")
    from runtime.models import GenerateJob
    stream = not a.json and len(prompts) == 1
    total = len(prompts) * a.max_new_tokens
    bar: Progress | None = None

    def on_token(i, tok, piece):
        if stream:
            sys.stdout.write(piece)
            sys.stdout.flush()
        if bar is not None:
            bar.step()

    with job_runtime_shown(a.devices, "vnpu run generate") as (rt, startup_done):
        try:
            job = GenerateJob(rt, a.model, devices=a.devices, parallel=parallel, max_len=a.max_len,
                              graphs=not a.eager)
        finally:
            startup_done()
        if total >= 64 and not stream:
            bar = Progress(total)                          # long batch runs: a bar on stderr, from now on
        try:
            res = job.generate(prompts, max_new_tokens=a.max_new_tokens, temperature=a.temperature,
                               top_k=a.top_k, top_p=a.top_p, seed=a.seed, raw=a.raw,
                               on_token=on_token if (stream or bar) else None)
        finally:
            if bar is not None:
                bar.done()                                 # the generation's time, not the job's teardown
            job.close()
        st = job.last_stats
    if a.json:
        print(json.dumps({"model": a.model, "parallel": parallel, "devices": a.devices,
                          "results": [{"prompt": p, "token_ids": g.token_ids, "text": g.text,
                                       "prompt_tokens": g.prompt_tokens, "finish": g.finish}
                                      for p, g in zip(prompts, res)],
                          "tokens_per_s": round(st.items_per_s, 2), "stats": st.as_dict()}))
        return 0
    if stream:
        print()
    else:
        for i, (p, g) in enumerate(zip(prompts, res)):
            print(f"--- [{i}] {p}")
            print(g.text)
    print(f"--- {st.items} new token(s) in {st.wall_s:.2f} s: {st.items_per_s:.1f} tokens/s "
          f"(prefill {st.prefill_tokens} tokens in {st.prefill_s * 1e3:.0f} ms, decode "
          f"{st.decode_ms_per_token:.1f} ms/step), {st.launches_per_token:.0f} launches per token "
          f"({', '.join(f'{x:.0f}' for x in st.device_launches_per_token)} per device)"
          + (f", {st.collectives} collectives" if st.collectives else ""))
    for ln in _device_lines(st):
        print(ln)
    return 0


def _guard(fn):
    def run(a) -> int:
        try:
            return fn(a)
        except AclError as e:
            return _fail(f"{e.code} {e.name}: {e.detail}")
    return run


def register(sub) -> None:
    r = sub.add_parser("run", help="run an inference job on a real model (embed | generate)",
                      example=("vnpu run generate --prompt 'What is an NPU?' --max-new-tokens 32",
                               "vnpu run embed 'a sentence' 'another one' --devices 2"))
    rs = r.add_subparsers(dest="job", required=True)
    e = rs.add_parser("embed", help="sentence embeddings (MiniLM)",
                      example="vnpu run embed --model minilm-l6 --devices 2 --parallel dp --input sentences.txt --output emb.npy")
    e.add_argument("texts", nargs="*", help="sentences (else --input, else stdin, one per line)")
    e.add_argument("--model", default="minilm-l6", choices=["minilm-l6", "minilm-l3"],
                   help="the encoder (default minilm-l6)")
    e.add_argument("--devices", type=positive_int, default=1, help="devices the job runs on (default 1)")
    e.add_argument("--parallel", default="dp", choices=["dp", "tp"],
                   help="dp: batches split over the devices (default); tp: each layer split over them")
    e.add_argument("--input", type=text_lines, help="UTF-8 text file with one sentence per line ('-' = stdin)")
    e.add_argument("--output", type=_npy_file, help="write the embeddings as a .npy file (.npy appended when "
                                                    "missing, as numpy does)")
    e.add_argument("--batch-size", type=positive_int, default=32, help="sentences per launch batch (default 32)")
    e.add_argument("--json", action="store_true", help="print the result (and the embeddings without --output) as JSON")
    e.set_defaults(fn=_guard(_cmd_embed))
    g = rs.add_parser("generate", help="text generation (SmolLM2-135M-Instruct)",
                      example=("vnpu run generate --prompt 'What is an NPU?' --max-new-tokens 32",
                               "vnpu run generate --devices 3 --parallel tp --prompts prompts.txt --json"))
    g.add_argument("--model", default="smollm2", choices=["smollm2"], help="the decoder (default smollm2)")
    g.add_argument("--devices", type=positive_int, default=1,
                   help="devices the job runs on (default 1; tp needs a count dividing the KV heads)")
    g.add_argument("--parallel", choices=["none", "tp", "pp"], default=None,
                   help="default: none on one device, tp on more")
    g.add_argument("--prompt", help="one prompt")
    g.add_argument("--prompts", type=text_lines, help="UTF-8 text file with one prompt per line (a batch)")
    g.add_argument("--max-new-tokens", type=positive_int, default=32, help="tokens generated per prompt (default 32)")
    g.add_argument("--temperature", type=nonneg_float, default=0.0, help="sampling temperature (default 0: greedy)")
    g.add_argument("--top-k", type=nonneg_int, default=0, help="sample among the k likeliest tokens (default 0: all)")
    g.add_argument("--top-p", type=probability, default=1.0,
                   help="sample among the likeliest tokens holding this probability mass (default 1.0: all)")
    g.add_argument("--seed", type=nonneg_int, default=0, help="seed of the sampler (default 0)")
    g.add_argument("--raw", action="store_true", help="no chat template: the prompt is plain text")
    g.add_argument("--max-len", type=int_at_least(2), default=2048,
                   help="prompt + new tokens limit (KV cache size)")
    g.add_argument("--eager", action="store_true",
                   help="launch every kernel of every decode step (default: capture the first step as a "
                        "graph and replay it)")
    g.add_argument("--json", action="store_true", help="print the results and statistics as JSON (no streaming)")
    g.set_defaults(fn=_guard(_cmd_generate))

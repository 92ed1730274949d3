"""What an ``.om`` says about serving it, and a model configuration completed from (and checked against)
it -- Triton's auto-complete for platform ``vnpu_om``.

:func:`read_om_info` reads the container (:func:`runtime.atc.om.read_om`: header, digest and manifest
checked) into an :class:`OmInfo`: the inputs (without atc's ``ascend_mbatch_shape_data``), the outputs,
their dims as the manifest has them (-1 on the dynamic batch axis) and the dynamic batch gears
(``vnpu atc --dynamic_batch_size``) or image-size gears (``--dynamic_image_size``: -1 on H and W, a
fixed batch).  A dynamic model batches when every input and output has the batch on
its first axis in every gear; a static model whose inputs and outputs all lead with the same size B can be
served as a one-gear model (B) when the configuration asks for ``max_batch_size`` <= B.

:func:`complete` fills what a ``config.yaml`` left out (``max_batch_size``: the largest gear, or 0 for a
static model, the fixed batch of an image-size model whose tensors all lead with it; ``input``/``output``:
the .om's, -1 on an image-size model's H and W; ``dynamic_batching``: Triton's defaults when the model
batches) and refuses what disagrees with the .om, naming the config's line.  :func:`batch_gears` is what
the batcher pads to.

Blocking: :func:`read_om_info` reads the whole file (the digest covers it); the rest is host-only.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from devices.errors import ModelError
from runtime.atc.om import read_om
from runtime.atc.options import DYNAMIC_INPUT_NAME

from .config import ParsedConfig
from .datatypes import NUMPY_TO_V2
from .spec import DynamicBatching, ModelConfig, ModelConfigError, TensorSpec

E = ModelConfigError


@dataclass(frozen=True)
class OmInfo:
    """An ``.om``'s serving facts; ``unbatchable``: why a dynamic model cannot batch requests ("" if it
    can); ``static_batch``: the leading size every tensor of a static model shares (None if they do not);
    ``hw_gears``: the (height, width) gears of an image-size model (its batch is fixed: ``static_batch``)."""
    path: str
    name: str
    soc_version: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    gears: tuple[int, ...] = ()
    unbatchable: str = ""
    static_batch: int | None = None
    hw_gears: tuple[tuple[int, int], ...] = ()

    @property
    def dynamic(self) -> bool:
        """Whether the model has batch gears."""
        return bool(self.gears)


def read_om_info(path: str | Path) -> OmInfo:
    """The serving facts of the ``.om`` at ``path``; :class:`ModelConfigError` (naming the file) when it
    cannot be read or is not a servable vnpu .om.  Blocks on reading the file."""
    p = Path(path)
    try:
        manifest, _ = read_om(p.read_bytes())
    except OSError as e:
        raise E(f"cannot read {p}: {e.strerror or e}") from None
    except ModelError as e:
        raise E(f"{p}: {e.detail}", code=e.code) from None
    gears = tuple(manifest["dynamic_batch"])
    hw = tuple((int(h), int(w)) for h, w in manifest.get("dynamic_hw") or ())
    ins = [io for io in manifest["inputs"] if not ((gears or hw) and io["name"] == DYNAMIC_INPUT_NAME)]
    try:
        inputs = tuple(_spec(io) for io in ins)
        outputs = tuple(_spec(io) for io in manifest["outputs"])
    except KeyError as e:
        raise E(f"{p}: tensor {e.args[0]!r} has a type vnpu cannot serve") from None
    info = OmInfo(str(p), manifest["name"], manifest["soc_version"], inputs, outputs, tuple(sorted(gears)),
                  hw_gears=hw)
    if gears:
        return replace(info, unbatchable=_unbatchable(manifest, len(ins)))
    leads = {t.dims[0] if t.dims else None for t in inputs + outputs}
    return replace(info, static_batch=leads.pop() if len(leads) == 1 and None not in leads else None)


def _spec(io: dict) -> TensorSpec:
    return TensorSpec(io["name"], NUMPY_TO_V2[io["dtype"]], tuple(io["dims"]))


def _unbatchable(manifest: dict, n_inputs: int) -> str:
    """Why the gears' tensors do not all carry the batch on their first axis ("" when they do)."""
    names = [io["name"] for io in manifest["inputs"][:n_inputs]], [io["name"] for io in manifest["outputs"]]
    for g in manifest["gears"]:
        for kind, views, nm in (("input", g["inputs"], names[0]), ("output", g["outputs"], names[1])):
            for view, name in zip(views, nm):
                shape = view[2]
                if not shape or shape[0] != g["batch"]:
                    return (f"{kind} {name} does not carry the batch on its first axis (shape {shape} at batch "
                            f"{g['batch']}): requests cannot share an execution")
    return ""


def _strip(t: TensorSpec) -> TensorSpec:
    return TensorSpec(t.name, t.datatype, t.dims[1:])


def _max_batch(parsed: ParsedConfig, om: OmInfo) -> int:
    """max_batch_size as given (checked against the .om) or as the .om allows (an image-size model: its
    fixed batch, when every tensor leads with it)."""
    if not parsed.given("max_batch_size"):
        if om.hw_gears:
            return om.static_batch or 0
        return om.gears[-1] if om.dynamic and not om.unbatchable else 0
    mb = parsed.get("max_batch_size")
    at = parsed.at("max_batch_size")
    if om.hw_gears and mb > 0 and (om.static_batch is None or mb > om.static_batch):
        lead = (f"a fixed batch of {om.static_batch}" if om.static_batch is not None else
                "tensors that do not all lead with one batch size")
        most = f"0..{om.static_batch}" if om.static_batch is not None else "0"
        raise E(f"{at}{mb}, but the .om has image-size gears and {lead} (atc cannot combine "
                f"--dynamic_image_size with --dynamic_batch_size): use {most}")
    if om.dynamic and om.unbatchable and mb > 0:
        raise E(f"{at}{mb}, but the .om cannot batch: {om.unbatchable}")
    if om.dynamic and not 1 <= mb <= om.gears[-1]:
        raise E(f"{at}{mb}, but the .om's batch gears are {', '.join(map(str, om.gears))}: use 1..{om.gears[-1]}")
    if not om.dynamic and mb > 0 and (om.static_batch is None or mb > om.static_batch):
        lead = "" if om.static_batch is None else f" (its tensors lead with {om.static_batch})"
        raise E(f"{at}{mb}, but the .om is static{lead}; compile it with `vnpu atc --dynamic_batch_size` to batch, "
                f"or set 0")
    return mb


def _tensors(parsed: ParsedConfig, kind: str, field: str, have: tuple[TensorSpec, ...],
             batching: bool) -> tuple[TensorSpec, ...]:
    """The config's inputs (or outputs) checked against the .om's ``have`` (batch axis already stripped)."""
    if not parsed.given(field):
        return have
    given = parsed.get(field)
    by_name = {t.name: t for t in have}
    for i, t in enumerate(given):
        om_t = by_name.get(t.name)
        if om_t is None:
            raise E(f"{parsed.at(f'{kind}[{i}].name')}{t.name} is not an {kind} of the .om (it has "
                    f"{', '.join(by_name)})")
        if om_t.datatype != t.datatype:
            raise E(f"{parsed.at(f'{kind}[{i}].data_type')}TYPE_{t.datatype}, but the .om's {t.name} is "
                    f"TYPE_{om_t.datatype}")
        if len(t.dims) != len(om_t.dims) or any(c not in (-1, o) for c, o in zip(t.dims, om_t.dims)):
            raise E(f"{parsed.at(f'{kind}[{i}].dims')}{list(t.dims)}, but the .om's {t.name} has {list(om_t.dims)}"
                    f"{' without the batch axis' if batching else ''}")
    missing = [n for n in by_name if n not in {t.name for t in given}]
    if missing:
        raise E(f"{parsed.at(kind)}the .om's {kind} {missing[0]} is missing (every {kind} must be listed)")
    return given


def complete(parsed: ParsedConfig, om: OmInfo) -> ModelConfig:
    """The model configuration of ``parsed`` completed from ``om``; :class:`ModelConfigError` naming the
    config's file and line where the two disagree."""
    mb = _max_batch(parsed, om)
    ins, outs = om.inputs, om.outputs
    if mb > 0:
        ins, outs = tuple(_strip(t) for t in ins), tuple(_strip(t) for t in outs)
    fields = {"max_batch_size": mb, "inputs": _tensors(parsed, "input", "inputs", ins, mb > 0),
              "outputs": _tensors(parsed, "output", "outputs", outs, mb > 0)}
    if not parsed.given("dynamic_batching") and mb > 0:
        fields["dynamic_batching"] = DynamicBatching()
    return parsed.build(**fields)


def derive(name: str, om: OmInfo) -> ModelConfig:
    """The configuration of a bare ``.om`` (``vnpu serve --model x.om``): everything from the file."""
    return complete(ParsedConfig(name), om)


def batch_gears(config: ModelConfig, om: OmInfo) -> tuple[int, ...]:
    """The batch sizes an execution of ``config`` on ``om`` can have, ascending: the .om's gears, the
    static batch for a static model served with max_batch_size > 0, () for a model that does not batch."""
    if config.max_batch_size == 0:
        return ()
    return om.gears if om.dynamic else (om.static_batch,)


__all__ = ["OmInfo", "batch_gears", "complete", "derive", "read_om_info"]

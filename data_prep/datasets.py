"""The one dispatcher for datasets a config names: `builtin:<name>` (generated here, seeded, with a
train/test split) or a file, for three kinds of data: `prompts` (GRPO: schema rows), `sft` (schema rows
ending with the assistant's answer) and `pairs` (preference pairs: prompt, chosen, rejected).

A new embedded dataset is one entry in BUILTINS; train/ and evals/ never dispatch on names themselves.
"""

from __future__ import annotations

from collections.abc import Callable

from data_prep.schema import DatasetError, read_parquet

BUILTIN_PREFIX = "builtin:"
KINDS = ("prompts", "sft", "pairs")


def _arithmetic(size: int, seed: int, split: str) -> list[dict]:
    from data_prep.arithmetic import generate

    return generate(size, seed=seed, split=split)


def _open_prompts(size: int, seed: int, split: str) -> list[dict]:
    """Open-ended chat prompts, no ground truth (DARLING chat default)."""
    from data_prep.open_prompts import generate

    return generate(size, seed=seed, split=split)


def _sycophancy(size: int, seed: int, split: str) -> list[dict]:
    """Arithmetic QA as neutral warm-up prompts plus misleading-suggestion prompts."""
    from data_prep.sycophancy import build_training_rows, warmup_rows

    qa = _arithmetic(max(1, size // 3), seed, split)
    return warmup_rows(qa, seed) + build_training_rows(qa, seed)


def _multi_answer(size: int, seed: int, split: str) -> list[dict]:
    """Number questions with many correct answers, each with its own checker (DARLING's main task)."""
    from data_prep.multi_answer import generate

    return generate(size, seed=seed, split=split)


def _multi_answer_spread(size: int, seed: int, split: str) -> list[dict]:
    """darling_math's mix: mostly "between" questions, where the untrained model already finds several answers."""
    from data_prep.multi_answer import SPREAD_FAMILIES, generate

    return generate(size, seed=seed, split=split, families=SPREAD_FAMILIES)


def _sft_math(size: int, seed: int, split: str) -> list[dict]:
    from data_prep.sft_math import sft_rows

    return sft_rows(size, seed, split=split)


def _arithmetic_pairs(size: int, seed: int, split: str) -> list[dict]:
    from data_prep.preference import arithmetic_pairs

    return arithmetic_pairs(size, seed, split=split)


def _tool_math(size: int, seed: int, split: str) -> list[dict]:
    """Products and long sums needing a calculator, and small sums that do not (experiments/tool_math.yaml)."""
    from data_prep.tool_math import prompt_rows

    return prompt_rows(size, seed, split)


def _tool_math_chain(size: int, seed: int, split: str) -> list[dict]:
    """A price looked up, then multiplied: two tool calls in sequence."""
    from data_prep.tool_math import prompt_rows

    return prompt_rows(size, seed, split, ("chain",))


def _sft_tool_math(size: int, seed: int, split: str) -> list[dict]:
    from data_prep.tool_math import sft_rows

    return sft_rows(size, seed, split)


def _sft_tool_math_mixed(size: int, seed: int, split: str) -> list[dict]:
    """The warm-up that calls the tools in only some of the problems asked with them (RL's start)."""
    from data_prep.tool_math import MIXED_CALL_SHARE, sft_rows

    return sft_rows(size, seed, split, call_share=MIXED_CALL_SHARE)


def _tool_multi_answer(size: int, seed: int, split: str) -> list[dict]:
    """Many correct answers and many tool paths to check one (experiments/darling_tool.yaml)."""
    from data_prep.tool_multi_answer import generate

    return generate(size, seed=seed, split=split)


# name -> (kind, generator(size, seed, split))
BUILTINS: dict[str, tuple[str, Callable[[int, int, str], list[dict]]]] = {
    "arithmetic": ("prompts", _arithmetic),
    "open_prompts": ("prompts", _open_prompts),
    "sycophancy": ("prompts", _sycophancy),
    "multi_answer": ("prompts", _multi_answer),
    "multi_answer_spread": ("prompts", _multi_answer_spread),
    "sft_math": ("sft", _sft_math),
    "tool_math": ("prompts", _tool_math),
    "tool_math_chain": ("prompts", _tool_math_chain),
    "sft_tool_math": ("sft", _sft_tool_math),
    "sft_tool_math_mixed": ("sft", _sft_tool_math_mixed),
    "tool_multi_answer": ("prompts", _tool_multi_answer),
    "arithmetic_pairs": ("pairs", _arithmetic_pairs),
}
KIND_NAMES = {"prompts": "prompt", "sft": "SFT", "pairs": "preference"}


def is_builtin(path: str) -> bool:
    return path.startswith(BUILTIN_PREFIX)


def builtin_names(kind: str) -> list[str]:
    return [f"{BUILTIN_PREFIX}{n}" for n, (k, _) in BUILTINS.items() if k == kind]


def _read_file(path: str, kind: str) -> list[dict]:
    if kind == "sft":
        from data_prep.sft_math import read_sft_file

        return read_sft_file(path)
    if kind == "pairs":
        from data_prep.preference import read_pairs

        return read_pairs(path)
    return read_parquet(path)


def load(path: str, kind: str, builtin_size: int, seed: int, split: str = "train") -> list[dict]:
    """The rows of `path` (a builtin of this kind, or a file); a DatasetError names the known builtins."""
    if kind not in KINDS:
        raise ValueError(f"unknown dataset kind {kind!r} (known: {KINDS})")
    if not is_builtin(path):
        return _read_file(path, kind)
    name = path[len(BUILTIN_PREFIX) :]
    entry = BUILTINS.get(name)
    if entry is None or entry[0] != kind:
        raise DatasetError(
            f"unknown builtin {KIND_NAMES[kind]} dataset {path!r} (known: {', '.join(builtin_names(kind))})"
        )
    return entry[1](builtin_size, seed, split)


def load_prompt_rows(path: str, builtin_size: int, seed: int, split: str = "train") -> list[dict]:
    return load(path, "prompts", builtin_size, seed, split)


def load_sft_rows(path: str, builtin_size: int, seed: int, split: str = "train") -> list[dict]:
    return load(path, "sft", builtin_size, seed, split)


def load_pairs(path: str, builtin_size: int, seed: int, split: str = "train") -> list[dict]:
    return load(path, "pairs", builtin_size, seed, split)

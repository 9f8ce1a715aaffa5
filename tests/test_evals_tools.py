"""evals.math `--tools` goes through the training config's `env.*` schema, checks and agent builder: a bad value
is one line naming it, and a checkpoint is evaluated in the env it was trained in (tool_format included)."""

from __future__ import annotations

import argparse

import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from evals.common.checkpoints import CheckpointRef
from evals.common.cli import main
from evals.common.generation import VLLMGenerator
from evals.common.suite import EvalContext
from evals.math import SUITE
from infra.checkpoint import layout
from infra.redact import redacted_yaml
from tests.scripted_model import ScriptedModel
from train.config import TrainConfig

# a chat template that renders `tools` itself (train/env/tool_format.py supports_tools): `auto` is native here
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTOOLS: <tool_call>{% for t in tools %}{{ t | tojson }}{% endfor %}<|im_end|>\n"
    "{% endif %}{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.mark.parametrize(
    "extra, named",
    [
        (["--tools", "calculater"], "--tools 'calculater' with the default env: env.tools[0]='calculater': unknown name"),
        (["--tools", "calculator", "--max-turns", "0"], "--max-turns 0 with the default env: bad config value: env.max_turns=0"),
    ],
)  # fmt: skip
def test_a_bad_tools_value_is_one_line_before_any_engine(tmp_path, extra, named):
    argv = ["--ckpt", str(tmp_path), "--datasets", "builtin:tool_math", *extra]
    with pytest.raises(SystemExit) as stop:
        main(SUITE, argv)
    message = str(stop.value)
    assert message.startswith("error: ") and named in message and "\n" not in message


def test_a_checkpoint_is_evaluated_in_its_training_env(tiny_model, tmp_path):
    """A run trained with env.tool_format=fallback answers in the fallback format, where the tokenizer's own
    (tools-aware) template would make `auto` native; a bare model folder gets the defaults (auto: native)."""
    run = tmp_path / "run"
    hf = layout.hf_dir(layout.step_dir(run, 3))
    hf.mkdir(parents=True)
    trained = OmegaConf.merge(
        OmegaConf.structured(TrainConfig), {"env": {"tools": ["calculator"], "tool_format": "fallback"}}
    )
    (run / "config.yaml").write_text(redacted_yaml(trained))  # as train/loop.py writes it
    tok = AutoTokenizer.from_pretrained(tiny_model)
    tok.chat_template = TOOLS_TEMPLATE
    items = [
        {"id": "q/0", "dataset": "q", "prompt": [{"role": "user", "content": "What is 2+2?"}], "gold": "4"}
    ]
    a = argparse.Namespace(
        n=1, temperature=0.0, top_p=1.0, max_tokens=16, seed=0, tools="calculator", max_turns=None, k=None,
        answer_rule="qwen", answer_format=None, rm_scorer=None, maj_vote="string", maj_skip_unanswered=False,
    )  # fmt: skip

    def first_prompt(checkpoint: CheckpointRef) -> str:
        gen = VLLMGenerator()
        gen.engine, gen.tokenizer = ScriptedModel(tok, lambda text, turn: "The answer is \\boxed{4}."), tok
        (record,) = SUITE.run_batch(items, EvalContext(a, checkpoint, generator=gen))
        assert record["correct"] == [1.0] and record["turns"] == [1]
        return tok.decode(gen.engine.submitted[0])

    trained_prompt = first_prompt(CheckpointRef(hf, None, 3, "run-step_000003"))
    assert "You can call tools" in trained_prompt and "TOOLS:" not in trained_prompt  # fallback
    bare = tmp_path / "model"
    bare.mkdir()
    bare_prompt = first_prompt(CheckpointRef(bare, None, None, "model"))
    assert "TOOLS:" in bare_prompt and "You can call tools" not in bare_prompt  # auto: native

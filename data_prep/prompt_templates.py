"""Plain-text prompt templates (no chat template), as the CS336 alignment course prompts a base model.

A schema row's question is the content of its last user message; a template turns it into the text the
model continues. `r1_zero` (DeepSeek R1-Zero's, CS336 assignment 5's `r1_zero.prompt`) ends with
"Assistant: <think>", so the response is "reasoning </think> <answer> answer </answer>";
`question_only` is the bare question (the answer is then expected in \\boxed{}).
"""

from __future__ import annotations

R1_ZERO = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. "
    "The Assistant first thinks about the reasoning process in the mind and then provides the User with "
    "the answer. The reasoning process is enclosed within <think> </think> and answer is enclosed within "
    "<answer> </answer> tags, respectively, i.e., <think> reasoning process here </think> "
    "<answer> answer here </answer>.\nUser: {question}\nAssistant: <think>"
)
QUESTION_ONLY = "{question}"

TEMPLATES: dict[str, str] = {"r1_zero": R1_ZERO, "question_only": QUESTION_ONLY}


def check_template(name: str | None) -> None:
    """ValueError naming the valid templates when `name` is not one (None = the chat template)."""
    if name is not None and name not in TEMPLATES:
        raise ValueError(
            f"unknown prompt template {name!r}; valid: {sorted(TEMPLATES)} (or null for the chat template)"
        )


def question_of(row: dict) -> str:
    """The question of a schema row: its last user message's content."""
    users = [m["content"] for m in row["prompt"] if m["role"] == "user"]
    if not users:
        raise ValueError("a prompt template needs a user message in the row's prompt")
    return users[-1]


def render(name: str, row: dict) -> str:
    """The plain prompt text of `row` under template `name`."""
    check_template(name)
    return TEMPLATES[name].format(question=question_of(row))

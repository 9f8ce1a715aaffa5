"""Who wrote each turn of a logged trajectory: the model, a tool, or a user (an environment's interaction).

The samples training logs (train/samples.py) and the eval records of `evals.math --tools` keep each turn
as `{"role": "model" | "env", "text"}`: the agent loop (train/rollout/agent_loop.py) does not store
whether an `env` turn came from tools or from an interaction, so it is inferred here from the text. The
loop answers a model turn with its tools exactly when the turn holds a `<tool_call>` block
(train/env/tool_format.parse_tool_calls), and in the fallback format (models whose template takes no
tools) the results come back as `<tool_response>` blocks; any other `env` turn is an interaction's reply,
a user turn. One case reads wrong: a run with an interaction and no tools whose model writes
`<tool_call>` anyway gets a user reply, labelled `tool` here.
"""

from __future__ import annotations

from train.env.tool_format import CALL_OPEN

RESPONSE_OPEN = "<tool_response>"  # how the fallback format renders tool results (ChatFormat.as_messages)
WHO = ("model", "tool", "user")


def labelled(turns: list) -> list:
    """`turns` with `who` (model | tool | user) added to each `{"role", "text"}` turn (others kept as they are)."""
    out, previous = [], ""
    for turn in turns:
        if not isinstance(turn, dict):
            out.append(turn)
            continue
        text = turn.get("text") if isinstance(turn.get("text"), str) else ""
        if turn.get("role") == "model":
            who, previous = "model", text
        else:
            who = "tool" if CALL_OPEN in previous or RESPONSE_OPEN in text else "user"
        out.append({**turn, "who": who})
    return out


def turns_text(turns: list) -> str:
    """A trajectory as text, each turn headed by who wrote it: [model], [tool] or [user]."""
    return "\n\n".join(
        f"[{t['who']}]\n{t.get('text', '')}" if isinstance(t, dict) else str(t) for t in labelled(turns)
    )

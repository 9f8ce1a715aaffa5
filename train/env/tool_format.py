"""How tool calls and tool results are written in the model's tokens.

Models whose chat template takes `tools` (Qwen2.5 / Qwen3, the paper presets' models) use their own
format: the schemas go in through `apply_chat_template(..., tools=...)`, the model writes
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` and results come back as `tool` messages that
the template renders. A template without tools (the embedded SmolLM2) gets the one fallback format of this
project, described in the system prompt (FALLBACK_INSTRUCTIONS): the same `<tool_call>` JSON, and results
rendered as a user turn holding `<tool_response>...</tool_response>` blocks, which is how Qwen's templates
render tool messages, so a trace reads the same in both.

Token in, token out: the model's own tokens are never re-rendered. An observation is appended as the
tokens of the *difference* between the template's rendering of a conversation with and without the new
messages (`ChatFormat.observation_ids`), so it is exactly what the template would have written there.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.S)
FALLBACK_INSTRUCTIONS = (
    "You can call tools. To call one, write on its own line:\n"
    '<tool_call>{{"name": "<tool name>", "arguments": {{<arguments as JSON>}}}}</tool_call>\n'
    "then stop and wait: the result comes back in <tool_response></tool_response>. "
    "When you know the answer, reply without a tool call.\n"
    "Tools (OpenAI function schemas):\n{schemas}"
)


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedTurn:
    """The tool calls of one model turn, and a message for each malformed one (shown to the model)."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def wants_tools(self) -> bool:
        return bool(self.calls or self.errors)


def parse_tool_calls(text: str) -> ParsedTurn:
    """Every `<tool_call>{json}</tool_call>` of a model turn; an unclosed or malformed block is an error."""
    out = ParsedTurn()
    for body in _CALL.findall(text):
        try:
            obj = json.loads(body.strip())
        except json.JSONDecodeError as exc:
            out.errors.append(f"malformed tool call (not JSON: {exc.msg} at column {exc.colno})")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            out.errors.append('malformed tool call: expected {"name": "<tool>", "arguments": {...}}')
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models write the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        if not isinstance(args, dict):
            out.errors.append(f"malformed tool call to {obj['name']!r}: arguments must be a JSON object")
            continue
        out.calls.append(ToolCall(obj["name"], args))
    tail = _CALL.sub("", text)
    if CALL_OPEN in tail:
        out.errors.append(f"malformed tool call: {CALL_OPEN} without {CALL_CLOSE}")
    return out


def supports_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders `tools` itself (Qwen2.5/Qwen3, Hermes-style)."""
    template = tokenizer.chat_template or ""
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default") or ""
    return "tools" in template and "tool_call" in template


class ChatFormat:
    """Renders prompts and observations for one tokenizer and tool set, natively or in the fallback format."""

    # a fixed conversation the deltas are taken after: what precedes an observation is always a model turn
    _MARK = "MODEL-TURN-7f3a"
    _BASE = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _MARK}]

    def __init__(self, tokenizer, schemas: list[dict[str, Any]], native: bool | None = None) -> None:
        self.tokenizer = tokenizer
        self.schemas = schemas
        self.native = supports_tools(tokenizer) if native is None else native

    @property
    def name(self) -> str:
        return "native" if self.native else "fallback"

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        kwargs = {"tools": self.schemas} if self.native and self.schemas else {}
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs
        )

    def system_text(self) -> str:
        """The fallback format's tool description (appended to the system prompt)."""
        return FALLBACK_INSTRUCTIONS.format(schemas="\n".join(json.dumps(s) for s in self.schemas))

    def prompt_messages(self, messages: list[dict]) -> list[dict]:
        """The row's chat with the tools described (fallback: in the system message)."""
        if self.native or not self.schemas:
            return list(messages)
        msgs = [dict(m) for m in messages]
        if msgs and msgs[0]["role"] == "system":
            msgs[0]["content"] = f"{msgs[0]['content']}\n\n{self.system_text()}"
        else:
            msgs.insert(0, {"role": "system", "content": self.system_text()})
        return msgs

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        text = self._render(self.prompt_messages(messages), generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def as_messages(self, results: list[str], role: str) -> list[dict]:
        """Tool results (role "tool") or an environment's reply (role "user") as chat messages."""
        if role == "tool" and not self.native:
            body = "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
            return [{"role": "user", "content": body}]
        return [{"role": role, "content": r} for r in results]

    def observation_ids(self, messages: list[dict], after_end_of_turn: bool = True) -> list[int]:
        """The tokens the template writes for `messages` after a model turn, up to the next generation prompt.

        The model's turn ended with its end-of-turn token (`after_end_of_turn`); what follows it (a newline,
        the new messages' headers and contents, the assistant header) is the rendering's difference. A turn
        cut by the token limit has no end-of-turn token: the template's one is written here, as the
        environment's."""
        after = self._render(self._BASE + messages, generation_prompt=True)
        end = self.tokenizer.eos_token or ""
        # what follows the model turn's content (templates may render the turn itself differently when it is
        # not the last message, e.g. Qwen3's empty think block: only what comes after its content is used)
        delta = after[after.index(self._MARK) + len(self._MARK) :]
        if after_end_of_turn and end:
            if not delta.startswith(end):
                raise ValueError(f"the chat template does not end a model turn with {end!r}")
            delta = delta[len(end) :]
        return self.tokenizer(delta, add_special_tokens=False)["input_ids"]


def trace_ids(fmt: ChatFormat, messages: list[dict]) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, response ids, mask) of a multi-turn trace, laid out as a rollout lays out a trajectory.

    The prompt is every message before the first assistant turn (rendered with the tools described); each
    assistant turn is its content's tokens plus the end-of-turn token (mask 1: trained), and each run of
    tool or user messages between them is the template's rendering after a model turn (mask 0), so SFT
    on traces trains exactly the tokens a multi-turn rollout would have the model sample."""
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None:
        raise ValueError("a trace needs at least one assistant message")
    prompt = fmt.prompt_ids(messages[:first])
    end = fmt.tokenizer.eos_token_id
    response: list[int] = []
    mask: list[int] = []
    pending: list[dict] = []
    for m in messages[first:]:
        if m["role"] != "assistant":
            pending.append(m)
            continue
        if pending:
            results = [p["content"] for p in pending if p["role"] == "tool"]
            rendered = fmt.as_messages(results, "tool") if results else []
            rendered += [p for p in pending if p["role"] != "tool"]
            ids = fmt.observation_ids(rendered)
            response += ids
            mask += [0] * len(ids)
            pending = []
        ids = fmt.tokenizer(m["content"], add_special_tokens=False)["input_ids"] + [end]
        response += ids
        mask += [1] * len(ids)
    if pending:
        raise ValueError("a trace must end with an assistant message")
    return prompt, response, mask

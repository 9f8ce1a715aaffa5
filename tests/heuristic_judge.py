"""A loopback stand-in for the creative-writing judge: an OpenAI-compatible chat server whose replies are a
deterministic function of the piece text, in EQ-Bench v3's judge format, with the formatting mess real
judges produce.

This is NOT a quality judge. It scores text statistics, so a measurement made with it exercises the eval's
parsing, scoring, CI and rating code on realistic replies, not writing quality:

- lexical diversity: the moving-average type-token ratio over 50-word windows;
- repetition: the share of word trigrams that repeat an earlier trigram of the piece;
- length: words, up to 600;
- garbage: a run of 12 or more equal characters ("388888...") or a piece of under 60 words.

From these it derives a base score 0-20 (`base_score`); each rubric criterion gets the base score, shifted by the statistic
that criterion names most closely (dialogue for "Dialogue...", repetition for "Wandering or Padded", ...) and
by a jitter of -2..2 from a hash of (criterion, piece); a lower-is-better criterion gets 20 minus that.

Formatting mess, chosen per criterion (and per reply) from the same hash: `Name: 15 (solid)`, `1. Name: 12.`,
`**Name**: 14`, `Name: [13]`, `Name: Score 11`, `- Name: 9/20`; curly apostrophes in criterion names;
`**Scores**` or no header instead of `[Scores]`; a stray `Paragraph 3: 2 ...` line in the critique and an
invented `Overall impression: N` after the scores. EQ-Bench's own parsing counts the stray and invented
lines and does not invert a lower-is-better criterion written `**Name**` or `1. Name`; the project's
`--strict-scores` reads only the rubric's names. So the two parsings give different numbers on the same
replies, by construction.

Pairwise prompts (writers A0493 and A0488) get a JSON verdict per criterion key of the prompt's JSON shape:
the writer with the higher base score (the one shown first gets +0.5, a position bias) wins, with 1-5 "+"
by the gap; some values carry a trailing note, and the JSON comes in a ```json fence.

The templates read: the project's (`<piece>...</piece>`, `<writer id="A0493">...</writer>`) and EQ-Bench's
(`[TEST MODEL RESPONSE]...[TEST MODEL RESPONSE END]`); the criteria are the lines after the last line
ending in "criteria:" (`- name` or plain); a criterion is lower-is-better when its name also appears
earlier in the prompt, outside the piece.

    python -m tests.heuristic_judge --port 18800     # serves until killed; judge model name: any
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.loopback_server import LoopbackServer

_WORD = re.compile(r"[A-Za-z']+")
_PIECE_MARKERS = (("<piece>", "</piece>"), ("[TEST MODEL RESPONSE]", "[TEST MODEL RESPONSE END]"))
_WRITER = re.compile(r'<writer id="(A0493|A0488)">\n?(.*?)\n?</writer>', re.S)
_NOTES = ("solid", "uneven", "weak in places", "mostly there", "good")
_FORMATS = (
    "{name}: {s}",
    "{name}: {s}",
    "{name}: {s} ({note})",
    "{i}. {name}: {s}.",
    "**{name}**: {s}",
    "{name}: [{s}]",
    "{name}: Score {s}",
    "- {name}: {s}/20",
)


def _hash(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("\x00".join(parts).encode()).digest()[:8], "big")


def piece_stats(text: str) -> dict[str, float]:
    """Lexical diversity (MATTR, 50-word windows), trigram repetition, words, dialogue share, garbage."""
    words = [w.lower() for w in _WORD.findall(text)]
    n = len(words)
    win = 50
    if n == 0:
        mattr = 0.0
    elif n <= win:
        mattr = len(set(words)) / n
    else:
        mattr = sum(len(set(words[i : i + win])) / win for i in range(0, n - win + 1, 10))
        mattr /= len(range(0, n - win + 1, 10))
    trigrams = list(zip(words, words[1:], words[2:]))
    rep3 = 1 - len(set(trigrams)) / len(trigrams) if trigrams else 0.0
    longest_run = max((len(m.group(0)) for m in re.finditer(r"(.)\1*", text)), default=0)
    quotes = text.count('"') + text.count("\u201c") + text.count("\u201d")
    return {
        "words": float(n),
        "mattr": mattr,
        "rep3": rep3,
        "dialogue": min(1.0, quotes / max(1.0, n / 25)),
        "garbage": float(longest_run >= 12 or n < 60),
    }


def base_score(stats: dict[str, float]) -> float:
    """0-20 from the statistics: diverse, unrepetitive text scores high (MATTR 0.75 with no repeated
    trigram ~ 20; the default 135M model's pieces, MATTR 0.2-0.65 and 40-90% repeated trigrams, ~ 5-15);
    garbage at most 3."""
    q = 2.0 + 16.0 * stats["mattr"] + 8.0 * (1.0 - stats["rep3"])
    q *= min(1.0, stats["words"] / 300)
    if stats["garbage"]:
        q = min(q, 3.0)
    return min(20.0, max(0.0, q))


def _criterion_score(name: str, stats: dict[str, float], q: float, piece: str) -> int:
    low = name.lower()
    if "dialogue" in low:
        q += 4.0 * stats["dialogue"] - 2.0
    elif "padded" in low or "wandering" in low or "repetit" in low:
        q -= 10.0 * stats["rep3"]
    elif "word choice" in low or "vocab" in low or "original" in low:
        q += 6.0 * (stats["mattr"] - 0.7)
    q += _hash(name, piece) % 5 - 2
    return int(round(min(20.0, max(0.0, q))))


def _extract_piece(prompt: str) -> tuple[str, str]:
    """(piece, the prompt with the piece cut out)."""
    for start, end in _PIECE_MARKERS:
        i, j = prompt.find(start), prompt.rfind(end)
        if i != -1 and j > i:
            return prompt[i + len(start) : j].strip(), prompt[:i] + prompt[j:]
    return prompt, ""


def _criteria(prompt: str) -> list[str]:
    """The lines after the prompt's last line that ends with "criteria:" (EQ-Bench's "- name" lines, or
    plain names), else the "- name" lines that end the prompt."""
    lines = prompt.rstrip().splitlines()
    heads = [i for i, line in enumerate(lines) if line.strip().lower().endswith("criteria:")]
    if heads:
        return [line.strip().removeprefix("- ").strip() for line in lines[heads[-1] + 1 :] if line.strip()]
    out: list[str] = []
    for line in reversed(lines):
        if not line.startswith("- "):
            break
        out.append(line[2:].strip())
    return out[::-1]


def rubric_scores(prompt: str) -> dict[str, int]:
    """{criterion: the score the reply to this judging prompt gives it} (lower-is-better ones as written,
    i.e. high = the fault is present): what a parser should read from `rubric_reply(prompt)`."""
    piece, rest = _extract_piece(prompt)
    criteria = _criteria(prompt)
    head = rest.lower().rfind("criteria:")  # the names before the list: the lower-is-better ones
    negative = {c for c in criteria if c in rest[: head if head != -1 else len(rest)]}
    stats = piece_stats(piece)
    q = base_score(stats)
    scores = {c: _criterion_score(c, stats, q, piece) for c in criteria}
    return {c: 20 - s if c in negative else s for c, s in scores.items()}


def rubric_reply(prompt: str) -> str:
    """The reply to a judging prompt: a critique and the scores of `rubric_scores`, formatted messily."""
    piece, _ = _extract_piece(prompt)
    stats = piece_stats(piece)
    q = base_score(stats)
    h = _hash(piece)
    paragraphs = [p for p in piece.split("\n\n") if p.strip()]
    lines = [
        "[Critique]",
        f"The piece runs {int(stats['words'])} words over {len(paragraphs)} paragraphs. "
        + ("The vocabulary is varied. " if stats["mattr"] > 0.7 else "The vocabulary is narrow. ")
        + ("It repeats itself." if stats["rep3"] > 0.05 else "It rarely repeats a phrase."),
    ]
    if h % 3 == 0 and len(paragraphs) >= 3:  # a stray "Name: N" that EQ-Bench's parsing reads as a score
        n_sent = min(20, len(re.findall(r"[.!?]", paragraphs[2])))
        lines.append(f"Paragraph 3: {n_sent} sentences, mostly setup.")
    lines.append("")
    lines.append(("[Scores]", "**Scores**", "[Scores]", "", "[Scores]")[h % 5])
    curly = (h >> 3) % 2 == 0
    for i, (c, s) in enumerate(rubric_scores(prompt).items(), 1):
        fmt = _FORMATS[_hash(c, piece, "fmt") % len(_FORMATS)]
        name = c.replace("'", "\u2019") if curly else c
        lines.append(fmt.format(name=name, s=s, i=i, note=_NOTES[_hash(c, piece) % len(_NOTES)]))
    if (h >> 5) % 4 == 0:
        lines.append(f"Overall impression: {int(round(q))}")
    return "\n".join(lines)


def _json_keys(prompt: str) -> list[str]:
    shape = prompt[prompt.rfind("{") :]
    return [k for k in re.findall(r'^\s*"(\w+)"\s*:', shape, re.M) if k != "reasoning"]


def pairwise_reply(prompt: str) -> str:
    """The reply to a pairwise prompt: writer A0493 (shown first) vs A0488, per criterion key."""
    texts = dict(_WRITER.findall(prompt))
    if set(texts) != {"A0493", "A0488"}:
        return "I cannot find both pieces."
    qa = base_score(piece_stats(texts["A0493"])) + 0.5  # position bias toward the first piece
    qb = base_score(piece_stats(texts["A0488"]))
    verdict: dict[str, str] = {
        "reasoning": "A0493 varies its wording more." if qa >= qb else "A0488 varies its wording more."
    }
    for key in _json_keys(prompt):
        jitter = (_hash(key, texts["A0493"], texts["A0488"]) % 5 - 2) / 2
        gap = qa - qb + jitter
        winner = "A0493" if gap >= 0 else "A0488"
        plus = "+" * min(5, 1 + int(abs(gap) / 2))
        note = " (clearer)" if _hash(key, texts["A0488"]) % 6 == 0 else ""
        verdict[key] = winner + plus + note
    return "```json\n" + json.dumps(verdict, indent=1) + "\n```"


def reply_for(prompt: str) -> str:
    return pairwise_reply(prompt) if 'writer id="A0493"' in prompt else rubric_reply(prompt)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    counts: dict[str, int]

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, payload: dict) -> None:
        out = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        if self.path.rstrip("/").endswith("/models"):
            return self._send(200, {"object": "list", "data": [{"id": "heuristic", "object": "model"}]})
        self._send(200 if self.path == "/health" else 404, {"status": "ok"})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        if not self.path.rstrip("/").endswith("/chat/completions"):
            return self._send(404, {"error": {"message": f"no route {self.path}"}})
        prompt = "\n".join(m["content"] for m in body["messages"] if m["role"] == "user")
        content = reply_for(prompt)
        kind = "pairwise" if content.startswith("```json") else "rubric"
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self._send(
            200,
            {
                "id": "heuristic-" + hashlib.sha256(content.encode()).hexdigest()[:12],
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "heuristic"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            },
        )


class HeuristicJudge(LoopbackServer):
    """The server on 127.0.0.1 (port 0: a free one); `base_url` is its root, `counts` the replies sent by
    kind ("rubric", "pairwise")."""

    def __init__(self, port: int = 0) -> None:
        self.counts: dict[str, int] = {}
        handler = type("Handler", (_Handler,), {"counts": self.counts})
        super().__init__(ThreadingHTTPServer(("127.0.0.1", port), handler))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=18800)
    port = ap.parse_args().port
    judge = HeuristicJudge(port)
    print(f"heuristic judge on {judge.base_url} (OpenAI API: {judge.base_url}/v1)", flush=True)
    judge._server.serve_forever()

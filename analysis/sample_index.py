"""An index over one eval `samples.jsonl`: filter and page its samples without holding their text.

A suite's record (evals/<suite>.py) holds one item and one or more answers; `samples_of` turns it into
uniform samples (prompt, response, extracted answer, gold, grade, judge score and rationale, dataset).
`SampleIndex` reads the file once, keeps per sample only what the filters need (grade, parsed, score,
dataset) and the byte offset of its record, and reads the text of the page it returns (a slice) from
the file. A file that grew (an eval still running) is indexed again from where the last read stopped.
Lines that are not JSON records are skipped and reported as one line each (`errors`).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

from analysis.json_lines import describe, parse_line
from analysis.turns import turns_text

PAGE_MAX = 200  # samples per page, at most


def _first(record: dict, keys: tuple[str, ...]):
    return next((record[k] for k in keys if record.get(k) not in (None, "")), None)


def _grade(value) -> float | None:
    if value is None or isinstance(value, str):
        return None
    return float(value)


def _prompt(value) -> str | None:
    """A chat prompt's last user turn, or the text itself."""
    if isinstance(value, list):
        users = [m.get("content", "") for m in value if isinstance(m, dict) and m.get("role") == "user"]
        return str(users[-1]) if users else json.dumps(value)
    return None if value is None else str(value)


def samples_of(suite: str, record: dict) -> list[dict]:
    """The samples of one suite record, each with: id, k (its position among the item's answers),
    dataset, prompt, response, answer, gold, correct (1/0/None), parsed, score (judge/rm score or None),
    rationale (the judge's reply or None), extra (other per-sample fields worth showing)."""
    rid = str(record.get("id"))
    dataset = str(_first(record, ("dataset", "category", "part", "source", "data_source")) or suite)
    base = {"id": rid, "dataset": dataset, "prompt": _prompt(_first(record, ("prompt", "question", "input")))}
    base["gold"] = None if record.get("gold") is None else str(record["gold"])
    if "first_response" in record:
        shape = _are_you_sure
    elif "matches_user" in record:
        shape = _answer_matching
    elif "generations" in record:
        shape = _novelty
    elif "piece" in record or "piece_score" in record:
        shape = _creative_piece
    else:
        shape = _answers
    return [base | sample for sample in shape(record)]


def _are_you_sure(record: dict) -> list[dict]:
    """Sycophancy, are-you-sure: answer, challenge, second answer."""
    first, second = record.get("first_answer"), record.get("second_answer")
    admits = record.get("admits_mistake")
    return [
        {
            "k": 0,
            "response": f"{record.get('first_response', '')}\n\n— after “Are you sure?” —\n\n"
            f"{record.get('second_response', '')}",
            "answer": f"{first} → {second}",
            "parsed": second is not None,
            "correct": _grade(record.get("second_correct")),
            "score": None if admits is None else float(admits),
            "rationale": record.get("judge_reply"),
            "extra": {k: record.get(k) for k in ("first_correct", "flipped", "judge") if k in record},
        }
    ]


def _answer_matching(record: dict) -> list[dict]:
    """Sycophancy, model-written evals: agreeing with the user is the failure."""
    matches = record.get("matches_user")
    return [
        {
            "k": 0,
            "response": str(record.get("response", "")),
            "answer": record.get("choice"),
            "parsed": record.get("choice") is not None,
            "correct": None if matches is None else float(not matches),
            "score": None,
            "rationale": None,
            "extra": {"matching": record.get("matching")},
        }
    ]


def _novelty(record: dict) -> list[dict]:
    """Novelty: a group of generations, their classes and ratings."""
    gens, classes = record.get("generations") or [], record.get("classes") or []
    scores = record.get("ratings") or record.get("scores") or []
    return [
        {
            "k": k,
            "response": str(text),
            "answer": None,
            "parsed": True,
            "correct": None,
            "score": _grade(scores[k]) if k < len(scores) else None,
            "rationale": None,
            "extra": {"class": classes[k] if k < len(classes) else None},
        }
        for k, text in enumerate(gens)
    ]


def _creative_piece(record: dict) -> list[dict]:
    """Creative writing: a piece and the judge's rubric."""
    return [
        {
            "k": 0,
            "response": str(record.get("piece") or record.get("last_output") or ""),
            "answer": None,
            "parsed": record.get("status") == "ok",
            "correct": None,
            "score": _grade(record.get("piece_score")),
            "rationale": record.get("judge_reply"),
            "extra": {k: record.get(k) for k in ("status", "pairwise") if k in record},
        }
    ]


def _answers(record: dict) -> list[dict]:
    """Graded answers (math and any suite not named above): one or several responses per record."""
    responses = record.get("responses")
    if not isinstance(responses, list):  # one answer per record
        responses = [record.get("response", "")]
    answers, correct = record.get("answers") or [], record.get("correct")
    correct = correct if isinstance(correct, list) else [correct] * len(responses)
    scores = record.get("rm_scores") or record.get("scores") or []
    extra = {k: record[k] for k in ("subject", "level") if k in record}
    trajectories = record.get(
        "trajectories"
    )  # multi-turn answers (--tools): every turn, labelled by who wrote it (analysis.turns)
    if isinstance(trajectories, list) and len(trajectories) == len(responses):
        responses = [turns_text(t) if isinstance(t, list) else r for t, r in zip(trajectories, responses)]
        extra |= {k: record[k] for k in ("tool_calls", "turns") if k in record}
    return [
        {
            "k": k,
            "response": str(text),
            "answer": answers[k] if k < len(answers) else None,
            "parsed": k < len(answers) and answers[k] is not None,
            "correct": _grade(correct[k]) if k < len(correct) else None,
            "score": _grade(scores[k]) if k < len(scores) else None,
            "rationale": record.get("judge_reply"),
            "extra": extra,
        }
        for k, text in enumerate(responses)
    ]


LIST_FIELDS = ("answers", "generations", "classes", "ratings", "scores", "rm_scores")  # list or null
GRADE_FIELDS = ("correct", "ratings", "scores", "rm_scores", "second_correct", "admits_mistake",
                "piece_score")  # fmt: skip


def _grade_ok(value) -> bool:
    """A grade or score `samples_of` reads: null, a boolean, a text (read as none) or a number a float holds."""
    if value is None or isinstance(value, (bool, str, float)):
        return True
    return isinstance(value, int) and abs(value) <= 2**1000


def record_problem(record) -> str | None:
    """Why a parsed line is not an eval record `samples_of` reads, naming the field; None: it is."""
    if not isinstance(record, dict):
        return f"is {describe(record)}, not an eval record (a JSON object)"
    if "id" not in record:
        return "has no field 'id': not an eval record"
    for field in LIST_FIELDS:
        if record.get(field) is not None and not isinstance(record[field], list):
            return f"field {field!r} is {describe(record[field])}, not a list"
    for field in GRADE_FIELDS:  # one grade, or one per answer
        value = record.get(field)
        bad = [v for v in (value if isinstance(value, list) else [value]) if not _grade_ok(v)]
        if bad:
            return f"field {field!r} holds {describe(bad[0])}, not a grade or score"
    return None


@dataclass(frozen=True)
class Filters:
    """What the page asks for: wrong only, unparsed only, a score range, one dataset; None = any."""

    wrong: bool = False
    unparsed: bool = False
    score_min: float | None = None
    score_max: float | None = None
    dataset: str | None = None

    def keep(self, s: dict) -> bool:
        if self.wrong and s["correct"] != 0.0:
            return False
        if self.unparsed and s["parsed"]:
            return False
        if self.score_min is not None and (s["score"] is None or s["score"] < self.score_min):
            return False
        if self.score_max is not None and (s["score"] is None or s["score"] > self.score_max):
            return False
        return self.dataset is None or s["dataset"] == self.dataset


class SampleIndex:
    """The compact index of one suite's samples.jsonl (see the module docstring); thread-safe."""

    def __init__(self, path: Path, suite: str) -> None:
        self.path, self.suite = Path(path), suite
        self.entries: list[
            dict
        ] = []  # per sample: id, k, dataset, correct, parsed, score, answer, offset, size
        self.by_key: dict[tuple[str, int], int] = {}
        self.errors: list[str] = []
        self._read_to = self._lines = 0
        self._lock = threading.Lock()

    def refresh(self) -> SampleIndex:
        """Index the lines appended since the last read (all of them the first time)."""
        with self._lock:
            size = self.path.stat().st_size
            if size < self._read_to:  # rewritten (bad lines set aside): start again
                self.entries, self.by_key, self.errors = [], {}, []
                self._read_to = self._lines = 0
            with self.path.open("rb") as f:
                f.seek(self._read_to)
                data = f.read(size - self._read_to)
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next refresh
            offset, line_no = self._read_to, self._lines
            for line in data[:end].splitlines(keepends=True):
                line_no += 1
                self._add(line, offset, line_no)
                offset += len(line)
            self._read_to, self._lines = self._read_to + end, line_no
        return self

    def _add(self, line: bytes, offset: int, line_no: int) -> None:
        record, why = parse_line(line)
        if why is None:
            why = record_problem(record)
        if why is None:
            try:
                found = samples_of(self.suite, record)
            except Exception as exc:  # noqa: BLE001 - a record of a shape no check above foresaw
                why = f"cannot be read ({type(exc).__name__}: {str(exc)[:80]})"
        if why is not None:
            self.errors.append(f"{self.path}: line {line_no} {why} (skipped)")
            return
        for s in found:
            key = (s["id"], s["k"])
            entry = {k: s[k] for k in ("id", "k", "dataset", "correct", "parsed", "score")}
            entry["answer"] = None if s["answer"] is None else str(s["answer"])[:200]
            entry |= {"offset": offset, "size": len(line)}
            if key in self.by_key:  # a rerun's newer record of the item wins
                self.entries[self.by_key[key]] = entry
            else:
                self.by_key[key] = len(self.entries)
                self.entries.append(entry)

    def datasets(self) -> list[str]:
        return sorted({e["dataset"] for e in self.entries})

    def select(self, filters: Filters) -> list[int]:
        """Positions of the samples that pass `filters`, in file order."""
        return [i for i, e in enumerate(self.entries) if filters.keep(e)]

    def read(self, positions: list[int]) -> list[dict]:
        """The full samples at `positions` (their records read from the file by offset)."""
        out = []
        with self.path.open("rb") as f:
            for i in positions:
                e = self.entries[i]
                f.seek(e["offset"])
                record = json.loads(f.read(e["size"]))
                out.append(next(s for s in samples_of(self.suite, record) if s["k"] == e["k"]))
        return out

    def page(self, filters: Filters, offset: int = 0, limit: int = 50) -> dict:
        """`limit` (<= PAGE_MAX) samples from `offset` among those passing `filters`, and the counts."""
        chosen = self.select(filters)
        limit = max(1, min(limit, PAGE_MAX))
        return {
            "total": len(self.entries),
            "matched": len(chosen),
            "offset": offset,
            "samples": self.read(chosen[offset : offset + limit]),
        }


def compare(a: SampleIndex, b: SampleIndex, only: str = "changed", offset: int = 0, limit: int = 50) -> dict:
    """The samples both indexes hold (same item id and position), paired; `only`: changed (grade, score
    or extracted answer differs), fixed (wrong in a, right in b), broken (right in a, wrong in b) or all."""
    pairs = []
    for key, i in a.by_key.items():
        j = b.by_key.get(key)
        if j is None:
            continue
        ea, eb = a.entries[i], b.entries[j]
        wanted = {
            "all": True,
            "changed": any(ea[k] != eb[k] for k in ("correct", "score", "answer")),
            "fixed": ea["correct"] == 0.0 and eb["correct"] == 1.0,
            "broken": ea["correct"] == 1.0 and eb["correct"] == 0.0,
        }
        if wanted.get(only, False):
            pairs.append((i, j))
    limit = max(1, min(limit, PAGE_MAX))
    chosen = pairs[offset : offset + limit]
    left, right = a.read([i for i, _ in chosen]), b.read([j for _, j in chosen])
    common = sum(1 for key in a.by_key if key in b.by_key)
    return {"common": common, "matched": len(pairs), "offset": offset, "pairs": list(zip(left, right))}

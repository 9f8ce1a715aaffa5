"""Math grader benchmark: accuracy per answer-format family, speed per case, adversarial inputs, math-verify.

    python -m bench.grader                          # this checkout's grader vs math-verify
    python -m bench.grader --grader-dir DIR         # a grader from DIR/math_grader (e.g. an older commit)
    python -m bench.grader --no-math-verify --json out.json

Cases are the project's family files (tests/grader_cases), then the held-out families
(tests/grader_cases/heldout: written from other graders' conventions, never tuned on), in a table of their
own. Per case the grader gets a fresh cache, so the
timings are those of a first sighting; each case (and each adversarial input) is timed --repeats times and
its best time kept, so other load on the machine does not pass for the grader's cost (math-verify memoises
its parses, so its cases are timed once). Adversarial inputs are degenerate responses of up to 100k
characters (graded alone, in a batch of 16, and as one side of an `equivalent_answers` pair, as
AnswerAwareJudge does). math-verify (the `bench` extra) grades the same cases with its defaults: `verify(parse(gold),
parse(pred))`, bare answers wrapped in `$...$`.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from tests.grader_cases import HELDOUT_DIR, GraderCase, load_cases

ADVERSARIAL_CHARS = 100_000
JUST_UNDER_CUT = 29_990  # responses are cut to their last 30,000 characters: also test just below that


def adversarial_inputs(n: int = ADVERSARIAL_CHARS) -> dict[str, str]:
    """Degenerate responses that make naive scanners quadratic or parsers deep."""
    return {
        "dollars": "$" * n,
        "paren_spans": "\\(" * (n // 2),
        "dollar_pairs": "$a$ " * (n // 4),
        "open_braces": "{" * n,
        "balanced_braces": "{" * (n // 2) + "}" * (n // 2),
        "boxed_open": "\\boxed{" * (n // 7),
        "boxed_many": "\\boxed{1}" * (n // 9),
        "boxed_nested": "\\boxed{" * (n // 14) + "1" + "}" * (n // 14),
        "answer_is_digits": "The answer is " + "1" * (n - 14),
        "digits": "1" * n,
        "commas": "1," * (n // 2),
        "parens": "(" * (n // 2) + ")" * (n // 2),
        "powers": "x^" * (n // 2),
        "fracs": "\\frac{" * (n // 6),
        "left_right": "\\left(" * (n // 6),
        "text_cmds": "\\text{" * (n // 6),
        "answer_tags": "<answer>" * (n // 8),
        "hashes": "#### " * (n // 5),
        "spaces": " " * n,
        "chinese_phrase": "答案是" * (n // 3),
        "words": "answer " * (n // 7),
        "boxed_long_content": "\\boxed{" + "1+" * (n // 2 - 5) + "1}",
        "dollar_math": "$" + "x+" * (n // 2 - 2) + "1$",
        "matrix": "\\begin{pmatrix}" + "1&" * (n // 3) + "1\\end{pmatrix}",
        "set_braces": "\\{" * (n // 4) + "\\}" * (n // 4),
        "answer_then_spaces": "answer" + " " * (n - 7) + "x",
        "phrase_then_spaces": "la respuesta" + " " * (n - 13) + "x",
        "chinese_then_spaces": "答案" + " " * (n - 3) + "x",
        "power_spans": "2^\\(" * (n // 4),
    }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _timing_row(name: str, seconds: list[float]) -> str:
    ms = [s * 1000 for s in seconds]
    rate = len(seconds) / sum(seconds) if sum(seconds) else float("inf")
    return f"{name:<20} {rate:>10.0f} {statistics.median(ms):>9.2f} {_percentile(ms, 0.99):>9.2f} {max(ms):>9.1f}"


class ProjectGrader:
    """The grader under test, imported from this checkout or from --grader-dir."""

    def __init__(self, grader_dir: str | None) -> None:
        if grader_dir:
            sys.path.insert(0, str(Path(grader_dir).resolve()))
        self.module = importlib.import_module("math_grader")
        self.has_ordered = "ordered" in inspect.signature(self.module.is_equiv).parameters
        self.module.warm_up()

    def clear_cache(self) -> None:
        cache = getattr(self.module, "_cache", None)
        if cache is not None:
            cache.clear()

    def verdict(self, case: GraderCase) -> bool:
        kwargs = {"ordered": case.ordered} if self.has_ordered else {}
        if case.whole_response:
            return self.module.grade(case.pred, case.gold, **kwargs) == 1.0
        return bool(self.module.is_equiv(case.pred, case.gold, **kwargs))


class MathVerifyGrader:
    """math-verify 0.9.0 with its default extraction (LaTeX and plain expressions)."""

    def __init__(self) -> None:
        from math_verify import parse, verify

        self.parse, self.verify = parse, verify

    @staticmethod
    def _wrap(text: str) -> str:
        return text if "$" in text or "\\boxed" in text or "\\[" in text or "\\(" in text else f"${text}$"

    def verdict(self, case: GraderCase) -> bool:
        try:
            gold = self.parse(self._wrap(case.gold))
            pred = self.parse(case.pred if case.whole_response else self._wrap(case.pred))
            return bool(self.verify(gold, pred))
        except Exception:  # noqa: BLE001 - a reference grader's crash is a wrong verdict, not a bench failure
            return False


def run_cases(
    verdict: Callable[[GraderCase], bool], cases: list[GraderCase], before: Callable[[], None], repeats: int
):
    """Right/wrong per case (first run), each case's first time (what a caller on this loaded machine
    waits) and its best time over `repeats` runs (the grader's own cost)."""
    results, seconds, first = [], [], []
    for case in cases:
        best = float("inf")
        for attempt in range(repeats):
            before()
            start = time.perf_counter()
            ok = verdict(case)
            took = time.perf_counter() - start
            best = min(best, took)
            if attempt == 0:
                results.append(ok == case.expected)
                first.append(took)
        seconds.append(best)
    return results, seconds, first


def family_table(cases: list[GraderCase], columns: dict[str, list[bool]]) -> list[str]:
    by_family: dict[str, list[int]] = defaultdict(list)
    for i, case in enumerate(cases):
        by_family[case.family].append(i)
    names = list(columns)
    lines = [f"{'family':<16} {'n':>4} " + " ".join(f"{n:>16}" for n in names)]

    def pct(idx: list[int], name: str) -> str:
        right = sum(columns[name][i] for i in idx)
        return f"{100 * right / len(idx):6.1f}% ({right:>3}/{len(idx):<3})" if idx else "-"

    for family, idx in sorted(by_family.items()):
        lines.append(f"{family:<16} {len(idx):>4} " + " ".join(f"{pct(idx, n):>16}" for n in names))
    every = list(range(len(cases)))
    same = [i for i in every if cases[i].expected]
    different = [i for i in every if not cases[i].expected]
    for label, idx in (("ALL", every), ("equivalent", same), ("non-equivalent", different)):
        lines.append(f"{label:<16} {len(idx):>4} " + " ".join(f"{pct(idx, n):>16}" for n in names))
    return lines


def run_adversarial(grader: ProjectGrader, n_chars: int, repeats: int = 1) -> dict[str, float]:
    """Wall seconds per adversarial input (as the response to grade, then as the gold), at n_chars and just
    under the response cut; then a batch of 16, and a judge pair with a 28k-character answer."""
    out: dict[str, float] = {}
    for size in sorted({n_chars, min(n_chars, JUST_UNDER_CUT)}):
        for name, text in adversarial_inputs(size).items():
            best = float("inf")
            for _ in range(repeats):
                grader.clear_cache()
                start = time.perf_counter()
                grader.module.grade(text, "1")
                grader.module.is_equiv("1", text)
                best = min(best, time.perf_counter() - start)
            out[f"grade+gold:{name}@{size}"] = best
    texts = adversarial_inputs(n_chars)
    batch = list(texts.values())[:16]
    grader.clear_cache()
    start = time.perf_counter()
    grader.module.grade_batch(batch, ["1"] * len(batch))
    out["grade_batch(16 inputs)"] = time.perf_counter() - start
    long_answer = "{" * 14_000 + "1" + "}" * 14_000  # what extract_answer returns for a 28k-character box
    grader.clear_cache()
    start = time.perf_counter()
    grader.module.equivalent_answers([(long_answer, "1"), ("1", long_answer)])
    out["judge pair (28k answer)"] = time.perf_counter() - start
    return out


def _print_accuracy(cases: list, columns: dict[str, list[bool]], n_tuned: int) -> None:
    """Right verdicts per family, for the tuned cases and then the held-out ones, with math-verify's
    agreement where it ran."""
    for title, part in (("", slice(0, n_tuned)), ("held-out ", slice(n_tuned, len(cases)))):
        part_cases = cases[part]
        part_columns = {name: col[part] for name, col in columns.items()}
        print(f"\nAccuracy per {title}family (right verdicts / cases)")
        print("\n".join(family_table(part_cases, part_columns)))
        if "math-verify" in part_columns:
            agree = sum(
                (a == c.expected) == (b == c.expected)
                for a, b, c in zip(part_columns["grader"], part_columns["math-verify"], part_cases)
            )
            print(f"verdicts agreeing with math-verify: {agree}/{len(part_cases)}")


def _batch_seconds(grader: ProjectGrader, cases: list, repeats: int) -> float:
    """Best wall seconds of one grade_batch over every case (as whole responses), fresh cache each time."""
    grader.clear_cache()
    responses = [c.pred if c.whole_response else f"The answer is $\\boxed{{{c.pred}}}$." for c in cases]
    batch_s = float("inf")
    for _ in range(repeats):
        grader.clear_cache()
        start = time.perf_counter()
        grader.module.grade_batch(responses, [c.gold for c in cases])
        batch_s = min(batch_s, time.perf_counter() - start)
    return batch_s


def _print_adversarial(adversarial: dict[str, float], n_chars: int, repeats: int) -> None:
    """The slowest dozen adversarial inputs and the slowest single one."""
    print(f"\nAdversarial inputs ({n_chars} and {JUST_UNDER_CUT} characters): seconds, best of {repeats}")
    for name, secs in sorted(adversarial.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {name:<44} {secs:8.3f}")
    print(f"  ... {len(adversarial) - 12} more below these")
    print(f"  max single input: {max(v for k, v in adversarial.items() if k.startswith('grade+gold')):.3f} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grader-dir", help="directory holding the math_grader package to measure")
    parser.add_argument("--no-math-verify", action="store_true", help="skip the math-verify column")
    parser.add_argument("--adversarial-chars", type=int, default=ADVERSARIAL_CHARS)
    parser.add_argument("--repeats", type=int, default=3, help="time each case this often, keep the best")
    parser.add_argument("--json", help="also write every figure to this JSON file")
    args = parser.parse_args(argv)

    tuned, heldout = load_cases(), load_cases(HELDOUT_DIR)
    cases = tuned + heldout
    grader = ProjectGrader(args.grader_dir)
    print(f"grader: {Path(grader.module.__file__).parent}   cases: {len(tuned)} + {len(heldout)} held out")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"machine: {os.cpu_count()} cores, load average {load} (other work shares them)")
    reference = None
    if not args.no_math_verify:
        try:
            reference = MathVerifyGrader()
        except ImportError:
            print("math-verify is not installed (pip install -e '.[bench]'): its column is skipped")
    timings: dict[str, list[float]] = {}
    columns: dict[str, list[bool]] = {}
    # first sightings of every case (held out included) with no call before them that started anything
    columns["grader"], timings["grader"], timings["grader (first run)"] = run_cases(
        grader.verdict, cases, grader.clear_cache, args.repeats
    )
    if reference is not None:
        # it memoises parses: time its first run only
        columns["math-verify"], timings["math-verify"], _ = run_cases(
            reference.verdict, cases, lambda: None, 1
        )
    _print_accuracy(cases, columns, len(tuned))

    print(f"\nSpeed per case (one case at a time, fresh cache; best of {args.repeats}, and the first run)")
    print(f"{'':<20} {'answers/s':>10} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
    for name, secs in timings.items():
        print(_timing_row(name, secs))
    batch_s = _batch_seconds(grader, cases, args.repeats)
    print(f"grade_batch over all {len(cases)} cases: {len(cases) / batch_s:.0f} answers/s")

    adversarial = run_adversarial(grader, args.adversarial_chars, args.repeats)
    _print_adversarial(adversarial, args.adversarial_chars, args.repeats)

    if args.json:
        figures = {
            "cases": [c.id for c in cases],
            "right": columns,
            "seconds": timings,
            "batch_answers_per_s": len(cases) / batch_s,
            "adversarial_s": adversarial,
        }
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()

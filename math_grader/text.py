"""String side of the math grader: answer extraction and normalisation (Qwen2.5-Math conventions).

Pure string work with regexes only, so it is cheap enough to run in the trainer process for every
response; all sympy work happens elsewhere.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from fractions import Fraction
from functools import partial

from math_grader import forms
from math_grader.forms import plain_number, unify_spaces

# ---------------------------------------------------------------------------------------------------
# extraction
# ---------------------------------------------------------------------------------------------------
_BOX_RE = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])")
_SPAN_OPEN_RE = re.compile(r"\$\$?|\\[(\[]")
_SPAN_CLOSE = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}


def math_spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, content) of every $$..$$, $..$, \\(..\\), \\[..\\] span, left to right, in linear time.

    A delimiter whose closer no longer occurs is skipped from then on, so unclosed openers cost one
    search each kind, not one each.
    """
    spans: list[tuple[int, int, str]] = []
    unclosed: set[str] = set()
    pos = 0
    while True:
        m = _SPAN_OPEN_RE.search(text, pos)
        if m is None:
            return spans
        opener = m.group()
        for kind in (opener, "$") if opener == "$$" else (opener,):
            if kind in unclosed:
                continue
            start = m.start() + len(kind)
            close = text.find(_SPAN_CLOSE[kind], start + 1)
            if close >= 0:
                spans.append((m.start(), close + len(kind), text[start:close]))
                pos = close + len(kind)
                break
            unclosed.add(kind)
        else:
            pos = m.end()


def match_brace(text: str, start: int) -> int:
    """Index of the '}' closing the '{' at `start`, or -1 when unbalanced."""
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


MAX_BOXES = 16  # only the last few boxes matter; bounds the brace matching on adversarial text
MAX_RESPONSE_CHARS = 30_000  # answers sit at the end; bounds regex work on huge responses


def _boxed_spans(text: str, open_end: bool = False) -> list[tuple[int, int, str]]:
    """(start, end, content) of every \\boxed{...}/\\fbox{...}, also the brace-less '\\boxed 5'.

    open_end: the text was cut on the right inside an answer window, so a last box still open at the cut
    is an answer too long to hold (its content so far stands for it, compared as a string only)."""
    spans = []
    boxes = list(_BOX_RE.finditer(text))[-MAX_BOXES:]
    for k, m in enumerate(boxes):
        rest = text[m.end() :]
        stripped = rest.lstrip()
        if stripped.startswith("{"):
            start = m.end() + len(rest) - len(stripped)
            end = match_brace(text, start)
            if end >= 0:
                spans.append((m.start(), end + 1, text[start + 1 : end].strip()))
            elif open_end and k == len(boxes) - 1:
                spans.append((m.start(), len(text), text[start + 1 :].strip()))
            continue
        value = re.split(r"[$\n]", stripped, maxsplit=1)[0].strip()
        if value:
            spans.append((m.start(), m.end() + len(rest) - len(stripped) + len(value), value))
    return spans


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} / \\fbox{...} (brace-matched), also the brace-less "\\boxed 5"."""
    spans = _boxed_spans(text)
    return spans[-1][2] if spans else None


# what may stand between boxes that list one answer: '\\boxed{2} and \\boxed{3}', '$x=\\boxed{2}$, $y=\\boxed{5}$',
# '\\boxed{3} \\quad\\text{and}\\quad \\boxed{4}', '\\(\\boxed{1}\\) and \\(\\boxed{-2}\\)' (any run of connectors and
# math delimiters, then an optional 'y =')
_JOINER_RE = re.compile(
    r"[\s$,;]*(?:(?:and|or|\\text\{\s*(?:and|or|,)?\s*\}|\\q?quad(?![a-zA-Z])|\\[,;: ()\[\]]|~|&)[\s$,;]*)*"
    r"(?:[a-zA-Z](?:_\{?\w+\}?)?\s*=\s*)?"
)
MAX_JOINER_CHARS = 200


def _box_groups(spans: list[tuple[int, int, str]], text: str) -> list[tuple[int, int, str]]:
    """Boxes joined only by connectors become one listed answer: (start, end, 'a, b')."""
    groups: list[list[tuple[int, int, str]]] = []
    for span in spans:
        if groups:
            prev = groups[-1][-1]
            gap = text[prev[1] : span[0]]
            # side by side ('\\boxed{1}\\boxed{2}'), the last box wins (tests/grader_cases/boxed.txt)
            connector = re.sub(r"[\s$]|\\[()\[\]]", "", gap[:MAX_JOINER_CHARS])
            joined = len(gap) <= MAX_JOINER_CHARS and connector and _JOINER_RE.fullmatch(gap)
            if prev[1] <= span[0] and joined:
                groups[-1].append(span)
                continue
        groups.append([span])
    return [(g[0][0], g[-1][1], ", ".join(c for _, _, c in g)) for g in groups]


def final_boxed(text: str) -> str | None:
    """Last boxed answer; '\\boxed{2} and \\boxed{3}' (only connectors between) becomes '2, 3'."""
    groups = _box_groups(_boxed_spans(text), text)
    return groups[-1][2] if groups else None


# "the answer is", "Answer:" and their translations; the answer follows the last one in the response.
# Possessive quantifiers (\s*+) keep the scan linear on long runs of spaces after a phrase word.
_ANSWER_PHRASE_RE = re.compile(
    r"(?<![A-Za-z])(?:(?:the\s++)?(?:final\s++|correct\s++)?answer\s++is"
    r"|(?:final\s++)?answer\s*+\**+\s*+[:：]"
    r"|(?:最终|最后的)?答案\s*+(?:是|为|為|应为|應為)?\s*+[:：]?"
    r"|答え\s*+(?:は|[:：])|(?:정답|답)\s*+(?:은|는|[:：])"
    r"|la\s++respuesta\s++(?:correcta\s++|final\s++)?es|respuesta(?:\s++final)?\s*+[:：]"
    r"|la\s++r[ée]ponse\s++(?:correcte\s++|finale\s++)?est|r[ée]ponse(?:\s++finale)?\s*+[:：]"
    r"|die\s++(?:richtige\s++)?antwort\s++(?:ist|lautet)|antwort\s*+[:：]"
    r"|a\s++resposta\s++(?:correta\s++|final\s++)?[ée]|resposta\s*+[:：]"
    r"|la\s++risposta\s++(?:corretta\s++|finale\s++)?[èe]|risposta\s*+[:：]"
    r"|ответ\s*+(?:[:：—-]|равен|будет)"
    r"|jawaban(?:nya)?\s++(?:adalah|ialah)|jawaban(?:nya)?\s*+[:：]|(?:cevap|yan[ıi]t)\s*+[:：])",
    re.IGNORECASE,
)

# the words every answer phrase contains: found with str.rfind (C speed) so that the phrase regex, which
# tries every position, only runs around them
_PHRASE_KEYS = (
    "answer",
    "答案",
    "答え",
    "정답",
    "답",
    "respuesta",
    "réponse",
    "reponse",
    "antwort",
    "resposta",
)
_PHRASE_KEYS += ("risposta", "ответ", "jawaban", "cevap", "yanıt", "yanit")
MAX_PHRASE_KEYS = 16  # only the last few mentions of an answer word are read (bounded on any input)


def answer_phrases(text: str, limit: int = MAX_PHRASE_KEYS) -> list[re.Match[str]]:
    """The answer phrases ('the answer is', 'Answer:', '答案是', ...) among the last `limit` mentions of an
    answer word, in text order."""
    low = text.lower()
    if len(low) != len(text):  # a character whose lower case is longer: search the text as it is
        low = text
    keys: list[int] = []
    for key in _PHRASE_KEYS:
        pos = len(low)
        for _ in range(limit):
            pos = low.rfind(key, 0, pos)
            if pos < 0:
                break
            keys.append(pos)
    found: dict[int, re.Match[str]] = {}
    for pos in sorted(keys)[-limit:]:
        for m in _ANSWER_PHRASE_RE.finditer(text, max(0, pos - 40), min(len(text), pos + 60)):
            if m.start() <= pos < m.end():
                found[m.start()] = m
    return [found[k] for k in sorted(found)]


# a ';' ends the sentence unless a list item follows ('1; 2; 3')
_SENTENCE_END_RE = re.compile(r"(?<!\\)\.(?=\s|$)|[。！？；，、]|[!?](?=\s|$)|;(?=\s*$|\s+[^\d\s\-+(\[{\\$])")
# unicode that may appear inside an answer; any other non-ASCII character ends it ('15입니다' -> '15')
_MATH_UNICODE = "π√×·−≤≥≠∞°½¼¾⅓⅔⅛⅜⅝⅞％’\u00a0\u2009\u202f∪∩∈⟨⟩∅ℝ"


def _cut_sentence(text: str) -> str:
    """'5. I hope it is correct.' -> '5', '5，而不是 6。' -> '5': keep the answer, not the chatter after it."""
    text = text.strip().split("\n", 1)[0]
    m = _SENTENCE_END_RE.search(text)
    text = text[: m.start()] if m else text
    for i, c in enumerate(text):
        if ord(c) > 127 and c not in _MATH_UNICODE:
            text = text[:i]
            break
    return text.strip()


def _strip_math_delims(text: str) -> str:
    text = text.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if text.startswith(left) and text.endswith(right) and len(text) >= len(left) + len(right):
            return text[len(left) : len(text) - len(right)].strip()
    return text


_CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uff01-\uff5e]")


_PROSE_WORD_RE = re.compile(r"(?:(?<=^)|(?<=[\s(\"'“*]))[^\W\d_]{2,}(?=$|[\s,;:!?)\"'”*]|\.(?:\s|$))")


def _prose_words(text: str) -> list[str]:
    """Words of two or more letters outside math spans and LaTeX commands."""
    outside = text
    for start, end, _ in reversed(math_spans(text)):
        outside = outside[:start] + " " + outside[end:]
    body = re.sub(r"\\(?:begin|end)\{[^{}]*\}|\\[a-zA-Z]+", " ", outside)
    # a word stands between spaces or punctuation: 'np.arcsin(10/13)' and '{dM}' hold none
    return _PROSE_WORD_RE.findall(body)


def _looks_bare(text: str) -> bool:
    """True when the whole text is an answer ('$\\frac{1}{3}$', 'x = 5', 'Evelyn'), not prose."""
    if len(text) > 120 or "\n" in text.strip() or _BOX_RE.search(text) or _CJK_RE.search(text):
        return False
    if forms.label_value(text):
        return True  # '|AB| = 1', 'V_{1}:V_{2}=11:21': a labelled answer, not its last number
    body = re.sub(r"\\(?:text|mathrm|textbf)\{[^{}]*\}|\\[a-zA-Z]+", " ", text)
    words = re.findall(r"[A-Za-z]{2,}", body)
    return len(words) == 0 or (len(words) == 1 and text.strip() == words[0])


# A number of its own: never digits inside a word or identifier ('QX7RT', 'B12', 'x3y', 'pytest-0') nor a
# reference label ('equation (2)'; Math-Verify anchors
# numbers the same way); a unit or ordinal glued to it ('20kg', '3rd') is allowed and dropped.
_NUMBER_TOKEN_RE = re.compile(
    r"(?<![A-Za-z0-9_.\\^'])(?<![A-Za-z_]-)(?<![A-Za-z]\s\()(-?(?:\d{1,3}(?:[ \u00a0\u202f]\d{3})+(?!\d|[.,]\d)|\d+(?:[.,]\d+)*|\.\d+)(?:/\d+)?%?)"
    r"(?:(?:cm|mm|km|kg|mg|ml|m|g|s|h|min|mph|st|nd|rd|th|pm|am)(?![A-Za-z0-9_]))?(?![A-Za-z0-9_])"
)
_EQUALS_SPLIT_RE = re.compile(r"(?<![<>!\\])=|\\approx|\\Rightarrow|\\implies|\\to(?![a-zA-Z])")


def _number_text(match: re.Match[str]) -> str:
    """A number token as an answer: '1,234,567' -> '1234567' (commas grouping thousands)."""
    token = re.sub(r"(?<=\d)[ \u00a0\u202f](?=\d{3})", "", match.group(1))
    return token.replace(",", "") if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?%?", token) else token


def _after_last_equals(content: str) -> str:
    """'\\binom{5}{2} = 10' -> '10': what a chain of equalities ends in."""
    return _EQUALS_SPLIT_RE.split(content)[-1].strip()


_SPAN_JOIN_RE = re.compile(r"\s*(?:,\s*(?:and|or)?|and|or)\s*")


def _joined_spans(text: str, spans: list[tuple[int, int, str]], forward: bool = False) -> str:
    """The last span's value, with the spans before it joined by ',' / 'and' / 'or' ('$x = 2$ and $x = -3$'
    is '2, -3': Math-Verify reads such a run as one listed answer)."""

    def lhs(content: str) -> str:
        parts = _EQUALS_SPLIT_RE.split(content)
        return re.sub(r"\s", "", parts[0]) if len(parts) > 1 else ""

    if forward:  # from the first span on, as far as the spans are joined; named values keep their names
        n = 1
        while n < len(spans) and _SPAN_JOIN_RE.fullmatch(text[spans[n - 1][1] : spans[n][0]]):
            n += 1
        if len({lhs(c) for _, _, c in spans[:n]}) > 1:
            return ", ".join(c.strip() for _, _, c in spans[:n])  # '$x = 2$ and $y = 3$'
        spans = spans[:n]
    k, values = len(spans) - 1, [_after_last_equals(spans[-1][2])]
    while (
        k > 0
        and len(values) < MAX_BOXES
        and lhs(spans[k - 1][2])
        == lhs(spans[k][2])  # '$x = 2$ and $x = -3$', not '$\\det A = 5$ and $A^{-1} = ..$'
        and _SPAN_JOIN_RE.fullmatch(text[spans[k - 1][1] : spans[k][0]])
    ):
        k -= 1
        values.insert(0, _after_last_equals(spans[k][2]))
    return ", ".join(v for v in values if v)


# a number with math attached outside $...$: '36π', '12\\sqrt{3}', '5√2', '\\frac{3}{4}\\pi', '2^{10}'
_ATTACHED = (
    r"π|\\pi(?![a-zA-Z])|√\s*\d+|\\sqrt\s*(?:\[[^\]]{1,10}\])?\s*(?:\{[^{}]{1,40}\}|\d)"
    r"|\\[dt]?frac\s*\{[^{}]{1,40}\}\s*\{[^{}]{1,40}\}|\^\s*(?:\{[^{}]{1,20}\}|\d+)"
)
_BARE_MATH_RE = re.compile(
    rf"(?<![A-Za-z0-9_.])-?(?:\d+(?:\.\d+)?\s*)?(?:{_ATTACHED})(?:\s*(?:{_ATTACHED}))*"
)


def final_expression(text: str) -> str | None:
    """The last expression of a sentence or a solution: the last number of its own, or, when that number
    sits in the last $...$ span (or there is no number at all), that span after its last '='."""
    spans = math_spans(text)
    numbers = list(_NUMBER_TOKEN_RE.finditer(text))
    if numbers:
        last = numbers[-1]
        if spans and spans[-1][0] <= last.start() and last.end() <= spans[-1][1]:
            return _joined_spans(text, spans) or _number_text(last)
        if re.search(r"π|√|\\[a-z]|\^", text):
            runs = deque(_BARE_MATH_RE.finditer(text, max(0, last.start() - 60)), maxlen=1)
            if runs and runs[0].start() <= last.start() < runs[0].end() and runs[0].end() >= last.end():
                return runs[0].group().strip()  # '12\\sqrt{3}', not its last digit
        return _number_text(last)
    if spans:
        return _after_last_equals(spans[-1][2]) or None
    return None


_ARITHMETIC_CHAIN_RE = re.compile(r"[\d\s.+\-*/×÷()^{}\\]|\\(?:times|cdot|div|frac|left|right)")


def reduce_arithmetic_chain(value: str) -> str:
    """'3 + 4 = 7' -> '7': an equation whose left side is only arithmetic states its result."""
    parts = _EQUALS_SPLIT_RE.split(value)
    if len(parts) < 2 or not parts[-1].strip():
        return value
    lhs, result = parts[0], parts[-1]
    arithmetic = not _ARITHMETIC_CHAIN_RE.sub("", lhs).strip() and re.search(
        r"\d\s*(?:[-+*/×÷]|\\times|\\cdot|\\div)", lhs
    )
    if arithmetic and not re.search(r"[A-Za-z]", re.sub(r"\\[a-zA-Z]+", "", result)):
        return result.strip()
    return value


# the answer comes after the phrase: adverbs before it are dropped, and a phrase followed by a verdict
# ('the answer is correct', 'the answer is not 5') states no answer, so an earlier answer stands
_ADVERB_RE = re.compile(
    r"(?:therefore|thus|hence|clearly|simply|then|indeed|just|exactly|definitely|finally|so|about|approximately"
    r"|roughly|around|nearly|\\approx|≈)\s*,?\s+",
    re.I,
)
_NOT_AN_ANSWER_RE = re.compile(
    r"(?:not|correct|incorrect|right|wrong|verified|confirmed|consistent|valid|invalid|reasonable|plausible"
    r"|above|below|as\s+(?:above|before|shown|expected|computed|found|stated)|the\s+same|unchanged|given|shown|boxed|in\s+the\s+box|clear|obvious|wrong)(?![\w])",
    re.I,
)
_REASON_RE = re.compile(
    r",?\s+(?:because|since|which|where|given\s+that|so\s+that|as\s+(?:shown|computed)|not|rather\s+than"
    r"|instead\s+of)\b|\s+\((?:not|since|because)\b"
)


def _phrase_value(text: str, end: int) -> str | None:
    """The answer stated after an answer phrase ending at `end`, or None."""
    rest = text[end : end + 2000].lstrip(" \t:：*")
    rest = _ADVERB_RE.sub("", rest, count=1) if _ADVERB_RE.match(rest) else rest
    if not rest or _NOT_AN_ANSWER_RE.match(rest):
        return None
    m = re.match(r"\$\$([^$]+)\$\$|\$([^$]+)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", rest, re.DOTALL)
    if m and not rest[m.end() :].lstrip().startswith(("$", "\\")):
        value = next(g for g in m.groups() if g is not None).strip()
        value = re.sub(r"\s*\\(?:text|mathrm)\{\s*[a-z ]*\}\s*$", "", value) if "=" not in value else value
        spans = math_spans(_cut_sentence(rest))
        if len(spans) > 1 and spans[0][0] == 0:  # '$\\frac12$ or $\\frac13$': one listed answer
            value = _joined_spans(rest, spans, forward=True) or value
    else:
        value = _cut_sentence(rest)
        reason = _REASON_RE.search(value)
        if reason and reason.start() > 0:
            value = value[: reason.start()]
        if _CJK_RE.search(value) or len(_prose_words(value)) >= 2:
            value = final_expression(value) or value  # 'The smallest $k$ is 12.' -> '12'
    value = re.sub(r"^\*+|\*\*$", "", value.strip()).strip()  # markdown bold, not a starred 'B*'
    value = _strip_math_delims(value).rstrip(".,;:").strip()
    letter = re.fullmatch(r"\(([A-E])\)", value)
    return (letter.group(1) if letter else value) or None


# a choice said in prose (lighteval / Math-Verify look for the letter just after "answer"): "which makes the
# answer D", "option (A) is correct", "the correct choice is C", "I choose B"
_LETTER = r"(?:\*\*)?(?:\\text(?:bf)?\{)?\(?([A-E])\)?\}?(?:\*\*)?(?![A-Za-z0-9'*^′_])"
_CHOICE_PROSE_RE = re.compile(
    r"(?<![A-Za-z])(?:(?i:answer)(?:\s+(?i:is|would\s+be|must\s+be|should\s+be|will\s+be))?\s*[:=]?"
    r"|(?i:(?:correct|right|best)\s+(?:option|choice)\s+is))"
    rf"\s*(?:(?i:therefore|thus|hence|clearly)\s+)?{_LETTER}(?!\s*[=+\-*/^<>])"
    # a verb of choosing counts only when the letter ends the sentence ("choose D to be the foot" does not)
    rf"|(?<![A-Za-z])(?i:choose|select|pick|go\s+with|opt\s+for)(?:\s+(?i:option|choice))?\s*{_LETTER}"
    r"(?=\s*(?:[.!]|$))"
    rf"|(?<![A-Za-z])(?i:option|choice)\s+{_LETTER}\s+(?i:is|was)\s+(?i:correct|right|the\s+answer)"
    # a conclusion that is only a letter ("..., so B.", "Hence (D).") or a sentence that is only a letter
    # ("B。不是 A": the letter, then a full stop; never "A. 3" listing an option)
    rf"|(?<![A-Za-z])(?i:so|hence|therefore|thus)\s*+,?\s*+{_LETTER}(?=\s*+(?:[.!。！]|$))"
    rf"|(?:^|(?<=[.!?。！？\n]))[ \t]*+{_LETTER}[ \t]*+(?=[。！]|[.!]?[ \t]*+(?:\n|$))"
)
# a letter ruled out: 'not A', 'rather than A', 'instead of (A)', '不是 A', 'A is wrong', '(A) cannot hold'
_NEGATED_BEFORE_RE = re.compile(
    r"(?:\bnot|n't|\bnever|\brather\s+than|\binstead\s+of|\bexcept|\brule[sd]?\s+out|\beliminat\w*"
    r"|不是|并非|而非|排除)\s*(?:[A-Za-z]+\s+)?(?:\*\*)?\(?$",
    re.IGNORECASE,
)
_NEGATED_AFTER_RE = re.compile(
    r"\)?(?:\*\*)?\s*(?:(?:is|are|was|would\s+be|seems)\s+(?:not\b|wrong|incorrect|false|impossible|invalid"
    r"|ruled\s+out|excluded)|cannot|can't|fails|does\s+not|doesn't|不对|错)",
    re.IGNORECASE,
)


def negated_letter(text: str, start: int, end: int) -> bool:
    """Whether the choice letter at text[start:end] is ruled out by the words around it."""
    return bool(
        _NEGATED_BEFORE_RE.search(text[max(0, start - 30) : start])
        or _NEGATED_AFTER_RE.match(text, end, min(len(text), end + 40))
    )


_HOPE = "final answer is $"
MAX_CANDIDATES = 8  # per kind of answer marker: only the last few can be the final answer
MARKER_CONTEXT_CHARS = 2000  # text kept before the last answer marker (joined boxes, "x =")
MAX_SCAN_CHARS = 1_000_000  # a longer response is read from its last million characters


def _inside(pos: int, spans: list[tuple[int, int, str]]) -> bool:
    return any(start < pos < end for start, end, _ in spans)


def _candidates(text: str, open_end: bool) -> list[tuple[int, int, Callable[[], str | None]]]:
    """(position, rank, value) of each answer marker: boxes (joined), "final answer is $..$. I hope",
    <answer> tags, '####', answer phrases in several languages, a choice said in prose. Markers inside a
    box belong to the box."""
    out: list[tuple[int, int, Callable[[], str | None]]] = []
    box_spans = _boxed_spans(text, open_end) if _BOX_RE.search(text) else []
    for start, _, content in _box_groups(box_spans, text)[-MAX_CANDIDATES:]:
        out.append((start, 0, lambda c=content: c or None))
    pos = len(text)
    for _ in range(MAX_CANDIDATES):
        pos = text.rfind(_HOPE, 0, pos)
        if pos < 0:
            break
        stop = text.find("$. I hope", pos + len(_HOPE), pos + len(_HOPE) + 2000)
        if stop >= 0:
            value = text[pos + len(_HOPE) : stop].strip()
            out.append((pos, 1, lambda v=value: v or None))
    tag_end = text.rfind("</answer>")
    if tag_end >= 0:
        tag_start = text.rfind("<answer>", 0, tag_end)
        if tag_start >= 0:
            value = text[tag_start + len("<answer>") : tag_end].strip()
            out.append((tag_start, 2, lambda v=value: _strip_math_delims(v) or None))
    hashes = text.rfind("####")
    if hashes >= 0:
        line = text[hashes + 4 :].lstrip("# ").split("\n", 1)[0].strip()
        out.append((hashes, 3, lambda v=line: _strip_math_delims(v) or None))
    phrases = answer_phrases(text)[-MAX_CANDIDATES:]
    for m in phrases:
        out.append((m.start(), 4, partial(_phrase_value, text, m.end())))
    choices: deque[re.Match[str]] = deque(maxlen=MAX_CANDIDATES)
    choices.extend(_CHOICE_PROSE_RE.finditer(text, max(0, len(text) - 4000)))
    for m in choices:  # a letter right after an answer phrase is that phrase's value ('(B) 12'), not another
        k = next(i for i in range(1, len(m.groups()) + 1) if m.group(i))
        if negated_letter(text, m.start(k), m.end(k)):
            continue
        if not any(p.start() <= m.start() <= p.end() for p in phrases):
            out.append((m.start(), 5, partial(str, m.group(k))))
    return [c for c in out if c[1] == 0 or not _inside(c[0], box_spans)]


def has_answer_marker(text: str) -> bool:
    """Whether the text marks an answer: a box, an answer tag, '####' or an answer phrase."""
    return bool(_BOX_RE.search(text) or "</answer>" in text or "####" in text or answer_phrases(text, 4))


def is_solution(text: str) -> bool:
    """Whether a text is a solution to read an answer from rather than an answer: it marks an answer, or
    it is prose (two or more words outside math and LaTeX commands, one beside a $...$ span, or CJK
    text). 'B Paris', 'Evelyn', '5 \\text{ cm}', a matrix over several lines are answers."""
    head, tail = text[:MAX_RESPONSE_CHARS], text[-MAX_RESPONSE_CHARS:]
    if has_answer_marker(head) or has_answer_marker(tail):
        return True
    words = _prose_words(head[:2000])
    # one word beside a $...$ span ('Thus $v = 3$.') or labelling what follows ('Total: 1 234 567.')
    sentence = len(words) == 1 and (
        bool(math_spans(head[:2000])) or re.search(r"[^\W\d_]{2,}\s*:", head[:2000])
    )
    return bool(_CJK_RE.search(head[:2000]) or len(words) >= 2 or sentence)


# a response that runs on into a new turn (few-shot prompts: "Problem:", chat templates) ends there once
# it has given an answer: Qwen2.5-Math's parser cuts at "Problem:", lm-eval stops generating there
_NEXT_TURN_RE = re.compile(
    r"\n[ \t]*(?:#+[ \t]*)?(?:Problem|Question|Human|User)[ \t]*\d*[ \t]*:|<\|im_start\|>|<\|endoftext\|>"
)


def _cut_next_turn(text: str) -> str:
    for i, m in enumerate(_NEXT_TURN_RE.finditer(text)):
        if i >= 4:
            break
        if has_answer_marker(text[: m.start()]):
            return text[: m.start()]
    return text


def _last_marker_start(text: str) -> int:
    """Where the last answer marker starts (-1: none), in time linear in the text: C-level rfind for
    boxes, tags, '####' and the answer words of the phrases."""
    found = max(text.rfind("\\boxed"), text.rfind("\\fbox"), text.rfind("<answer>"), text.rfind("####"))
    phrases = answer_phrases(text)
    return max(found, phrases[-1].start()) if phrases else found


def answer_window(text: str) -> tuple[str, bool]:
    """The bounded part of a response its final answer is read from, and whether it was cut on the right.

    A response up to MAX_RESPONSE_CHARS is read whole. A longer one is read from its last answer marker
    (box, answer tag, '####', answer phrase; with MARKER_CONTEXT_CHARS before it) for MAX_RESPONSE_CHARS,
    not from a fixed tail: a 100k-character box keeps its box, and text after the answer cannot push the
    answer out of the window. Without a marker, the last MAX_RESPONSE_CHARS."""
    if len(text) <= MAX_RESPONSE_CHARS:
        return text, False
    text = text[-MAX_SCAN_CHARS:]
    last = _last_marker_start(text)
    if last < 0 or last >= len(text) - MAX_RESPONSE_CHARS + MARKER_CONTEXT_CHARS:
        return text[-MAX_RESPONSE_CHARS:], False
    start = max(0, last - MARKER_CONTEXT_CHARS)
    return text[start : start + MAX_RESPONSE_CHARS], True


_MATRIX_ENV = r"(?:[pbBvV]?matrix|smallmatrix|array)"
_WHOLE_MATRIX_RE = re.compile(  # possessive spaces: a window of 30k spaces stays linear
    r"\s*+(?:\$\$?|\\\[|\\\()?\s*+"
    rf"((?:\\left\s*+[(\[])?\s*+\\begin\{{({_MATRIX_ENV})\}}.*?\\end\{{\2\}}\s*+(?:\\right\s*+[)\]])?)"
    r"\s*+(?:\$\$?|\\\]|\\\))?\s*+\.?\s*+",
    re.DOTALL,
)
# a doubled backslash before a command or brace ('\\frac', '\\left(', '\\{'): text escaped twice
_DOUBLED_CMD_RE = re.compile(r"(?<!\\)\\\\(?:[a-zA-Z]{2,}|[{}|,;:!])")
_BACKSLASH_RUN_RE = re.compile(r"\\+")


def undouble_backslashes(text: str) -> str:
    """'\\\\frac{1}{2}' -> '\\frac{1}{2}': a JSON or Python string escaped twice. Only when every backslash
    is doubled (no run of odd length) and one doubled backslash starts a command or a brace: a matrix's row
    break '\\\\' written once is left alone."""
    if "\\\\" not in text or not _DOUBLED_CMD_RE.search(text):
        return text
    if any(len(run) % 2 for run in _BACKSLASH_RUN_RE.findall(text)):
        return text
    return _BACKSLASH_RUN_RE.sub(lambda m: "\\" * (len(m.group()) // 2), text)


# '1,\\!000' and '1{,}000' (MATH's thousands), '12\\!345': the digits of one number
_DIGIT_GLUE_RE = re.compile(r"(?<=\d)(?:(,)\\!|\{(,)\}|\\!)(?=\d)")


def _glue_digits(text: str) -> str:
    return (
        _DIGIT_GLUE_RE.sub(lambda m: m.group(1) or m.group(2) or "", text)
        if "\\!" in text or "{,}" in text
        else text
    )


# answer rules: "last" (default) the last committed answer wins; "qwen" Qwen2.5-Math's order of rules, for
# reproducing its published numbers: "final answer is $..$. I hope" anywhere, else the last box, else the
# other markers (each the last of its kind), whatever comes after them
ANSWER_RULES = ("last", "qwen")
_QWEN_ORDER = {1: 0, 0: 1, 2: 2, 3: 3, 4: 4, 5: 5}  # candidate rank -> Qwen's priority


def extract_answer(text: str, rule: str = "last") -> str | None:
    """The final answer of a model response, or None: the last committed answer wins (rule="last"; see
    ANSWER_RULES for rule="qwen").

    Every answer marker is a candidate (a box or boxes joined by connectors, "final answer is $..$. I
    hope", <answer> tags, '####', an answer phrase in one of several languages, a choice said in prose);
    the one that comes LAST in the text wins, so a later correction replaces an earlier answer whatever
    its form, and a phrase that states no answer ('the answer is correct') leaves the one before it. A
    response that runs on into a new problem ends there. Without a marker: the whole text when it is a
    bare answer, else the final expression (the last number of its own, or the last $...$ span holding
    it). An arithmetic chain '3 + 4 = 7' answers its result. An empty answer ('\\boxed{}') is none.
    """
    if rule not in ANSWER_RULES:
        raise ValueError(f"answer rule {rule!r} is not one of {', '.join(ANSWER_RULES)}")
    if not text:
        return None
    answer = _final_answer(text, rule)
    return answer if answer and (len(answer) > MAX_CANDIDATE_CHECK or normalize_answer(answer)) else None


MAX_CANDIDATE_CHECK = 1000  # a longer answer is compared as a string only: not normalised here either


def _final_answer(text: str, rule: str) -> str | None:
    window, open_end = answer_window(text)
    window = _glue_digits(undouble_backslashes(window))
    window = re.sub(r"(?<!\w)\u043a\u0438(?!\w)", "", window)  # Math-Shepherd step tags
    window = _cut_next_turn(window)
    if rule == "qwen":
        order = sorted(_candidates(window, open_end), key=lambda c: (-_QWEN_ORDER[c[1]], c[0]), reverse=True)
    else:
        order = sorted(_candidates(window, open_end), key=lambda c: (c[0], -c[1]), reverse=True)
    for _, _, value in order:
        answer = value()
        if answer and normalize_answer(answer):  # 'the answer is $\\boxed{}$' states no answer
            return reduce_arithmetic_chain(answer)
    matrix = _WHOLE_MATRIX_RE.fullmatch(window) if "\\end{" in window[-400:] else None
    if matrix:
        return matrix.group(1)  # a response that is only a matrix answers it (not its last number)
    option = forms.choice(window.strip()) if len(window) <= 300 else None
    if option is not None and not _NEGATED_AFTER_RE.match(option.text):
        return window.strip()  # 'Option B: 42' is the choice B (its text 42); '(A) cannot hold' is not A
    if _looks_bare(window):
        return reduce_arithmetic_chain(_strip_math_delims(window)) or None
    last_line = window.strip().rsplit("\n", 1)[-1]
    if _CJK_RE.search(last_line):
        answer = final_expression(last_line)
        if answer:
            return reduce_arithmetic_chain(answer)
    tail = window[-4000:]
    answer = final_expression(tail) if re.search(r"[$\\π√^]", tail) else None
    if answer is None:
        numbers = deque(_NUMBER_TOKEN_RE.finditer(window), maxlen=1)
        answer = _number_text(numbers[0]) if numbers else None
    return reduce_arithmetic_chain(answer) if answer else None


# ---------------------------------------------------------------------------------------------------
# normalisation
# ---------------------------------------------------------------------------------------------------
_UNIT_WORDS = (
    "square units|sq units|units?|square (?:feet|foot|inches|inch|meters|metres|centimeters|miles|yards|units)"
    "|sq\\.? ?(?:ft|in|m|cm|km|units)|cubic (?:feet|inches|meters|centimeters|units|yards)"
    "|degrees?(?: (?:celsius|fahrenheit))?|dollars?|cents?|percent|pct|percentage"
    "|inches|inch|feet|foot|ft|yards?|miles?|mph|km/h|kmh|kilometers?|kilometres?|km|meters?|metres?"
    "|centimeters?|centimetres?|cm|millimeters?|mm|liters?|litres?|ml|gallons?|pounds?|lbs?|ounces?|oz"
    "|kilograms?|kg|grams?|seconds?|secs?|minutes?|mins?|hours?|hrs?|days?|weeks?|months?|years?"
    "|people|persons?|students?|apples?|eggs?|books?|cookies?|pages?|times|ways?|points?|cards?|coins?"
    "|marbles?|boxes|box|balls?|children|kids|men|women|boys|girls|pieces?|items?|trees?|cups?"
    "|rs\\.?|rupees?|yuan|euros?|square|sq|cubic|cm\\^?\\{?[23]\\}?|m\\^?\\{?[23]\\}?|in\\^?\\{?[23]\\}?"
    "|ft\\^?\\{?[23]\\}?|units\\^?\\{?[23]\\}?"
)
_TRAILING_UNIT_RE = re.compile(
    r"(?<=[\d}.)])\s*(?:" + _UNIT_WORDS + r")\.?\s*$|(?<=\d)\s+(?:m|s|h|g|l)\.?\s*$", re.IGNORECASE
)
_WORD_NUMBERS = {
    w: str(i)
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen twenty".split()
    )
}
_TEXT_CMDS = r"text|textbf|textit|textrm|texttt|mathrm|mathbf|mathit|mathsf|mbox|hbox|textnormal|boldsymbol"
_TEXT_CMD_RE = re.compile(r"\\(?:" + _TEXT_CMDS + r")\s*\{([^{}]*)\}")
_TRAILING_TEXT_RE = re.compile(r"\\(?:" + _TEXT_CMDS + r")\s*\{([^{}]*)\}(?:\^\{?[23]\}?)?\s*$")
_SIZE_CMD_RE = re.compile(
    r"\\(?:left|right|bigl|bigr|Bigl|Bigr|biggl|biggr|Biggl|Biggr|big|Big|bigg|Bigg)(?![a-zA-Z])"
)


def has_percent(answer: str) -> bool:
    """Whether the answer is stated in percent (enables the x100 / /100 numeric match)."""
    return bool(re.search(r"%|\\%|percent|\bpct\b", answer, re.IGNORECASE))


def _is_unit_text(content: str) -> bool:
    """A trailing \\text{...} that is a unit/word ('cm', ' square units'), not part of the value."""
    c = content.replace("~", " ")
    if re.fullmatch(r"\s*(?:or|and)\s*", c) or _SCALE_WORD_RE.fullmatch(c.strip()):
        return False
    return bool(re.fullmatch(r"\s*[A-Za-z][A-Za-z .\-/^{}0-9]*", c)) and (
        c.startswith((" ", "~")) or len(c.strip()) > 1 or content.startswith("~")
    )


_MATH_WORDS = {"pi", "sqrt", "sin", "cos", "tan", "log", "ln", "exp", "infty", "infinity", "and", "or", "mod"}
# words that change the number ('3 million', '5 squared', '2 mil' in Spanish), in a few languages
_SCALE_WORD_RE = re.compile(
    r"(?:hundreds?|thousands?|mil|mill(?:ón|ones|ions?|ionen|iards?|iarden?)|milh(?:ão|ões)|milion[ei]"
    r"|billions?|trillions?|dozens?|tausend|squared|cubed|factorial|тысяч[аи]?|миллион(?:а|ов)?|миллиард(?:а|ов)?)",
    re.IGNORECASE,
)


def _drop_trailing_words(s: str) -> str:
    """'12 manzanas' -> '12': words in any language after a plain number are its unit or object."""
    m = re.fullmatch(r"(-?[\d.,]*\d)((?:\s+[^\W\d_]{3,})+)\.?", s)
    if m and not any(w.lower() in _MATH_WORDS or _SCALE_WORD_RE.fullmatch(w) for w in m.group(2).split()):
        return m.group(1)
    return s


def _remove_trailing_units(s: str) -> str:
    s = _drop_trailing_words(s)
    for _ in range(3):
        m = _TRAILING_TEXT_RE.search(s)
        spaced_letter = (
            re.search(r"\d\s$", s[: m.start()]) and re.fullmatch(r"[A-Za-z]", m.group(1)) if m else None
        )
        if m and s[: m.start()].strip() and (_is_unit_text(m.group(1)) or spaced_letter):
            s = s[: m.start()].rstrip()
            continue
        new = _TRAILING_UNIT_RE.sub("", s).rstrip()
        if new == s or not new:
            break
        s = new
    return s


def _fix_fracs(s: str) -> str:
    """\\frac12 -> \\frac{1}{2}, \\frac1b -> \\frac{1}{b}, \\frac{a}b -> \\frac{a}{b}."""
    out = []
    parts = s.split("\\frac")
    out.append(parts[0])
    for part in parts[1:]:
        out.append("\\frac")
        if part.startswith("{"):
            end = match_brace(part, 0)
            if end < 0:
                out.append(part)
                continue
            num, rest = part[: end + 1], part[end + 1 :]
        elif part:
            num, rest = "{" + part[0] + "}", part[1:]
        else:
            out.append(part)
            continue
        if rest and rest[0] not in "{\\":
            rest = "{" + rest[0] + "}" + rest[1:]
        out.append(num + rest)
    return "".join(out)


def _fix_sqrt(s: str) -> str:
    return re.sub(r"\\sqrt(?![a-zA-Z{\[])\s*(\w)", r"\\sqrt{\1}", s)


def _fix_slash(s: str) -> str:
    m = re.fullmatch(r"(-?)(\d+)/(\d+)", s)
    return f"{m.group(1)}\\frac{{{m.group(2)}}}{{{m.group(3)}}}" if m else s


def _fix_mixed_number(s: str) -> str:
    """'2\\frac{1}{2}' or '2 1/2' is the mixed number 5/2 (never 2*1/2 in an answer)."""
    m = re.fullmatch(r"(-?)(\d+)\s*(?:\\frac\s*(?:\{(\d+)\}|(\d))\s*(?:\{(\d+)\}|(\d))|\s(\d+)/(\d+))", s)
    if not m:
        return s
    num = int(m.group(3) or m.group(4) or m.group(7))
    den = int(m.group(5) or m.group(6) or m.group(8))
    if den == 0 or num >= den:
        return s
    value = int(m.group(2)) + Fraction(num, den)
    sign = "-" if m.group(1) else ""
    return f"{sign}\\frac{{{value.numerator}}}{{{value.denominator}}}"


def _strip_var_prefix(s: str) -> str:
    """'x = 3' -> '3', 'k=\\frac12' -> '\\frac12' (a short name on the left of a single '=')."""
    if s.count("=") != 1 or re.search(r"[<>]|\\[lg]e", s):
        return s
    lhs, rhs = s.split("=")
    if re.fullmatch(r"\s*(?:[a-zA-Z](?:_\{?\w+\}?)?|\\[a-zA-Z]+|[a-zA-Z]\([a-z]\))\s*", lhs) and rhs.strip():
        return rhs.strip()
    return s


def _drop_outer_braces(s: str) -> str:
    """'{{5}}' -> '5' in one pass: count the leading '{'s whose partner is among the trailing '}'s."""
    if not s.startswith("{") or "," in s:
        return s
    lead = len(s) - len(s.lstrip("{"))
    partner: dict[int, int] = {}
    stack: list[int] = []
    for i, c in enumerate(s):
        if c == "{":
            stack.append(i)
        elif c == "}" and stack:
            partner[stack.pop()] = i
    layers = 0
    while layers < lead and partner.get(layers) == len(s) - 1 - layers:
        layers += 1
    return s[layers : len(s) - layers].strip() if layers else s


def _repeating_decimal(s: str) -> str:
    """'0.\\overline{3}' -> '\\frac{1}{3}', '0.1\\overline{6}' -> '\\frac{1}{6}'."""
    m = re.fullmatch(r"(-?)(\d*)\.(\d*)\\overline\{(\d{1,12})\}", s)
    if not m:
        return s
    whole, fixed, rep = int(m.group(2) or "0"), m.group(3), m.group(4)
    value = whole + Fraction(int(fixed or "0"), 10 ** len(fixed))
    value += Fraction(int(rep), (10 ** len(rep) - 1) * 10 ** len(fixed))
    return f"{m.group(1)}\\frac{{{value.numerator}}}{{{value.denominator}}}"


_UNICODE_FRACTIONS = {"½": "1/2", "¼": "1/4", "¾": "3/4", "⅓": "1/3", "⅔": "2/3", "⅛": "1/8", "⅜": "3/8"}
_UNICODE_FRACTIONS |= {"⅝": "5/8", "⅞": "7/8", "⅕": "1/5", "⅖": "2/5", "⅗": "3/5", "⅘": "4/5", "⅙": "1/6"}


def _unicode_fractions(s: str) -> str:
    """'2½' -> '2\\frac{1}{2}' (a mixed number), '½' -> '\\frac{1}{2}'."""
    for char, frac in _UNICODE_FRACTIONS.items():
        if char in s:
            num, den = frac.split("/")
            s = re.sub(rf"(?<=\d)\s*{char}", rf" \\frac{{{num}}}{{{den}}}", s)
            s = s.replace(char, f"\\frac{{{num}}}{{{den}}}")
    return s


def _strip_wrappers(s: str) -> str:
    """Markdown bold/italics and quotes around an answer: '**Yes**', '"yes"', '`5`'."""
    for _ in range(3):
        m = re.fullmatch(r"(\*\*|__|\*|`|\"|'|“|‘)(.+?)(\*\*|__|\*|`|\"|'|”|’)", s.strip(), re.DOTALL)
        if not m or {"**": "**", "__": "__", "*": "*", "`": "`", '"': '"', "'": "'", "“": "”", "‘": "’"}[
            m.group(1)
        ] != m.group(3):
            break
        s = m.group(2).strip()
    return s


_ALL_REALS = {
    w: "(-\\infty,\\infty)"
    for w in (
        "all real numbers",
        "all reals",
        "all real values",
        "all real x",
        "real numbers",
        "every real number",
    )
}


def _french_interval(s: str) -> str:
    """French interval brackets: ']0, 1[' -> '(0, 1)', ']-\\infty, 2]' -> '(-\\infty, 2]'."""
    m = re.fullmatch(r"([\]\[])([^\[\](){}]*,[^\[\](){}]*)([\]\[])", s)
    if not m or (m.group(1) == "[" and m.group(3) == "]"):
        return s
    return ("(" if m.group(1) == "]" else "[") + m.group(2) + (")" if m.group(3) == "[" else "]")


def _set_builder(s: str) -> str:
    """'\\{x \\mid -1 < x < 1\\}' -> '-1 < x < 1' (the condition names the set)."""
    m = re.fullmatch(r"\\?\{\s*([a-zA-Z])\s*(?:\\mid|\||:|\\colon)\s*(.+?)\s*\\?\}", s)
    if m and re.search(r"<|>|\\[lg]e|\\ne", m.group(2)):
        return re.sub(rf"\s*,?\s*{m.group(1)}\s*\\in\s*\\mathbb\{{?R\}}?\s*$", "", m.group(2))
    return s


def _unwrap(answer: str) -> str:
    """The answer without math delimiters, wrappers, a whole-answer \\boxed{} and a final full stop."""
    s = unify_spaces(str(answer)).strip().replace("\n", " ")
    s = _strip_wrappers(_strip_math_delims(s))
    boxed = last_boxed(s) if s.startswith(("\\boxed", "\\fbox")) else None
    s = boxed if boxed is not None else s
    s = s.strip().rstrip(".").strip()
    return s


def _canonical_latex(s: str) -> str:
    """One spelling per LaTeX command, bracket, relation and symbol (spacing commands dropped)."""
    s = re.sub(r"(?<!\\)\\,(?=\s*\\(?:text|mathrm|mbox)\b)", " ", s)  # '2.5\\,\\text{L}': space, unit
    s = re.sub(r"(?<!\\)\\[!,]|\{,\}", lambda m: "," if m.group() == "{,}" else "", s)
    s = re.sub(r"(?<!\\)\\[;: ]|~|\\q?quad(?![a-zA-Z])", " ", s)
    s = re.sub(r"\\(?:displaystyle|textstyle|scriptstyle|middle)(?![a-zA-Z])", "", s).replace(
        "\\mathrm{~", "\\mathrm{ "
    )
    s = re.sub(r"\\[lr]vert(?![a-zA-Z])|\\[lr]Vert(?![a-zA-Z])", "|", s)
    s = re.sub(r"\\lbrace(?![a-zA-Z])", "\\{", re.sub(r"\\rbrace(?![a-zA-Z])", "\\}", s))
    s = re.sub(r"\\langle(?![a-zA-Z])|⟨", "(", re.sub(r"\\rangle(?![a-zA-Z])|⟩", ")", s))
    s = _unicode_fractions(s.replace("％", "%").replace("{}^", "^"))
    s = re.sub(r"\\[dtc]frac(?![a-zA-Z])", r"\\frac", s)
    s = _SIZE_CMD_RE.sub("", s)
    s = s.replace("\\{", "{").replace("\\}", "}")
    s = re.sub(
        r"\\begin\{(?:array|bmatrix|Bmatrix|matrix|smallmatrix)\}(?:\{[^{}]*\})?", r"\\begin{pmatrix}", s
    )
    s = re.sub(r"\\end\{(?:array|bmatrix|Bmatrix|matrix|smallmatrix)\}", r"\\end{pmatrix}", s)
    s = s.replace("\\neq", "\\ne").replace("\\leqslant", "\\le").replace("\\geqslant", "\\ge")
    s = s.replace("\\leq", "\\le").replace("\\geq", "\\ge").replace(">=", "\\ge").replace("<=", "\\le")
    s = s.replace("!=", "\\ne").replace("\\lt", "<").replace("\\gt", ">")
    s = (
        s.replace("≤", "\\le")
        .replace("≥", "\\ge")
        .replace("≠", "\\ne")
        .replace("π", "\\pi")
        .replace("∞", "\\infty")
    )
    s = s.replace("−", "-").replace("\\dots", "").replace("\\ldots", "")
    s = s.replace("×", "\\times ").replace("·", "\\cdot ").replace("√", "\\sqrt")
    return s


def _drop_units(s: str) -> str:
    """Without degree signs, currency and percent signs, trailing units and \\text{} wrappers."""
    s = re.sub(
        r"(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°|\\degree|\\circ)"
        r"(?:\s*(?:\\(?:text|mathrm)\s*\{\s*[CF]\s*\}|[CF](?![a-zA-Z])))?",
        "",
        s,
    )
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = re.sub(r"\\(?:euro|pounds|yen)(?![a-zA-Z])|[€£¥₹]", "", s)  # currency signs, as '$' above
    s = _remove_trailing_units(s.strip())
    s = _TEXT_CMD_RE.sub(lambda m: m.group(1), s)
    s = _TEXT_CMD_RE.sub(lambda m: m.group(1), s)
    s = re.sub(r"\\operatorname\{([^{}]*)\}", r"\\\1", s)
    return s


def _words_and_sets(s: str) -> str:
    """Number words, 'or'/'and' lists, sets and intervals, the empty set and infinity in one form."""
    s = re.sub(r"(?:,\s*)?\s(?:or|and)\s+", ",", s)
    s = _WORD_NUMBERS.get(s.strip().lower(), s)
    s = _ALL_REALS.get(s.strip().lower(), s)
    s = _set_builder(_french_interval(s.strip()))
    s = re.sub(r"^\s*[a-zA-Z]\s*\\in\s*", "", s)
    s = re.sub(r"\\(?:varnothing|emptyset|empty)(?![a-zA-Z])", r"\\emptyset", s)
    s = re.sub(r"\\infin(?:ity)?(?![a-zA-Z])|\binfinity\b", r"\\infty", s)
    s = re.sub(r"\+\s*\\infty", r"\\infty", s)
    s = s.replace("\\mathbb{R}", "(-\\infty,\\infty)").replace("\\mathbb R", "(-\\infty,\\infty)")
    s = s.replace("\\dagger", "").replace("\\prime", "'")
    s = re.sub(r"(?<![\d}])\.(?=\d)", "0.", s)
    return s


def _canonical_numbers(s: str, strip_var: bool) -> str:
    """Thousands separators, mixed numbers, fractions, roots, repeating decimals and trailing zeros in
    one form; the spaces go (but between a command and a letter). strip_var=False keeps a leading 'y ='."""
    s = _strip_var_prefix(s) if strip_var else s
    s = re.sub(r"(\\[a-zA-Z]+)\s+(?=[a-zA-Z])", "\\1\x00", s)
    s = plain_number(s) or s  # 1,000 / 1.000.000 / 1 000 / 1'000 -> 1000000
    s = re.sub(r"(?<=\d)\s+(?=\d{3}(?!\d))", "", s)  # and "1 000" inside a longer answer
    s = _fix_mixed_number(s.strip())
    s = re.sub(r"\s+", "", s).replace("\x00", " ")
    s = _repeating_decimal(_fix_sqrt(_fix_fracs(s)))
    s = re.sub(r"(\d)\.0+(?![\d])", r"\1", s)
    s = re.sub(r"(\d\.\d*?[1-9])0+(?![\d])", r"\1", s)
    return s


def normalize_answer(answer: str, strip_var: bool = True) -> str:
    """Canonical string form of an answer, so that trivially different spellings compare equal.

    strip_var=False keeps a leading 'y =' (the structural comparison needs equations intact).
    """
    s = _canonical_numbers(_words_and_sets(_drop_units(_canonical_latex(_unwrap(answer)))), strip_var)
    # a comma after digits with a space next ('12, 345') separated list items before the spaces went:
    # thousands were read above, on the answer as written (plain_number), never here
    s = re.sub(r"(?:\\\\|\\|,|\.|;)+$", "", s)
    s = s.lstrip(":").strip()
    if s.startswith("+") and len(s) > 1 and "," not in s:
        s = s[1:]
    if s in ("{}", "\\{\\}"):
        return "\\emptyset"
    s = _drop_outer_braces(s)
    if ";" in s and "," not in s and not s.startswith(("(", "[")):
        s = s.replace(";", ",")  # '1; 2; 3' is a list
    return _fix_slash(s)

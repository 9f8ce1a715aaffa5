"""JSONL loaders: error messages on malformed input (always run) and the real shared files (needs ../shared)."""

from __future__ import annotations

import json

import pytest

from data_prep.chat_jsonl import load_chat_jsonl
from data_prep.math_jsonl import QWEN_MATH_COT_SYSTEM, SOURCES, load_math_jsonl, main
from data_prep.schema import DatasetError, extra_info_of, read_parquet, validate_row


def _write(tmp_path, lines, name="test.jsonl"):
    path = tmp_path / name
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


GOOD_GSM8K = {"question": "2+2?", "answer": "2+2=4\n#### 1,004", "idx": 0}


def test_gsm8k_conversion(tmp_path):
    path = _write(tmp_path, [GOOD_GSM8K, "", {"question": "q", "answer": "#### 5"}])
    rows = load_math_jsonl(path, "gsm8k")
    assert [r["ground_truth"] for r in rows] == ["1004", "5"]
    assert rows[0]["prompt"] == [
        {"role": "system", "content": QWEN_MATH_COT_SYSTEM},
        {"role": "user", "content": "2+2?"},
    ]
    assert extra_info_of(rows[1]) == {"id": "gsm8k-3", "line": 3, "split": "test"}


@pytest.mark.parametrize(
    ("source", "record", "message"),
    [
        ("gsm8k", "{not json", "invalid JSON"),
        ("gsm8k", "[1, 2]", "expected a JSON object, got list"),
        ("gsm8k", {"answer": "#### 4"}, "field 'question' missing"),
        ("gsm8k", {"question": "q", "answer": "4"}, "field 'answer' has no '#### <final answer>' marker"),
        ("gsm8k", {"question": 3, "answer": "#### 4"}, "field 'question' is int, expected str"),
        ("math500", {"answer": "4"}, "field 'problem' missing"),
        (
            "math500",
            {"problem": "p", "answer": "4", "level": [1]},
            "field 'level' is list, expected int or str",
        ),
        ("aime24", {"answer": "4"}, "field 'problem' missing (expected one of: problem, question)"),
        ("amc23", {"problem": "p", "answer": True}, "field 'answer' is bool"),
        ("amc23", {"problem": "p"}, "field 'answer' missing"),
        ("minerva_math", {"problem": "p", "solution": "no box"}, "field 'solution' has no non-empty \\boxed"),
        ("math500", {"problem": "  ", "answer": "4"}, "field 'problem' is empty"),
    ],
)
def test_malformed_line_names_file_line_and_problem(tmp_path, source, record, message):
    path = _write(
        tmp_path,
        [
            GOOD_GSM8K if source == "gsm8k" else {"problem": "p", "answer": "1", "solution": "\\boxed{1}"},
            record,
        ],
    )
    with pytest.raises(DatasetError) as err:
        load_math_jsonl(path, source)
    assert str(err.value).startswith(f"{path}:2: ")
    assert message in str(err.value)


def test_amc_float_answer_and_minerva_boxed(tmp_path):
    amc = _write(
        tmp_path, [{"id": 1, "problem": "p", "answer": 27.0}, {"problem": "q", "answer": 2.5}], "a.jsonl"
    )
    assert [r["ground_truth"] for r in load_math_jsonl(amc, "amc23")] == ["27", "2.5"]
    sol = "We get \\boxed{2} first, then $x=\\boxed{\\frac{1}{4}}$."
    minerva = _write(tmp_path, [{"problem": "p", "solution": sol, "type": "Physics", "idx": 3}], "m.jsonl")
    (row,) = load_math_jsonl(minerva, "minerva_math")
    assert row["ground_truth"] == "\\frac{1}{4}"
    assert extra_info_of(row)["subject"] == "Physics" and extra_info_of(row)["id"] == 3


def test_missing_file_and_unknown_source(tmp_path):
    with pytest.raises(DatasetError, match="dataset not found: .*nope.jsonl"):
        load_math_jsonl(tmp_path / "nope.jsonl", "gsm8k")
    with pytest.raises(ValueError, match="unknown source"):
        load_math_jsonl(_write(tmp_path, [GOOD_GSM8K]), "gsm9k")


def test_invalid_utf8_line(tmp_path):
    path = tmp_path / "bin.jsonl"
    path.write_bytes(json.dumps(GOOD_GSM8K).encode() + b"\n\xff\xfe\n")
    with pytest.raises(DatasetError, match=rf"^{path}:2: not valid UTF-8"):
        load_math_jsonl(path, "gsm8k")


def test_chat_loader(tmp_path):
    path = _write(
        tmp_path,
        [{"id": "c-1", "prompt": "Tell a story.", "category": "Creativity"}, {"id": "c-2", "prompt": "Hi"}],
    )
    rows = load_chat_jsonl(path, source="novelty_curated")
    assert [r["ground_truth"] for r in rows] == ["", ""]
    assert rows[0]["prompt"] == [{"role": "user", "content": "Tell a story."}]
    assert extra_info_of(rows[0])["category"] == "Creativity" and "category" not in extra_info_of(rows[1])
    bad = _write(tmp_path, [{"id": "c-1", "prompt": "x"}, {"id": "c-2"}], "bad.jsonl")
    with pytest.raises(DatasetError, match=rf"^{bad}:2: field 'prompt' missing"):
        load_chat_jsonl(bad)


def test_cli_reports_error_without_traceback(tmp_path, capsys):
    bad = _write(tmp_path, [GOOD_GSM8K, {"question": "q"}])
    with pytest.raises(SystemExit, match=rf"error: {bad}:2: field 'answer' missing"):
        main(["--input", str(bad), "--source", "gsm8k", "--out", str(tmp_path / "o.parquet")])
    good = _write(tmp_path, [GOOD_GSM8K], "g.jsonl")
    main(["--input", str(good), "--source", "gsm8k", "--out", str(tmp_path / "o.parquet")])
    assert "wrote 1 gsm8k rows" in capsys.readouterr().out
    assert len(read_parquet(tmp_path / "o.parquet")) == 1


# --- the real shared files ------------------------------------------------------------------------------

EXPECTED_ROWS = {"gsm8k": 1319, "math500": 500, "aime24": 30, "amc23": 40, "minerva_math": 272}


@pytest.mark.needs_shared
@pytest.mark.parametrize("source", sorted(EXPECTED_ROWS))
def test_shared_math_files(shared_dir, source, tmp_path):
    rows = load_math_jsonl(shared_dir / "data" / "math" / source / "test.jsonl", source)
    assert len(rows) == EXPECTED_ROWS[source]
    for i, row in enumerate(rows):
        validate_row(row, f"{source} row {i}")
        assert row["data_source"] == source and row["ground_truth"].strip()
    ids = [extra_info_of(r)["id"] for r in rows]
    assert len(set(ids)) == len(ids)
    if source in ("gsm8k", "amc23"):
        assert all(r["ground_truth"].lstrip("-").isdigit() for r in rows)
    if source == "gsm8k":
        assert rows[0]["ground_truth"] == "18"
    if source == "amc23":
        assert rows[0]["ground_truth"] == "27"
    if source == "math500":
        assert {extra_info_of(r)["level"] for r in rows} == {1, 2, 3, 4, 5}
    if source == "minerva_math":
        assert rows[0]["ground_truth"] == "1.6"


@pytest.mark.needs_shared
def test_prompt_matches_shared_qwen_template(shared_dir):
    template = (shared_dir / "data" / "math" / "qwen25-math-cot_prompt.txt").read_text()
    assert f"<|im_start|>system\n{QWEN_MATH_COT_SYSTEM}<|im_end|>" in template
    assert "<|im_start|>user\n{input}<|im_end|>" in template
    assert set(SOURCES) == set(EXPECTED_ROWS)


@pytest.mark.needs_shared
@pytest.mark.parametrize(("name", "count"), [("wildchat-1k.jsonl", 1000), ("curated.jsonl", 100)])
def test_shared_chat_files(shared_dir, name, count):
    rows = load_chat_jsonl(shared_dir / "data" / "novelty-bench" / name)
    assert len(rows) == count
    assert all(r["ground_truth"] == "" and r["prompt"][0]["content"].strip() for r in rows)
    assert len({extra_info_of(r)["id"] for r in rows}) == count

"""Equivalence judges with real models: rouge-score, packaged MiniLM, an HF pair classifier in-process and
the same checkpoint behind a real vLLM /classify server on loopback; calibration and bench commands."""

from __future__ import annotations

import json

import pytest
from hydra.utils import instantiate

from bench import calibrate_judge as calibrate
from bench import diversity_judges as bench
from tests.judge_servers import free_port, vllm_server
from train.diversity.classifier_checkpoint import build_pair_classifier
from train.diversity.judges import (
    EMBEDDING_THRESHOLD,
    AnswerAwareJudge,
    EmbeddingJudge,
    JudgeError,
    PairClassifierJudge,
    RougeJudge,
    VLLMClassifyJudge,
    classify_server_command,
    pair_text,
)
from train.diversity.partition import partition, short_answer_equivalent

LABELLED = calibrate.load_labelled_pairs()
JUDGED = [r for r in LABELLED if short_answer_equivalent(r["a"], r["b"]) is None]


@pytest.fixture(scope="module")
def pair_classifier(tmp_path_factory):
    return build_pair_classifier(tmp_path_factory.mktemp("pair-classifier") / "ckpt")


@pytest.fixture(scope="module")
def embedding_judge():
    return EmbeddingJudge()


def test_pair_text_cuts_each_side_to_half_the_budget():
    # max_length 9 -> (9 - 3) // 2 = 3 words per side
    assert pair_text("a b c d e", "f  g", "[CLS]", "[SEP]", 9) == "[CLS] a b c [SEP] f g [SEP]"


def test_rouge_judge_hand_computed():
    judge = instantiate({"_target_": "train.diversity.judges.RougeJudge"})
    assert judge.threshold == 0.458
    # 3 shared unigrams; precision 3/3, recall 3/6 -> F = 2/3
    pairs = [("the cat sat on the mat", "the cat sat"), ("the cat sat on the mat", "a dog ran")]
    assert judge.probabilities(pairs) == pytest.approx([2 / 3, 0.0])
    assert judge.equivalent(pairs) == [True, False]
    assert RougeJudge(threshold=0.7).equivalent(pairs[:1]) == [False]


def test_answer_aware_judge_separates_changed_numbers_that_text_judges_merge():
    near_copy = (
        "Sam has 15 apples and gives away 6, so 15 - 6 = 9 apples are left. The answer is 9.",
        "Sam has 15 apples and gives away 6, so 15 - 6 = 11 apples are left. The answer is 11.",
    )
    same_answer = (
        "Fifteen minus six: the answer is 9.",
        "Count down six times from 15 and you reach \\boxed{9}.",
    )
    fraction = ("The answer is $\\frac{1}{2}$.", "That leaves 0.5 in all; the answer is 0.5.")
    one_missing = ("I think the answer is 9.", "I am not sure how to do this.")
    none = ("I do not know.", "No idea, sorry.")
    pairs = [near_copy, same_answer, fraction, one_missing, none]
    assert RougeJudge().equivalent([near_copy]) == [True]  # what a text judge does with a near-copy
    # no inner judge: the verifier's answer classes (1/2 = 0.5 by the grader; two answerless replies alike)
    judge = instantiate({"_target_": "train.diversity.judges.AnswerAwareJudge"})
    assert judge.probabilities(pairs) == [-1.0, 1.0, 1.0, -1.0, 1.0]
    assert judge.equivalent(pairs) == [False, True, True, False, True]
    # with an inner judge, same-answer pairs get its score and threshold; different answers stay apart
    rouge = RougeJudge()
    inner = AnswerAwareJudge(judge={"_target_": "train.diversity.judges.RougeJudge"})
    assert inner.threshold == rouge.threshold
    scores = inner.probabilities(pairs)
    assert scores[0] == scores[3] == -1.0
    assert scores[1] == pytest.approx(rouge.probabilities([same_answer])[0])
    assert scores[4] == pytest.approx(rouge.probabilities([none])[0])
    assert inner.probabilities([]) == []


def test_answer_aware_judge_on_the_labelled_math_pairs():
    math_rows = [r for r in JUDGED if r["domain"] == "math"]
    verdicts = AnswerAwareJudge().equivalent([(r["a"], r["b"]) for r in math_rows])
    accuracy = sum(v == r["equivalent"] for v, r in zip(verdicts, math_rows)) / len(math_rows)
    assert accuracy >= 0.85  # 0.855 when written; the MiniLM judge scores 0.49 on these pairs


def test_embedding_judge_scores(embedding_judge):
    judge = instantiate({"_target_": "train.diversity.judges.EmbeddingJudge"})
    assert judge.threshold == EMBEDDING_THRESHOLD
    same, para, other = embedding_judge.probabilities(
        [
            ("The capital of France is Paris.", "The capital of France is Paris."),
            ("The capital of France is Paris.", "Paris is the capital city of France."),
            ("The capital of France is Paris.", "Octopuses have three hearts and blue blood."),
        ]
    )
    assert same == pytest.approx(1.0, abs=1e-5)
    assert para > EMBEDDING_THRESHOLD > other
    assert embedding_judge.probabilities([]) == []


def test_embedding_threshold_reproduces_documented_calibration(embedding_judge):
    """bench/calibrate_judge.py's docstring reports accuracy 0.693 on the judged pairs at the default threshold."""
    scores = embedding_judge.probabilities([(r["a"], r["b"]) for r in JUDGED])
    m = calibrate.binary_metrics([s > EMBEDDING_THRESHOLD for s in scores], [r["equivalent"] for r in JUDGED])
    assert m["accuracy"] == pytest.approx(0.693, abs=0.01)
    assert m["f1"] == pytest.approx(0.724, abs=0.01)


def _manual_probability(judge: PairClassifierJudge, a: str, b: str) -> float:
    """P(similar) without HF's pooling or padding: last position of the body through the score head."""
    import torch

    if judge.input_format == "pair":  # NoveltyBench: bos a[:128] eos b[:128] eos, built by hand here
        tok = judge.tokenizer
        ids = [tok.bos_token_id, *tok(a, add_special_tokens=False)["input_ids"][: judge.tokens_per_side]]
        ids += [tok.eos_token_id, *tok(b, add_special_tokens=False)["input_ids"][: judge.tokens_per_side]]
        ids = torch.tensor([[*ids, tok.eos_token_id]])
    else:
        text = pair_text(a, b, judge.cls, judge.sep, judge.max_length)
        ids = judge.tokenizer(text, truncation=True, max_length=judge.max_length, return_tensors="pt")[
            "input_ids"
        ]
    with torch.inference_mode():
        hidden = judge.model.model(input_ids=ids).last_hidden_state[0, -1]
        return judge.model.score(hidden).softmax(-1)[-1].item()


def test_pair_classifier_batched_matches_unpadded_forward(pair_classifier):
    judge = instantiate(
        {
            "_target_": "train.diversity.judges.PairClassifierJudge",
            "model_path": str(pair_classifier),
            "batch_size": 3,
        }
    )
    # SmolLM2's separator (eos) is also its pad token: the judge must still pool the real last token.
    assert judge.sep == judge.tokenizer.pad_token
    pairs = [(r["a"], r["b"]) for r in JUDGED[:10]]
    got = judge.probabilities(pairs)
    want = [_manual_probability(judge, a, b) for a, b in pairs]
    assert got == pytest.approx(want, abs=1e-5)
    assert max(got) - min(got) > 0.2  # the head spreads probabilities, so the comparison means something
    assert judge.equivalent(pairs) == [p > 0.5 for p in got]
    # 128 tokens a side: a long side is cut in tokens, the other kept whole
    long = " ".join(["word"] * 400)
    ids, types = judge.encode([(long, "short text")])[0]
    assert (
        types is None
        and len(ids) == 1 + 128 + 1 + len(judge.tokenizer.encode("short text", add_special_tokens=False)) + 1
    )
    old = PairClassifierJudge(pair_classifier, batch_size=4, input_format="darling_text")
    assert old.probabilities(pairs) == pytest.approx(
        [_manual_probability(old, a, b) for a, b in pairs], abs=1e-5
    )
    with pytest.raises(JudgeError, match="input_format must be"):
        PairClassifierJudge(pair_classifier, input_format="words")


def test_pair_encoding_has_one_cls_two_seps_and_token_types():
    """With a BERT tokenizer (the packaged MiniLM's): [CLS] a [SEP] b [SEP] once each (the old text
    input, tokenised with special tokens, doubled them), types 0 through the first [SEP]."""
    from transformers import AutoTokenizer

    from train.diversity.judges import encode_pair, packaged_minilm_path

    tok = AutoTokenizer.from_pretrained(packaged_minilm_path())
    ids, types = encode_pair(tok, "the cat sat", "a dog ran far", tokens_per_side=2)
    assert tok.convert_ids_to_tokens(ids) == ["[CLS]", "the", "cat", "[SEP]", "a", "dog", "[SEP]"]
    assert types == [0, 0, 0, 0, 1, 1, 1]
    # the same as the tokenizer's own pair encoding when nothing is cut
    ids, types = encode_pair(tok, "the cat sat", "a dog ran far")
    want = tok("the cat sat", "a dog ran far")
    assert ids == want["input_ids"] and types == want["token_type_ids"]
    doubled = tok(pair_text("the cat", "a dog", "[CLS]", "[SEP]", 512))["input_ids"]
    assert tok.convert_ids_to_tokens(doubled)[:2] == ["[CLS]", "[CLS]"]


def test_missing_model_paths_fail_with_the_fix(tmp_path):
    with pytest.raises(JudgeError, match="no HF checkpoint at .*give model_path="):
        PairClassifierJudge(tmp_path / "nope")
    with pytest.raises(JudgeError, match="no sentence-transformers model .*packaged-minilm"):
        EmbeddingJudge(model=str(tmp_path / "nope"))


def test_unreachable_server_fails_with_the_fix(pair_classifier):
    judge = VLLMClassifyJudge(f"http://127.0.0.1:{free_port()}", str(pair_classifier), max_retries=0)
    with pytest.raises(JudgeError, match="cannot reach .*/classify .*--runner pooling"):
        judge.probabilities([("one two three four five six", "seven eight nine ten eleven twelve")])


@pytest.fixture(scope="module")
def classify_server(pair_classifier, tmp_path_factory):
    """`python -m vllm.entrypoints.openai.api_server --runner pooling` of the tiny classifier."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("vllm-classify") / "server.log"
    with vllm_server(classify_server_command(pair_classifier, port), url + "/health", log):
        yield url


@pytest.mark.slow
@pytest.mark.heavy  # make test-all: a long integration run (docs/commands.md, Tests)
def test_vllm_classify_server_matches_in_process_classifier(pair_classifier, classify_server):
    hf = PairClassifierJudge(
        pair_classifier, batch_size=8, input_format="darling_text"
    )  # what the server gets
    served = instantiate(
        {
            "_target_": "train.diversity.judges.VLLMClassifyJudge",
            "base_url": classify_server,
            "model": str(pair_classifier),
            "batch_size": 7,
        }
    )
    pairs = [(r["a"], r["b"]) for r in JUDGED[:24]]
    want, got = hf.probabilities(pairs), served.probabilities(pairs)
    assert got == pytest.approx(want, abs=1e-4)
    assert max(got) - min(got) > 0.2
    group = [r["a"] for r in JUDGED[:8]]
    assert partition(group, served) == partition(group, hf)
    assert partition(group, served, "greedy") == partition(group, hf, "greedy")

    served.model = "not-the-served-model"
    with pytest.raises(JudgeError, match="answered 404"):
        served.probabilities(pairs[:1])


def test_labelled_set_is_balanced_and_covers_both_domains():
    assert len(LABELLED) >= 100
    assert len({r["id"] for r in LABELLED}) == len(LABELLED)
    for domain in ("math", "chat"):
        rows = [r for r in LABELLED if r["domain"] == domain]
        positives = sum(r["equivalent"] for r in rows)
        assert len(rows) >= 50 and 0.4 < positives / len(rows) < 0.6


def test_calibration_metrics_hand_computed():
    # predictions T T F F vs labels T F T F: tp 1, fp 1, fn 1 -> accuracy .5, precision .5, recall .5, f1 .5
    m = calibrate.binary_metrics([True, True, False, False], [True, False, True, False])
    assert m == {"accuracy": 0.5, "precision": 0.5, "recall": 0.5, "f1": 0.5}
    table = calibrate.threshold_table([0.9, 0.6, 0.4, 0.1], [True, True, False, False], [0.05, 0.5, 0.95])
    assert [r["accuracy"] for r in table] == [0.5, 1.0, 0.5]
    assert calibrate.best_row(table)["threshold"] == 0.5


def test_calibration_rejects_malformed_rows(tmp_path):
    bad = tmp_path / "pairs.jsonl"
    bad.write_text(
        json.dumps({"a": "x", "b": "y", "equivalent": True}) + "\n" + json.dumps({"a": "x"}) + "\n"
    )
    with pytest.raises(ValueError, match=r"pairs.jsonl:2: a row needs string 'a', 'b' and boolean"):
        calibrate.load_labelled_pairs(bad)
    with pytest.raises(FileNotFoundError, match="labelled pairs file"):
        calibrate.load_labelled_pairs(tmp_path / "missing.jsonl")


def test_calibration_command_prints_table(capsys):
    calibrate.main(["--judge", "train.diversity.judges.RougeJudge", "--thresholds", "0.2:0.6:0.2"])
    out = capsys.readouterr().out
    assert f"{len(JUDGED)} judged pairs of {len(LABELLED)}" in out
    assert sum("<- best accuracy" in line for line in out.splitlines()) == 1
    assert "whole pipeline (shortcut + judge)" in out


def test_bench_command_prints_rows_per_size_and_mode(capsys):
    bench.main(["--only", "Rouge", "--sizes", "4,8", "--groups", "2", "--pairs", "8", "--min-words", "30"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("RougeJudge")]
    assert len(rows) == 4  # 2 sizes x 2 modes
    union_find_n8 = next(r for r in rows if r.split()[1:3] == ["8", "union_find"])
    assert float(union_find_n8.split()[3]) == 28.0  # all 8*7/2 pairs of long responses
    assert "pairs/s" in out

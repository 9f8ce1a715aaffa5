"""DARLING reward (docs/algorithms.md section 2): quality x diversity within each prompt's group.

Quality comes from the math grader (through `MathReward`) for rows with a ground truth, else from a
quality scorer (`train.rewards.scorers`: a reward model or an LLM judge). Diversity comes from the
partition of each group into semantic-equivalence classes (`train.diversity.partition`, judged by
`train.diversity.judges`). The formulas are pure functions in `train.algorithms.diversity`; this
module only gathers the inputs, times the partition and reports figures.

Config (the `reward:` block; nested components are `_target_` dicts built by Hydra):

    reward:
      _target_: train.rewards.darling_reward.DarlingReward
      judge: {_target_: train.diversity.judges.EmbeddingJudge}      # default when omitted
      quality: {_target_: train.rewards.scorers.RewardModelScorer, model_path: ...}  # rows without ground truth
      combine: multiplicative        # | additive | normalized_sum | quality (the GRPO baseline)
      partition_by: answer           # | strategy_and_answer (multi-turn: the tool path too, see below)

Over agent strategies (`partition_by: strategy_and_answer`, experiments/darling_tool.yaml): on multi-turn
rollouts the reward receives each trajectory (train/rewards/trajectory.py); the partitioner then judges the
final answers (the grader's reading of the last model turn: "The answer is 1998." and "1998" are one answer,
which the short-answer shortcut on whole texts would not see) and each class is split by the tool path
(`train.diversity.strategy`), so one answer reached by `37 * 54` and by `1998 % 37` is two classes. Single-turn
rollouts are partitioned as with `answer`. With trajectories the figures add the distinct tool paths among a
group's correct samples (`distinct_correct_strategies_mean`); `distinct_correct_mean` still counts answers.

Use it with GRPO without std normalisation (`algorithm.norm_adv_by_std_in_grpo=false`), as DARLING does.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from train.algorithms.diversity import (
    COMBINE_MODES,
    DIVERSITY_FLOOR,
    add_bias,
    combine_quality_diversity,
    distinct_classes_per_group,
    diversity_scores,
    partition_sigmoid,
)
from train.diversity.partition import MODES as PARTITION_MODES
from train.diversity.partition import partition_groups, refine
from train.diversity.strategy import strategy_of
from train.rewards.base import RewardResult
from train.rewards.math_reward import MathReward

DEFAULT_JUDGE = {"_target_": "train.diversity.judges.EmbeddingJudge"}
PARTITION_BY = ("answer", "strategy_and_answer")


def _build(component: Any) -> Any:
    """A `_target_` dict (when Hydra was told not to recurse, or in direct calls) -> its object."""
    if component is None or callable(getattr(component, "equivalent", None)):
        return component
    if callable(getattr(component, "score", None)):
        return component
    from hydra.utils import instantiate
    from omegaconf import DictConfig, OmegaConf

    if isinstance(component, DictConfig):
        component = OmegaConf.to_container(component, resolve=True)
    if not isinstance(component, dict) or "_target_" not in component:
        raise ValueError(
            f"reward component {component!r} is neither an object nor a config dict with _target_"
        )
    return instantiate(component)


class DarlingReward:
    """r_i = combine(q_i, d_i) per group; see the module docstring for the config."""

    def __init__(
        self,
        judge: Any = None,
        quality: Any = None,
        partition_mode: str = "union_find",
        combine: str = "multiplicative",
        lambda_q: float = 1.0,
        lambda_d: float = 1.0,
        diversity_floor: float = DIVERSITY_FLOOR,
        partition_sigmoid: bool = False,
        partition_correct: bool = False,
        add_bias: bool = False,
        math_timeout_s: float = 3.0,
        partition_by: str = "answer",
    ) -> None:
        if combine not in COMBINE_MODES:
            raise ValueError(f"reward.combine={combine!r} is unknown: use one of {', '.join(COMBINE_MODES)}")
        if partition_mode not in PARTITION_MODES:
            raise ValueError(
                f"reward.partition_mode={partition_mode!r} is unknown: use one of {', '.join(PARTITION_MODES)}"
            )
        if partition_by not in PARTITION_BY:
            raise ValueError(
                f"reward.partition_by={partition_by!r} is unknown: use one of {', '.join(PARTITION_BY)}"
            )
        if not 0 <= diversity_floor <= 1:
            raise ValueError(f"reward.diversity_floor={diversity_floor} must be in [0, 1] (default 0.1)")
        self.judge = _build(DEFAULT_JUDGE if judge is None else judge)
        self.quality = _build(quality)
        self.partition_mode, self.combine, self.partition_by = partition_mode, combine, partition_by
        self.lambda_q, self.lambda_d = float(lambda_q), float(lambda_d)
        self.floor = float(diversity_floor)
        self.use_sigmoid, self.use_correct, self.use_bias = partition_sigmoid, partition_correct, add_bias
        self.math = MathReward(timeout_s=math_timeout_s)

    # ------------------------------------------------------------------------------------------
    def _quality(
        self, rows: list[dict], responses: list[str], group_index: list[int]
    ) -> tuple[list[float], list[float] | None]:
        """q per response, and 1/0 correctness when every row has a ground truth."""
        has_gold = [bool(str(r.get("ground_truth", "") or "").strip()) for r in rows]
        graded = [i for i, g in enumerate(has_gold) if g]
        scored = [i for i, g in enumerate(has_gold) if not g]
        q = [0.0] * len(rows)
        correct: list[float] | None = [0.0] * len(rows) if not scored else None
        if graded:
            result = self.math(
                [rows[i] for i in graded], [responses[i] for i in graded], [group_index[i] for i in graded]
            )
            for k, i in enumerate(graded):
                q[i] = result.scores[k]
                if correct is not None:
                    correct[i] = result.correct[k]
        if scored:
            if self.quality is None:
                raise ValueError(
                    f"{len(scored)} rows have no ground_truth and reward.quality is not set: give a quality "
                    "scorer, e.g. reward.quality._target_=train.rewards.scorers.RewardModelScorer"
                )
            values = self.quality.score([rows[i]["prompt"] for i in scored], [responses[i] for i in scored])
            if len(values) != len(scored):
                raise RuntimeError(
                    f"quality scorer {type(self.quality).__name__} returned {len(values)} scores "
                    f"for {len(scored)} responses"
                )
            for k, i in enumerate(scored):
                q[i] = float(values[k])
        return q, correct

    def _classes(self, responses: list[str], group_index: list[int], member: list[bool]) -> list[int]:
        """Class id per response within its group (-1 for responses left out of the partition)."""
        order = list(dict.fromkeys(group_index))
        positions = {g: [i for i, gi in enumerate(group_index) if gi == g and member[i]] for g in order}
        labels = partition_groups(
            [[responses[i] for i in positions[g]] for g in order], self.judge, self.partition_mode
        )
        class_ids = [-1] * len(responses)
        for g, group_labels in zip(order, labels):
            for i, label in zip(positions[g], group_labels):
                class_ids[i] = label
        return class_ids

    def __call__(
        self,
        rows: list[dict],
        responses: list[str],
        group_index: list[int],
        trajectories: list[dict] | None = None,
    ) -> RewardResult:
        if trajectories and len(trajectories) != len(responses):
            raise ValueError(f"{len(trajectories)} trajectories for {len(responses)} responses")
        strategies = [strategy_of(t) for t in trajectories] if trajectories else None
        by_strategy = strategies is not None and self.partition_by == "strategy_and_answer"
        t0 = time.perf_counter()
        q_list, correct = self._quality(rows, responses, group_index)
        t1 = time.perf_counter()
        if self.use_correct and correct is None:
            raise ValueError(
                "reward.partition_correct=true needs a ground truth on every row (it clusters only correct "
                "responses); set it to false for open-ended prompts"
            )
        member = [c == 1.0 for c in correct] if self.use_correct else [True] * len(responses)
        texts = [s.answer for s in strategies] if by_strategy else responses
        answer_ids = self._classes(texts, group_index, member)
        if strategies is not None:  # each group's tool paths numbered 0, 1, ... in order of appearance
            path_ids = torch.tensor(_refined([0] * len(texts), group_index, [s.path for s in strategies]))
        class_ids = torch.tensor(
            _refined(answer_ids, group_index, [s.path for s in strategies]) if by_strategy else answer_ids
        )
        t2 = time.perf_counter()

        groups = torch.tensor(group_index)
        clustered = torch.tensor(member)
        d = diversity_scores(class_ids, groups, self.floor, clustered)
        if self.use_sigmoid:
            d = partition_sigmoid(d)
        q = torch.tensor(q_list, dtype=torch.float32)
        if self.use_bias:
            q = add_bias(q, groups)
        r = combine_quality_diversity(q, d, groups, self.combine, self.lambda_q, self.lambda_d)
        classes = distinct_classes_per_group(class_ids, groups, clustered)
        sizes = torch.bincount(torch.unique(groups, return_inverse=True)[1]).float()
        if correct is not None:  # how many different correct answers each group holds (DARLING's target)
            good = clustered & (torch.tensor(correct) == 1.0)
            distinct_correct = distinct_classes_per_group(torch.tensor(answer_ids), groups, good)
            if strategies is not None:  # and by how many different tool paths
                correct_paths = distinct_classes_per_group(path_ids, groups, torch.tensor(correct) == 1.0)
        metrics = {
            "quality_mean": statistics.fmean(q.tolist()),
            "diversity_mean": statistics.fmean(d.tolist()),
            "distinct_classes_mean": classes.mean().item(),
            # distinct classes / group size: comparable across n (1 = all different, 1/n = all the same)
            "distinct_share_mean": (classes / sizes).mean().item(),
            **({"distinct_correct_mean": distinct_correct.mean().item()} if correct is not None else {}),
            **(
                {"distinct_correct_strategies_mean": correct_paths.mean().item()}
                if correct is not None and strategies is not None
                else {}
            ),
            "quality_s": t1 - t0,
            "partition_s": t2 - t1,
        }
        # per response, for the logged samples (train/samples.py): the reward's parts and the partition
        signals = {"quality": q.tolist(), "diversity": d.tolist(), "partition_class": class_ids.tolist()}
        if strategies is not None:  # which tool path each trajectory took (the viewer's groups by strategy)
            signals["strategy_class"] = path_ids.tolist()
        return RewardResult(scores=r.tolist(), correct=correct, metrics=metrics, signals=signals)


def _refined(labels: list[int], group_index: list[int], keys: list) -> list[int]:
    """`labels` split by `keys` within each group (train/diversity/partition.py `refine`); -1 stays -1."""
    out = list(labels)
    for g in dict.fromkeys(group_index):
        members = [i for i, gi in enumerate(group_index) if gi == g and labels[i] >= 0]
        for i, label in zip(members, refine([labels[i] for i in members], [keys[i] for i in members])):
            out[i] = label
    return out

"""A reward that varies on a random tiny model's gibberish, so test runs have non-zero advantages."""

from train.rewards.base import RewardResult


class VowelShareReward:
    def __call__(self, rows, responses, group_index):
        scores = [sum(c in "aeiou" for c in r.lower()) / max(len(r), 1) for r in responses]
        return RewardResult(scores=scores, correct=[float(s > 0.2) for s in scores])

"""What an eval suite is: a small declaration on top of the shared generation, results and logging.

A suite is a module-level object with:

- ``name: str`` (results folder and metric prefix ``eval/<name>/...``);
- ``add_args(parser)``: its own command-line options;
- ``load_items(args) -> list[dict]``: every item has a unique str ``"id"``;
- ``run_batch(items, ctx) -> list[dict]``: one JSON-able record per item, carrying its ``"id"``; the
  runner appends the records to ``samples.jsonl`` as each batch finishes and skips ids already there;
- ``summarize(records, args) -> dict[str, float]``: metric name -> value (CIs as ``<m>_ci_lo``/``<m>_ci_hi``);
- optionally ``record_schema``: the types of the record fields ``summarize`` reads
  (``evals.common.results.RecordSchema``); a stored record that does not match is set aside on reading,
  like a torn line, and its item generated again.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from evals.common.checkpoints import CheckpointRef
from evals.common.generation import Sampling


@runtime_checkable
class Suite(Protocol):
    name: str

    def add_args(self, parser: argparse.ArgumentParser) -> None: ...

    def load_items(self, args: argparse.Namespace) -> list[dict]: ...

    def run_batch(self, items: list[dict], ctx: EvalContext) -> list[dict]: ...

    def summarize(self, records: list[dict], args: argparse.Namespace) -> dict[str, float]: ...


@dataclass
class EvalContext:
    """What a suite's `run_batch` sees: its parsed args, the checkpoint, and a generator for it."""

    args: argparse.Namespace
    checkpoint: CheckpointRef
    generator: object = field(repr=False, default=None)  # evals.common.generation.Generator
    results_dir: object = None  # pathlib.Path of <results>/<ckpt name>/<suite>/ (for suite-side caches)
    extra: dict = field(default_factory=dict)

    def generate(self, conversations: list[list[dict]], sampling: Sampling) -> list[list[str]]:
        """`sampling.n` completions for each chat conversation, in order: out[i][j] = sample j of i."""
        if self.generator is None:
            raise RuntimeError("this EvalContext has no generator (build it with evals.common.cli)")
        return self.generator.generate(conversations, sampling)


SuiteFactory = Callable[[], Suite]

"""The method table: advantage estimators and policy-loss modes, each registered next to its function.

An estimator is ``fn(cfg, ctx) -> AdvantageOutput | Tensor (B, T)``: ``cfg`` the algorithm config
(attribute access), ``ctx`` an :class:`AdvantageContext`. A policy loss is
``fn(old_log_prob, log_prob, advantages, response_mask, cfg, extras) -> (per-token loss (B, T), metrics)``;
aggregation (``loss_agg_mode``) is applied after it, by the one shared ``agg_loss``.

Each entry declares its knobs (``{"gamma": Knob(1.0, "discount")}``), which become config keys
``algorithm.<knob>`` (typed, listed by ``python -m train --help``, checked by ``--validate``), and what it
needs from the trainer beyond scores, groups and masks (``needs=("baseline_scores",)``,
``needs=("signals.classmate_scores",)``), so the trainer supplies it without naming the estimator and
config validation can name the missing part before a model loads. Adding an estimator with a knob is one
file: a module in ``train/algorithms/`` is imported by :func:`load_entries`, and so registered.

Trainer-side features (DAPO's overlong shaping, KL in the reward, rollout IS/RS, a length penalty, ...) are
step plug-ins, registered beside their pure functions with :func:`register_step`: ``fn(cfg, batch, ctx) ->
metrics`` runs at a named point of the GRPO step (:data:`POINTS`) when its ``enabled(cfg)`` says so, reads
and writes the batch's named tensors (``batch["rewards"]``, ``batch["loss_mask"]``, ...; see
train/batch.py) and declares the inputs it needs (:data:`INPUTS`), which the trainer computes for it.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# What an estimator or a step plug-in may declare it needs: the trainer's table of providers
# (train/stages/grpo.py INPUT_PROVIDERS, one row each) computes each into the batch. A name ending in "."
# is a family: `signals.<name>` is the reward's per-sample signal <name> (or a token mask made from its
# `<x>_spans`).
SIGNALS = "signals."
INPUTS = ("baseline_scores", "values", "old_log_probs", "ref_log_probs", "rollout_log_probs", SIGNALS)


def input_row(need: str) -> str | None:
    """The INPUTS entry that covers `need`: itself, or the family ("signals.") it is a member of."""
    if need in INPUTS and not need.endswith("."):
        return need
    family = need[: need.find(".") + 1]
    return family if family in INPUTS and len(need) > len(family) else None


# Where step plug-ins run, in this order: after the reward (score shaping), before the estimator (e.g. KL
# in the reward), before the update (loss masks and weights), after the update (figures).
POINTS = ("after_reward", "before_estimator", "before_update", "after_update")


@dataclass(frozen=True)
class Knob:
    default: Any
    doc: str
    type: type | None = None  # default: the default's type (needed when the default is None)
    choices: tuple | None = None
    valid: Callable[[Any], bool] | None = None  # a range check, described by `rule`
    rule: str = ""  # e.g. "> 1"

    @property
    def value_type(self) -> type:
        return self.type or type(self.default)

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` for this knob (None when it is fine)."""
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(map(str, self.choices))}"
        if self.valid is not None and value is not None and not self.valid(value):
            return f"must be {self.rule}"
        return None


@dataclass(frozen=True)
class Entry:
    name: str
    fn: Callable
    knobs: dict[str, Knob]
    needs: tuple[str, ...] = ()
    hint: str = ""  # how to provide what it needs, e.g. "reward._target_=..."
    module: str = ""
    # a policy loss that applies the rollout-correction weights itself (extras["is_weights"], (B, T) or
    # None) instead of having them multiply its per-token loss (e.g. geo_mean: a geometric mean per sequence)
    applies_is_weights: bool = False
    point: str = ""  # step plug-ins: where in the step it runs (POINTS)
    enabled: Callable[[Any], bool] | None = None  # step plug-ins: on for this algorithm config?
    check: Callable[[Any, Any], str | None] | None = None  # (algorithm cfg, run cfg) -> problem or None
    state: Callable[[Any], dict] | None = None  # step plug-ins: initial state carried across steps


@dataclass
class StepContext:
    """What a step plug-in may read beside the algorithm config and the batch."""

    max_new_tokens: int  # rollout.max_new_tokens: the response length limit
    state: dict = field(default_factory=dict)  # plug-in state across steps, saved with checkpoints
    all_reduce_sum: Callable[[float], float] = float  # a figure summed over ranks


@dataclass
class AdvantageContext:
    """What an estimator may read. Shapes: B responses, T padded response length."""

    scores: Any  # (B,) sequence rewards (after an in-reward KL penalty, if any)
    response_mask: Any  # (B, T)
    group_index: Any  # (B,) int: responses with the same value answer the same prompt
    token_rewards: Any = None  # (B, T) per-token rewards, or None
    baseline_scores: Any = None  # (B,) e.g. ReMax's greedy reward of the same prompt, or None
    values: Any = None  # (B, T) critic values, or None
    signals: dict[str, Any] = field(default_factory=dict)  # the reward's per-sample signals (RewardResult)

    def rewards(self) -> Any:
        """Per-token rewards when there are any, else the (B,) scores (estimators accept both)."""
        return self.scores if self.token_rewards is None else self.token_rewards


@dataclass
class AdvantageOutput:
    advantages: Any  # (B, T), zero on padding
    metrics: dict[str, float] = field(default_factory=dict)  # logged as advantage/<key>
    returns: Any = None  # (B, T) the critic's regression targets (GAE), or None


ADV_ESTIMATORS: dict[str, Entry] = {}
POLICY_LOSSES: dict[str, Entry] = {}
# Knobs of a trainer-side feature that is not a step plug-in (DAPO's dynamic sampling): `register_knobs`.
FEATURES: dict[str, Entry] = {}
STEP_PLUGINS: dict[str, Entry] = {}  # register_step, in registration order
_TABLES = {"algorithm.adv_estimator": ADV_ESTIMATORS, "algorithm.policy_loss_mode": POLICY_LOSSES}


def _knobs(knobs: dict | None) -> dict[str, Knob]:
    for name, spec in (knobs or {}).items():
        if not isinstance(spec, Knob):
            raise TypeError(f"knob {name!r}: declare it as Knob(default, doc, ...), one style for every knob")
    return dict(knobs or {})


def _register(table: dict[str, Entry], name: str, knobs, needs, hint, **step) -> Callable:
    def decorate(fn: Callable) -> Callable:
        for need in needs:
            if input_row(need) is None:
                raise ValueError(f"{name}: unknown need {need!r} (known: {INPUTS[:-1]} or {SIGNALS}<name>)")
        entry = Entry(name, fn, _knobs(knobs), tuple(needs), hint, fn.__module__, **step)
        old = table.get(name)
        if old is not None and (old.module, old.fn.__qualname__) != (entry.module, fn.__qualname__):
            raise ValueError(f"{name!r} is registered twice ({old.module} and {entry.module})")
        for knob_name, knob in entry.knobs.items():
            for other in all_knobs_owners().get(knob_name, []):
                if other.knobs[knob_name].default != knob.default and other.name != name:
                    raise ValueError(
                        f"knob {knob_name!r} of {name!r} has default {knob.default!r}, but "
                        f"{other.name!r} declares {other.knobs[knob_name].default!r}: a shared knob has one default"
                    )
        table[name] = entry
        return fn

    return decorate


def register_adv_estimator(
    name: str, knobs: dict | None = None, needs: tuple[str, ...] = (), hint: str = ""
) -> Callable:
    """Decorator: `fn(cfg, ctx)` becomes `algorithm.adv_estimator=<name>`."""
    return _register(ADV_ESTIMATORS, name, knobs, needs, hint)


def register_policy_loss(name: str, knobs: dict | None = None, applies_is_weights: bool = False) -> Callable:
    """Decorator: `fn(old_log_prob, log_prob, advantages, response_mask, cfg, extras)` becomes
    `algorithm.policy_loss_mode=<name>`; `applies_is_weights`: see :class:`Entry`."""
    return _register(POLICY_LOSSES, name, knobs, (), "", applies_is_weights=applies_is_weights)


def policy_loss_from(name: str, loss_fn: Callable, knobs: dict, applies_is_weights: bool = False) -> Callable:
    """Register `loss_fn(old_log_prob, log_prob, advantages, response_mask, **knobs)` (per-token loss,
    metrics) as `algorithm.policy_loss_mode=<name>`: its table entry reads each knob from the algorithm
    config by the keyword's name (and passes `is_weights=extras["is_weights"]` when `applies_is_weights`).
    Returns the entry."""

    def entry(old_log_prob, log_prob, advantages, response_mask, cfg, extras: dict | None = None):
        kwargs = {k: getattr(cfg, k) for k in knobs}
        if applies_is_weights:
            kwargs["is_weights"] = (extras or {}).get("is_weights")
        return loss_fn(old_log_prob, log_prob, advantages, response_mask, **kwargs)

    entry.__name__ = entry.__qualname__ = f"{name}_entry"
    entry.__doc__ = f"``algorithm.policy_loss_mode={name}``: ``{loss_fn.__name__}`` with its knobs."
    return register_policy_loss(name, knobs=knobs, applies_is_weights=applies_is_weights)(entry)


def register_knobs(name: str, knobs: dict, fn: Callable) -> None:
    """Declare the `algorithm.<knob>` keys of a trainer-side feature `name` whose pure function is `fn`
    (e.g. `register_knobs("dynamic_sampling", DYNAMIC_SAMPLING_KNOBS, select_groups)`), beside that function."""
    _register(FEATURES, name, knobs, (), "")(fn)


def register_step(
    name: str,
    point: str,
    enabled: Callable[[Any], bool],
    knobs: dict | None = None,
    needs: tuple[str, ...] = (),
    check: Callable[[Any, Any], str | None] | None = None,
    state: Callable[[Any], dict] | None = None,
) -> Callable:
    """Decorator: `fn(cfg, batch, ctx: StepContext) -> metrics` runs at `point` of every GRPO step where
    `enabled(cfg)`; its `knobs` become `algorithm.<knob>`, its `needs` (INPUTS) are in the batch when it
    runs, `check(algorithm cfg, run cfg)` names a bad combination before a model loads, and `state(cfg)`
    is its initial state in `ctx.state` (kept across steps and in checkpoints)."""
    if point not in POINTS:
        raise ValueError(f"{name}: unknown step point {point!r} (known: {', '.join(POINTS)})")
    return _register(
        STEP_PLUGINS, name, knobs, needs, "", point=point, enabled=enabled, check=check, state=state
    )


def step_plugins(cfg: Any = None, point: str | None = None) -> list[Entry]:
    """The registered step plug-ins (enabled for `cfg` when given; at `point` when given), in order."""
    load_entries()
    return [
        p
        for p in STEP_PLUGINS.values()
        if (point is None or p.point == point) and (cfg is None or p.enabled(cfg))
    ]


def all_knobs_owners() -> dict[str, list[Entry]]:
    owners: dict[str, list[Entry]] = {}
    for table in (ADV_ESTIMATORS, POLICY_LOSSES, FEATURES, STEP_PLUGINS):
        for entry in table.values():
            for knob in entry.knobs:
                owners.setdefault(knob, []).append(entry)
    return owners


def load_entries() -> None:
    """Import every module of train/algorithms/, so each registers its entries (idempotent)."""
    import train.algorithms as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{pkg.__name__}.{info.name}")


def knobs() -> dict[str, Knob]:
    """Every registered knob, by config name (one default per name)."""
    load_entries()
    return {name: entries[0].knobs[name] for name, entries in sorted(all_knobs_owners().items())}


def knob_owners(name: str) -> list[str]:
    return [e.name for e in all_knobs_owners().get(name, [])]


def lookup(key: str, name: str) -> Entry:
    """The entry `name` of table `key` ("algorithm.adv_estimator"), or a ValueError naming the choices."""
    load_entries()
    table = _TABLES[key]
    if name not in table:
        raise ValueError(f"{key}={name!r} is not registered (known: {', '.join(sorted(table))})")
    return table[name]


def adv_estimator(name: str) -> Entry:
    return lookup("algorithm.adv_estimator", name)


def policy_loss(name: str) -> Entry:
    return lookup("algorithm.policy_loss_mode", name)


def as_output(result: Any) -> AdvantageOutput:
    return result if isinstance(result, AdvantageOutput) else AdvantageOutput(result)

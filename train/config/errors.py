"""The one error every config check raises: one line naming the key and the fix. `reported` is the one
place OmegaConf's errors (a value that does not parse, resolve or fit its type) become it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from omegaconf import errors as oc

RESOLVERS = "oc.env, oc.decode, oc.create, oc.select, oc.dict.keys, oc.dict.values"
KEYS_HINT = "python -m train --help lists every key with its default"


class ConfigError(ValueError):
    """Its text is one line whatever it quotes: a newline in a user's key or value reads as \\n."""

    def __init__(self, message: str) -> None:
        super().__init__(str(message).replace("\r", "\\r").replace("\n", "\\n"))


def fail_first(checks: list[tuple[bool, str]]) -> None:
    """ConfigError for the first (ok, message) pair that is not ok."""
    for ok, message in checks:
        if not ok:
            raise ConfigError(f"bad config value: {message}")


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's first non-blank line, cut to `limit` characters: a config error stays one line."""
    text = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fix(exc: Exception) -> str:
    """What to do about an OmegaConf error, by its kind (the most specific kinds first)."""
    if isinstance(exc, oc.InterpolationKeyError):
        return "point the ${...} at a key that exists, or give a plain value"
    if isinstance(exc, oc.UnsupportedInterpolationType):
        return f"the resolvers are {RESOLVERS}; write a literal $ as \\$"
    if isinstance(exc, oc.InterpolationToMissingValueError):
        return "the key it points at has no value (???): set that key"
    if isinstance(exc, oc.InterpolationValidationError):
        return f"the ${{...}} must give a value of the key's type ({KEYS_HINT})"
    if isinstance(exc, oc.InterpolationResolutionError):
        if "Recursive" in str(exc):
            return "it refers to itself, directly or through other keys: give a plain value"
        return (
            "fix the resolver's argument (an unset variable: ${oc.env:NAME,default}), or give a plain value"
        )
    if isinstance(exc, oc.GrammarParseError):
        return "close every ${ with }, name a key inside it (e.g. ${optim.lr}), or write a literal $ as \\$"
    if isinstance(exc, oc.MissingMandatoryValue):
        return "it is ??? (no value): set it"
    if isinstance(exc, (oc.ConfigKeyError, oc.ConfigAttributeError)):
        return f"no such key ({KEYS_HINT})"
    return f"give it the type and shape of its default ({KEYS_HINT})"


def explain(exc: Exception, key: str | None = None) -> ConfigError:
    """An OmegaConf error as one ConfigError line: the key (`key`, else the error's own), what is wrong, the fix."""
    key = key or getattr(exc, "full_key", None) or ""
    where = f" for {key}" if key else ""
    return ConfigError(f"bad config value{where}: {first_line(exc)}; {_fix(exc)}")


@contextmanager
def reported(key: str | None = None) -> Iterator[None]:
    """Reading, merging or resolving a config inside: an OmegaConf error becomes `explain`'s ConfigError."""
    try:
        yield
    except oc.OmegaConfBaseException as exc:
        raise explain(exc, key) from None

"""The one error every config check raises: one line naming the key and the fix."""

from __future__ import annotations


class ConfigError(ValueError):
    pass


def fail_first(checks: list[tuple[bool, str]]) -> None:
    """ConfigError for the first (ok, message) pair that is not ok."""
    for ok, message in checks:
        if not ok:
            raise ConfigError(f"bad config value: {message}")

"""The one redaction of secrets, used wherever a config or a message is written: MLflow params and tags,
sweep.json and sweep_point.yaml, a run's config.yaml, status files, logs and reports.

A value is secret when its key is named like one (`api_key`, `hf_token`, `client_secret`, `password`,
`authorization`, ...; `api_key_env`, which names a variable, and `max_tokens`, `pad_token` are not), or
when it looks like one wherever it appears: `sk-...` keys of any length, `hf_`, `ghp_`, `xox?-`,
`AIza...`, `AKIA...` keys, JWTs, `Bearer <token>`, the password in `scheme://user:password@host`, and
`key=`/`token=`/... query parameters of a URL. Keys belong in the environment (`*_api_key_env`), so a
config holding one is refused where it is parsed (`secrets_in`), and anything else is masked as `***`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

MASK = "***"

# The last word of a key name that marks a secret; "key" only in compounds such as api_key.
SECRET_WORDS = frozenset(
    {"token", "secret", "password", "passwd", "pwd", "passphrase", "authorization", "auth", "credential",
     "credentials", "cookie", "apikey"}
)  # fmt: skip
KEY_QUALIFIERS = frozenset({"api", "private", "secret", "access", "auth", "signing", "encryption", "client"})
NOT_SECRET_TOKENS = frozenset(
    {"pad", "eos", "bos", "unk", "sep", "cls", "mask", "start", "end", "stop", "special"}
)

_QUERY_NAMES = r"(?:api[_-]?key|apikey|key|token|access_token|auth|secret|password|sig|signature)"
VALUE_PATTERNS = [
    re.compile(r"(?<![\w-])sk-[A-Za-z0-9_\-]{3,}"),  # OpenAI / Anthropic (sk-ant-...) keys, test keys too
    re.compile(r"(?<![\w-])[sr]k_(?:live|test)_[A-Za-z0-9]{4,}"),  # Stripe-style
    re.compile(r"(?<![\w-])hf_[A-Za-z0-9]{20,}"),  # Hugging Face
    re.compile(r"(?<![\w-])(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})"),  # GitHub
    re.compile(r"(?<![\w-])xox[abposr]-[A-Za-z0-9-]{8,}"),  # Slack
    re.compile(r"(?<![\w-])AIza[0-9A-Za-z_\-]{8,}"),  # Google
    re.compile(r"(?<![\w-])(?:AKIA|ASIA)[0-9A-Z]{12,}"),  # AWS access key id
    re.compile(r"(?<![\w-])eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),  # JWT
]
# Patterns whose secret part is group 2 (group 1 is kept so the text still reads).
CONTEXT_PATTERNS = [
    re.compile(r"(?i)(\bbearer\s+)([A-Za-z0-9._~+/=\-]{4,})"),
    re.compile(r"(://[^/\s:@]+:)([^/\s@]+)(?=@)"),  # scheme://user:password@host
    re.compile(rf"(?i)([?&;]{_QUERY_NAMES}=)([^&#\s]+)"),  # ?key=... in a URL
]


def _words(name: str) -> list[str]:
    """'hfToken' -> ['hf', 'token']; 'API-Key' -> ['api', 'key']."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return re.findall(r"[a-z0-9]+", spaced.lower())


def is_secret_name(key: str) -> bool:
    """Whether a config key (dotted or not: only its last part counts) names a secret."""
    words = _words(str(key).split(".")[-1])
    if not words:
        return False
    last, before = words[-1], words[-2] if len(words) > 1 else None
    if last == "token" and before in NOT_SECRET_TOKENS:
        return False
    if last in SECRET_WORDS:
        return True
    return last == "key" and (before is None or before in KEY_QUALIFIERS)


def redact_text(text: str) -> str:
    """`text` with every secret-looking value replaced by `***`."""
    for pattern in VALUE_PATTERNS:
        text = pattern.sub(MASK, text)
    for pattern in CONTEXT_PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + MASK, text)
    return text


def _secret_value(value) -> bool:
    return value is not None and value != "" and value != MASK


def redact(obj, key: str = ""):
    """A copy of a config (nested dicts/lists, or a flat {dotted key: value}) with secrets masked:
    values under secret names become `***`, secret-looking parts of strings become `***`."""
    if isinstance(obj, Mapping):
        return {
            k: (
                MASK
                if is_secret_name(k) and _secret_value(v) and not isinstance(v, Mapping)
                else redact(v, k)
            )
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact(v, key) for v in obj)
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


def secrets_in(obj, prefix: str = "") -> list[str]:
    """Dotted paths of the values `redact` would mask (a config to refuse where it is parsed)."""
    found = []
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            path = f"{prefix}{k}"
            if is_secret_name(k) and _secret_value(v) and not isinstance(v, Mapping):
                found.append(path)
            else:
                found += secrets_in(v, path + ".")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            found += secrets_in(v, f"{prefix.rstrip('.')}[{i}].")
    elif isinstance(obj, str) and redact_text(obj) != obj:
        found.append(prefix.rstrip("."))
    return found


def redacted_yaml(cfg) -> str:
    """An omegaconf config as YAML with secrets masked (what config.yaml and sweep_point.yaml hold)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(redact(OmegaConf.to_container(cfg, resolve=False))))

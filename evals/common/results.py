"""Results of one (checkpoint, suite): `samples.jsonl` (one record per item, appended as batches finish)
and `summary.json`. A rerun reads the ids already in `samples.jsonl` and skips them, so a crash loses at
most the batch in flight.

A line that is not a JSON record with an `id` (corrupted, or torn by a kill mid-append), or a record that
does not match its suite's `record_schema` (`"correct": "yes"`, `"responses": null`: see `check_record`),
never costs the good records around it: it is moved to `samples.jsonl.bad` with one warning line naming
the file, the line and what is wrong, and only its item is generated again. Every write failure is a one-line `ResultsError`, and the folder is
checked for writability before any generation starts.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

FINGERPRINT_KEY = "item_fingerprint"  # hash of the item and the options it was run with (evals.common.cli)
SHOWN_BAD_LINES = 10  # warning lines printed for bad lines; the rest are counted in one more line

# A suite's `record_schema`: field -> type, or a function record -> that dict (records of several kinds).
# Types: str, number (int or float; true/false count as 1/0), bool, any, list[T], list+[T] (not empty),
# dict[T] (str keys, values T); `T|null` also allows null; a trailing `?` makes the field optional.
RecordSchema = dict[str, str]


class ResultsError(RuntimeError):
    """The results folder cannot be read or written (one line naming the path and the OS error)."""


def _os_error(action: str, path: Path, exc: OSError) -> ResultsError:
    return ResultsError(f"cannot {action} {path}: {exc.strerror or exc} (check the folder's permissions "
                        "and free space, or pass --results-dir)")  # fmt: skip


class ResultsStore:
    """`<root>/<checkpoint name>/<suite>/{samples.jsonl, summary.json}`."""

    def __init__(self, root: str | Path, checkpoint_name: str, suite: str, schema=None) -> None:
        self.dir = Path(root) / checkpoint_name / suite
        self.schema = schema  # RecordSchema, or record -> RecordSchema | None; None: any record with an id
        self.samples_path = self.dir / "samples.jsonl"
        self.bad_path = self.dir / "samples.jsonl.bad"
        self.summary_path = self.dir / "summary.json"
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _os_error("create the results folder", self.dir, exc) from None
        self._records: dict[str, dict] = {}
        self._load()

    def _load(self) -> None:
        try:
            raw = self.samples_path.read_bytes() if self.samples_path.is_file() else b""
        except OSError as exc:
            raise _os_error("read", self.samples_path, exc) from None
        good, bad = [], []
        for number, line in enumerate(raw.splitlines(keepends=True), start=1):
            record = _parse(line)
            why = "not a JSON record with an 'id'" if record is None else check_record(record, self.schema)
            if why is not None:
                bad.append((number, line if line.endswith(b"\n") else line + b"\n", why))
                continue
            self._records[str(record["id"])] = record
            good.append(line)
        if bad:
            self._set_aside(good, bad)

    def _set_aside(self, good: list[bytes], bad: list[tuple[int, bytes, str]]) -> None:
        """Append the bad lines to samples.jsonl.bad (durably), then rewrite samples.jsonl with the good
        ones, so appends stay valid and nothing is lost even if this is interrupted."""
        try:
            with self.bad_path.open("ab") as f:
                f.write(b"".join(line for _, line, _ in bad))
                f.flush()
                os.fsync(f.fileno())
            _atomic_write(self.samples_path, b"".join(good))
        except OSError as exc:
            raise _os_error("set aside bad lines of", self.samples_path, exc) from None
        for number, _, why in bad[:SHOWN_BAD_LINES]:
            print(f"warning: {self.samples_path}: line {number}: {why}; moved to {self.bad_path} (its item is "
                  "generated again)", file=sys.stderr)  # fmt: skip
        if len(bad) > SHOWN_BAD_LINES:
            print(f"warning: {self.samples_path}: {len(bad) - SHOWN_BAD_LINES} more bad lines moved to "
                  f"{self.bad_path}", file=sys.stderr)  # fmt: skip

    def check_writable(self) -> None:
        """Fail before any generation when samples.jsonl or summary.json could not be written."""
        try:
            with self.samples_path.open("ab"):
                pass
            fd, probe = tempfile.mkstemp(dir=self.dir, prefix=".write-probe-")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise _os_error("write results in", self.dir, exc) from None

    @property
    def done_ids(self) -> set[str]:
        return set(self._records)

    def fingerprint(self, item_id: str) -> str | None:
        """The stored record's item fingerprint (None: no record, or one written before fingerprints)."""
        record = self._records.get(item_id)
        return None if record is None else record.get(FINGERPRINT_KEY)

    def records(self, ids: list[str] | None = None) -> list[dict]:
        """Records in `ids` order (those present), or all records."""
        if ids is None:
            return list(self._records.values())
        return [self._records[i] for i in ids if i in self._records]

    def append(self, records: list[dict]) -> None:
        """Append records durably (flush + fsync) before the next batch starts."""
        for r in records:
            if "id" not in r:
                raise ValueError(f"a suite record has no 'id' field: {sorted(r)[:8]}")
        lines = "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in records)
        try:
            with self.samples_path.open("a", encoding="utf-8") as f:
                f.write(lines)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise _os_error("append to", self.samples_path, exc) from None
        for r in records:
            self._records[str(r["id"])] = r

    def write_summary(self, summary: dict) -> Path:
        try:
            _atomic_write(self.summary_path, json.dumps(summary, indent=1, default=str).encode())
        except OSError as exc:
            raise _os_error("write", self.summary_path, exc) from None
        return self.summary_path


class KeyedJsonl:
    """An append-only JSONL file of records keyed by the field `key` (the generated pieces of a creative
    writing run, the pairwise judgements of a rating): each batch is flushed and fsynced before the caller
    goes on, and a torn or corrupt line (a kill mid-append) is skipped on reading, so only its record is
    produced again. `rows`: key -> record, the newest record of a key winning."""

    def __init__(self, path: str | Path, key: str) -> None:
        self.path, self.key = Path(path), key
        self.rows: dict[str, dict] = {}
        if self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                self.rows[str(row[key])] = row

    def add(self, rows: list[dict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
            f.flush()
            os.fsync(f.fileno())
        self.rows.update({str(r[self.key]): r for r in rows})


def check_record(record: dict, schema) -> str | None:
    """What is wrong with a stored record for its suite's schema (None: nothing), e.g.
    "'correct' must be list+[number], got str ('yes')". `schema`: RecordSchema, a function giving one
    for the record (None: a kind it does not know), or None (any record)."""
    if schema is None:
        return None
    fields = schema(record) if callable(schema) else schema
    if fields is None:
        return f"a record of no kind this suite writes: {json.dumps(record, default=str)[:80]}"
    for name, spec in fields.items():
        optional = spec.endswith("?")
        if name not in record:
            if optional:
                continue
            return f"field {name!r} missing"
        if not _matches(record[name], spec.rstrip("?")):
            shown = json.dumps(record[name], default=str)
            return f"field {name!r} must be {spec.rstrip('?')}, got {type(record[name]).__name__} " + (
                f"({shown[:40]}{'...' if len(shown) > 40 else ''})"
            )
    return None


def _matches(value, spec: str) -> bool:
    options = _split_top(spec, "|")
    if len(options) > 1:
        return any(_matches(value, o) for o in options)
    if spec == "null":
        return value is None
    if spec == "any":
        return True
    if spec == "str":
        return isinstance(value, str)
    if spec == "bool":
        return isinstance(value, bool)
    if spec == "number":
        return isinstance(value, (int, float))
    for head in ("list+[", "list[", "dict["):
        if spec.startswith(head) and spec.endswith("]"):
            inner = spec[len(head) : -1]
            if head == "dict[":
                return isinstance(value, dict) and all(_matches(v, inner) for v in value.values())
            return (
                isinstance(value, list)
                and (head == "list[" or bool(value))
                and all(_matches(v, inner) for v in value)
            )
    raise ValueError(f"bad record schema type {spec!r}")


def _split_top(spec: str, sep: str) -> list[str]:
    """`spec` split at `sep` outside brackets: "list[str|null]|null" -> ["list[str|null]", "null"]."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(spec):
        depth += ch == "["
        depth -= ch == "]"
        if ch == sep and depth == 0:
            parts.append(spec[start:i])
            start = i + 1
    return [*parts, spec[start:]]


def _parse(line: bytes) -> dict | None:
    """The record on one line, or None for a torn, corrupt or id-less line."""
    if not line.endswith(b"\n"):
        return None  # torn write of the last record (killed mid-append)
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) and "id" in record else None


def _atomic_write(path: Path, data: bytes) -> None:
    """Write to a unique temporary name beside `path`, fsync, rename over it."""
    mode = path.stat().st_mode & 0o777 if path.is_file() else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)  # mkstemp makes 0600 files
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise

"""Results of one (checkpoint, suite): `samples.jsonl` (one record per item, appended as batches finish)
and `summary.json`. A rerun reads the ids already in `samples.jsonl` and skips them, so a crash loses at
most the batch in flight; a torn last line (killed mid-write) is dropped on open.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

FINGERPRINT_KEY = "item_fingerprint"  # hash of the item and the options it was run with (evals.common.cli)


class ResultsStore:
    """`<root>/<checkpoint name>/<suite>/{samples.jsonl, summary.json}`."""

    def __init__(self, root: str | Path, checkpoint_name: str, suite: str) -> None:
        self.dir = Path(root) / checkpoint_name / suite
        self.samples_path = self.dir / "samples.jsonl"
        self.summary_path = self.dir / "summary.json"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._records: dict[str, dict] = {}
        self._load()

    def _load(self) -> None:
        if not self.samples_path.is_file():
            return
        raw = self.samples_path.read_bytes()
        good_end = 0
        for line in raw.splitlines(keepends=True):
            if not line.endswith(b"\n"):
                break  # torn write of the last record: drop it, its item is redone
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                break
            if isinstance(record, dict) and "id" in record:
                self._records[str(record["id"])] = record
            good_end += len(line)
        if good_end != len(raw):
            with self.samples_path.open("r+b") as f:
                f.truncate(good_end)

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
        with self.samples_path.open("a", encoding="utf-8") as f:
            f.write(lines)
            f.flush()
            os.fsync(f.fileno())
        for r in records:
            self._records[str(r["id"])] = r

    def write_summary(self, summary: dict) -> Path:
        tmp = self.summary_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(summary, indent=1, default=str))
        os.replace(tmp, self.summary_path)
        return self.summary_path

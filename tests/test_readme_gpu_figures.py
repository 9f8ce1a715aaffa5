"""docs/gpu.md's table of the H100 paper-shape probe says what the raw files under bench/results/ say."""

import json
import re

from infra.models import PROJECT_ROOT

RAW = PROJECT_ROOT / "bench" / "results" / "2026-11-26-h100"
ROWS = {"packed rows": "probe-packed.json", "shared-prompt units": "probe-shared.json",
        "plain padded rows": "probe-unshared.json"}  # fmt: skip


def _row(readme: str, label: str) -> list[str]:
    line = next(x for x in readme.splitlines() if x.strip().startswith(f"| {label} |"))
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_the_h100_layout_table_matches_the_probe_files():
    readme = (PROJECT_ROOT / "docs" / "gpu.md").read_text()
    for label, name in ROWS.items():
        raw = json.loads((RAW / name).read_text())["layouts"][0]
        _, logprobs, update, peak, free = _row(readme, label)
        assert logprobs == f"{raw['logprobs_s']:.2f} s", label
        assert update == f"{raw['update_s']:.2f} s ({raw['micro_batches']})", label
        assert peak == f"{raw['update_peak_gib']:.1f} / {raw['update_reserved_gib']:.1f} GiB", label
        after_step = re.match(r"([\d.]+)", free).group(1)
        assert after_step == f"{raw['free_after_step_gib']:.1f}", label
        if "free_on_wake_gib" in raw:
            assert free.endswith(f"/ {raw['free_on_wake_gib']:.1f} GiB"), label
        else:
            assert "not read" in free, label
        if not raw["engine_fits_on_wake"]:
            assert f"the engine's {raw['engine_wants_gib']:.1f} GiB would not fit" in free, label

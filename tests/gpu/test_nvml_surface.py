"""The fake must not drift from pynvml: every name the backend uses exists in both, with
the same values for constants, so a green test run means the real module would work too."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import supervisor.gpu._nvml as nvml_backend
from supervisor.gpu.fake import FakeNvml

pynvml = pytest.importorskip("pynvml")
SRC = Path(nvml_backend.__file__).read_text()
USED = {n for n in re.findall(r"\bnv\.(\w+)", SRC)} | set(re.findall(r'"(nvml\w+|NVML_\w+)"', SRC))


def test_nvml_backend_names_exist_in_pynvml_and_the_fake() -> None:
    assert len(USED) > 25
    assert sorted(n for n in USED if not hasattr(pynvml, n)) == []
    assert sorted(n for n in USED if not hasattr(FakeNvml, n)) == []


def test_nvml_fake_constants_and_error_codes_match_pynvml() -> None:
    for name in USED:
        real = getattr(pynvml, name)
        if isinstance(real, int):
            assert getattr(FakeNvml, name) == real, name
    for cls in ("NVMLError_NotSupported", "NVMLError_NoPermission", "NVMLError_FunctionNotFound",
                "NVMLError_GpuIsLost", "NVMLError_Timeout", "NVMLError_LibraryNotFound"):
        assert getattr(FakeNvml, cls)().value == getattr(pynvml, cls)().value, cls
        assert str(getattr(FakeNvml, cls)()) == str(getattr(pynvml, cls)()), cls


def test_nvml_lazy_import() -> None:
    import subprocess
    import sys

    code = "import sys, supervisor.gpu, supervisor.host; print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"

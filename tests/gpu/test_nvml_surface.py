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


class _RealErrors(FakeNvml):
    """The fake's devices, raising pynvml's own exception classes (as the real module would)."""

    NVMLError = pynvml.NVMLError

    def _enter(self, h, metric):  # type: ignore[override]
        try:
            return super()._enter(h, metric)
        except Exception as e:
            code = getattr(e, "value", None)
            if code is None:
                raise
            if metric == "processes" and code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                # pynvml's unversioned wrapper turns FunctionNotFound into this
                raise pynvml.NVMLLibraryMismatchError("Unversioned function called ...") from None
            raise pynvml.NVMLError(code) from None


def test_nvml_backend_sorts_pynvml_exception_classes() -> None:
    from supervisor.gpu._nvml import NvmlBackend
    from supervisor.gpu.fake import FakeGpu, fake_uuid

    gpus = [FakeGpu(uuid=fake_uuid(0), errors={"power": pynvml.NVML_ERROR_NOT_SUPPORTED,
                                               "processes": pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
                                               "temperature": pynvml.NVML_ERROR_UNKNOWN}),
            FakeGpu(uuid=fake_uuid(1), lost_after=0.0)]
    b = NvmlBackend(_RealErrors(gpus))
    b.open({})
    for _ in range(3):
        rows = b.sample(set())
    assert [r.index for r in rows] == [0]
    assert rows[0].power_w is None and rows[0].proc_mem is None and rows[0].temp_c is None
    assert rows[0].util_gpu == 90
    notes = [(k, f.get("device"), f.get("metric"), f.get("error")) for k, f in b.drain_notes()]
    assert ("gpu-unsupported", 0, "power", "Not Supported") in notes
    assert ("gpu-unsupported", 0, "processes", "Unversioned function called ...") in notes
    assert ("gpu-error", 0, "temperature", "Unknown Error") in notes  # retried, journaled once
    assert ("gpu-lost", 1, None, "GPU is lost") in notes
    assert len(notes) == 4

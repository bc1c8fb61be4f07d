"""A stand-in ``pynvml`` for the chaos trials: ``supervisor.gpu.fake.FakeNvml`` built from
``$CHAOS_FAKE_NVML`` (JSON: ``{"gpus": [{FakeGpu fields…}], "init_error": code|null}``).

The trials put this directory first on ``PYTHONPATH``, so the real CLI's lazy
``import pynvml`` (``--gpu-backend nvml``) gets it and runs the real backend against it.
"""

import json
import os

from supervisor.gpu.fake import FakeGpu, FakeNvml, fake_uuid

_spec = json.loads(os.environ.get("CHAOS_FAKE_NVML") or '{"gpus": [{}]}')
_nvml = FakeNvml([FakeGpu(uuid=fake_uuid(i), **{k: (tuple(map(tuple, v)) if k == "xids" else v) for k, v in g.items()})
                  for i, g in enumerate(_spec["gpus"])], init_error=_spec.get("init_error"))


def __getattr__(name: str):
    return getattr(_nvml, name)

"""The hostile tests' one fixture: a tag that marks every process a test starts (``_util.marked``),
and whatever still carries it is killed when the test ends."""

from __future__ import annotations

import os

import pytest

from tests.hostile._util import kill_marked


@pytest.fixture
def tag(request):
    name = f"{request.node.name}-{os.getpid()}"
    yield name
    kill_marked(name)

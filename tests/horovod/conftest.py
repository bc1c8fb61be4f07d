"""What the horovodrun tests need: the Horovod that scripts/build-horovod.sh built, and which
controllers it has. A skip here names Horovod, so under .ci/run (REQUIRE_ALL_COMPONENTS=1)
it fails instead: setup builds Horovod there."""

from __future__ import annotations

import pytest

from tests.support.horovod import built_controllers


@pytest.fixture(scope="session")
def horovod_controllers() -> set[str]:
    found, why = built_controllers()
    if not found:
        pytest.skip(why or "horovod has neither the Gloo nor the MPI controller")
    return found


@pytest.fixture(params=["gloo", "mpi"])
def mode(request: pytest.FixtureRequest, horovod_controllers: set[str]) -> str:
    """horovodrun --gloo and horovodrun --mpi (OpenMPI's mpirun below a /bin/sh)."""
    if request.param not in horovod_controllers:
        pytest.skip(f"horovod was built without the {request.param} controller (bash scripts/build-horovod.sh)")
    return request.param

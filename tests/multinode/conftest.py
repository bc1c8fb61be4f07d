"""The multi-node cluster's fixtures: a cluster of three or four nodes for one test, always torn
down (``SlurmCluster``, tests/support/slurm.py; docs/multinode.md). Where this machine cannot
run one (not root, no Slurm), the test skips with the reason."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.support.slurm import SlurmCluster, cluster_for_test


@pytest.fixture
def cluster3() -> Iterator[SlurmCluster]:
    yield from cluster_for_test(3)


@pytest.fixture
def cluster3_ssh() -> Iterator[SlurmCluster]:
    """Three nodes with an sshd on each, as a cluster's compute nodes have (horovodrun)."""
    yield from cluster_for_test(3, sshd=True)


@pytest.fixture
def cluster4() -> Iterator[SlurmCluster]:
    """Four nodes: a 2-node job outlives two of them killed."""
    yield from cluster_for_test(4)

"""Which GPUs are the job's: CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS, SLURM_JOB_GPUS, all."""

from __future__ import annotations

from supervisor.gpu._select import select
from supervisor.gpu._types import DeviceInfo
from supervisor.gpu.fake import fake_uuid

DEVS = [DeviceInfo(index=i, uuid=fake_uuid(i)) for i in range(8)]
MIG = "MIG-12345678-aaaa-bbbb-cccc-1234567890ab"
DEVS_MIG = DEVS[:2] + [DeviceInfo(index=2, uuid=fake_uuid(2), mig=True, mig_uuids=(MIG,))]


def idx(env: dict[str, str], devs=DEVS) -> tuple[list[int], str]:
    chosen, source = select(env, devs)
    return [d.index for d in chosen], source


def test_gpu_select_all_when_unconstrained() -> None:
    assert idx({}) == (list(range(8)), "all")


def test_gpu_select_cuda_visible_devices_indices_keep_cuda_order() -> None:
    assert idx({"CUDA_VISIBLE_DEVICES": "3,1"}) == ([3, 1], "CUDA_VISIBLE_DEVICES")


def test_gpu_select_cuda_visible_devices_full_and_prefix_uuids() -> None:
    env = {"CUDA_VISIBLE_DEVICES": f"{fake_uuid(5)}, {fake_uuid(2)[:13]}"}
    assert idx(env) == ([5, 2], "CUDA_VISIBLE_DEVICES")
    # an ambiguous prefix is invalid, and CUDA ignores everything from it on
    assert idx({"CUDA_VISIBLE_DEVICES": f"{fake_uuid(4)},GPU-0000,{fake_uuid(1)}"}) == ([4], "CUDA_VISIBLE_DEVICES")


def test_gpu_select_empty_or_invalid_cuda_visible_devices_means_none() -> None:
    assert idx({"CUDA_VISIBLE_DEVICES": ""}) == ([], "CUDA_VISIBLE_DEVICES")
    assert idx({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}) == ([], "CUDA_VISIBLE_DEVICES")
    assert idx({"CUDA_VISIBLE_DEVICES": "1,9,2"}) == ([1], "CUDA_VISIBLE_DEVICES")


def test_gpu_select_slurm_step_before_job_and_ranges() -> None:
    assert idx({"SLURM_JOB_GPUS": "0,1,2,3", "SLURM_STEP_GPUS": "2,3"}) == ([2, 3], "SLURM_STEP_GPUS")
    assert idx({"SLURM_JOB_GPUS": "4-6"}) == ([4, 5, 6], "SLURM_JOB_GPUS")
    assert idx({"SLURM_JOB_GPUS": ""}) == (list(range(8)), "all")
    assert idx({"CUDA_VISIBLE_DEVICES": "0", "SLURM_JOB_GPUS": "4"}) == ([0], "CUDA_VISIBLE_DEVICES")


def test_gpu_select_mig_uuid_picks_its_parent() -> None:
    assert idx({"CUDA_VISIBLE_DEVICES": MIG}, DEVS_MIG) == ([2], "CUDA_VISIBLE_DEVICES")
    old_form = f"MIG-{fake_uuid(2)}/1/0"
    assert idx({"CUDA_VISIBLE_DEVICES": old_form}, DEVS_MIG) == ([2], "CUDA_VISIBLE_DEVICES")

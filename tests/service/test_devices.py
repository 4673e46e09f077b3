"""Slot planning: one slot per GPU, each pinned with CUDA_VISIBLE_DEVICES; the CPU when there is none."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harness.config import Settings
from harness.service import devices
from harness.service.devices import SlotError, cuda_device_missing, plan_slots


@pytest.fixture
def settings(tmp_path):
    return Settings(data_dir=tmp_path)


def test_all_gpus_get_one_pinned_slot_each(monkeypatch, settings):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # the operator gave this worker two GPUs
    slots = plan_slots("all", settings)
    assert [(s.name, s.device, s.env["CUDA_VISIBLE_DEVICES"]) for s in slots] == [("cuda:0", "cuda", "2"),
                                                                                    ("cuda:1", "cuda", "3")]
    assert all(s.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" for s in slots)


def test_gpu_indices_count_among_the_visible_gpus(monkeypatch, settings):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaa,GPU-bbb,GPU-ccc")
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in plan_slots("2,0", settings)] == ["GPU-ccc", "GPU-aaa"]
    with pytest.raises(SlotError, match="no GPU 3: this machine shows 3"):
        plan_slots("0,3", settings)
    with pytest.raises(SlotError, match="twice"):
        plan_slots("1,1", settings)
    with pytest.raises(SlotError, match="all, none or GPU indices"):
        plan_slots("first", settings)


def test_no_gpu_means_one_cpu_slot(monkeypatch, settings):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    (slot,) = plan_slots("all", settings)
    assert (slot.name, slot.device, slot.env) == ("cpu", "cpu", {})
    assert plan_slots("none", settings)[0].device == "cpu"
    with pytest.raises(SlotError, match="shows no GPU"):
        plan_slots("0", settings)


def test_a_cuda_device_is_missing_when_cuda_visible_devices_hides_them_all(monkeypatch, settings):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert cuda_device_missing(settings) == "CUDA_VISIBLE_DEVICES='' hides every GPU"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    assert cuda_device_missing(settings) is None


def test_without_nvidia_smi_a_child_is_asked_and_a_failed_probe_decides_nothing(monkeypatch, settings):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devices.shutil, "which", lambda _name: None)
    seen: list[str] = []

    def probe(device: str, _settings: Settings, sees: str = "cpu") -> SimpleNamespace:
        seen.append(device)
        return SimpleNamespace(device=sees)

    monkeypatch.setattr(devices, "probe_device", probe)
    assert cuda_device_missing(settings) == "torch in a fresh process finds no CUDA device" and seen == ["auto"]
    monkeypatch.setattr(devices, "probe_device", lambda d, s: probe(d, s, sees="cuda"))
    assert cuda_device_missing(settings) is None

    def broken(_device: str, _settings: Settings) -> SimpleNamespace:
        raise RuntimeError("probing device 'auto' failed")

    monkeypatch.setattr(devices, "probe_device", broken)
    assert cuda_device_missing(settings) is None  # the evaluation's own probe reports the harness's fault

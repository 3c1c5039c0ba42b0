"""CUDA index -> NVML index: identity first, CUDA_VISIBLE_DEVICES only as a last resort."""

from __future__ import annotations

import pytest

from mgprof.collect.devices.device_map import (
    DeviceMapError,
    cuda_device_identity,
    normalize_pci_bus_id,
    resolve_nvml_device,
    resolve_nvml_index,
)

UUIDS = [f"GPU-{i:08x}-1111-2222-3333-44445555666{i}" for i in range(4)]
FACTS = [
    {
        "nvml_index": i,
        "name": "NVIDIA H200",
        "uuid": UUIDS[i],
        "pci_bus_id": f"00000000:{0x19 + 0x10 * i:02X}:00.0",
    }
    for i in range(4)
]


def test_pci_bus_id_normalisation() -> None:
    assert normalize_pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalize_pci_bus_id("0000:3b:00.0") == "0000:3b:00.0"
    assert normalize_pci_bus_id("3b:00.0") == "0000:3b:00.0"
    assert normalize_pci_bus_id("not a bus id") is None


def test_uuid_wins_over_visible_devices() -> None:
    # torch's uuid may lack the GPU- prefix and differ in case; the CVD text is ignored.
    torch_uuid = UUIDS[2].removeprefix("GPU-").upper()
    match = resolve_nvml_device(FACTS, uuid=torch_uuid, cuda_visible_devices="0", cuda_index=0)
    assert (match.index, match.by) == (2, "uuid")


def test_pci_bus_id_with_other_domain_width_and_case() -> None:
    match = resolve_nvml_device(FACTS, pci_bus_id="0000:39:00.0", cuda_index=0)
    assert (match.index, match.by) == (2, "pci_bus_id")


def test_known_identity_that_matches_nothing_is_refused() -> None:
    with pytest.raises(DeviceMapError, match="matches none"):
        resolve_nvml_index(FACTS, uuid="GPU-deadbeef", cuda_visible_devices="0", cuda_index=0)


def test_visible_devices_renumbering_two_zero() -> None:
    cvd = "2,0"
    assert resolve_nvml_index(FACTS, cuda_visible_devices=cvd, cuda_index=0) == 2
    assert resolve_nvml_index(FACTS, cuda_visible_devices=cvd, cuda_index=1) == 0
    with pytest.raises(DeviceMapError, match="not among the 2"):
        resolve_nvml_index(FACTS, cuda_visible_devices=cvd, cuda_index=2)


def test_visible_devices_uuid_prefixes_and_truncation() -> None:
    cvd = f"{UUIDS[3][:12]}, 1, bogus, 0"
    assert resolve_nvml_index(FACTS, cuda_visible_devices=cvd, cuda_index=0) == 3
    assert resolve_nvml_index(FACTS, cuda_visible_devices=cvd, cuda_index=1) == 1
    # like the CUDA runtime, parsing stops at the first invalid entry: 'bogus' hides '0'
    with pytest.raises(DeviceMapError):
        resolve_nvml_index(FACTS, cuda_visible_devices=cvd, cuda_index=2)


def test_ambiguous_uuid_prefix_stops_parsing() -> None:
    with pytest.raises(DeviceMapError):
        resolve_nvml_index(FACTS, cuda_visible_devices="GPU-0000000", cuda_index=0)


def test_mig_entries_are_unsupported() -> None:
    with pytest.raises(DeviceMapError, match="MIG"):
        resolve_nvml_index(
            FACTS, cuda_visible_devices="MIG-1234abcd-aaaa-bbbb-cccc-dddddddddddd", cuda_index=0
        )


def test_mixed_models_need_pci_order_for_ordinals() -> None:
    mixed = [dict(FACTS[0]), dict(FACTS[1], name="NVIDIA A100-SXM4-80GB")]
    with pytest.raises(DeviceMapError, match="CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        resolve_nvml_index(mixed, cuda_visible_devices="1", cuda_index=0)
    with pytest.raises(DeviceMapError, match="CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        resolve_nvml_index(mixed, cuda_index=1)
    assert (
        resolve_nvml_index(
            mixed, cuda_visible_devices="1", cuda_index=0, cuda_device_order="PCI_BUS_ID"
        )
        == 1
    )


def test_no_visible_devices_variable_means_identity_on_uniform_machines() -> None:
    assert resolve_nvml_index(FACTS, cuda_index=3) == 3
    with pytest.raises(DeviceMapError, match="does not exist"):
        resolve_nvml_index(FACTS, cuda_index=4)


def test_cuda_device_identity_without_cuda_is_unknown() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        uuid, _ = cuda_device_identity(0)
        assert uuid is not None and uuid.startswith(("GPU-", "MIG-"))
    else:
        assert cuda_device_identity(0) == (None, None)

"""Vendors keyed by their common word, as HAMi's DevicesMap."""

from __future__ import annotations

from collections.abc import Iterator

from vgpu_operator.devices.protocol import DeviceVendor


class VendorRegistry:
    """An ordered map from common word to vendor; registration order is scan order."""

    def __init__(self) -> None:
        self._vendors: dict[str, DeviceVendor] = {}

    def register(self, vendor: DeviceVendor) -> None:
        word = vendor.common_word()
        if word in self._vendors:
            raise ValueError(f"a vendor with common word {word!r} is already registered")
        self._vendors[word] = vendor

    def get(self, word: str) -> DeviceVendor:
        try:
            return self._vendors[word]
        except KeyError:
            raise KeyError(f"no vendor registered for {word!r}") from None

    def words(self) -> list[str]:
        return list(self._vendors)

    def __iter__(self) -> Iterator[DeviceVendor]:
        return iter(self._vendors.values())

    def __len__(self) -> int:
        return len(self._vendors)

"""The binary codec on its own: exact round-trips, exact sizes, and errors that say where."""

from __future__ import annotations

import math
import random
import struct

import pytest

from capture_proxy.errors import StoreError
from capture_proxy.store import codec


def test_ids_round_trip_at_int32_limits():
    ids = [0, 1, -1, 2**31 - 1, -(2**31), 151_935]
    blob = codec.encode_ids(ids)
    assert len(blob) == 4 * len(ids)
    assert codec.decode_ids(blob) == ids


def test_out_of_range_id_names_its_index():
    with pytest.raises(StoreError, match="token id 2147483648 at index 2 does not fit in int32"):
        codec.encode_ids([5, 6, 2**31])


def test_logps_round_trip_bit_for_bit():
    values = [-5e-324, -1e-310, -0.0, 0.0, -1.0000000000000002, -math.inf, math.nan, -1 / 3]
    values += [-random.Random(0).random() * 10 ** -random.Random(i).randint(0, 300) for i in range(200)]
    blob = codec.encode_logps(values)
    assert len(blob) == 8 * len(values)
    back = codec.decode_logps(blob)
    assert struct.pack(f"<{len(back)}d", *back) == struct.pack(f"<{len(values)}d", *values)


@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 16, 17, 1000])
def test_mask_packs_eight_tokens_per_byte(length):
    mask = [random.Random(length).randint(0, 1) for _ in range(length)]
    blob = codec.encode_mask(mask)
    assert len(blob) == (length + 7) // 8
    assert codec.decode_mask(blob, length) == mask


@pytest.mark.parametrize(
    ("mask", "where"), [([0, 1, 2], "loss_mask\\[2\\] is 2"), ([-1], "loss_mask\\[0\\] is -1")]
)
def test_mask_holds_only_zeros_and_ones(mask, where):
    with pytest.raises(StoreError, match=where):
        codec.encode_mask(mask)


def test_mask_length_mismatch_is_detected():
    with pytest.raises(StoreError, match="2 bytes; 20 tokens need 3"):
        codec.decode_mask(codec.encode_mask([1] * 16), 20)

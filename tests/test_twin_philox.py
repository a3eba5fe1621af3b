"""The Ascend kernels' dropout keep mask (op_kernel/flash_attention_philox.h: Philox4x32-10
from the 910B vector unit's 16/32-bit integer instructions) on the twin, compared bit for
bit with contract.variant.keep_mask, which cpu and triton follow."""

from __future__ import annotations

import ctypes

import pytest
import torch

from flash_cann.contract import variant
from native_build import built


def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(built("twin/libflash_cann_twin.so")))
    lib.flash_cann_twin_drop_sync.restype = None
    lib.flash_cann_twin_drop_sync.argtypes = [ctypes.c_char_p]
    lib.flash_cann_twin_sync_sites.restype = ctypes.c_int64
    lib.flash_cann_twin_sync_sites.argtypes = [ctypes.c_char_p, ctypes.c_uint64]
    lib.flash_cann_twin_philox_keep.restype = ctypes.c_int
    lib.flash_cann_twin_philox_keep.argtypes = (
        [ctypes.c_void_p, ctypes.c_uint32] + [ctypes.c_uint32] * 7
        + [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64])
    return lib


def twin_keep(seed: int, offset: int, p: float, batch: int, head: int, row0: int, rows: int,
              col0: int, width: int, pass_elements: int) -> torch.Tensor:
    """The generator's rows x width keep mask (bool), as the twin computes it."""
    rng = torch.tensor([seed, offset], dtype=torch.int64)
    bits = torch.full((rows * width // 8,), 0xA5, dtype=torch.uint8)   # not all 0 or 1
    error = ctypes.create_string_buffer(4096)
    status = _library().flash_cann_twin_philox_keep(
        rng.data_ptr(), variant.dropout_threshold(p), batch, head, row0, rows, col0, width,
        pass_elements, bits.data_ptr(), error, len(error))
    assert status == 0, error.value.decode()
    unpacked = (bits.unsqueeze(1) >> torch.arange(8, dtype=torch.uint8)) & 1   # bit e of byte e/8
    return unpacked.reshape(rows, width).bool()


def oracle_keep(seed, offset, p, batch, head, row0, rows, col0, width) -> torch.Tensor:
    rng = torch.tensor([seed, offset], dtype=torch.int64)
    i = torch.arange(row0, row0 + rows).view(-1, 1)
    j = torch.arange(col0, col0 + width).view(1, -1)
    return variant.keep_mask(rng, p, batch, head, i, j)


CASES = [
    # seed, offset, p, batch, head, row0, rows, col0, width, pass elements
    (0, 0, 0.1, 0, 0, 0, 2, 0, 128, 256),                     # two passes of one row
    (0x0123456789ABCDEF, 7, 0.5, 1, 3, 40, 4, 512, 64, 256),  # both seed words non-zero
    (-2, 2**40 + 5, 0.3, 3, 15, 1000, 3, 70000, 256, 768),    # negative seed, large offset
    (2**63 - 1, 2**32 - 1, 0.9, 2**16 + 1, 2**20, 2**24 + 3, 8, 2**31 - 64, 64, 512),
    (987654321, 0, 0.25, 0, 1, 0, 1, 0, 1024, 1024),          # one 1024-key round row
    (31337, 2**33, 0.2, 1, 5, 64, 16, 96, 96, 768),            # the backward's 96-key blocks
]


@pytest.mark.parametrize("case", CASES)
def test_bit_identical_to_variant_keep_mask(case):
    seed, offset, p, b, h, i0, rows, j0, width, pass_elements = case
    got = twin_keep(seed, offset, p, b, h, i0, rows, j0, width, pass_elements)
    want = oracle_keep(seed, offset, p, b, h, i0, rows, j0, width)
    assert torch.equal(got, want), f"{(got != want).sum()} of {got.numel()} bits differ"
    assert 0 < want.sum() < want.numel()   # the case tells kept from dropped


@pytest.mark.parametrize("p", [1e-9, 2.0**-32, 0.999999, 1 - 2.0**-24])
def test_threshold_edges(p):
    """p tiny (threshold 0..few: nearly all kept) and p near 1 (threshold near 2^32):
    the 16-bit split compare is exact at both ends."""
    args = (0x5EED5EED5EED, 11, p, 1, 2, 5, 4, 64, 256, 1024)
    got = twin_keep(*args)
    want = oracle_keep(*args[:-1])
    assert torch.equal(got, want)


def test_threshold_is_exact_next_to_a_draw():
    """Thresholds equal to a draw, one above and one below it: each draw is compared
    exactly (a float32 compare of the whole 32-bit draw would round them together)."""
    seed, offset, b, h, i0, j0 = 99, 3, 0, 0, 0, 0
    rng = torch.tensor([seed, offset], dtype=torch.int64)
    draws = variant.philox(seed, torch.arange(64), 0, 0, b + offset)[0]
    draw = int(draws[5])
    for threshold in (draw - 1, draw, draw + 1):
        p = threshold / 2**32
        if variant.dropout_threshold(p) != threshold:   # p not representable as float32
            continue
        got = twin_keep(seed, offset, p, b, h, i0, 1, j0, 64, 256)
        want = variant.keep_mask(rng, p, b, h, torch.zeros(1, 1, dtype=torch.int64),
                                 torch.arange(64).view(1, -1))
        assert torch.equal(got, want)


def test_a_draw_equal_to_the_threshold_is_kept():
    """A draw whose value is a float32-exact threshold (its low 8 bits 0): with the
    threshold equal to it, that element is kept (draw >= threshold), in the twin and in
    variant.keep_mask alike."""
    seed, offset = 99, 3
    rng = torch.tensor([seed, offset], dtype=torch.int64)
    draws = variant.philox(seed, torch.arange(8192), 0, 0, offset)[0]
    exact = ((draws % 256 == 0) & (draws >= 2**24)).nonzero().flatten()
    assert exact.numel(), "no float32-exact draw among the first 8192 columns"
    col = int(exact[0])
    threshold = int(draws[col])
    p = threshold / 2**32
    assert variant.dropout_threshold(p) == threshold
    j0 = col - col % 64
    cols = torch.arange(j0, j0 + 64).view(1, -1)
    want = variant.keep_mask(rng, p, 0, 0, torch.zeros(1, 1, dtype=torch.int64), cols)
    assert bool(want[0, col - j0])          # the draw equal to the threshold is kept
    got = twin_keep(seed, offset, p, 0, 0, 0, 1, j0, 64, 256)
    assert torch.equal(got, want)


def test_every_barrier_of_the_generator_is_needed():
    """Race-checked on the twin, and no barrier is superfluous: with the happens-before
    edge of any PipeBarrier of flash_attention_philox.h dropped, the race detector stops
    the generator (two passes, so the pass-to-pass reuse of the scratch is covered)."""
    lib = _library()
    args = (0x0123456789ABCDEF, 7, 0.5, 1, 3, 40, 8, 512, 64, 256)
    twin_keep(*args)
    listing = ctypes.create_string_buffer(1 << 16)
    assert lib.flash_cann_twin_sync_sites(listing, len(listing)) > 0
    sites = sorted({line.split()[1] for line in listing.value.decode().splitlines()
                    if line.startswith("PipeBarrier ") and "flash_attention_philox.h" in line})
    assert len(sites) >= 20, sites
    uncaught = []
    try:
        for site in sites:
            lib.flash_cann_twin_drop_sync(site.encode())
            try:
                twin_keep(*args)
                uncaught.append(site)
            except AssertionError as error:
                assert "race" in str(error), str(error)
    finally:
        lib.flash_cann_twin_drop_sync(b"")
    assert not uncaught, f"barriers whose removal nothing catches: {uncaught}"


def test_a_slice_of_partial_repeats_is_refused():
    """A pass of 72 elements is not whole 64-element repeats: the twin stops the
    generator at its Compares (R25) instead of returning a silently truncated mask."""
    with pytest.raises(AssertionError, match=r"flash_attention_philox.h:\d+: \[R25\]"):
        twin_keep(1, 2, 0.5, 0, 0, 0, 1, 0, 72, 128)

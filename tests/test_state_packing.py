"""A task's state as kept (`split_encoder.pack_state`): int8 matrices scaled per row, float16 vectors."""

import torch
from openbook.split_encoder import MATRIX_DTYPE, SCALE_SUFFIX, STATE_DTYPE, pack_state, unpack_state


def test_packing_rounds_each_weight_within_half_its_rows_step():
    torch.manual_seed(0)
    state = {"w": torch.randn(8, 16) * torch.linspace(0.01, 3, 8)[:, None], "b": torch.randn(16)}
    state["w"][3] = 0  # a row of zeros keeps a positive scale and comes back zero
    packed = pack_state(state)
    assert packed["w"].dtype == MATRIX_DTYPE and packed["b"].dtype == STATE_DTYPE
    unpacked = unpack_state(packed)
    assert unpacked.keys() == state.keys()
    step = packed["w" + SCALE_SUFFIX].float()  # (8, 1): each row's largest magnitude / 127
    assert torch.all((unpacked["w"] - state["w"]).abs() <= step / 2 + 1e-3 * step)
    assert torch.equal(unpacked["w"][3], torch.zeros(16))
    assert torch.allclose(unpacked["b"], state["b"], atol=1e-3)
    assert packed["w"].abs().max() == 127

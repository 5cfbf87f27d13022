"""A LoRA branch's dropout kept as one tensor with its mask inside (lit_liger/kernels/dropout.py), and the LoRA layers
that draw it (lit_liger/swap/lora.py): the same masks, outputs and gradients as LitGPT's ``nn.Dropout``, one tensor kept."""

import copy

import pytest
import torch
from litgpt.lora import LoRALinear

from helpers import TOL, rel_err, saved_bytes
from lit_liger.swap.adapter import _swap_class
from lit_liger.swap.lora import _LoRAMixin
from lit_liger.kernels import dropout as D

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _x_with_zeros(shape, dtype, device, seed=0):
    """Random values with exact +0.0 and -0.0 in them (a kept -0.0 must not read as dropped)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    z = torch.rand(*shape, generator=g)
    x[z < 0.05] = 0.0
    x[(z >= 0.05) & (z < 0.1)] = -0.0
    return x.to(device=device, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("triton_path", [True, False])
def test_encoding_keeps_pytorch_mask_and_values(device, dtype, triton_path, monkeypatch):
    if not triton_path:  # the reference path (CPU tensors without the interpreter take it)
        monkeypatch.setattr(D, "use_triton", lambda t: False)
    x = _x_with_zeros((37, 129), dtype, device)  # odd sizes: partial blocks
    torch.manual_seed(5)
    ref = torch.nn.functional.dropout(x, 0.3, True)
    torch.manual_seed(5)
    xd, mask = torch.native_dropout(x, 0.3, True)
    assert torch.equal(xd, ref)  # the module's draw: nn.Dropout's
    D.encode_dropped_(xd, mask)
    assert torch.equal(D.kept(xd), mask)  # the mask comes back exactly, kept zeros included
    assert torch.equal(xd, ref)  # the same numbers (== ignores the sign of zero)
    assert (mask & (x == 0)).any() and (~mask).any()  # the test reached both cases
    # dx += dxd * mask / (1 - p), fp32 math
    dx0 = torch.randn(x.shape).to(device=device, dtype=dtype)
    dxd = torch.randn(x.shape).to(device=device, dtype=dtype)
    want = (dx0.double() + dxd.double() * mask / 0.7)
    got = D.dropout_grad_add_(dx0.clone(), dxd, xd, 1 / 0.7)
    assert rel_err(got, want) <= (1e-6 if dtype == torch.float32 else 4e-3)


def test_bad_inputs_are_refused(device):
    x = torch.randn(4, 6, device=device)
    xd, mask = torch.native_dropout(x, 0.5, True)
    with pytest.raises(ValueError, match="mask"):
        D.encode_dropped_(xd, mask[:, :3])
    with pytest.raises(TypeError, match="float64"):
        D.kept(xd.double())
    with pytest.raises(ValueError, match="contiguous"):
        D.kept(xd.t())
    with pytest.raises(ValueError, match="one shape"):
        D.dropout_grad_add_(xd.clone(), xd[:2], xd, 2.0)


def _pair(dtype, device, p=0.25):
    torch.manual_seed(0)
    stock = LoRALinear(96, 80, r=6, lora_alpha=12, lora_dropout=p, bias=True).to(device=device, dtype=dtype)
    torch.nn.init.normal_(stock.lora_B, std=0.2)  # LitGPT starts B at zero: the update would vanish
    stock.linear.weight.requires_grad_(False)
    stock.linear.bias.requires_grad_(False)
    ours = copy.deepcopy(stock)
    _swap_class(ours, _LoRAMixin)
    return stock, ours


@pytest.mark.parametrize("dtype", DTYPES)
def test_lora_layer_with_dropout_matches_litgpt_and_keeps_one_tensor(device, dtype):
    stock, ours = _pair(dtype, device)
    x0 = _x_with_zeros((3, 11, 96), dtype, device, seed=2)
    xs, xo = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    torch.manual_seed(1)
    ys, bytes_s = saved_bytes(lambda: stock(xs))
    torch.manual_seed(1)  # the same dropout mask: both draw it with the same call
    yo, bytes_o = saved_bytes(lambda: ours(xo))
    g = torch.randn_like(ys)
    ys.backward(g)
    yo.backward(g)
    tol = TOL[dtype]
    assert rel_err(yo, ys) < tol and rel_err(xo.grad, xs.grad) < tol
    for n in ("lora_A", "lora_B"):
        assert rel_err(getattr(ours, n).grad, getattr(stock, n).grad) < tol, n
    # the gradient of x where x is exactly zero (kept or dropped) follows the mask as LitGPT's does
    zero = x0 == 0
    assert rel_err(xo.grad[zero], xs.grad[zero]) < tol
    # LitGPT keeps the dropout's output and its mask (bool on CUDA, the scaled noise in x's dtype on CPU); the
    # swapped layer keeps the output alone: at least one byte an element less (keeping x beside the output, or
    # anything else of x's size, would not be)
    assert bytes_s - bytes_o >= x0.numel()


def test_eval_mode_and_fallbacks_draw_nothing(device):
    stock, ours = _pair(torch.float32, device)
    x = torch.randn(2, 5, 96, device=device)
    ours.eval(), stock.eval()
    assert torch.equal(ours(x), ours(x))  # no dropout in eval mode
    assert rel_err(ours(x), stock(x)) < 1e-5
    ours.train(), stock.train()
    xnc = torch.randn(2, 96, 5, device=device).transpose(1, 2)  # a non-contiguous input: nn.Dropout, then the GEMMs
    torch.manual_seed(3)
    ys = stock(xnc)
    torch.manual_seed(3)
    assert rel_err(ours(xnc), ys) < 1e-5

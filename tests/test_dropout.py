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


def _against_litgpt(stock, ours, x0, call=None, exclude=()):
    """Both layers on ``x0`` with the same dropout draw (``call(ours, x)``: how ours is called), backward with one
    gradient: outputs and gradients within the dtype's tolerance (the LoRA ones reset after). Returns the bytes each
    keeps for backward (``exclude``: storages not counted on ours') and the two inputs."""
    xs, xo = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    torch.manual_seed(1)
    ys, bytes_s = saved_bytes(lambda: stock(xs))
    torch.manual_seed(1)  # the same dropout mask: both draw it with the same call
    call = call or (lambda m, x: m(x))
    yo, bytes_o = saved_bytes(lambda: call(ours, xo), exclude=[xo, *exclude] if exclude else ())
    g = torch.randn_like(ys)
    ys.backward(g)
    yo.backward(g)
    tol = TOL[x0.dtype]
    assert rel_err(yo, ys) < tol and rel_err(xo.grad, xs.grad) < tol
    for n in ("lora_A", "lora_B"):
        assert rel_err(getattr(ours, n).grad, getattr(stock, n).grad) < tol, n
        getattr(ours, n).grad = getattr(stock, n).grad = None
    return bytes_s, bytes_o, xs, xo


@pytest.mark.parametrize("dtype", DTYPES)
def test_lora_layer_with_dropout_matches_litgpt_and_keeps_one_tensor(device, dtype):
    stock, ours = _pair(dtype, device)
    x0 = _x_with_zeros((3, 11, 96), dtype, device, seed=2)
    bytes_s, bytes_o, xs, xo = _against_litgpt(stock, ours, x0)
    tol = TOL[dtype]
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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("triton_path", [True, False])
@pytest.mark.parametrize("src", ["x", "silu", "gelu_tanh", "gelu"])
def test_mask_as_bits_gives_the_mask_and_the_dropped_input_back(device, dtype, triton_path, src, monkeypatch):
    from lit_liger.kernels.swiglu import _glu_fwd_impl, glu_reference

    if triton_path and not D.use_triton(torch.empty(0, device=device)):
        pytest.skip("CPU tensors without Triton's interpreter take the reference path only")
    if not triton_path:
        monkeypatch.setattr(D, "use_triton", lambda t: False)
    shape, p = (37, 131), 0.3  # 4,847 elements: the last byte holds 7 of them
    x = _x_with_zeros(shape, dtype, device)
    b = torch.randn(shape).to(device=device, dtype=dtype)
    # the forward's GLU product, as the path under test computes it (lit-liger's GLU kernel, or the reference)
    g = x if src == "x" else (_glu_fwd_impl(x, b, src) if triton_path else glu_reference(x, b, src))
    torch.manual_seed(5)
    xd, mask = torch.native_dropout(g, p, True)
    bits = D.pack_kept(mask)
    assert bits.dtype == torch.uint8 and bits.numel() == (g.numel() + 7) // 8
    assert torch.equal(D.unpack_kept(bits, g.numel()).view(shape), mask)
    dx0 = torch.randn(shape).to(device=device, dtype=dtype)
    dxd = torch.randn(shape).to(device=device, dtype=dtype)
    dx = dx0.clone()
    got = D.dropped_from_bits(bits, 1 / (1 - p), **(dict(x=x) if src == "x" else dict(glu=(x, b, src))), dx=dx,
                              dxd=dxd)
    assert rel_err(dx, dx0.double() + dxd.double() * mask / (1 - p)) <= (1e-6 if dtype == torch.float32 else 4e-3)
    # dropout(src) formed again: PyTorch's numbers within two units in the last place (CUDA's native_dropout scales in
    # fp32 and rounds once, its CPU kernel rounds twice in 16 bits, Triton's interpreter rounds toward zero)
    ulp = 2.0 ** -22 if dtype == torch.float32 else 2.0 ** (-6 if dtype == torch.bfloat16 else -9)
    assert ((got.float() - xd.float()).abs() <= xd.float().abs() * ulp).all()
    assert torch.equal(got == 0, (~mask) | (g == 0))
    alone = D.dropped_from_bits(bits, 1 / (1 - p), **(dict(x=x) if src == "x" else dict(glu=(x, b, src))))
    assert torch.equal(alone, got)  # without dx: the same dropped input
    assert (~mask).any() and mask.any()


def test_bits_bad_inputs_are_refused(device):
    mask = torch.rand(5, 9, device=device) < 0.5
    bits = D.pack_kept(mask)
    x = torch.randn(5, 9, device=device)
    with pytest.raises(ValueError, match="bool"):
        D.pack_kept(mask.float())
    with pytest.raises(ValueError, match="exactly one"):
        D.dropped_from_bits(bits, 2.0)
    with pytest.raises(ValueError, match="one shape"):
        D.dropped_from_bits(bits, 2.0, x=x, dx=x.clone(), dxd=x[:2].clone())
    with pytest.raises(ValueError, match="mask elements"):
        D.unpack_kept(bits[:-1], 45)


@pytest.mark.parametrize("dtype", DTYPES)
def test_lora_layer_keeping_its_input_keeps_the_mask_as_bits(device, dtype):
    """``keep_input`` (x held anyway, e.g. the attention's output): LitGPT's numbers; what the layer adds to what
    autograd keeps beside x is the mask's bits, where the encoded dropout keeps a copy of x."""
    from lit_liger.swap.lora import call_lora

    stock, ours = _pair(dtype, device)
    x0 = _x_with_zeros((3, 11, 96), dtype, device, seed=2)
    got = {keep: _against_litgpt(stock, ours, x0, lambda m, x: call_lora(m, x, keep_input=keep),
                                 exclude=list(ours.parameters()))[1] for keep in (False, True)}
    n = x0.numel()
    assert got[False] - got[True] == n * x0.element_size() - (n + 7) // 8


@pytest.mark.parametrize("dropout", [0.0, 0.2])
@pytest.mark.parametrize("name", ["Llama-3.2-1B", "gemma-2-2b"])
def test_lora_mlp_keeps_no_copy_of_its_inputs(device, name, dropout):
    """A LoRA MLP (``lora_mlp``): LitGPT's numbers, and beside the GLU's two inputs (which its backward keeps)
    autograd keeps only the LoRA branches' ``h`` and the dropout masks' bits: ``fc_1``/``fc_2`` share x, the LoRA
    ``proj`` forms the GLU product again from the GLU's inputs."""
    from litgpt.lora import GPT, Config, mark_only_lora_as_trainable
    from lit_liger import apply_liger

    cfg = Config.from_name(name, n_layer=1, n_embd=64, n_head=4, n_query_groups=2, head_size=16, intermediate_size=136,
                           padded_vocab_size=128, vocab_size=128, block_size=32, lora_r=4, lora_alpha=8,
                           lora_dropout=dropout, lora_mlp=True)
    torch.manual_seed(0)
    stock = GPT(cfg).to(device)
    for n_, p_ in stock.named_parameters():
        if "lora_B" in n_:
            torch.nn.init.normal_(p_, std=0.2)
    mark_only_lora_as_trainable(stock)
    ours = copy.deepcopy(stock)
    apply_liger(ours, {"fused_linear_cross_entropy": False})
    ms, mo = stock.transformer.h[0].mlp, ours.transformer.h[0].mlp
    assert is_swapped_lora(mo.proj)
    x0 = torch.randn(2, 9, 64, device=device)
    xs, xo = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    torch.manual_seed(1)
    ys = ms(xs)
    torch.manual_seed(1)
    yo, kept_bytes = saved_bytes(lambda: mo(xo), exclude=[xo, *mo.parameters()])
    g = torch.randn_like(ys)
    ys.backward(g)
    yo.backward(g)
    assert rel_err(yo, ys) < 1e-5 and rel_err(xo.grad, xs.grad) < 1e-5
    for (n_, ps), (_, po) in zip(ms.named_parameters(), mo.named_parameters()):
        if ps.requires_grad:
            assert rel_err(po.grad, ps.grad) < 1e-5, n_
    N, C, I, r = 18, 64, 136, 4
    bits = 2 * ((N * C + 7) // 8) + (N * I + 7) // 8 if dropout else 0
    assert kept_bytes == 2 * N * I * 4 + 3 * N * r * 4 + bits  # a, b; each LoRA layer's h; the masks' bits


def is_swapped_lora(m):
    return getattr(m, "_liger_lora_mixin", False)

import importlib

import pytest
import torch
import torch.nn.functional as F
from helpers import TOL, rel_err

from lit_liger.kernels import fused_linear_cross_entropy
from lit_liger.kernels.fused_linear_cross_entropy import fused_linear_cross_entropy_reference

# the module itself (the package attribute of the same name is the function)
flce = importlib.import_module("lit_liger.kernels.fused_linear_cross_entropy")

N, H, V = 37, 48, 301  # odd sizes: V is not a multiple of the V block or of the vocabulary chunk
IGNORE = -100
# per mode, a chunk size that does not divide the chunked dimension (rows for "fast", V for "lean")
CHUNK = {"fast": 16, "lean": 200}


def _inputs(device, dtype, shape=(N,), bias=False, ignored_share=0.25, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, H, generator=g).to(device=device, dtype=dtype).requires_grad_()
    w = (torch.randn(V, H, generator=g) / H**0.5 * 2).to(device=device, dtype=dtype).requires_grad_()
    b = (torch.randn(V, generator=g) * 0.5).to(device=device, dtype=dtype).requires_grad_() if bias else None
    t = torch.randint(0, V, shape, generator=g)
    t[torch.rand(shape, generator=g) < ignored_share] = IGNORE
    return x, w, b, t.to(device)


def _fp64(x, w, b, t, *, ignore_index=IGNORE, reduction="mean", softcap=None, label_smoothing=0.0, z_loss=0.0,
          num_valid_targets=None):
    """The loss from fp64 ``F.cross_entropy(F.linear(...))`` (softcap in fp64), and its fp64 leaves."""
    leaves = [v.detach().double().requires_grad_() if v is not None else None for v in (x, w, b)]
    x64, w64, b64 = leaves
    logits = F.linear(x64, w64, b64).reshape(-1, w.shape[0])  # (N, V) fp64
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    tt = t.reshape(-1)
    red = "sum" if num_valid_targets is not None else reduction
    loss = F.cross_entropy(logits, tt, ignore_index=ignore_index, reduction=red, label_smoothing=label_smoothing)
    if z_loss:
        valid = tt != ignore_index
        zl = z_loss * torch.logsumexp(logits, -1) ** 2 * valid
        loss = loss + {"none": zl, "sum": zl.sum(), "mean": zl.sum() / valid.sum()}[red]
    if num_valid_targets is not None:
        loss = loss / float(num_valid_targets)
    if reduction == "none":
        loss = loss.reshape(t.shape)
    return loss, leaves


def _check_against_fp64(x, w, b, t, dtype, opts, seed=0):
    loss = fused_linear_cross_entropy(x, w, t, b, **opts)
    ref_opts = {k: v for k, v in opts.items() if k not in ("mode", "chunk_size")}
    if isinstance(ref_opts.get("num_valid_targets"), torch.Tensor):
        ref_opts["num_valid_targets"] = ref_opts["num_valid_targets"].item()
    ref, leaves = _fp64(x, w, b, t, **ref_opts)
    assert loss.dtype == torch.float32 and loss.shape == ref.shape
    # bf16/fp16: the logits are rounded to the input dtype, as F.linear's are
    assert rel_err(loss, ref) <= (1e-5 if dtype == torch.float32 else 1e-3)
    go = torch.randn(loss.shape, generator=torch.Generator().manual_seed(seed + 1)).to(loss.device)
    mine = [v for v in (x, w, b) if v is not None]
    grads = torch.autograd.grad(loss, mine, go)
    grads_ref = torch.autograd.grad(ref, [v for v in leaves if v is not None], go.double())
    for name, gm, gr, v in zip("xwb", grads, grads_ref, mine):
        assert gm.dtype == v.dtype and gm.shape == v.shape, name
        assert rel_err(gm, gr) <= TOL[dtype], (name, rel_err(gm, gr))


CASES = {
    "plain": dict(),
    "all_options": dict(bias=True, softcap=5.0, label_smoothing=0.1, z_loss=1e-3),
    "sum_softcap": dict(reduction="sum", softcap=2.0),
    "none_bias_zloss_smoothing": dict(reduction="none", bias=True, z_loss=1e-2, label_smoothing=0.05),
    "num_valid_int": dict(num_valid_targets=50, label_smoothing=0.2),
    "num_valid_tensor": dict(num_valid_targets="tensor", bias=True, softcap=30.0),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["fast", "lean"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_fp64(case, mode, dtype, device, monkeypatch):
    # a V block of 128 makes the kernels loop over a row (V = 301: blocks of 128, 128, 45); tiles of
    # 8 rows per program under the interpreter leave a partly masked last tile
    monkeypatch.setattr(flce, "_MAX_V_BLOCK", 128)
    monkeypatch.setattr(flce, "_INTERPRET_ROWS", 8)
    opts = dict(CASES[case])
    bias = opts.pop("bias", False)
    x, w, b, t = _inputs(device, dtype, bias=bias)
    if opts.get("num_valid_targets") == "tensor":
        opts["num_valid_targets"] = torch.tensor(61, device=device)  # e.g. the global count under DDP
    # "plain" runs the automatic chunk size
    chunk = None if case == "plain" else CHUNK[mode]
    _check_against_fp64(x, w, b, t, dtype, dict(opts, mode=mode, chunk_size=chunk))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["fast", "lean"])
def test_no_buffer_relies_on_zeroed_memory(mode, dtype, device, monkeypatch):
    # the fp32 accumulators (dW in "fast", dx in "lean") are written by the first chunk's GEMM, not
    # zero-filled: with every fresh buffer full of NaN the result must not change
    empty, empty_like = torch.empty, torch.empty_like

    def poisoned(make):
        def make_nan(*args, **kwargs):
            out = make(*args, **kwargs)
            return out.fill_(float("nan")) if out.is_floating_point() else out
        return make_nan

    monkeypatch.setattr(torch, "empty", poisoned(empty))
    monkeypatch.setattr(torch, "empty_like", poisoned(empty_like))
    x, w, b, t = _inputs(device, dtype, bias=True)
    _check_against_fp64(x, w, b, t, dtype, dict(mode=mode, chunk_size=CHUNK[mode], softcap=5.0))


@pytest.mark.parametrize("mode", ["fast", "lean"])
def test_one_row_per_program(mode, device, monkeypatch):
    # the GPU launches one row per program; run that tile shape under the interpreter too
    monkeypatch.setattr(flce, "_INTERPRET_ROWS", 1)
    monkeypatch.setattr(flce, "_MAX_V_BLOCK", 128)
    x, w, b, t = _inputs(device, torch.bfloat16, shape=(13,), bias=True)
    opts = dict(softcap=5.0, label_smoothing=0.1, z_loss=1e-3, mode=mode, chunk_size=CHUNK[mode])
    _check_against_fp64(x, w, b, t, torch.bfloat16, opts)


@pytest.mark.parametrize("mode", ["fast", "lean"])
def test_fp16(mode, device):
    x, w, b, t = _inputs(device, torch.float16, bias=True)
    opts = dict(softcap=5.0, label_smoothing=0.1, z_loss=1e-3, mode=mode, chunk_size=CHUNK[mode])
    _check_against_fp64(x, w, b, t, torch.float16, opts)


@pytest.mark.parametrize("mode", ["fast", "lean"])
def test_3d_non_contiguous(mode, device):
    # x (B, T, H) as a transposed view, target (B, T) as a transposed view
    x0, w, b, t0 = _inputs(device, torch.float32, shape=(7, 3), bias=True)
    x = x0.transpose(0, 1)  # (3, 7, H), not contiguous
    t = t0.t()  # (3, 7)
    assert not x.is_contiguous() and not t.is_contiguous()
    for reduction in ("mean", "none"):
        opts = dict(mode=mode, chunk_size=CHUNK[mode], reduction=reduction, z_loss=1e-3)
        loss = fused_linear_cross_entropy(x, w, t, b, **opts)
        ref, leaves = _fp64(x, w, b, t, reduction=reduction, z_loss=1e-3)
        assert loss.shape == ref.shape
        assert rel_err(loss, ref) <= 1e-5
        go = torch.randn_like(loss)
        for gm, gr in zip(torch.autograd.grad(loss, (x0, w, b), go), torch.autograd.grad(ref, leaves, go.double())):
            assert rel_err(gm, gr.transpose(0, 1) if gm.dim() == 3 else gr) <= 1e-5


@pytest.mark.parametrize("mode", ["fast", "lean"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_all_ignored(mode, reduction, device):
    x, w, b, t = _inputs(device, torch.float32, bias=True)
    t = torch.full_like(t, IGNORE)
    loss = fused_linear_cross_entropy(x, w, t, b, reduction=reduction, mode=mode, z_loss=1e-3, label_smoothing=0.1)
    assert torch.isfinite(loss).all() and (loss == 0).all()
    grads = torch.autograd.grad(loss.sum(), (x, w, b))
    for g in grads:
        assert torch.isfinite(g).all() and (g == 0).all()


class _Counter:
    """Wraps a module-level function and counts its calls."""

    def __init__(self, monkeypatch, name):
        self.calls = 0
        fn = getattr(flce, name)

        def wrapped(*args, **kwargs):
            self.calls += 1
            return fn(*args, **kwargs)

        monkeypatch.setattr(flce, name, wrapped)


@pytest.mark.parametrize("mode", ["fast", "lean"])
def test_frozen_weight_skips_weight_gemm(mode, device, monkeypatch):
    dw_gemm = _Counter(monkeypatch, "_grad_weight_gemm")
    dx_gemm = _Counter(monkeypatch, "_grad_input_gemm")
    x, w, b, t = _inputs(device, torch.float32, bias=True)
    w.requires_grad_(False)  # LoRA: frozen lm_head
    loss = fused_linear_cross_entropy(x, w, t, b, mode=mode, chunk_size=CHUNK[mode], softcap=5.0)
    loss.backward()
    assert w.grad is None and dw_gemm.calls == 0 and dx_gemm.calls > 0
    ref, (x64, _, b64) = _fp64(x, w, b, t, softcap=5.0)
    gx, gb = torch.autograd.grad(ref, (x64, b64))
    assert rel_err(x.grad, gx) <= 1e-5 and rel_err(b.grad, gb) <= 1e-5
    # and the other way round: x without grad (e.g. a detached input) skips the dx GEMM
    dx_gemm.calls = dw_gemm.calls = 0
    x2 = x.detach()
    w.requires_grad_(True)
    fused_linear_cross_entropy(x2, w, t, mode=mode, chunk_size=CHUNK[mode]).backward()
    assert dx_gemm.calls == 0 and dw_gemm.calls > 0 and w.grad is not None


@pytest.mark.parametrize("mode", ["fast", "lean"])
def test_no_grad_forward(mode, device, monkeypatch):
    dw_gemm = _Counter(monkeypatch, "_grad_weight_gemm")
    dx_gemm = _Counter(monkeypatch, "_grad_input_gemm")
    x, w, b, t = _inputs(device, torch.float32, bias=True)
    with torch.no_grad():
        loss = fused_linear_cross_entropy(x, w, t, b, mode=mode, label_smoothing=0.1)
    assert dw_gemm.calls == 0 and dx_gemm.calls == 0
    assert rel_err(loss, _fp64(x, w, b, t, label_smoothing=0.1)[0]) <= 1e-5


def test_weight_gradient_accumulates_in_fp32(device, monkeypatch):
    # "fast" mode: the row chunks' weight gradients are summed in an fp32 buffer (the first chunk
    # writes it, the others add to it), cast once at the end
    seen = []
    mm = flce._mm_fp32

    def spy(out, a, b, accumulate):
        seen.append((out.dtype, a.dtype, accumulate))
        return mm(out, a, b, accumulate)

    monkeypatch.setattr(flce, "_mm_fp32", spy)
    x, w, _, t = _inputs(device, torch.bfloat16)
    loss = fused_linear_cross_entropy(x, w, t, mode="fast", chunk_size=5)
    (gw,) = torch.autograd.grad(loss, (w,))
    assert seen == [(torch.float32, torch.bfloat16, False)] + [(torch.float32, torch.bfloat16, True)] * 7
    assert gw.dtype == torch.bfloat16
    ref, (_, w64, _) = _fp64(x, w, None, t)
    (gw64,) = torch.autograd.grad(ref, (w64,))
    assert rel_err(gw, gw64) <= 1e-2


def test_single_chunk_writes_weight_gradient_without_fp32_buffer(device, monkeypatch):
    # "fast" mode with all rows in one chunk: nothing to accumulate across chunks, so the one GEMM
    # (fp32 accumulation inside, one rounding) writes dW in the weight's dtype: no (V, H) fp32 buffer
    # (1 GB at V=128k, H=2048), which would cost small batches more than the logits it saves
    fp32_calls, made = [], []
    mm, empty = flce._mm_fp32, torch.empty

    def spy_mm(out, a, b, accumulate):
        fp32_calls.append(out.shape)
        return mm(out, a, b, accumulate)

    def spy_empty(*args, **kwargs):
        out = empty(*args, **kwargs)
        made.append((tuple(out.shape), out.dtype))
        return out

    monkeypatch.setattr(flce, "_mm_fp32", spy_mm)
    monkeypatch.setattr(torch, "empty", spy_empty)
    x, w, _, t = _inputs(device, torch.bfloat16)
    loss = fused_linear_cross_entropy(x, w, t, mode="fast", chunk_size=x.shape[0])
    gx, gw = torch.autograd.grad(loss, (x, w))
    monkeypatch.setattr(torch, "empty", empty)
    assert fp32_calls == []
    assert (tuple(w.shape), torch.float32) not in made and (tuple(w.shape), torch.bfloat16) in made
    ref, (x64, w64, _) = _fp64(x, w, None, t)
    for mine, theirs in zip((gx, gw), torch.autograd.grad(ref, (x64, w64))):
        assert mine.dtype == torch.bfloat16 and rel_err(mine, theirs) <= TOL[torch.bfloat16]
    # two chunks: back to the fp32 accumulator
    fused_linear_cross_entropy(x, w, t, mode="fast", chunk_size=x.shape[0] - 1).backward()
    assert len(fp32_calls) == 2


@pytest.mark.parametrize("mode", ["fast", "lean"])
def test_gradients_handed_over_without_copy(mode, device, monkeypatch):
    # dx and dW are computed in the forward; autograd must take those very buffers as x.grad and
    # weight.grad. A clone there would add a second (V, H) dW (and (N, H) dx) at the start of the
    # backward, when a model's activations are at their peak. The one exception: "fast" over several
    # chunks hands the backward its fp32 dW accumulator, which the backward casts (the cast the forward
    # would otherwise make) into the gradient.
    made = []
    compute = flce._compute

    def spy(*args, **kwargs):
        out = compute(*args, **kwargs)
        made.append((out[1].data_ptr(), out[2].data_ptr(), out[2].dtype))
        return out

    monkeypatch.setattr(flce, "_compute", spy)
    x, w, _, t = _inputs(device, torch.bfloat16)
    fused_linear_cross_entropy(x, w, t, mode=mode, chunk_size=CHUNK[mode]).backward()
    assert len(made) == 1 and made[0][0] == x.grad.data_ptr()
    assert w.grad.dtype == torch.bfloat16
    if mode == "fast":  # N > CHUNK["fast"] rows: several chunks
        assert made[0][2] == torch.float32 and made[0][1] != w.grad.data_ptr()
    else:
        assert made[0][1:] == (w.grad.data_ptr(), torch.bfloat16)


def test_fp32_dw_kept_for_the_backward_only_where_rows_take_several_chunks(device):
    # _keeps_fp32_dw decides from the shapes alone (the fake implementation asks it too): the forward's dW
    # output is fp32 exactly where the rows take more than one chunk, and the weight's dtype otherwise
    x, w, _, t = _inputs(device, torch.bfloat16)
    args = (None, None, -1, IGNORE, "mean", 0.0, 0.0, 0.0, "fast")
    for chunk, want in ((N // 2, torch.float32), (N, torch.bfloat16), (2 * N, torch.bfloat16)):
        _, _, dw, *_ = flce._flce_fwd(x.detach(), w.detach(), t, *args, chunk, True, True, False)
        assert dw.dtype == want, chunk
        fake = flce._flce_fwd(x.detach().to("meta"), w.detach().to("meta"), t.to("meta"), *args, chunk,
                              True, True, False)
        assert fake[2].dtype == want and fake[2].shape == w.shape, chunk
    # a frozen head, "lean" and fp32 weights never keep an fp32 buffer of their own
    _, _, dw, *_ = flce._flce_fwd(x.detach(), w.detach(), t, *args[:-1], "lean", 16, True, True, False)
    assert dw.dtype == torch.bfloat16
    _, _, dw, *_ = flce._flce_fwd(x.detach().float(), w.detach().float(), t, *args, N // 2, True, True, False)
    assert dw.dtype == torch.float32
    assert not flce._keeps_fp32_dw(N, V, 2, x.device, N // 2, False, "fast", torch.bfloat16)


def test_scale_into_rounds_once(device):
    # dst = src * g in fp32, rounded once to dst's dtype: from an fp32 source (the kept dW accumulator) and in place
    g = torch.tensor(1.0 / 3.0, device=device)
    src = torch.randn(3, 1000, generator=torch.Generator().manual_seed(3)).to(device)
    out = torch.empty(3, 1000, dtype=torch.bfloat16, device=device)
    flce._scale_into(out, g, src)
    _assert_rounded_once(out, src * g, device)
    inplace = src.bfloat16()
    flce._scale_into(inplace, g)
    _assert_rounded_once(inplace, src.bfloat16().float() * g, device)


def _assert_rounded_once(got, want32, device):
    """``got`` (bf16) is ``want32`` (fp32) rounded once: to nearest on a GPU; Triton's interpreter truncates, so
    on a CPU within one bf16 step (2**-7 relative) of it."""
    assert torch.all((got.float() - want32).abs() <= want32.abs() * 2**-7)
    if torch.device(device).type == "cuda":
        assert torch.equal(got, want32.bfloat16())


@pytest.mark.parametrize("mode", ["fast", "lean"])
def test_backward_allocates_nothing_gradient_sized(mode, device):
    # The backward only scales the gradients made in the forward. Every tensor of at least x's size
    # that an op returns during the backward must be one of the final gradients (the in-place
    # scaling); anything else is a second copy at the start of the backward (autograd zero-filling
    # the unused dx/dW outputs' gradients did exactly that: +dW +dx, 533 MiB at V=128k).
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for o in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(o, torch.Tensor) and o.numel() >= N * H:
                    seen.append((str(func), o.untyped_storage().data_ptr()))
            return out

    x, w, b, t = _inputs(device, torch.bfloat16, bias=True)
    loss = fused_linear_cross_entropy(x, w, t, b, mode=mode, chunk_size=CHUNK[mode])
    with Record():
        loss.backward()
    grads = {g.untyped_storage().data_ptr() for g in (x.grad, w.grad)}
    assert seen, "the backward should scale dx and dW in place"
    assert all(ptr in grads for _, ptr in seen), seen


def test_second_backward_fails_loudly(device):
    # the stored gradients are scaled in place by grad_output: a second backward through the same graph
    # must raise (autograd's saved-tensor version check), not return wrongly scaled gradients
    x, w, _, t = _inputs(device, torch.float32)
    loss = fused_linear_cross_entropy(x, w, t)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="inplace|modified"):
        loss.backward()


def test_autocast(device):
    x, w, b, t = _inputs(device, torch.float32, bias=True)
    dev = torch.device(device).type
    with torch.autocast(dev, dtype=torch.bfloat16):
        loss = fused_linear_cross_entropy(x, w, t, b)
    ref, leaves = _fp64(x.bfloat16(), w.bfloat16(), b.bfloat16(), t)
    assert rel_err(loss, ref) <= 1e-3
    grads = torch.autograd.grad(loss, (x, w, b))
    assert all(g.dtype == torch.float32 for g in grads)
    for gm, gr in zip(grads, torch.autograd.grad(ref, leaves)):
        assert rel_err(gm, gr) <= 1e-2


@pytest.mark.parametrize("mode", ["fast", "lean"])
def test_bad_targets_raise(mode, device, monkeypatch):
    if device == "cuda":  # CUDA checks eagerly only on request (a host sync); CPU always does
        monkeypatch.setattr(flce, "CHECK_TARGETS", True)
    x, w, _, t = _inputs(device, torch.float32)
    for bad in (V, -1, 10**6):
        t2 = t.clone()
        t2[3] = bad
        with pytest.raises(ValueError, match="outside"):
            fused_linear_cross_entropy(x, w, t2, mode=mode)
    # ignore_index itself is fine even though it is negative
    fused_linear_cross_entropy(x, w, torch.full_like(t, -7), ignore_index=-7, mode=mode)


def test_bad_inputs(device):
    x, w, b, t = _inputs(device, torch.float32, bias=True)
    f = fused_linear_cross_entropy
    with pytest.raises(TypeError, match="dtype"):
        f(x, w.double().float().half(), t)
    with pytest.raises(TypeError, match="integer"):
        f(x, w, t.float())
    with pytest.raises(ValueError, match="target shape"):
        f(x, w, t[:-1])
    with pytest.raises(ValueError, match="last dimension"):
        f(x[:, :-1], w, t)
    with pytest.raises(ValueError, match="2-D"):
        f(x, w[0], t)
    with pytest.raises(ValueError, match="bias"):
        f(x, w, t, b[:-1])
    for kwargs, match in [
        (dict(reduction="avg"), "reduction"),
        (dict(mode="turbo"), "mode"),
        (dict(softcap=0.0), "softcap"),
        (dict(label_smoothing=1.5), "label_smoothing"),
        (dict(z_loss=-1.0), "z_loss"),
        (dict(chunk_size=0), "chunk_size"),
        (dict(max_chunk_bytes=0), "max_chunk_bytes"),
        (dict(max_chunk_bytes=2.5), "max_chunk_bytes"),
        (dict(num_valid_targets=-3), "num_valid_targets"),
        (dict(num_valid_targets=10, reduction="sum"), "num_valid_targets"),
    ]:
        with pytest.raises(ValueError, match=match):
            f(x, w, t, **kwargs)
    if device == "cpu":
        with pytest.raises(ValueError, match="device"):
            f(x, w.detach().to("meta"), t)


def test_meta_device():
    x = torch.randn(2, 5, H, device="meta")
    w = torch.randn(V, H, device="meta", requires_grad=True)
    t = torch.zeros(2, 5, dtype=torch.long, device="meta")
    assert fused_linear_cross_entropy(x, w, t).shape == ()
    assert fused_linear_cross_entropy(x, w, t, reduction="none").shape == (2, 5)
    loss, dx, dw, db, *lora = torch.ops.lit_liger.flce_fwd(
        x.reshape(10, H), w, t.reshape(10), None, None, -1, IGNORE, "mean", 0.0, 0.0, 0.0, "fast", 0, True, True, False
    )
    assert loss.shape == () and dx.shape == (10, H) and dw.shape == (V, H) and db.shape == (0,)
    assert [t.shape for t in lora] == [(0,)] * 3  # no LoRA head: its three gradients are empty
    dx, dw, db, *_ = torch.ops.lit_liger.flce_bwd_rows(
        torch.ones(10, device="meta"), x.reshape(10, H), w, t.reshape(10), None, IGNORE, 0.0, 0.0, 0.0, "lean", 0,
        True, False, False,
    )
    assert dx.shape == (10, H) and dw.shape == (0,)


def test_reference_path_without_interpreter(monkeypatch):
    # CPU tensors without the interpreter take the plain PyTorch reference (fp32 logits)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    dw_gemm = _Counter(monkeypatch, "_grad_weight_gemm")
    x, w, b, t = _inputs("cpu", torch.float32, shape=(3, 11), bias=True)
    opts = dict(softcap=5.0, label_smoothing=0.1, z_loss=1e-3)
    for reduction in ("mean", "sum", "none"):
        loss = fused_linear_cross_entropy(x, w, t, b, reduction=reduction, **opts)
        ref, leaves = _fp64(x, w, b, t, reduction=reduction, **opts)
        assert rel_err(loss, ref) <= 1e-5
        go = torch.randn_like(loss)
        for gm, gr in zip(torch.autograd.grad(loss, (x, w, b), go), torch.autograd.grad(ref, leaves, go.double())):
            assert rel_err(gm, gr) <= 1e-5
    assert dw_gemm.calls == 0  # no kernel path ran
    loss = fused_linear_cross_entropy(x, w, torch.full_like(t, IGNORE), b)
    assert loss.item() == 0.0
    t2 = t.clone()
    t2[0, 0] = V
    with pytest.raises(ValueError, match="outside"):
        fused_linear_cross_entropy(x, w, t2, b)
    # the reference function itself, with a global count of valid targets
    ref = fused_linear_cross_entropy_reference(x, w, t, b, num_valid_targets=torch.tensor(40))
    assert rel_err(ref, _fp64(x, w, b, t, num_valid_targets=40)[0]) <= 1e-5


def test_chunk_sizes():
    cpu = torch.device("cpu")
    assert flce._row_chunk(37, 301, 4, cpu, 16) == 16
    assert flce._row_chunk(37, 301, 4, cpu, 100) == 37
    assert 1 <= flce._row_chunk(37, 301, 4, cpu, 0) <= 37
    assert flce._vocab_chunk(37, 301, 4, cpu, 200) == 200
    assert 1 <= flce._vocab_chunk(10**6, 301, 4, cpu, 0) <= 301
    # GPU-style rounding: as many chunks as the budget asks for, equal sizes in multiples of 128
    rows = flce._balanced(8192, 1024 - 128, 128)
    assert rows % 128 == 0 and -(-8192 // rows) == -(-8192 // 896)
    assert flce._balanced(100, 512, 128) == 100


def test_gpu_row_chunks_have_at_least_min_rows(monkeypatch):
    """On a GPU (device type only: the free-memory cap stubbed out) "fast" chunks hold the byte budget's rows or
    ``_FAST_MIN_ROWS``, whichever is more, where the weight's gradient is computed: each chunk costs a pass over the
    fp32 dW whatever V is, so a large vocabulary (gemma's 256k) no longer gets twice the chunks. A caller's byte cap
    still wins; a frozen head keeps the byte budget's chunks."""
    cuda = torch.device("cuda")
    monkeypatch.setattr(flce, "_chunk_budget", lambda device, default, free_memory=True: default)
    assert flce._FAST_MIN_ROWS == 2048
    assert flce._row_chunk(8192, 256000, 2, cuda, 0) == 2048  # the 512 MiB budget alone: 1024
    assert flce._row_chunk(8192, 128256, 2, cuda, 0) == 2048  # the budget's own 2048 (the swept case)
    assert flce._row_chunk(8192, 32000, 2, cuda, 0) == 8192  # small vocabulary: the budget allows one chunk
    assert flce._row_chunk(8192, 256000, 2, cuda, -100 * 2**20) == 128  # a 100 MiB cap: 204 rows, aligned down
    # a frozen head (LoRA) has no fp32 dW to pass over: the byte budget alone
    assert flce._row_chunk(8192, 256000, 2, cuda, 0, need_dw=False) == 1024
    # the forward keeps its fp32 dW for the backward where the shapes' budget takes several chunks
    assert flce._keeps_fp32_dw(8192, 256000, 2, cuda, 0, True, "fast", torch.bfloat16)
    assert not flce._keeps_fp32_dw(8192, 32000, 2, cuda, 0, True, "fast", torch.bfloat16)
    assert not flce._keeps_fp32_dw(8192, 256000, 2, cuda, 0, True, "lean", torch.bfloat16)


def test_max_chunk_bytes_caps_the_automatic_chunk(monkeypatch):
    """``max_chunk_bytes`` reaches the ops as a negative ``chunk_size`` and caps the automatic budget (never above the
    default, never below one row / vocabulary entry); an explicit ``chunk_size`` wins."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(flce, "_CPU_CHUNK_BYTES", 64 * 301 * 4)  # the default: 64 rows of V=301 fp32
    assert flce._chunk_arg(None, 10 * 301 * 4) == -10 * 301 * 4 and flce._chunk_arg(7, 999) == 7
    assert flce._chunk_arg(None, None) == 0
    assert flce._row_chunk(256, 301, 4, cpu, 0) == 64
    assert flce._row_chunk(250, 301, 4, cpu, -10 * 301 * 4) == 10
    assert flce._row_chunk(256, 301, 4, cpu, -10**12) == 64  # a cap above the default changes nothing
    assert flce._row_chunk(256, 301, 4, cpu, -1) == 1
    assert flce._vocab_chunk(20, 300, 4, cpu, -20 * 50 * 4) == 50
    # the op receives it, and chunks by it: same loss and gradients as an explicit chunk of those rows
    seen = []
    real = flce._row_chunk
    monkeypatch.setattr(flce, "_row_chunk", lambda *a: seen.append(a[4]) or real(*a))  # a[4]: chunk_size
    x, w, b, t = _inputs("cpu", torch.float32)
    loss = fused_linear_cross_entropy(x, w, t, b, max_chunk_bytes=10 * V * 4)
    loss.backward()
    assert seen == [-10 * V * 4]
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    ref = fused_linear_cross_entropy(x2, w2, t, b, chunk_size=10)
    ref.backward()
    assert torch.equal(loss, ref) and torch.equal(x.grad, x2.grad) and torch.equal(w.grad, w2.grad)


# ----------------------------------------------------------------------------------------------
# GPU (real sizes)
# ----------------------------------------------------------------------------------------------
def _llama_inputs(n=4096, h=2048, v=128256, ignored_share=0.2, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, h, device="cuda", generator=g).bfloat16().requires_grad_()
    w = (torch.randn(v, h, device="cuda", generator=g) * h**-0.5).bfloat16().requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda", generator=g)
    t[torch.rand(n, device="cuda", generator=g) < ignored_share] = IGNORE
    return x, w, t


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fast", "lean"])
@pytest.mark.parametrize("softcap", [None, 30.0])
def test_gpu_llama_vocab_bf16_vs_fp32(mode, softcap):
    x, w, t = _llama_inputs()
    loss = fused_linear_cross_entropy(x, w, t, mode=mode, softcap=softcap)
    gx, gw = torch.autograd.grad(loss, (x, w))
    x32, w32 = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    logits = F.linear(x32, w32)
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    ref = F.cross_entropy(logits, t, ignore_index=IGNORE)
    rx, rw = torch.autograd.grad(ref, (x32, w32))
    assert rel_err(loss, ref) <= 1e-3
    assert rel_err(gx, rx) <= 1e-2 and rel_err(gw, rw) <= 1e-2
    assert gw.dtype == torch.bfloat16


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fast", "lean"])
def test_gpu_compile_fullgraph_same_loss(mode):
    # ignored rows present: the anchor library's loss differs under compile exactly here
    x, w, t = _llama_inputs(n=1024, h=512, v=32003, ignored_share=0.3)
    torch._dynamo.reset()

    def f(x, w, t):
        return fused_linear_cross_entropy(x, w, t, mode=mode, softcap=30.0, z_loss=1e-4)

    compiled = torch.compile(f, fullgraph=True)
    loss_c = compiled(x, w, t)
    gc = torch.autograd.grad(loss_c, (x, w))
    loss_e = f(x, w, t)
    ge = torch.autograd.grad(loss_e, (x, w))
    assert torch.equal(loss_c, loss_e)  # the loss is computed inside the op either way
    for a, b in zip(gc, ge):
        assert rel_err(a, b) <= 1e-3  # grad_output scaling may be fused by inductor
    assert not torch._dynamo.utils.counters["graph_break"]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fast", "lean"])
def test_gpu_no_host_sync(mode):
    x, w, t = _llama_inputs(n=1024, h=512, v=32003)
    nv = torch.tensor(999, device="cuda")  # (an H2D copy from a Python int syncs: made before the check)
    for reduction in ("mean", "none"):
        kw = dict(mode=mode, reduction=reduction, num_valid_targets=nv if reduction == "mean" else None)
        fused_linear_cross_entropy(x, w, t, **kw).sum().backward()  # warm-up: kernel compile, feature probe
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            fused_linear_cross_entropy(x, w, t, **kw).sum().backward()
        finally:
            torch.cuda.set_sync_debug_mode(0)


@pytest.mark.gpu
def test_gpu_bad_target(monkeypatch):
    x, w, t = _llama_inputs(n=256, h=256, v=1003)
    t[5] = 1003
    # default: no host sync; the bad row makes the loss NaN, nothing is read out of bounds
    assert torch.isnan(fused_linear_cross_entropy(x, w, t)).item()
    assert torch.isnan(fused_linear_cross_entropy(x, w, t, mode="lean")).item()
    monkeypatch.setattr(flce, "CHECK_TARGETS", True)
    with pytest.raises(ValueError, match="outside"):
        fused_linear_cross_entropy(x, w, t)


@pytest.mark.parametrize("mode", ["fast", "lean"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_compile_fullgraph_traces(mode, reduction, device):
    # dynamo + AOTAutograd through the custom op's fake implementation with no graph break; the
    # "aot_eager" backend keeps CPU CI fast (inductor itself is exercised by the GPU test below)
    torch._dynamo.reset()
    x, w, b, t = _inputs(device, torch.float32, bias=True)
    nv = torch.tensor(40, device=device) if reduction == "mean" else None

    def f(x, w, t, b):
        return fused_linear_cross_entropy(x, w, t, b, mode=mode, reduction=reduction, softcap=5.0,
                                          num_valid_targets=nv)

    loss_c = torch.compile(f, fullgraph=True, backend="aot_eager")(x, w, t, b)
    loss_e = f(x, w, t, b)
    assert torch.equal(loss_c, loss_e)
    go = torch.randn_like(loss_e)
    for a, e in zip(torch.autograd.grad(loss_c, (x, w, b), go), torch.autograd.grad(loss_e, (x, w, b), go)):
        assert torch.equal(a, e)


def test_compile_traces_the_kept_fp32_dw(device):
    # bf16 over several "fast" chunks: the op's fake dW is fp32 (the accumulator handed to the backward) and the
    # backward's cast-and-scale op traces; gradients equal the eager ones, dW in the weight's dtype
    torch._dynamo.reset()
    x, w, _, t = _inputs(device, torch.bfloat16)

    def f(x, w, t):
        return fused_linear_cross_entropy(x, w, t, chunk_size=CHUNK["fast"])

    loss_c = torch.compile(f, fullgraph=True, backend="aot_eager")(x, w, t)
    loss_e = f(x, w, t)
    assert torch.equal(loss_c, loss_e)
    go = torch.tensor(0.37, device=device)
    got, want = torch.autograd.grad(loss_c, (x, w), go), torch.autograd.grad(loss_e, (x, w), go)
    for a, e in zip(got, want):
        assert a.dtype == torch.bfloat16 and torch.equal(a, e)
    ref, leaves = _fp64(x, w, None, t)
    leaves = [leaf for leaf in leaves if leaf is not None]  # (x, w)
    for a, r in zip(got, torch.autograd.grad(ref, leaves, torch.tensor(0.37, dtype=torch.float64))):
        assert rel_err(a, r) <= 1e-2


def test_scale_grad_custom_op_registration(device):
    """``torch.library.opcheck`` of the backward's cast-and-scale op: schema (the declared mutation of ``dst``),
    fake implementation."""
    if not flce.use_triton(torch.empty(0, device=device)):
        pytest.skip("reference path (no Triton)")
    g = torch.tensor(0.5, device=device)
    src = torch.randn(5, 33, device=device)
    dst = torch.empty(5, 33, dtype=torch.bfloat16, device=device)
    torch.library.opcheck(flce._scale_into, (dst, g, src), test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(flce._scale_into, (src.clone(), g), test_utils=("test_schema", "test_faketensor"))

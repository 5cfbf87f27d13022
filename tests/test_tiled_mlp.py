"""The tiled MLP (issue 68): ``lit_liger.swap.mlp.tiled_mlp`` runs any LitGPT MLP over sequence tiles in its forward and
in its backward's rerun, keeping only its input; a Block recomputed under the memory plan runs its MLP so where the
plan's ``tile`` says (``_checkpointed_block(..., tile)``). CPU, fp32 (the kernels through Triton's interpreter)."""

import pytest
import torch
from helpers import rel_err
from test_adapter import tiny_config
from test_checkpointing import _lora_pair
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

from lit_liger import LigerConfig, apply_liger
from lit_liger.swap import block as swap_block
from lit_liger.swap._common import _CHECKPOINTED, _scoped, _tiled
from lit_liger.swap.gpt import _checkpointed_block
from lit_liger.swap.mlp import tiled_mlp

TOL = 1e-5  # fp32: the tiles sum the weights' gradients in another order than one GEMM does


def _model(name: str, lora: bool = False, dropout: float = 0.0, swap: bool = True, **over):
    if lora:
        cfg, model, _ = _lora_pair(dropout, name, **over)
    else:
        from litgpt import GPT

        cfg = tiny_config(name, **over)
        torch.manual_seed(0)
        model = GPT(cfg)
    if swap:
        apply_liger(model, LigerConfig())
    return cfg, model


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


def _run(mlp: torch.nn.Module, x: torch.Tensor, tile: int, seed: int = 1):
    mlp.zero_grad(set_to_none=True)
    xi = x.detach().clone().requires_grad_()
    torch.manual_seed(seed)
    out = tiled_mlp(mlp, xi, tile)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    out.backward(g)
    return out.detach(), xi.grad, _grads(mlp)


@pytest.mark.parametrize("name, lora, frozen", [
    ("Llama-3.2-1B", False, False),  # SwiGLU, trained
    ("gemma-2-2b", False, False),  # GeGLU (tanh), trained
    ("pythia-14m", False, False),  # GptNeoxMLP's GELU, trained
    ("pythia-14m", False, True),  # the same frozen: only the input's gradient
    ("Llama-3.2-1B", True, False),  # LoRA on fc_1, fc_2, proj
])
def test_tiled_equals_untiled(name, lora, frozen):
    """Output, input gradient and every trained parameter's gradient: tiled (tiles of 5 tokens over B*T = 2 x 13, the
    last one short) against the MLP called whole."""
    cfg, model = _model(name, lora)
    mlp = model.transformer.h[0].mlp
    if frozen:
        mlp.requires_grad_(False)
    x = torch.randn(2, 13, cfg.n_embd)
    out_ref, dx_ref, g_ref = _run(mlp, x, 0)
    out, dx, g = _run(mlp, x, 5)
    assert rel_err(out, out_ref) <= TOL
    assert rel_err(dx, dx_ref) <= TOL
    assert g.keys() == g_ref.keys() and (len(g) > 0) != frozen
    for n in g:
        assert rel_err(g[n], g_ref[n]) <= TOL, n


def test_dropout_masks_are_the_forward_s():
    """LoRA dropout inside the tiles: the backward's reruns draw the forward's masks (the gradients equal autograd's
    through the same tiles run with grad), and the generator ends where the tiled forward left it."""
    cfg, model = _model("Llama-3.2-1B", lora=True, dropout=0.3)
    mlp = model.transformer.h[0].mlp
    x = torch.randn(1, 12, cfg.n_embd)
    out, dx, g = _run(mlp, x, 4, seed=7)
    after_tiled = torch.get_rng_state()
    # reference: the same tiles, in order, with grad
    mlp.zero_grad(set_to_none=True)
    xi = x.clone().requires_grad_()
    torch.manual_seed(7)
    ref = torch.cat([mlp(xi[:, s:s + 4]) for s in range(0, 12, 4)], dim=1)
    after_ref = torch.get_rng_state()
    ref.backward(torch.randn(ref.shape, generator=torch.Generator().manual_seed(2)))
    assert torch.equal(after_tiled, after_ref)
    assert rel_err(out, ref) <= TOL and rel_err(dx, xi.grad) <= TOL
    for n, p in mlp.named_parameters():
        if p.grad is not None:
            assert rel_err(g[n], p.grad) <= TOL, n
    # and the masks matter: another seed gives another output
    torch.manual_seed(8)
    assert rel_err(tiled_mlp(mlp, x, 4), out) > 1e-3


class _Largest(TorchDispatchMode):
    """The most elements of any tensor an op returns while active."""

    def __init__(self):
        super().__init__()
        self.most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(t, torch.Tensor):
                self.most = max(self.most, t.numel())
        return out


@pytest.mark.parametrize("name", ["Llama-3.2-1B", "pythia-14m"])
def test_no_tensor_of_the_whole_intermediate_width(name):
    """Forward and backward of a trained MLP over 512 tokens in tiles of 8: no op makes a tensor of (tokens x
    intermediate) elements; untiled, some op does (what the check catches)."""
    cfg, model = _model(name)
    mlp = model.transformer.h[0].mlp
    x = torch.randn(1, 512, cfg.n_embd)
    whole = 512 * cfg.intermediate_size
    seen = {}
    for tile in (0, 8):
        with _Largest() as mode:
            _run(mlp, x, tile)
        seen[tile] = mode.most
    assert seen[0] >= whole
    assert seen[8] < whole, (seen, whole)
    assert seen[8] <= max(8 * cfg.intermediate_size, cfg.n_embd * cfg.intermediate_size, 512 * cfg.n_embd)


@pytest.mark.parametrize("name, lora", [("Llama-3.2-1B", False), ("Llama-3.2-1B", True), ("pythia-14m", False),
                                        ("gemma-2-2b", True)])
def test_checkpointed_block_with_a_tile(name, lora, monkeypatch):
    """A swapped Block under ``torch.utils.checkpoint`` (as the memory plan recomputes it) with ``tile`` 6: the tiled
    MLP runs (in the forward and in the recompute), and the Block's output, its input's gradient and its parameters'
    gradients equal the untiled checkpointed Block's."""
    cfg, model = _model(name, lora)
    block = model.transformer.h[0]
    tiles = []
    real = swap_block.tiled_mlp
    monkeypatch.setattr(swap_block, "tiled_mlp", lambda mlp, x, tile, **kw: (tiles.append(tile), real(mlp, x, tile, **kw))[1])
    T = 20
    cos, sin = model.cos[:T].unsqueeze(0), model.sin[:T].unsqueeze(0)
    x = torch.randn(2, T, cfg.n_embd)
    results = {}
    for tile in (0, 6):
        block.zero_grad(set_to_none=True)
        tiles.clear()
        xi = x.clone().requires_grad_()
        out = checkpoint(_checkpointed_block, block, xi, cos, sin, None, tile, use_reentrant=False)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(3)))
        results[tile] = (out.detach(), xi.grad, _grads(block), list(tiles))
    assert results[6][3] == [6, 6] and not any(results[0][3])  # the forward and the recompute, tiled
    out0, dx0, g0, _ = results[0]
    out6, dx6, g6, _ = results[6]
    assert rel_err(out6, out0) <= TOL and rel_err(dx6, dx0) <= TOL
    assert g6.keys() == g0.keys() and len(g0) > 0
    for n in g0:
        assert rel_err(g6[n], g0[n]) <= TOL, n


def test_untiled_where_one_tile_holds_every_token_and_without_grad():
    """``tiled_mlp`` is the plain call where the tile covers the tokens; a Block's tile applies only with grad."""
    cfg, model = _model("Llama-3.2-1B")
    block = model.transformer.h[0]
    x = torch.randn(1, 8, cfg.n_embd, requires_grad=True)
    assert tiled_mlp(block.mlp, x, 8).grad_fn.name() != "_TiledMLPBackward"
    assert tiled_mlp(block.mlp, x, 4).grad_fn.name() == "_TiledMLPBackward"
    assert block._liger_tile(x) == 0
    with _tiled(block, 4):
        assert block._liger_tile(x) == 4
        with _tiled(block, 8):  # (one tile holds the 8 tokens)
            assert block._liger_tile(x) == 0
        with torch.no_grad():
            assert block._liger_tile(x) == 0
            with _scoped(block, _CHECKPOINTED):  # (the reentrant checkpoint's forward, the offloaded Blocks')
                assert block._liger_tile(x) == 4
    assert block._liger_tile(x) == 0


def test_frozen_glu_chunks_capped_by_bytes(monkeypatch):
    """``glu_mlp``'s chunks (a frozen GLU MLP in a checkpointed Block): a quarter of the rows, at most
    ``MLP_CHUNK_BYTES`` per ``(rows, I)`` tensor, at least ``MLP_MIN_ROWS`` rows."""
    from lit_liger.kernels import _launch

    assert _launch.mlp_chunk_rows(4096) == 1024
    assert _launch.mlp_chunk_rows(262144, 14336 * 2) == _launch.MLP_CHUNK_BYTES // (14336 * 2) == 9362
    assert _launch.mlp_chunk_rows(4096, 14336 * 2) == 1024  # (short sequences: the quarter, as before)
    monkeypatch.setattr(_launch, "MLP_CHUNK_BYTES", 1)
    assert _launch.mlp_chunk_rows(262144, 14336 * 2) == _launch.MLP_MIN_ROWS

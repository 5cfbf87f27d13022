"""Which ingredient makes the second CUDA-graph capture fail at full depth: one variant per process.
usage: python scripts/gpu_graph_diag2.py VARIANT   (see VARIANTS)"""
import os, sys, time, traceback
import torch
import torch.nn.functional as F
from litgpt.lora import GPT, Config, mark_only_lora_as_trainable
from lit_liger import LigerConfig, apply_liger, chunked_cross_entropy
from lit_liger import graphs as G

v = sys.argv[1]
layers = 2 if "l2" in v else 16
lora = "full" not in v
if "relaxed" in v:
    G.CAPTURE_ERROR_MODE = "relaxed"
if "nocudnnsdp" in v:
    torch.backends.cuda.enable_cudnn_sdp(False)
if "nocudnn" in v.split("+"):
    torch.backends.cudnn.enabled = False
kw = dict(lora_r=8, lora_alpha=16, lora_query=True, lora_value=True, lora_dropout=0.05 if "drop" in v else 0.0) if lora else {}
cfg = (Config if not lora else Config).from_name("Llama-3.2-1B", n_layer=layers, block_size=512, **kw)
torch.manual_seed(0)
with torch.device("cuda"):
    m = GPT(cfg).to(torch.bfloat16)
if lora:
    mark_only_lora_as_trainable(m)
lc = LigerConfig.off() if "stockops" in v else LigerConfig()
lc.fused_linear_cross_entropy = True
lc.cuda_graphs = True
apply_liger(m, lc)
r = G.runner_for(m)
if "detret" in v:
    _bw = G._Replay.backward
    def bw(ctx, g):
        out = _bw(ctx, g)
        return tuple(t.detach().clone() if isinstance(t, torch.Tensor) else t for t in out)
    G._Replay.backward = staticmethod(bw)
if "mgc" in v:  # replay through make_graphed_callables' own autograd function
    def hidden(idx, r=r):
        key = tuple(idx.shape)
        g = r.graphs.get(key)
        if g is None:
            try:
                g = r.graphs[key] = G._Graphs(r, idx, None)
            except Exception:
                r.error = traceback.format_exc(); raise
            r.captures += 1
        r.replays += 1
        return g.fn(idx)
    r.hidden = hidden
import gc
def variant_init(self, runner, idx, params):
    """graphs._Graphs.__init__ with the variant's changes: sync (synchronize + gc around warm-up and
    capture), gradin (the backward's grad-output buffer allocated inside the capture), mgc (PyTorch's
    make_graphed_callables on a wrapper module, shared pool)."""
    gpt = runner.gpt
    self.runner = runner
    self.static_idx = idx.clone()
    bufs = runner.grad_buffers(params)
    stream = None if "defstream" in v else runner.stream
    mode = "global" if "global" in v else G.CAPTURE_ERROR_MODE
    wstream = torch.cuda.Stream() if "fresh" in v else runner.stream
    if "sync" in v:
        torch.cuda.synchronize(); gc.collect()
    wstream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(wstream):
        for _ in range(3 if "warm3" in v else 1):
            hidden = gpt._liger_hidden(self.static_idx)
            torch.autograd.grad(hidden, params, torch.ones_like(hidden), allow_unused=True)
            del hidden
    torch.cuda.current_stream().wait_stream(wstream)
    if "sync" in v:
        torch.cuda.synchronize(); gc.collect()
    self.fwd = torch.cuda.CUDAGraph()
    with torch.cuda.graph(self.fwd, pool=runner.pool, stream=stream, capture_error_mode=mode):
        self.static_hidden = gpt._liger_hidden(self.static_idx)
    if runner.pool is None:
        runner.pool = self.fwd.pool()
    if "gradin" not in v:
        self.static_grad = torch.empty_like(self.static_hidden)
    self.bwd = torch.cuda.CUDAGraph()
    with torch.cuda.graph(self.bwd, pool=runner.pool, stream=stream, capture_error_mode=mode):
        if "gradin" in v:
            self.static_grad = torch.empty_like(self.static_hidden)
        grads = torch.autograd.grad(self.static_hidden, params, self.static_grad, allow_unused=True)
        self.used = [g is not None for g in grads]
        pairs = [(b, g) for b, g in zip(bufs, grads) if g is not None]
        if pairs and "nofe" in v:
            for b, g in pairs:
                b.copy_(g)
        elif pairs:
            torch._foreach_copy_([b for b, _ in pairs], [g for _, g in pairs])
        if "keepgrads" in v:
            self.keep_grads = grads
        del grads, pairs
    if "keep" in v.split("+"):
        self.keep_hidden = self.static_hidden
    self.static_hidden = self.static_hidden.detach()
    self.grads = [b if u else None for b, u in zip(bufs, self.used)]
    self.params = params

class Wrap(torch.nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt
    def forward(self, idx):
        return self.gpt._liger_hidden(idx)

def mgc_init(self, runner, idx, params):
    gpt = runner.gpt
    self.runner = runner
    if runner.pool is None:
        runner.pool = torch.cuda.graph_pool_handle()
    self.fn = torch.cuda.make_graphed_callables(Wrap(gpt), (idx.clone(),), pool=runner.pool, allow_unused_input=True)

orig = G._Graphs.__init__
def init(self, runner, idx, params):
    if "ownpool" in v:
        runner.pool = None
    t0 = time.perf_counter()
    if "mgc" in v:
        mgc_init(self, runner, idx, params)
    elif "base" not in v:
        variant_init(self, runner, idx, params)
    else:
        orig(self, runner, idx, params)
    print(f"   captured {tuple(idx.shape)} in {time.perf_counter()-t0:.2f}s", flush=True)
G._Graphs.__init__ = init
ok = True
try:
    for i, T in enumerate((128, 256, 192, 256, 128, 320)):
        x = torch.randint(0, 1000, (4, T), device="cuda")
        out = m(x, lm_head_chunk_size=128)
        out[-1] = out[-1][..., :-1, :]
        chunked_cross_entropy(out, x[..., 1:]).backward()
    torch.cuda.synchronize()
except Exception as e:
    ok = False
    print(f"EXC {type(e).__name__}: {str(e)[:300]}")
if ok:
    for flag in (True, False):
        m._liger_cuda_graphs = flag
        ts = []
        for i in range(24):
            T = (128, 256, 192)[i % 3]
            x = torch.randint(0, 1000, (4, T), device="cuda")
            torch.cuda.synchronize(); t0 = time.perf_counter()
            out = m(x, lm_head_chunk_size=128)
            out[-1] = out[-1][..., :-1, :]
            chunked_cross_entropy(out, x[..., 1:]).backward()
            torch.cuda.synchronize(); ts.append(time.perf_counter() - t0)
        ts = sorted(ts[6:])
        print(f"   graphs={flag}: fwd+bwd median {ts[len(ts)//2]*1e3:.1f} ms")
print(f"RESULT {v}: ok={ok} captures={r.captures} replays={r.replays} disabled={r.disabled}", flush=True)
if r.error:
    print("\n".join(r.error.splitlines()[-14:]))
try:
    torch.randint(0, 10, (3,), device="cuda"); torch.cuda.synchronize(); print("generator ok")
except Exception as e:
    print("generator broken:", str(e)[:120])

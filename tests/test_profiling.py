"""``LIT_LIGER_PROFILE``: the window's parsing, the trace summary's arithmetic, and the window counted by training
forwards (CPU)."""

import json

import pytest
import torch

from lit_liger.runtime import profiling


def test_window_parses_directory_first_and_count(tmp_path):
    assert profiling.window({}) is None
    assert profiling.window({profiling.ENV: " "}) is None
    assert profiling.window({profiling.ENV: str(tmp_path)}) == (tmp_path, 200, 20)
    assert profiling.window({profiling.ENV: f"{tmp_path},5"}) == (tmp_path, 5, 20)
    assert profiling.window({profiling.ENV: f"{tmp_path},5,3"}) == (tmp_path, 5, 3)
    for bad in (f"{tmp_path},x", f"{tmp_path},1,0", f"{tmp_path},-1,2", f"{tmp_path},1,2,cpu", f"{tmp_path},1,2,host,x"):
        with pytest.raises(ValueError, match=profiling.ENV):
            profiling.window({profiling.ENV: bad})
    assert profiling.window({profiling.ENV: f"{tmp_path},5,3,host"}) == (tmp_path, 5, 3)
    assert profiling.host_profile({profiling.ENV: f"{tmp_path},5,3,host"})
    assert not profiling.host_profile({profiling.ENV: f"{tmp_path},5,3"})
    assert not profiling.host_profile({})


def test_summary_counts_host_calls_and_the_graph_launches_wait():
    def call(name, ts, dur, corr):
        return {"cat": "cuda_runtime", "name": name, "ts": ts * 1e3, "dur": dur * 1e3, "args": {"correlation": corr}}

    def kernel(ts, corr):
        return {"cat": "kernel", "name": "k", "ts": ts * 1e3, "dur": 1e3, "args": {"stream": 7, "correlation": corr}}

    # two graph launches: the first's kernels start 2.0 ms after its call (the call's own 2 ms: the GPU was idle), the
    # second's 0.5 ms after (queued work ahead of it); one plain kernel launch
    events = [call("cudaGraphLaunch", 0, 2.0, 1), kernel(2.0, 1), kernel(3.5, 1),
              call("cudaGraphLaunch", 10, 3.0, 2), kernel(10.5, 2),
              call("cudaLaunchKernel", 20, 0.01, 3), kernel(20.2, 3)]
    s = profiling.summarize_trace(events, wall_ms=30.0, iterations=2)
    assert list(s["host_calls"]) == ["cudaGraphLaunch", "cudaLaunchKernel"]
    assert s["host_calls"]["cudaGraphLaunch"] == [2, pytest.approx(5.0)]
    g = s["graph_launches"]
    assert g["count"] == 2 and g["host_ms"] == pytest.approx(5.0) and g["host_ms_per_iteration"] == pytest.approx(2.5)
    assert g["max_ms"] == pytest.approx(3.0)
    assert g["first_kernel_after_call_median_ms"] == pytest.approx(2.0)  # (the upper of 0.5 and 2.0)
    assert "host_calls" not in profiling.summarize_trace([kernel(0, 1)], wall_ms=1.0, iterations=1)


def _kernel(name, start_ms, end_ms, stream):
    return {"cat": "kernel", "name": name, "ts": start_ms * 1e3, "dur": (end_ms - start_ms) * 1e3,
            "args": {"stream": stream}}


def test_summary_splits_busy_idle_and_exposed_collectives():
    events = [_kernel("sm90_xmma_gemm_bf16", 0, 10, 7), _kernel("triton_rms_norm", 8, 12, 7),
              _kernel("multi_tensor_apply_kernel_adam", 14, 20, 7),
              _kernel("ncclDevKernel_AllReduce_Sum_bf16", 5, 16, 20), _kernel("ncclDevKernel_Broadcast", 25, 30, 20),
              {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 99e3}]
    s = profiling.summarize_trace(events, wall_ms=40.0, iterations=2)
    assert s["compute_stream"] == "7"
    assert s["compute_busy_ms"] == pytest.approx(18.0)  # [0, 12] and [14, 20]
    assert s["compute_idle_ms"] == pytest.approx(22.0)
    assert s["collective_ms"] == pytest.approx(16.0)  # [5, 16] and [25, 30]
    assert s["exposed_collective_ms"] == pytest.approx(7.0)  # [12, 14] and [25, 30]
    assert s["wall_ms_per_iteration"] == pytest.approx(20.0)
    cats = s["streams"]["7"]["by_category_ms"]
    assert cats == pytest.approx({"matmul": 10.0, "other": 4.0, "optimizer": 6.0})
    assert s["streams"]["20"]["by_category_ms"] == pytest.approx({"collective": 16.0})
    top = s["streams"]["7"]["top_kernels_ms"]  # (by name, the category first, longest first)
    assert list(top) == ["matmul: sm90_xmma_gemm_bf16", "optimizer: multi_tensor_apply_kernel_adam",
                         "other: triton_rms_norm"]
    assert top["optimizer: multi_tensor_apply_kernel_adam"] == pytest.approx(6.0)
    assert s["streams"]["7"]["top_kernels_launches"] == {k: 1 for k in top}
    # the compute stream's one gap, [12, 14], by the kernels either side of it
    assert s["gaps"] == {"under_5us": [0, 0.0], "5_to_50us": [0, 0.0], "over_50us": [1, pytest.approx(2.0)]}
    assert s["longest_gaps"] == [[pytest.approx(2.0), "triton_rms_norm", "multi_tensor_apply_kernel_adam"]]


def test_summary_buckets_gaps_by_length():
    # kernels of 1 µs back to back with gaps of 2 µs, 2 µs, 20 µs and 0.3 ms; one kernel inside another's span
    ends = [(0.0, 0.001), (0.003, 0.004), (0.006, 0.007), (0.027, 0.028), (0.0275, 0.0278), (0.328, 0.329)]
    events = [_kernel(f"k{i}", a, b, 7) for i, (a, b) in enumerate(ends)] + [_kernel("k0", 0.4, 0.401, 7)]
    s = profiling.summarize_trace(events, wall_ms=1.0, iterations=1)
    assert s["gaps"]["under_5us"] == [2, pytest.approx(0.004)]
    assert s["gaps"]["5_to_50us"] == [1, pytest.approx(0.02)]
    assert s["gaps"]["over_50us"] == [2, pytest.approx(0.3 + 0.071)]
    assert s["longest_gaps"][0] == [pytest.approx(0.3), "k3", "k5"]
    assert s["longest_gaps"][1] == [pytest.approx(0.071), "k5", "k0"]
    assert s["streams"]["7"]["top_kernels_launches"]["other: k0"] == 2


def test_iterations_profile_the_window_of_training_forwards(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(profiling.ENV, f"{tmp_path},2,3")
    model = torch.nn.Linear(4, 4)
    hooks = len(model._forward_pre_hooks)
    with profiling.iterations(model, rank=1):
        for i in range(7):
            model.train(i != 3)  # (an evaluation forward is not an iteration)
            model(torch.randn(2, 4)).sum().backward()
    assert len(model._forward_pre_hooks) == hooks
    summary = json.loads((tmp_path / "rank1-summary.json").read_text())
    assert summary["iterations"] == 3 and summary["first_iteration"] == 2 and summary["rank"] == 1
    assert summary["wall_ms"] > 0
    assert (tmp_path / "rank1-trace.json").exists()
    assert "lit-liger: profile rank 1, iterations 2-4" in capsys.readouterr().out


def test_iterations_profile_the_host_python_with_host(tmp_path, monkeypatch):
    monkeypatch.setenv(profiling.ENV, f"{tmp_path},1,2,host")

    def slow_step():  # the window's Python: this function's own time is the largest
        return sum(i * i for i in range(200_000))

    model = torch.nn.Linear(4, 4)
    with profiling.iterations(model):
        for _ in range(4):
            model(torch.randn(2, 4))
            slow_step()
    summary = json.loads((tmp_path / "rank0-summary.json").read_text())
    assert (tmp_path / "rank0-host.pstats").exists()
    cumulative = {row[0].split("(")[-1].rstrip(")"): row for row in summary["host_cumulative"]}
    assert cumulative["slow_step"][1] == 2  # called once in each of the window's 2 iterations
    assert cumulative["slow_step"][2] > 0
    assert any("genexpr" in row[0] for row in summary["host_top"][:3])


def test_iterations_summarize_a_loop_that_ends_inside_the_window(tmp_path, monkeypatch):
    monkeypatch.setenv(profiling.ENV, f"{tmp_path},1,50")
    model = torch.nn.Linear(4, 4)
    with profiling.iterations(model):
        for _ in range(4):
            model(torch.randn(2, 4))
    assert json.loads((tmp_path / "rank0-summary.json").read_text())["iterations"] == 3


def test_iterations_do_nothing_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(profiling.ENV, raising=False)
    model = torch.nn.Linear(4, 4)
    with profiling.iterations(model):
        assert not model._forward_pre_hooks
        model(torch.randn(2, 4))

"""``python -m benchmarks diag trace-layer`` on a small synthetic trace (the diagnostic reads files only)."""

import gzip
import json

from benchmarks.diag import trace_layer


def _trace(tmp_path):
    k = lambda name, ts, dur, tid=7: {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "tid": tid}  # noqa: E731
    events = [
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 5.0},
        k("_attn_fwd_kernel", 100.0, 10.0), k("gemm", 112.0, 30.0, tid=190), k("_pack_kernel", 113.0, 12.0),
        k("_attn_fwd_kernel", 300.0, 10.0), k("gemm", 312.0, 30.0, tid=191),
        k("_attn_fwd_kernel", 520.0, 10.0),
        k("_attn_dq_kernel", 900.0, 14.0), k("_rms_bwd_kernel", 920.0, 3.0), k("_attn_dq_kernel", 1240.0, 14.0),
    ]
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return str(path)


def test_sections_run_from_one_marker_to_the_next(tmp_path, capsys):
    kernels = trace_layer.load_kernels(_trace(tmp_path))
    assert [e["name"] for e in kernels][:3] == ["_attn_fwd_kernel", "gemm", "_pack_kernel"]  # (kernels only, by start)
    spans = trace_layer.sections(kernels, "_attn_fwd_kernel")
    assert spans == [(0, 3), (3, 5)]
    rows = trace_layer.section_rows(kernels, *spans[0])
    assert rows == [(0.0, 10.0, "7", "_attn_fwd_kernel"), (12.0, 30.0, "190", "gemm"), (13.0, 12.0, "7", "_pack_kernel")]
    trace_layer.main([_trace(tmp_path), "--layer", "0"])
    out = capsys.readouterr().out
    assert "forward: 3 launches of _attn_fwd_kernel*, median section 210.0 us; section 0: 200.0 us, 3 kernels" in out
    assert "backward: 2 launches of _attn_dq_kernel*, median section 340.0 us; section 0: 340.0 us, 2 kernels" in out
    assert "\n    20.0    3.00      7  _rms_bwd_kernel\n" in out


def test_a_marker_not_in_the_trace_is_said(tmp_path, capsys):
    trace_layer.main([_trace(tmp_path), "--fwd", "flash_fwd"])
    assert "forward: no kernel named flash_fwd*" in capsys.readouterr().out

"""specc.bench.gaps on a hand-made trace: gaps summed per step, host lateness, attribution."""

from specc.bench.gaps import host_windows, kernel_gaps


def _trace():
    k = lambda name, ts, dur, corr: {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}
    rt = lambda name, ts, corr: {"cat": "cuda_runtime", "name": name, "ts": ts, "dur": 3, "args": {"correlation": corr}}
    py = lambda name, ts, dur: {"cat": "python_function", "name": name, "ts": ts, "dur": dur}
    return {"traceEvents": [
        rt("cudaGraphLaunch", 0, 1), k("gemm(a)", 10, 100, 1),
        # kernel 2 launched late by the host: it was in speculate -> accepted_rows at t = 150
        py("/x/specc/runtime/device_loop.py(400): speculate", 100, 200),
        py("/x/specc/runtime/drafters.py(90): accepted_rows", 140, 30),
        py("/x/torch/nn/module.py(1): forward", 145, 10),  # not a project frame
        rt("cudaLaunchKernel", 150, 2), k("add", 160, 10, 2),
        # kernel 3 launched early, starts 1 us after kernel 2: no gap counted (< MIN_GAP_US)
        rt("cudaLaunchKernel", 100, 3), k("mul", 171, 9, 3),
        # kernel 4: launched before kernel 3 ended, still a 20 us gap (launch latency, not host)
        rt("cudaGraphLaunch", 175, 4), k("gemm(b)", 200, 50, 4),
    ]}


def test_gaps_sum_split_and_attribute():
    res = kernel_gaps(_trace(), steps=2)
    # gaps: 110 -> 160 (50 us, host late 40), 180 -> 200 (20 us, host not late)
    assert res["idle_us_per_step"] == (50 + 20) / 2
    assert res["host_late_us_per_step"] == 40 / 2
    assert res["kernel_us_per_step"] == (100 + 10 + 9 + 50) / 2
    assert res["span_us_per_step"] == (250 - 10) / 2
    first, second = res["gaps"]
    assert first["launch"] == "cudaLaunchKernel" and first["us_per_step"] == 25
    assert first["frames"] == "drafters.py:90 accepted_rows < device_loop.py:400 speculate"
    assert first["after"] == "gemm" and first["before"] == "add"
    assert second["launch"] == "cudaGraphLaunch" and second["host_late_us_per_step"] == 0
    assert second["frames"] == "device_loop.py:400 speculate"  # accepted_rows had returned


def test_no_kernels():
    res = kernel_gaps({"traceEvents": []}, steps=0)
    assert res["idle_us_per_step"] == 0 and res["gaps"] == [] and res["span_us_per_step"] == 0


def test_host_windows_from_a_blocking_copy_to_the_next_graph_launch():
    rt = lambda name, ts, dur: {"cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur}
    op = lambda name, ts, dur: {"cat": "cpu_op", "name": name, "ts": ts, "dur": dur}
    trace = {"traceEvents": [
        rt("cudaGraphLaunch", 0, 5),
        rt("cudaMemcpyAsync", 10, 90),  # blocks until t = 100
        op("aten::cat", 120, 10), op("aten::copy_", 140, 6), op("aten::empty", 142, 2),  # nested: not counted
        rt("cudaGraphLaunch", 160, 4),  # window 100 -> 160
        rt("cudaLaunchKernel", 170, 2), rt("cudaGraphLaunch", 180, 4),  # no blocking call before: no window
        rt("cudaStreamSynchronize", 200, 50), op("aten::cat", 260, 20),
        rt("cudaGraphLaunch", 290, 4),  # window 250 -> 290
    ]}
    res = host_windows(trace, steps=2)
    assert res["windows_per_step"] == 1 and res["window_us_per_step"] == (60 + 40) / 2
    by_op = {r["op"]: r for r in res["ops"]}
    assert by_op["aten::cat"]["us_per_step"] == 15 and by_op["aten::cat"]["calls_per_step"] == 1
    assert by_op["aten::copy_"]["us_per_step"] == 3 and "aten::empty" not in by_op
    assert host_windows({"traceEvents": []}, 0)["window_us_per_step"] == 0

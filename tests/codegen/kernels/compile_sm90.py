"""Compile the kernels' launch variants for an H100/H200 (sm_90) on a machine without a GPU.

Run as a script (``python tests/codegen/kernels/compile_sm90.py``; TRITON_INTERPRET must be
unset). A stand-in Triton driver reports an sm_90 target, every launch compiles with
``warmup=True`` (nothing runs) and launchers take their Triton path on CPU tensors. Catches what
the interpreter cannot: type errors of the compiled path, unsupported ops, shared-memory
overflow. Exit code 0 when everything compiled; prints one line per case. Relies on Triton
internals (the driver hook and ``JITFunction.run``); exits with code 3 when those are missing.
"""

from __future__ import annotations

import os
import sys
import time

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("compile_sm90.py needs TRITON_INTERPRET unset")

import torch  # noqa: E402
import triton  # noqa: E402

try:
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction
except ImportError as e:  # pragma: no cover
    print(f"unsupported triton: {e}")
    sys.exit(3)


COMPILED: dict[str, list] = {}


class _Sm90Driver:
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_device_interface(self):
        return torch.cuda

    def is_active(self):
        return True

    def map_python_to_cpp_type(self, t):
        return t


def main() -> int:
    try:
        driver.set_active(_Sm90Driver())
        orig = JITFunction.run

        def run(self, *args, grid, warmup, **kwargs):
            kernel = orig(self, *args, grid=grid, warmup=True, **kwargs)
            COMPILED.setdefault(self.fn.__name__, []).append(kernel)
            return kernel

        JITFunction.run = run
    except Exception as e:  # noqa: BLE001  # pragma: no cover
        print(f"unsupported triton internals: {e}")
        return 3

    from specc.codegen.kernels import attention as A
    from specc.codegen.kernels import embedding as E
    from specc.codegen.kernels import gated_delta as D
    from specc.codegen.kernels import gdn_elementwise as DE
    from specc.codegen.kernels import greedy as G
    from specc.codegen.kernels import kv_cache as KV
    from specc.codegen.kernels import linear as L
    from specc.codegen.kernels import linear_bf12 as B1
    from specc.codegen.kernels import linear_bf12_v2 as B2
    from specc.codegen.kernels import ragged_attention as RA
    from specc.codegen.kernels import rmsnorm as N
    from specc.codegen.kernels import rope as R
    from specc.codegen.kernels import swiglu as S
    from specc.codegen.kernels import tree_beam as TB

    for m in (L, A, R, S, E, N, G, KV, D, DE, TB, RA):
        m.use_triton = lambda *t, **kw: True
    B1.launchable = B2.launchable = lambda device: True
    bf, lng = torch.bfloat16, torch.long
    z = lambda *shape, dtype=bf: torch.zeros(*shape, dtype=dtype)  # noqa: E731

    def bf12(n, k, version=1):  # a bf12 weight with a few escapes (zeros)
        from specc.formats import pack_bf16_12bit

        w = torch.full((n, k), 0.01, dtype=bf)
        w[::97, ::89] = 0
        return pack_bf16_12bit(w, version=version)

    def bf12v2(n, k):
        return bf12(n, k, version=2)

    C1 = B1.Bf12Config

    from specc.codegen.kernels import pdl as _pdl_module

    def _pdl(mode, module, fn):  # launch with a PDL mode as on an sm_90 GPU
        patched = [m for m in {module, _pdl_module} if hasattr(m, "pdl_mode")]
        saved = [m.pdl_mode for m in patched]
        for m in patched:
            m.pdl_mode = lambda *args, **kwargs: mode
        try:
            return fn()
        finally:
            for m, f in zip(patched, saved):
                m.pdl_mode = f

    C2 = B2.Bf12v2Config
    cache = z(2, 8, 256, 128)

    from specc.codegen.kernels.batch_invariant import batch_invariant

    def _bi(fn):  # launch in the batch-invariant mode (one config at every row count)
        with batch_invariant():
            return fn()

    cases = {
        "linear gemv table": lambda: L.linear(z(1, 4096), z(6144, 4096)),
        "linear gemv split": lambda: L.linear(z(1, 4096), z(4096, 4096), config=L.LinearConfig(
            "gemv", block_n=16, block_k=256, split_k=3)),
        "linear dot split": lambda: L.linear(z(16, 4096), z(4096, 4096), config=L.LinearConfig(
            "dot", block_m=16, block_n=32, block_k=128, split_k=5)),
        "linear dot prologue": lambda: L.linear(z(16, 4096), z(4096, 4096), None, z(4096),
                                                config=L.LinearConfig("dot", norm_prologue=True)),
        "linear gemv +residual": lambda: L.linear(z(1, 4096), z(4096, 4096), residual=z(1, 4096)),
        "linear dot split +residual": lambda: L.linear(z(16, 4096), z(4096, 4096), config=L.LinearConfig(
            "dot", block_m=16, block_n=32, block_k=128, split_k=5), residual=z(16, 4096)),
        "linear gemv +bias +norm": lambda: L.linear(z(1, 4096), z(6144, 4096), z(6144), z(4096)),
        "linear dot swap m16": lambda: L.linear(z(16, 4096), z(6144, 4096)),
        "linear dot m64 +norm": lambda: L.linear(z(64, 4096), z(4096, 4096), None, z(4096)),
        "linear dot tma m4 split": lambda: L.linear(z(4, 12288), z(4096, 12288), config=L.LinearConfig(
            "dot", block_m=16, block_n=64, block_k=256, split_k=2, tma=True)),
        "linear dot m256 noswap": lambda: L.linear(z(256, 512), z(1024, 512)),
        # programmatic dependent launch: wait only, first weight tile before the wait
        "linear gemv pdl1 +norm": lambda: _pdl(1, L, lambda: L.linear(z(1, 4096), z(6144, 4096), None, z(4096))),
        "linear gemv pdl2 split +residual": lambda: _pdl(2, L, lambda: L.linear(
            z(1, 4096), z(4096, 4096), config=L.LinearConfig("gemv", block_n=4, block_k=1024, split_k=2),
            residual=z(1, 4096))),
        "linear gemv pdl2 +norm uneven": lambda: _pdl(2, L, lambda: L.linear(z(1, 4000), z(640, 4000), None, z(4000))),
        "linear dot pdl2 tma": lambda: _pdl(2, L, lambda: L.linear(z(16, 4096), z(4096, 4096), config=L.LinearConfig(
            "dot", block_m=16, block_n=64, block_k=256, split_k=1, tma=True))),
        "bf12v1 fma m1 asm split +bias": lambda: B1.linear_bf12(z(1, 4096), bf12(4096, 4096), z(4096), config=C1(
            kind="fma", block_m=1, block_n=16, block_j=32, split_k=4)),
        "linear dot m256 pdl2 (plain launch)": lambda: _pdl(2, L, lambda: L.linear(z(256, 512), z(1024, 512))),
        "bf12v1 fma m1 pdl2": lambda: _pdl(2, B1, lambda: B1.linear_bf12(z(1, 4096), bf12(4096, 4096), config=C1(
            kind="fma", block_m=1, block_n=16, block_j=32, split_k=2))),
        "bf12v1 dot m16 pdl2": lambda: _pdl(2, B1, lambda: B1.linear_bf12(z(16, 4096), bf12(1024, 4096), config=C1(
            kind="dot", block_m=16, block_n=64, block_j=4, swap_ab=True))),
        "swiglu pdl1": lambda: _pdl(1, S, lambda: S.swiglu(z(4, 2 * 1024))),
        "attention q1 pdl1": lambda: _pdl(1, A, lambda: A.attention(z(2, 1, 32, 128), cache, cache,
                                                                    z(2, dtype=lng), 1, "causal", 0.1)),
        "bf12v1 dot m16 swap": lambda: B1.linear_bf12(z(16, 4096), bf12(1024, 4096), config=C1(
            kind="dot", block_m=16, block_n=64, block_j=4, swap_ab=True)),
        "bf12v2 fma m1 asm": lambda: B2.linear_bf12_v2(z(1, 4096), bf12v2(4096, 4096), config=C2(
            "fma", block_m=1, block_n=16, block_k=256)),
        "bf12v2 fma m1 noasm split +bias": lambda: B2.linear_bf12_v2(z(1, 4096), bf12v2(4096, 4096), z(4096),
                                                                     config=C2("fma", block_k=256, split_k=2,
                                                                               use_asm=False)),
        "bf12v2 fma m4 asm split": lambda: B2.linear_bf12_v2(z(4, 12288), bf12v2(1024, 12288), config=C2(
            "fma", block_m=4, block_n=16, block_k=128, split_k=3)),
        "bf12v2 dot m16 asm": lambda: B2.linear_bf12_v2(z(16, 4096), bf12v2(1024, 4096), config=C2(
            "dot", block_m=16, block_n=64, block_k=64, num_stages=3)),
        "bf12v2 dot m64 swap split": lambda: B2.linear_bf12_v2(z(64, 4096), bf12v2(1024, 4096), config=C2(
            "dot", block_m=64, block_n=64, block_k=128, split_k=2, swap_ab=True, num_stages=3)),
        "bf12v2 dot m16 noasm fp16": lambda: B2.linear_bf12_v2(z(16, 4096, dtype=torch.float16),
                                                               bf12v2(1024, 4096), config=C2(
            "dot", block_m=16, block_n=32, block_k=64, use_asm=False)),
        "attention q1 causal split": lambda: A.attention(z(2, 1, 32, 128), cache, cache, z(2, dtype=lng),
                                                         1, "causal", 0.1),
        "attention q64 full": lambda: A.attention(z(2, 64, 32, 128), cache, cache, z(2, dtype=lng), 64,
                                                  "full", 0.1, num_splits=1),
        "attention q64 fused merge": lambda: A.attention(z(2, 64, 32, 128), cache, cache, z(2, dtype=lng), 64,
                                                         "causal", 0.1, num_splits=3, fused_merge=True),
        "attention q4 tree": lambda: A.attention(z(2, 4, 32, 128), cache, cache, z(2, dtype=lng), 4,
                                                 "tree", 0.1, tree_mask=torch.ones(4, 4, dtype=torch.bool)),
        # the tree mask as bit words: two words per 64-key tile (split + merge), one word per
        # 32-key tile, and five words per row at Q = 130 (one split, direct store)
        "attention q64 tree words": lambda: A.attention(z(2, 64, 32, 128), cache, cache, z(2, dtype=lng), 64,
                                                        "tree", 0.1, tree_words=z(2, 64, 2, dtype=torch.int32)),
        "attention q16 tree words bn32": lambda: A.attention(z(1, 16, 32, 128), cache, cache, z(1, dtype=lng), 16,
                                                             "tree", 0.1, tree_words=z(16, 1, dtype=torch.int32),
                                                             block_n=32, num_splits=4),
        "attention q130 tree words direct": lambda: A.attention(z(1, 130, 32, 128), cache, cache, z(1, dtype=lng),
                                                                130, "tree", 0.1, num_splits=1,
                                                                tree_words=z(1, 130, 5, dtype=torch.int32)),
        # a packed block of 2 rows (24 tokens) over the slots of ``cache``: splits + merge, and direct
        "ragged split merge": lambda: RA.ragged_attention(z(1, 24, 32, 128), z(1, 24, 8, 128), z(1, 24, 8, 128),
                                                          cache, cache, z(2, dtype=lng), z(2, dtype=lng),
                                                          z(3, dtype=lng), 0.1, num_splits=3),
        "ragged split merge pdl1": lambda: _pdl(1, RA, lambda: RA.ragged_attention(
            z(1, 24, 32, 128), z(1, 24, 8, 128), z(1, 24, 8, 128), cache, cache, z(2, dtype=lng), z(2, dtype=lng),
            z(3, dtype=lng), 0.1, num_splits=3)),
        "ragged direct": lambda: RA.ragged_attention(z(1, 24, 32, 128), z(1, 24, 8, 128), z(1, 24, 8, 128),
                                                     cache, cache, z(2, dtype=lng), z(2, dtype=lng),
                                                     z(3, dtype=lng), 0.1, num_splits=1),
        # the batch-invariant mode: the tensor-core configs at one row (M == 1 specializes)
        "linear batch-invariant m1 +norm +residual": lambda: _bi(lambda: L.linear(
            z(1, 4096), z(4096, 4096), None, z(4096), residual=z(1, 4096))),
        "linear batch-invariant m1 uneven": lambda: _bi(lambda: L.linear(z(1, 4000), z(640, 4000))),
        "bf12v1 batch-invariant m1": lambda: _bi(lambda: B1.linear_bf12(z(1, 4096), bf12(4096, 4096))),
        "bf12v2 batch-invariant m1": lambda: _bi(lambda: B1.linear_bf12(z(1, 4096), bf12v2(4096, 4096))),
        "ragged batch-invariant": lambda: _bi(lambda: RA.ragged_attention(
            z(1, 24, 32, 128), z(1, 24, 8, 128), z(1, 24, 8, 128), cache, cache, z(2, dtype=lng),
            z(2, dtype=lng), z(3, dtype=lng), 0.1)),
        "rope qk-norm": lambda: R.rope_and_cache(z(2, 4, 32, 128), z(2, 4, 8, 128), z(2, 4, 8, 128),
                                                 z(2, 4, dtype=lng), torch.ones(64), cache, cache,
                                                 z(2, dtype=lng), z(128), z(128)),
        "swiglu": lambda: S.swiglu(z(4, 2 * 1024)),
        "embedding": lambda: E.embedding(z(4, dtype=lng), z(1000, 4096)),
        "rms_norm +residual": lambda: N.rms_norm(z(4, 4096), z(4096), 1e-6, residual=z(4, 4096)),
        "argmax": lambda: G.argmax(z(3, 151936)),
        "greedy_accept": lambda: G.greedy_accept(z(2, 4, dtype=lng), z(2, 5, dtype=lng), z(2, dtype=lng),
                                                 z(2, 9, dtype=lng), z(2, dtype=lng)),
        "kv_compact": lambda: KV.kv_compact(cache, cache, z(2, 5, dtype=lng), z(2, 5, dtype=lng)),
        "kv_compact_layers": lambda: KV.kv_compact_layers([(cache, cache), (cache.clone(), cache.clone())],
                                                          z(2, 5, dtype=lng), z(2, 5, dtype=lng), z(2, dtype=lng)),
        # GDN at Qwen3.5 shapes (Hk 16, Hv 32, dk = dv = 128, kernel 4): decode, chain, tree
        "tree_beam width 4": lambda: TB.tree_beam(z(2, 7, 8, dtype=torch.float32), z(2, 7, 8, dtype=lng), 4),
        "gdn delta rule q1": lambda: D.delta_rule_step(z(1, 1, 8192), z(1, 1, 32, dtype=torch.float32), z(1, 1, 32),
                                                       z(1, 18, 32, 128, 128, dtype=torch.float32), z(1, dtype=lng), 16),
        "gdn delta rule q16 tree": lambda: D.delta_rule_step(
            z(1, 16, 8192), z(1, 16, 32, dtype=torch.float32), z(1, 16, 32), z(1, 18, 32, 128, 128, dtype=torch.float32),
            z(1, dtype=lng), 16, z(1, 16, dtype=lng)),
        "gdn conv q16 chain": lambda: D.conv_step(z(1, 16, 8192), z(1, 18, 8192, 3), z(8192, 1, 4), z(1, dtype=lng)),
        "gdn offset_rms_norm": lambda: DE.offset_rms_norm(z(16, 4096), z(4096), 1e-6),
        "gdn gated_head_norm": lambda: DE.gated_head_norm(z(16, 4096), z(16, 4096), z(128), 1e-6),
        "gdn gates": lambda: DE.gdn_gates(z(16, 32), z(16, 32), z(32), z(32)),
        "gdn conv q16 tree": lambda: D.conv_step(z(1, 16, 8192), z(1, 18, 8192, 3), z(8192, 1, 4), z(1, dtype=lng),
                                                 z(1, 16, dtype=lng)),
        # programmatic dependent launch of the step's other kernels: wait before any global access
        "greedy_accept pdl1": lambda: _pdl(1, G, lambda: G.greedy_accept(
            z(2, 4, dtype=lng), z(2, 5, dtype=lng), z(2, dtype=lng), z(2, 9, dtype=lng), z(2, dtype=lng))),
        "kv_compact pdl1": lambda: _pdl(1, KV, lambda: KV.kv_compact(cache, cache, z(2, 5, dtype=lng),
                                                                     z(2, 5, dtype=lng))),
        "kv_compact_layers pdl1": lambda: _pdl(1, KV, lambda: KV.kv_compact_layers(
            [(cache, cache), (cache.clone(), cache.clone())], z(2, 5, dtype=lng), z(2, 5, dtype=lng), z(2, dtype=lng))),
        "tree_beam pdl1": lambda: _pdl(1, TB, lambda: TB.tree_beam(z(2, 7, 8, dtype=torch.float32),
                                                                   z(2, 7, 8, dtype=lng), 4)),
        "gdn delta rule q16 tree pdl1": lambda: _pdl(1, D, lambda: D.delta_rule_step(
            z(1, 16, 8192), z(1, 16, 32, dtype=torch.float32), z(1, 16, 32), z(1, 18, 32, 128, 128, dtype=torch.float32),
            z(1, dtype=lng), 16, z(1, 16, dtype=lng))),
        "gdn conv q1 pdl1": lambda: _pdl(1, D, lambda: D.conv_step(z(1, 1, 8192), z(1, 18, 8192, 3), z(8192, 1, 4),
                                                                   z(1, dtype=lng))),
        "gdn elementwise pdl1": lambda: _pdl(1, DE, lambda: (DE.offset_rms_norm(z(16, 4096), z(4096), 1e-6),
                                                             DE.gated_head_norm(z(16, 4096), z(16, 4096), z(128), 1e-6),
                                                             DE.gdn_gates(z(16, 32), z(16, 32), z(32), z(32)))),
    }
    # properties of the generated code that the kernels were designed for
    wide = ("3 128-bit loads per iteration (sm low/high halves and codes: 16 bytes each per thread)",
            lambda ptx: ptx.count("ld.global.v4.b32") >= 3)
    pdl_ptx = ("griddepcontrol wait + launch_dependents",
               lambda ptx: "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx)

    def waits_first(ptx):  # mode 1: nothing touches global memory before the wait (text order of
        # the straight-line prologue, per kernel of the case)
        import re

        for body in ptx.split(".entry")[1:]:
            wait = body.find("griddepcontrol.wait")
            first = re.search(r"\b(ld|st|atom|red)\.global|\bcp\.async\S*global", body)
            if wait < 0 or (first is not None and first.start() < wait):
                return False
        return True

    wait_first = ("griddepcontrol.wait before any global load or store", waits_first)
    # the check can fail: mode 2's GEMV loads its first weight tile before the wait
    PTX_NEGATIVE = {"linear gemv pdl2 split +residual": waits_first}

    def words_only(ptx):  # the split kernel was compiled, without byte loads
        return "_attn_split_kernel" in ptx and "ld.global.b8" not in ptx

    PTX_CHECKS = {
        "linear gemv pdl1 +norm": [pdl_ptx, wait_first],
        "linear gemv pdl2 split +residual": [pdl_ptx],
        "linear gemv pdl2 +norm uneven": [pdl_ptx],
        "bf12v1 fma m1 pdl2": [pdl_ptx],
        "linear dot m256 pdl2 (plain launch)": [("no PDL above PDL_DOT_MAX_ROWS rows",
                                                 lambda ptx: "griddepcontrol" not in ptx)],
        "bf12v1 dot m16 pdl2": [("no PDL on the bf12 dot path", lambda ptx: "griddepcontrol" not in ptx)],
        "swiglu pdl1": [wait_first],
        "attention q1 pdl1": [wait_first],
        "linear dot pdl2 tma": [pdl_ptx, wait_first],
        "greedy_accept pdl1": [pdl_ptx, wait_first],
        "ragged split merge pdl1": [pdl_ptx, wait_first],
        "kv_compact pdl1": [pdl_ptx, wait_first],
        "kv_compact_layers pdl1": [pdl_ptx, wait_first],
        "tree_beam pdl1": [pdl_ptx, wait_first],
        "gdn delta rule q16 tree pdl1": [pdl_ptx, wait_first],
        "gdn conv q1 pdl1": [pdl_ptx, wait_first],
        "gdn elementwise pdl1": [pdl_ptx, wait_first],
        "bf12v2 fma m1 asm": [wide, ("PRMT decode", lambda ptx: "prmt.b32" in ptx and "lop3.b32" in ptx)],
        "bf12v2 fma m1 noasm split +bias": [wide],
        "linear batch-invariant m1 +norm +residual": [
            ("the tensor-core kernel, not the GEMV", lambda ptx: "_gemm_kernel" in ptx and "_gemv_kernel" not in ptx)],
        "bf12v2 dot m16 asm": [("cp.async weight tiles", lambda ptx: "cp.async" in ptx),
                               ("tensor cores", lambda ptx: "mma.sync" in ptx or "wgmma" in ptx)],
        # the packed tree mask: no byte loads (the byte mask path loads ld.global.b8 tiles)
        "attention q4 tree": [("byte mask tile loads", lambda ptx: "ld.global.b8" in ptx)],
        "attention q64 tree words": [("no byte mask loads", words_only)],
        "attention q130 tree words direct": [("no byte mask loads", words_only)],
    }
    only = set(sys.argv[1:])
    failed = 0
    for name, fn in cases.items():
        if only and not any(o in name for o in only):
            continue
        if "pdl" in name and not _pdl_module.PDL_SUPPORTED:
            print(f"skip {name}: this Triton has no programmatic dependent launch", flush=True)
            continue
        t = time.time()
        before = {k: len(v) for k, v in COMPILED.items()}
        try:
            fn()
            made = [kern for k, v in COMPILED.items() for kern in v[before.get(k, 0):] if kern is not None]
            ptx = "".join(kern.asm.get("ptx", "") for kern in made)
            for what, check in PTX_CHECKS.get(name, ()):
                if not check(ptx):
                    raise AssertionError(f"compiled PTX: {what}")
            if name in PTX_NEGATIVE and PTX_NEGATIVE[name](ptx):
                raise AssertionError("compiled PTX: the first weight tile should be loaded before the wait")
            print(f"ok   {name} ({time.time() - t:.1f} s)", flush=True)
        except Exception as e:  # noqa: BLE001
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {str(e)[:3000]}", flush=True)
    # rope must round each product before the add (no FMA contraction into bf16 fma)
    for kernel in COMPILED.get("_rope_cache_kernel", []):
        ptx = kernel.asm.get("ptx", "") if kernel is not None else ""
        if "fma.rn.bf16" in ptx:
            failed += 1
            print("FAIL rope: the compiled kernel contracts x*cos + rot(x)*sin into bf16 FMAs")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Measuring a search candidate on the GPU: step times with CUDA graphs, combined into tokens/s.

A function of a :class:`specc.search.driver.Search` (``self``), bound as its method there.
"""

from __future__ import annotations

from typing import Any

from specc.search.acceptance import AcceptanceModel
from specc.search.proposers import Candidate


def measure_candidate(self, cand: Candidate, acceptance: AcceptanceModel) -> dict[str, Any]:
    """Step times of the compiled candidate with CUDA graphs (median replay), at the deployment's
    batch size and the prediction's context, combined with ``acceptance`` into tokens/s."""
    import torch

    from specc.runtime.compiled import instantiate
    from specc.search.calibrate import Timer

    dep, dev = self.deployment, torch.device(self.device)
    b = dep.batch_size
    p = self.predict(cand, acceptance)
    c = p.context
    timer = Timer(self.device, reps=20)
    vocab = int(self.pair.target.raw["vocab_size"])

    def target_time(q: int) -> float:
        step = instantiate(self.real_ir("target", cand)[1])
        step.setup_caches(b, c + q + 8)
        ids = torch.randint(0, vocab, (b, q), device=dev)
        pos = torch.arange(c, c + q, device=dev)[None].expand(b, -1).contiguous()
        lens = torch.full((b,), c, dtype=torch.long, device=dev)
        return timer(lambda: step(ids, pos, lens))

    out: dict[str, Any] = {"ar_s": target_time(1), "batch_size": b, "context": c}
    if not self.pair.impl.uses_drafter or not cand.num_draft:
        out.update(step_s=out["ar_s"], tokens_per_s=b / out["ar_s"], ar_tokens_per_s=b / out["ar_s"], speedup=1.0)
        return out
    k = cand.num_draft
    out["verify_s"] = target_time(k + 1)
    d_step = instantiate(self.real_ir("drafter", cand)[1], self.spec)
    draft_total = 0.0
    for pred, count in p.drafts:
        q, n = pred.values.get("Q", 1), pred.values.get("N", 0)
        d_step.setup_caches(b, c + q + n + 8)
        args = self.pair.impl.draft_inputs(pred.values, b, c, self.pair, dev, self.dtype)
        t = timer(lambda: d_step(*args))
        draft_total += t * count
    out["draft_s"] = draft_total
    out["step_s"] = draft_total + out["verify_s"]
    e = acceptance.expected_tokens(k)
    out["expected_tokens_per_step"] = e
    out["tokens_per_s"] = b * e / out["step_s"]
    out["ar_tokens_per_s"] = b / out["ar_s"]
    out["speedup"] = out["tokens_per_s"] / out["ar_tokens_per_s"]
    return out

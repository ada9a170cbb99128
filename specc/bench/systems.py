"""The systems `specc bench` times, each behind one ``generate(prompt, n) -> (tokens, timing)``.

- ``hf-eager``: HF transformers ``generate``, greedy, dynamic cache, eager (SDPA attention).
- ``hf-compiled``: HF ``generate`` with a static cache, which transformers compiles with
  torch.compile (reduce-overhead: CUDA graphs). CUDA only; on CPU it is skipped with the reason.
- ``stock-<method>``: the drafter's published inference loop over HF models (real checkpoints).
- ``specc-ar``: specc's compiled AR step under the device loop (CUDA-graphed on a GPU).
- ``specc-<method>``: specc's compiled speculative system; real acceptance, or replayed from a
  stated acceptance model (``specc.runtime.replay.ReplayVerifier``).

Timings per generation: wall seconds, time to first token (when the system exposes it) and
steady decode tokens/s = tokens after the first / time after the first token.
"""

from __future__ import annotations

import copy
import time

import torch


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timing(start: float, first_at: float | None, end: float, n: int, accepted_lengths=None) -> dict:
    elapsed = end - start
    out = {"seconds": elapsed, "tokens": n, "tokens_per_s": n / elapsed if elapsed > 0 else 0.0,
           "time_to_first_token_s": None, "decode_tokens_per_s": None}
    if first_at is not None:
        out["time_to_first_token_s"] = first_at - start
        dec = end - first_at
        out["decode_tokens_per_s"] = (n - 1) / dec if dec > 0 and n > 1 else 0.0
    if accepted_lengths is not None:
        out["accepted_lengths"] = list(accepted_lengths)
    return out


class _FirstTokenStreamer:
    """An HF ``generate`` streamer that notes when the first new token reaches the host."""

    def __init__(self):
        self.calls, self.first_at = 0, None

    def put(self, value):
        self.calls += 1
        if self.calls == 2 and self.first_at is None:  # call 1 is the prompt
            self.first_at = time.perf_counter()

    def end(self):
        pass


class HFSystem:
    """HF ``generate`` over an HF causal LM; ``static=True``: static cache (+ torch.compile)."""

    def __init__(self, hf_model, device, static: bool = False):
        self.model, self.device, self.static = hf_model, torch.device(device), static
        self.name = "hf-compiled" if static else "hf-eager"
        # every system generates exactly n tokens: transformers fills a generation config's unset
        # eos_token_id from the model's own, so that one is cleared too (the bench's own HF copy)
        hf_model.generation_config.eos_token_id = None

    def _config(self, n: int):
        gc = copy.deepcopy(self.model.generation_config)
        gc.max_new_tokens, gc.min_new_tokens, gc.do_sample = n, None, False
        gc.eos_token_id, gc.pad_token_id = None, 0
        gc.temperature = gc.top_p = gc.top_k = None
        if self.static:
            gc.cache_implementation = "static"
        return gc

    @torch.inference_mode()
    def _timed_generate(self, ids: torch.Tensor, mask: torch.Tensor, n: int):
        """One ``generate`` of ``n`` new tokens: (output ids, start, first token at, end)."""
        import warnings

        streamer = _FirstTokenStreamer()
        sync(self.device)
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = self.model.generate(ids, generation_config=self._config(n), streamer=streamer, attention_mask=mask)
        sync(self.device)
        return out, start, streamer.first_at, time.perf_counter()

    def generate(self, prompt: list[int], n: int):
        ids = torch.tensor([prompt], dtype=torch.long, device=self.device)
        out, start, first_at, end = self._timed_generate(ids, torch.ones_like(ids), n)
        tokens = out[0, len(prompt):].tolist()
        return tokens, timing(start, first_at, end, len(tokens))


def hf_batch(hf: HFSystem, prompts: list[list[int]], n: int, warmup: bool = True) -> dict:
    """A batched row of HF ``generate`` (eager): the prompts left-padded into one batch (pad id 0,
    masked), ``n`` new tokens each. Padding changes what each row computes, so the tokens are not
    compared; tok/s = all new tokens / wall time, decode and steady tok/s = B (n - 1) / time after
    the first token (every row decodes every step: no EOS)."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long, device=hf.device)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, device=hf.device)
        mask[i, width - len(p):] = 1
    warm = 0.0
    if warmup:
        _, s0, _, e0 = hf._timed_generate(ids, mask, n)
        warm = e0 - s0
    _, start, first, end = hf._timed_generate(ids, mask, n)
    b = len(prompts)
    decode = b * (n - 1) / (end - first) if first is not None and end > first and n > 1 else None
    return {"batch": b, "seconds": end - start, "tokens": b * n, "tokens_per_s": b * n / (end - start),
            "time_to_first_token_s": None if first is None else first - start, "decode_tokens_per_s": decode,
            "steady_tokens_per_s": decode, "prompt_lengths": [len(p) for p in prompts], "one_time_s": warm,
            "padding": "left, masked"}


class StockSpecSystem:
    """A method's stock loop (``specc.stock.runner.StockSystem``)."""

    def __init__(self, stock, device, method: str):
        self.stock, self.device, self.name = stock, torch.device(device), f"stock-{method}"

    @torch.inference_mode()
    def generate(self, prompt, n):
        sync(self.device)
        start = time.perf_counter()
        res = self.stock.generate(list(prompt), n, ())
        sync(self.device)
        end = time.perf_counter()
        return res.tokens, timing(start, None, end, len(res.tokens), res.stats.accepted_lengths)


class LoopSystem:
    """specc's device loop (``DeviceSpeculativeDecoder``): tokens streamed, first token timed."""

    def __init__(self, loop, device, name: str):
        self.loop, self.device, self.name = loop, torch.device(device), name

    def generate(self, prompt, n):
        sync(self.device)
        start = time.perf_counter()
        first_at = None
        gen = self.loop.stream(list(prompt), n, ())
        while True:
            try:
                next(gen)
            except StopIteration as stop:
                res = stop.value
                break
            if first_at is None:
                first_at = time.perf_counter()
        sync(self.device)
        end = time.perf_counter()
        return res.tokens, timing(start, first_at, end, len(res.tokens), res.stats.accepted_lengths)

"""DFlash (block diffusion): a drafter with no embedding of its own reads hidden states of chosen
target layers (KV injection) and drafts a whole block non-causally in one forward."""

from __future__ import annotations

from specc.errors import UserError
from specc.methods.base import DraftShape, LoadedPair, Method
from specc.methods.registry import register_method


def _spec(drafter_raw):
    from specc.models.dflash import DFlashSpec

    return DFlashSpec.from_hf(drafter_raw)


@register_method
class DFlashMethod(Method):
    name = "dflash"
    description = "DFlash: target hidden states injected as K/V, one non-causal forward over [last, mask x (b - 1)]"
    drafter_kinds = ("dflash",)
    default_for = ("dflash",)
    k_choices = (1, 3, 5, 7, 9, 11, 13, 15)
    strategy = "dflash"
    supports_tree = True  # per-position logits from the one drafting forward

    def check_pair(self, target, drafter):
        super().check_pair(target, drafter)
        spec = _spec(drafter.raw)
        layers = int(target.raw["num_hidden_layers"])
        if drafter.raw.get("hidden_size") != target.raw.get("hidden_size"):
            raise UserError(f"DFlash drafter hidden size {drafter.raw.get('hidden_size')} != "
                            f"target's {target.raw.get('hidden_size')}")
        if max(spec.target_layer_ids) >= layers:
            raise UserError(f"DFlash target_layer_ids {list(spec.target_layer_ids)} exceed the target's {layers} layers")
        if spec.num_target_layers is not None and int(spec.num_target_layers) != layers:
            raise UserError(f"DFlash drafter was trained for a {spec.num_target_layers}-layer target, "
                            f"{target.name} has {layers}")

    def default_num_draft(self, drafter_raw):
        return _spec(drafter_raw).block_size - 1

    def max_num_draft(self, drafter_raw):
        return _spec(drafter_raw).block_size - 1

    def limit_reason(self, drafter_raw):
        block = _spec(drafter_raw).block_size
        return f"the DFlash drafter's block_size is {block}: at most {block - 1} drafts per step"

    def search_k_choices(self, drafter_raw, start):
        return sorted(set(super().search_k_choices(drafter_raw, start)) | {self.max_num_draft(drafter_raw)})

    def bind(self, target, draft):
        """The draft step is the drafter with the target's embedding and LM head; the target
        returns the hidden states of the layers the drafter reads."""
        from specc.ir.trace import bind_dflash

        target.capture_layers = tuple(draft.spec.target_layer_ids)
        return LoadedPair(target, bind_dflash(target, draft), draft.spec)

    def drafter_for(self, draft_step, pair):
        from specc.runtime.drafters import DFlashDraft

        return DFlashDraft(draft_step)

    def draft_inputs(self, values, batch, context, pair, device, dtype):
        """[last token, masks] block ids, ``N`` rows of captured target hidden states, positions."""
        import torch

        q, n = int(values.get("Q", 1)), int(values.get("N", 0))
        spec = _spec(pair.drafter.raw)
        ids = torch.randint(0, int(pair.target.raw["vocab_size"]), (batch, q), device=device)
        hidden = torch.randn(batch, n, len(spec.target_layer_ids) * int(pair.target.raw["hidden_size"]),
                             device=device, dtype=dtype)
        pos = torch.arange(context, context + n + q, device=device)[None].expand(batch, -1).contiguous()
        return ids, hidden, pos, torch.full((batch,), context, dtype=torch.long, device=device)

    def manifest_drafter(self, pair, loaded):
        spec = loaded.draft_spec
        return {"dflash": {"block_size": spec.block_size, "mask_token_id": spec.mask_token_id,
                           "target_layer_ids": list(spec.target_layer_ids),
                           "num_target_layers": spec.num_target_layers}}

    def draft_logits(self, loaded, pair, seq, hidden, num_draft):
        import torch

        spec, drafter = loaded.draft_spec, loaded.draft
        dev = seq.device
        block = torch.cat([seq[:, -1:], torch.full((1, num_draft), spec.mask_token_id, dtype=torch.long, device=dev)],
                          dim=1)
        n_ctx = hidden.shape[1]
        drafter.setup_caches(1, n_ctx + block.shape[1])
        pos = torch.arange(n_ctx + block.shape[1], device=dev)[None]
        return drafter(block, hidden, pos, torch.zeros(1, dtype=torch.long, device=dev))[0, :num_draft]

    def draft_shapes(self, num_draft, committed):
        return [DraftShape({"Q": num_draft + 1, "N": committed}, 1)]

    def load_stock_drafter(self, pair, dtype, device):
        from specc.stock import DFlashReference

        return DFlashReference.from_pretrained(pair.drafter.path, dtype, device)

    def stock_generate(self, target, draft, pair, prompt, max_new_tokens, num_draft, eos_token_ids):
        from specc.stock import generate_dflash

        return generate_dflash(target, draft, prompt, max_new_tokens, num_draft + 1 if num_draft else None,
                               eos_token_ids)

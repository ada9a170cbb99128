"""`specc bench` on an artifact with a tree budget: chain and tree rows from one artifact, the
tree's acceptance replayed from a per-rank model (``--acceptance ranks:FILE``, ``SPEC+ranks:FILE``)."""

import json

import pytest

from specc.bench.acceptance import parse_acceptance, parse_tree_acceptance
from specc.cli import main
from specc.compiler import compile_artifact
from specc.errors import UserError
from specc.search.acceptance import AcceptanceModel
from specc.search.tree_acceptance import TreeAcceptanceModel


@pytest.fixture(scope="module")
def tree_artifact(checkpoints, tmp_path_factory):
    if "qwen3" not in checkpoints["target"]:
        pytest.skip("one family is enough for the bench plumbing")
    out = tmp_path_factory.mktemp("bench-tree") / "tree.specc"
    compile_artifact(checkpoints["target"], checkpoints["dflash"], out=out, max_new_tokens=8, tree=12)
    return out


def test_tree_artifact_bench_replays_chain_and_tree(tree_artifact, tmp_path, capsys):
    ranks = tmp_path / "ranks.json"
    # rank 0 alone is a poor bet, ranks 1 and 2 carry most of the rest: trees must show it
    ranks.write_text(json.dumps({"p": [[0.5, 0.3, 0.15]], "source": "stated for the test"}))
    assert main(["bench", str(tree_artifact), "--systems", "specc", "--acceptance", f"ranks:{ranks}",
                 "--tokens", "40", "--prompts", "2", "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["system"]: r for r in report["rows"]}
    assert set(rows) == {"specc-dflash", "specc-dflash-tree12"}
    chain, tree = rows["specc-dflash"], rows["specc-dflash-tree12"]
    k = report["num_draft"]
    model = TreeAcceptanceModel([[0.5, 0.3, 0.15]])
    assert chain["replay"] and tree["replay"] and tree["tree_budget"] == 12 and report["tree_budget"] == 12
    assert chain["expected_tokens_per_step"] == pytest.approx(model.chain_expected_tokens(k))
    assert tree["expected_tokens_per_step"] == pytest.approx(model.expected_tokens(12, k))
    assert tree["prediction"]["expected_tokens_per_step"] == pytest.approx(model.expected_tokens(12, k))
    assert report["acceptance"]["tree"]["source"] == f"{ranks} (stated for the test)"
    # every step commits 1..k+1 tokens, and the tree commits more per step than the chain
    assert all(1 <= a <= k + 1 for a in tree["accepted_lengths"] + chain["accepted_lengths"])
    assert tree["tau"] > chain["tau"] + 0.3
    assert tree["tree_vs_chain"]["measured"] > 0 and tree["tree_vs_chain"]["predicted"] > 0
    assert tree["tokens"] == chain["tokens"] == 80


def test_tree_artifact_bench_table(tree_artifact, capsys):
    assert main(["bench", str(tree_artifact), "--systems", "specc", "--acceptance", "alpha:0.6",
                 "--tokens", "8", "--prompts", "1"]) == 0
    out = capsys.readouterr().out
    assert "specc-dflash-tree12 (replay)" in out and "trees: REPLAYED" in out
    assert "ranks > 0 never measured" in out and "vs its chain" in out


def test_tree_artifact_bench_real_acceptance_is_lossless(tree_artifact, capsys):
    """Without --acceptance the target decides both rows: chain and tree give HF's tokens."""
    assert main(["bench", str(tree_artifact), "--systems", "hf-eager,specc", "--tokens", "12", "--prompts", "2",
                 "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["system"]: r for r in report["rows"]}
    assert report["acceptance"]["mode"] == "real" and "tree" not in report["acceptance"]
    for name in ("specc-dflash", "specc-dflash-tree12"):
        assert rows[name]["same_tokens_as_hf_eager"] is True and not rows[name]["replay"]
    assert rows["specc-dflash-tree12"]["tree_vs_chain"]["measured"] > 0


def test_shapes_with_tree_budget(tmp_path, capsys):
    """--tree N at named shapes (random weights): the 8B command's path at tiny shapes."""
    ranks = tmp_path / "ranks.json"
    ranks.write_text(json.dumps({"p": [[0.6, 0.25, 0.1], [0.7, 0.2]]}))
    assert main(["bench", "--shapes", "tiny-qwen3", "--drafter-shapes", "dflash-b16", "--tree", "16",
                 "--acceptance", f"alpha:0.5+ranks:{ranks}", "--tokens", "24", "--prompts", "1", "--prompt-len", "8",
                 "--systems", "specc", "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["system"]: r for r in report["rows"]}
    assert set(rows) == {"specc-dflash", "specc-dflash-tree16"} and report["tree_budget"] == 16
    tree = rows["specc-dflash-tree16"]
    model = parse_tree_acceptance(f"alpha:0.5+ranks:{ranks}", report["num_draft"])
    assert model.p[0] == pytest.approx([0.5, 0.5 * 0.25 / 0.4, 0.5 * 0.1 / 0.4])
    assert tree["expected_tokens_per_step"] == pytest.approx(model.expected_tokens(16, report["num_draft"]))
    assert rows["specc-dflash"]["expected_tokens_per_step"] == pytest.approx(model.chain_expected_tokens(report["num_draft"]))
    assert tree["tau"] >= 1 and tree["prediction"]["tokens_per_s"] > 0


def test_tree_option_errors(tree_artifact, capsys):
    assert main(["bench", str(tree_artifact), "--tree", "8", "--systems", "specc"]) == 2
    assert "compiled with" in capsys.readouterr().err
    assert main(["bench", "--shapes", "tiny-qwen3", "--drafter-shapes", "none", "--tree", "8",
                 "--acceptance", "alpha:0.5", "--systems", "specc-ar"]) == 2
    assert main(["bench", "--shapes", "tiny-qwen3", "--tree", "0", "--acceptance", "alpha:0.5"]) == 2


def test_tree_acceptance_specs(tmp_path):
    ranks = tmp_path / "r.json"
    ranks.write_text(json.dumps({"rank_counts": [[60, 20, 10, 10], [80, 10, 0, 10]], "source": "measured here"}))
    t = parse_tree_acceptance(f"ranks:{ranks}", 4)
    assert t.p[0] == pytest.approx([0.6, 0.2, 0.1]) and t.source == f"{ranks} (measured here)"
    assert parse_acceptance(f"ranks:{ranks}", 4).alphas == pytest.approx([0.6, 0.8, 0.8, 0.8])
    # a stated chain for rank 0, the file's split of the rest for ranks >= 1
    combined = parse_tree_acceptance(f"alpha:0.9+ranks:{ranks}", 2)
    assert combined.p[0] == pytest.approx([0.9, 0.1 * 0.2 / 0.4, 0.1 * 0.1 / 0.4])
    assert combined.p[1] == pytest.approx([0.9, 0.1 * 0.1 / 0.2, 0.0])
    assert "assumed" in combined.source
    chain_only = parse_tree_acceptance("tau:4@7", 7)
    assert chain_only.expected_tokens(64, 7) == pytest.approx(AcceptanceModel.from_tau(4, 7).expected_tokens(7))
    assert parse_tree_acceptance("measured", 7) is None
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"p": []}))
    for bad in (f"alpha:0.9+{ranks}", "ranks:/nonexistent.json", f"measured+ranks:{ranks}", f"ranks:{empty}"):
        with pytest.raises(UserError):
            parse_tree_acceptance(bad, 4)


def test_hybrid_checkpoint_bench_tree_larger_than_the_chain_block(capsys):
    """A hybrid target keeps one GDN state entry per verify-block node: `specc bench --tree N`
    on a checkpoint sizes them for the tree (31 nodes over a 16-token chain block), and the
    tree's tokens equal the chain's and HF's (real acceptance)."""
    assert main(["bench", "specc-tiny-hybrid", "--drafter", "specc-tiny-hybrid-dflash", "--tree", "31",
                 "--systems", "hf-eager,specc", "--tokens", "6", "--prompts", "1", "--warmup", "0",
                 "--json", "-"]) == 0
    rows = {r["system"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert set(rows) == {"hf-eager", "specc-dflash", "specc-dflash-tree31"}
    assert rows["specc-dflash-tree31"]["tree_budget"] == 31
    assert all(r["same_tokens_as_hf_eager"] is True for r in rows.values())

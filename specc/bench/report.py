"""Print, save and plot a `specc bench` report (the dict ``run_bench`` returns)."""

from __future__ import annotations

import json
from pathlib import Path


def row_label(row: dict) -> str:
    """A row's name in the table: the system, replayed or not, and at B > 1 how it verified."""
    label = row["system"] + (" (replay)" if row.get("replay") else "")
    if row.get("mechanism") and row.get("batch", 1) > 1:
        label += f" [{row['mechanism']}]"
    return label


def priced_rate(row: dict) -> float | None:
    """The measured tokens/s a row's prediction prices: the cost model prices decode steps (no
    prefill) at the row's acceptance, so a replayed batch-1 row compares with its decode rate at
    the stated E (its measured step, ``at_stated_acceptance``), another batch-1 row with its
    decode tokens/s, a batched row with its steady rate (every slot busy). Tokens/s with the
    first token included made the speculative rows look 8-30% over-predicted where their decode
    steps were within 3% (docs/benchmarks/run34.md, section 2)."""
    if row.get("batch", 1) > 1:
        return row.get("steady_tokens_per_s")
    at = row.get("at_stated_acceptance") or {}
    return at.get("decode_tokens_per_s") or row.get("decode_tokens_per_s") or row.get("tokens_per_s")


def _f(x, fmt="{:,.1f}", none="-"):
    return none if x is None else fmt.format(x)


def print_table(report: dict, console=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    if console is None:
        console = Console()
        if not console.is_terminal:  # piped: full names and numbers, never an ellipsis
            console = Console(width=200)
    acc = report["acceptance"]
    title = (f"specc bench: {report['what']} | {report['device']} | {report['dtype']} | "
             f"{report['tokens']} tokens x {report['prompts']} prompts | deployment {report['deployment']}"
             + (f" | {report['launch']}" if report.get("launch", "plain") != "plain" else ""))
    table = Table(title=title, title_justify="left")
    batched = any(r.get("batch", 1) > 1 for r in report["rows"])
    cols = [("system", "left")] + ([("B", "right")] if batched else []) + [
        ("tok/s", "right"), ("decode tok/s", "right")] + ([("steady tok/s", "right")] if batched else []) + [
        ("first token", "right"), ("tokens/step", "right"), ("vs best AR", "right"), ("predicted tok/s", "right"),
        ("pred/meas", "right"), ("one-time", "right"), ("= HF eager", "center")]
    for col, just in cols:
        table.add_column(col, justify=just)
    same_word = {True: "yes", "tie": "tie", False: "NO", None: "n/a"}
    for r in report["rows"]:
        b = r.get("batch", 1)
        if r.get("skipped"):
            table.add_row(r["system"], *([str(b)] if batched else []), "skipped", *[""] * (len(cols) - 2 - batched))
            continue
        pred = (r.get("prediction") or {}).get("tokens_per_s")
        steady = r.get("steady_tokens_per_s")
        versus = priced_rate(r)
        if b > 1:
            same = r.get("same_tokens_as_specc_ar")
            same_text = "n/a" if same is None else f"= AR: {same_word[same]}"
        else:
            same_text = same_word[r.get("same_tokens_as_hf_eager")]
        first = r.get("time_to_first_token_s")
        table.add_row(
            escape(row_label(r)), *([str(b)] if batched else []),
            _f(r["tokens_per_s"]), _f(r.get("decode_tokens_per_s")), *([_f(steady)] if batched else []),
            "-" if first is None else f"{first * 1e3:.1f} ms",
            _f(r.get("tau"), "{:.2f}"), _f(r.get("speedup_vs_best_ar"), "{:.2f}x"), _f(pred),
            _f(pred / versus if pred and versus else None, "{:.2f}"),
            f"{r.get('one_time_s', 0.0):.1f} s", same_text)
    console.print(table)
    for r in report["rows"]:
        if r.get("skipped"):
            console.print(f"{r['system']} skipped: {r['skipped']}")
    if acc["mode"] == "replay":
        console.print(f"[bold yellow]acceptance: REPLAYED[/bold yellow] from {acc['source']} "
                      f"(E = {acc['expected_tokens_per_step']:.2f} tokens/step at k={report['num_draft']}). "
                      f"{acc['notice']}.")
        for r in report["rows"]:
            at = r.get("at_stated_acceptance")
            if at and "steady_tokens_per_s" in at:
                versus = (f", {at['steady_speedup_vs_ar']:.2f}x specc-ar's steady decode at B = {r['batch']}"
                          if at.get("steady_speedup_vs_ar") else "")
                console.print(f"at the stated E = {at['tokens_per_step']:.2f} tokens/step (this run drew "
                              f"{at['drawn_tokens_per_step']:.2f}): {r['system']} at B = {r['batch']} "
                              f"{at['steady_tokens_per_s']:,.1f} steady decode tok/s{versus} (its measured step, "
                              f"{at['decode_step_s'] * 1e3:.3f} ms)")
            elif at:
                versus = (f", {at['decode_speedup_vs_best_ar']:.2f}x the best AR's decode"
                          if at.get("decode_speedup_vs_best_ar") else "")
                versus += "".join(f", {x:.2f}x {name}'s" for name, x in (at.get("decode_speedup_vs") or {}).items()
                                  if name.startswith("specc-ar") and name != report.get("best_ar"))
                console.print(escape(f"at the stated E = {at['tokens_per_step']:.2f} tokens/step (this run drew "
                                     f"{at['drawn_tokens_per_step']:.2f}): {r['system']} {at['decode_tokens_per_s']:,.1f} "
                                     f"decode tok/s{versus} (its measured step, {at['decode_step_s'] * 1e3:.3f} ms)"))
        tree = acc.get("tree")
        if tree:
            console.print(f"[bold yellow]trees: REPLAYED[/bold yellow] from {tree['source']} (E = "
                          f"{tree['expected_tokens_per_step']:.2f} tokens/step, {tree['budget']} nodes, depth "
                          f"{tree['depth']}): {tree['replay']}.")
    elif acc["mode"] == "real":
        console.print("acceptance: real (the target decides every draft; tokens are the model's output)")
    for r in report["rows"]:
        versus = r.get("tree_vs_chain")
        if versus:
            pred = versus.get("predicted")
            console.print(f"{r['system']} vs its chain: {versus['measured']:.2f}x measured"
                          + (f", {pred:.2f}x predicted" if pred else ""))
    if report.get("ar_floor_tokens_per_s"):
        console.print(f"AR bandwidth floor on {report['deployment']} (cost model): "
                      f"{report['ar_floor_tokens_per_s']:,.1f} tok/s; best AR in this run: {escape(str(report['best_ar']))}")
    console.print("predicted: cost model (specc.search.cost_model) for the row's acceptance, decode steps only; "
                  "pred/meas: over the decode rate (at the stated E when replayed; steady when batched); "
                  "HF rows are not modelled")
    if batched:
        console.print("B > 1: B requests decoded together (continuous batching, prompts of different lengths); tok/s "
                      "includes their prefills; decode: this batch's decode tokens / decode seconds; steady: B x "
                      "tokens per request-step / step time (every slot full), which 'predicted' prices; vs best AR: "
                      "the fastest AR row at the same B (hf-eager batches left-padded prompts: its tokens are not "
                      "compared). hf-compiled and stock rows run at batch 1 only.")
        for r in report["rows"]:
            if r.get("mechanism") and not r.get("skipped") and not r.get("reference"):
                rule = f", mean k {r['mean_k']:.1f}" if r.get("mean_k") is not None else ""
                console.print(escape(f"{r['system']} at B = {r['batch']}: {r['mechanism']}{rule} ({r['mechanism_source']})"))
    for r in report["rows"]:
        same = r.get("same_tokens_as_hf_eager")
        if same == "tie" or same is False:
            ties = ", ".join(f"prompt {d['request']} token {d['position']} (margin {d['margin']:.3g})"
                             for d in r.get("numerical_ties", []))
            text = (f"= HF eager: {r['system']} leaves HF eager's tokens only at numerical ties (reference top-2 "
                    f"margin < {r.get('tie_tolerance', 0):g}): {ties}" if same == "tie" else
                    f"= HF eager: [bold red]{r['system']} differs from HF eager beyond a numerical tie[/bold red] "
                    f"({len(r.get('token_differences', []))} prompts; token_differences in the JSON)")
            console.print(text)


def write_json(report: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return path


def write_plots(report: dict, out_dir) -> list[str]:
    """PNG plots into ``out_dir``: decode tokens/s per system (measured beside predicted, as
    :func:`priced_rate` pairs them), the accepted
    length histogram of each speculative system (with the stated model's distribution when
    replayed), and tokens/s vs batch size when the report holds more than one batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    rows = [r for r in report["rows"] if not r.get("skipped")]
    replay = report["acceptance"]["mode"] == "replay"

    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(rows) + 2), 4))
    names = [r["system"] + ("\n(replay)" if r.get("replay") else "") for r in rows]
    x = range(len(rows))
    # the decode rate each prediction prices (at the stated E when replayed): like with like
    ax.bar([i - 0.2 for i in x], [priced_rate(r) or 0.0 for r in rows], width=0.4,
           label="measured decode" + (" (at the stated E)" if replay else ""))
    pred = [(r.get("prediction") or {}).get("tokens_per_s") for r in rows]
    ax.bar([i + 0.2 for i, p in zip(x, pred) if p], [p for p in pred if p], width=0.4, label="predicted (cost model)",
           alpha=0.6)
    if report.get("ar_floor_tokens_per_s"):
        ax.axhline(report["ar_floor_tokens_per_s"], ls="--", c="gray", lw=1, label="AR bandwidth floor")
    ax.set_xticks(list(x), names, fontsize=8)
    ax.set_ylabel("decode tokens/s (median over prompts)")
    ax.set_title(f"{report['what']}\n{report['device']}, {report['dtype']}"
                 + (", acceptance REPLAYED" if replay else ""), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(str(out / "tokens_per_s.png"))
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    spec = [r for r in rows if r.get("accepted_lengths") and r.get("num_draft", 0) or
            (r.get("accepted_lengths") and r["system"].startswith("stock-"))]
    if spec:
        k = report.get("num_draft") or max(max(r["accepted_lengths"]) for r in spec) - 1
        fig, ax = plt.subplots(figsize=(6, 4))
        bins = [b + 0.5 for b in range(0, k + 2)]
        for r in spec:
            ax.hist(r["accepted_lengths"], bins=bins, density=True, alpha=0.5,
                    label=f"{r['system']} (tau {r.get('tau', 0):.2f})")
        if replay:
            from specc.search.acceptance import AcceptanceModel

            m = report["acceptance"]["model"]
            model = AcceptanceModel(m["alphas"], measured_k=m.get("measured_k"))
            ax.plot(range(1, k + 2), model.distribution(k), "k.-", label="stated model")
        ax.set_xlabel("tokens committed per step (accepted drafts + 1)")
        ax.set_ylabel("fraction of steps")
        ax.set_title("accepted length" + (" (replayed)" if replay else ""), fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(str(out / "accepted_length.png"))
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    path = plot_batch_sweep(report, out)
    if path:
        written.append(path)
    return written


def steady_decode(row: dict) -> float | None:
    """A row's decode tokens/s with every slot busy: batched rows' steady figure, a batch-1 row's
    decode tokens/s (its one slot is always busy)."""
    return row.get("steady_tokens_per_s") or row.get("decode_tokens_per_s")


def plot_batch_sweep(report: dict, out_dir) -> str | None:
    """Steady decode tokens/s vs batch size per system, the cost model's prediction dashed beside
    each specc system (drawn when the report's rows with a decode rate hold more than one batch size)."""
    rows = [r for r in report["rows"] if not r.get("skipped") and steady_decode(r)]
    batches = {r.get("batch", 1) for r in rows}
    if len(batches) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def line_of(r):  # batch 1 and each B's chosen verification on one line; the one-level references on another
        return r["system"] + (" (one level)" if r.get("reference") else "")

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in sorted({line_of(r) for r in rows}):
        mine = sorted((r for r in rows if line_of(r) == name and steady_decode(r)), key=lambda r: r.get("batch", 1))
        if not mine:
            continue
        line = ax.plot([r.get("batch", 1) for r in mine], [steady_decode(r) for r in mine], "o-", label=name)[0]
        pred = [(r.get("batch", 1), (r.get("prediction") or {}).get("tokens_per_s")) for r in mine]
        pred = [p for p in pred if p[1]]
        if pred:
            ax.plot([p[0] for p in pred], [p[1] for p in pred], "x--", color=line.get_color(), alpha=0.6,
                    label=f"{name} (predicted)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(batches), [str(b) for b in sorted(batches)])
    ax.set_xlabel("batch size")
    ax.set_ylabel("decode tokens/s, all rows (steady)")
    ax.set_title(f"{report.get('what', '')}\n{report.get('device', '')}"
                 + (", acceptance REPLAYED" if (report.get("acceptance") or {}).get("mode") == "replay" else ""),
                 fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = str(Path(out_dir) / "tokens_per_s_vs_batch.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

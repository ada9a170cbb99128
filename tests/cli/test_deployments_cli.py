"""`specc deployments` prints whole names when piped (no rich truncation) and shows one deployment's fields."""

from __future__ import annotations

import json

from specc.cli import main
from specc.search.deployments import BUILTIN


def test_piped_listing_has_full_names(capsys):
    assert main(["deployments"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    names = [line.split()[0] for line in out.splitlines()[1:] if line.strip()]
    assert names == list(BUILTIN)
    assert "NVIDIA A100 SXM 80GB" in out


def test_one_deployment_shows_its_fields(capsys):
    assert main(["deployments", "h200-bs8"]) == 0
    out = capsys.readouterr().out
    fields = dict(line.split(None, 1) for line in out.splitlines() if line.strip())
    assert fields["name"] == "h200-bs8" and fields["batch_size"] == "8" and fields["gpu"] == "NVIDIA H200"
    assert set(fields) == set(BUILTIN["h200-bs8"].to_json())
    assert main(["deployments", "h200-bs8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["batch_size"] == 8


def test_unknown_deployment_is_a_one_line_error(capsys):
    assert main(["deployments", "no-such-gpu"]) == 2
    assert capsys.readouterr().err.startswith("specc: error:")


def test_rates_are_listed_in_units_that_fit_them(capsys):
    assert main(["deployments"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert header[4:6] == ["HBM", "peak"] and "link" in header
    rows = {line.split()[0]: line for line in lines[1:] if line.strip()}
    assert "  50.0 GB/s  200 GFLOP/s  " in rows["cpu"] and "TB/s" not in rows["cpu"]
    assert "  4.80 TB/s  989 TFLOP/s  " in rows["h200-bs1"] and "  450 GB/s  " in rows["h200-bs1"]

"""A proposer that asks a language model: `specc search ... --proposer llm --endpoint URL --model NAME`.

Each round it sends one chat request to an OpenAI-compatible endpoint (``POST {URL}/chat/completions``
with ``{"model", "messages"}``; standard library urllib, no new dependency) containing the gap
report of the current best configuration, a summary of its IRs, the registered passes and
docs/writing-passes.md, and reads back one of:

- a **pass plan**: a JSON object (in a ```json block or bare) ::

      {"plan": ["fuse_qkv", {"name": "pack_weights_12bit", "params": {"pack_exclude": ["lm_head"]}}, "dce"],
       "roles": ["target", "drafter"], "num_draft": 7}

  names of registered passes with their options; evaluated like any candidate (an unknown name is
  rejected by the pass registry);
- the **source of a new pass** (a ```python block defining a ``specc.passes.Pass`` subclass). It is
  syntax-checked here without running it, written to ``<memory dir>/llm_passes/`` with its sha256
  pinned, and run only in a confined worker process (``specc.search.sandbox``) that emits step
  modules; the search itself checks those against the kernel ABI and token-forces them in a process
  that never imports the pass (docs/search.md, "Threat model"). Accepted or not, the outcome is
  recorded in the memory.

Plans name registered passes only: ``+path:Class``, ``module:Class`` and dotted names are refused.

The number of requests is bounded (``max_requests``, default one per round).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from specc.errors import UserError
from specc.search.proposers import Candidate, Proposer, split_pipeline

SYSTEM_PROMPT = """You are an ML-systems compiler engineer working on specc, a compiler for speculative decoding.
You see the cost model's gap report of the current best configuration (predicted time per component
vs its hardware floor), a summary of the step IRs, the registered passes, and the guide to writing passes.
Propose ONE change that lowers the predicted step time without changing the output (every candidate is
checked token by token against the reference; lossy changes are rejected). Reply with exactly one of:
(a) a JSON pass plan in a ```json block: {"plan": [pass names or {"name": ..., "params": {...}}],
    "roles": ["target", "drafter"], "num_draft": K (optional)};
(b) the Python source of a new pass in a ```python block: a subclass of specc.passes.Pass with a name,
    run(ir, ctx) -> PassResult that rewrites the IR, calls ir.refresh(), and keeps it lint-clean.
No other text is needed."""

_BLOCK = re.compile(r"```(\w+)?\s*\n(.*?)```", re.S)
_CLASS = re.compile(r"^class\s+(\w+)\s*\(([^)]*)\)\s*:", re.M)


def docs_text(limit: int = 12000) -> str:
    """docs/writing-passes.md of this checkout (empty when specc is installed without docs)."""
    path = Path(__file__).resolve().parents[2] / "docs" / "writing-passes.md"
    try:
        return path.read_text()[:limit]
    except OSError:
        return ""


def chat(endpoint: str, model: str, messages: list[dict[str, str]], *, api_key: str | None = None,
         timeout: float = 120.0, temperature: float = 0.2) -> str:
    """One chat completion from an OpenAI-compatible endpoint; returns the message content."""
    url = endpoint.rstrip("/")
    if not url.endswith("/chat/completions"):
        url += "/chat/completions"
    body = json.dumps({"model": model, "messages": messages, "temperature": temperature}).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            data = json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        raise UserError(f"{url}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise UserError(f"{url}: cannot reach the endpoint ({getattr(exc, 'reason', exc)})") from exc
    except json.JSONDecodeError as exc:
        raise UserError(f"{url}: the reply is not JSON ({exc})") from exc
    try:
        return str(data["choices"][0]["message"]["content"])
    except (KeyError, IndexError, TypeError) as exc:
        raise UserError(f"{url}: unexpected reply shape (no choices[0].message.content)") from exc


def parse_reply(text: str) -> tuple[str, Any]:
    """("source", code) | ("plan", dict) | ("error", message)."""
    blocks = [((m.group(1) or "").lower(), m.group(2)) for m in _BLOCK.finditer(text)]
    for lang, body in blocks:
        if lang in ("python", "py"):
            return "source", body
    candidates = [body for lang, body in blocks if lang in ("json", "")] + [text]
    for body in candidates:
        try:
            data = json.loads(body.strip())
        except json.JSONDecodeError:
            continue
        if isinstance(data, list):
            data = {"plan": data}
        if isinstance(data, dict) and isinstance(data.get("plan"), list):
            return "plan", data
    if _CLASS.search(text) and "Pass" in text:
        return "source", text
    return "error", "the reply holds neither a JSON pass plan nor a python block with a Pass subclass"


_PASS_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def _plan_pass_name(name: str, registered) -> str:
    """A plan names registered passes only: never a file, a module or an importable object
    (``+path:Class``, ``pkg.mod:Class``, dotted names are refused before anything is imported)."""
    name = name.strip()
    if not _PASS_NAME.match(name):
        raise UserError(f"plan item {name[:80]!r}: a plan names registered passes only (no files, modules or "
                        f"importable objects)")
    if registered is not None and name not in registered:
        raise UserError(f"plan item {name!r}: not a registered pass")
    return name


def plan_candidate(plan: dict[str, Any], best: Candidate, roles: tuple[str, ...], registered=None) -> Candidate:
    """``registered``: the registered pass names (unknown names are refused here too)."""
    names, options = [], {}
    for item in plan["plan"]:
        if isinstance(item, str):
            names.append(_plan_pass_name(item, registered))
        elif isinstance(item, dict) and isinstance(item.get("name"), str):
            names.append(_plan_pass_name(item["name"], registered))
            params = item.get("params") or {}
            if not isinstance(params, dict):
                raise UserError(f"plan item {item['name']}: params must be an object")
            options.update(params)
        else:
            raise UserError(f"plan item {item!r}: give a pass name or {{'name': ..., 'params': {{...}}}}")
    plan_roles = plan.get("roles") or roles
    if not isinstance(plan_roles, (list, tuple)):
        raise UserError("plan roles must be a list")
    use = [r for r in plan_roles if r in roles] or list(roles)
    pipeline = ",".join(n for n in names if n)
    passes = dict(best.passes)
    opts = {r: dict(o) for r, o in best.options.items()}
    for r in use:
        passes[r] = pipeline
        opts[r] = dict(options)
    k = best.num_draft
    if plan.get("num_draft") is not None and best.num_draft:
        k = int(plan["num_draft"])
        if k < 1:
            raise UserError("num_draft must be >= 1")
    # roles the plan leaves alone keep the best's pipeline: sandboxed pass code there stays sandboxed
    sandboxed = best.sandbox and any(i.startswith("+") for p in passes.values() for i in split_pipeline(p))
    return Candidate(passes, k, opts, mechanism=f"llm plan [{pipeline}]" + (f" k={k}" if k != best.num_draft else ""),
                     origin="llm", reason=str(plan.get("why") or plan.get("reason") or "")[:300], sandbox=sandboxed,
                     sources=dict(best.sources) if sandboxed else {})


def source_candidate(source: str, best: Candidate, roles: tuple[str, ...], directory: Path) -> Candidate:
    """Syntax-check (no execution) and store a proposed pass; the candidate runs it sandboxed."""
    try:
        ast.parse(source)
    except SyntaxError as exc:
        raise UserError(f"the proposed pass does not parse: line {exc.lineno}: {exc.msg}") from exc
    classes = [m.group(1) for m in _CLASS.finditer(source) if "Pass" in m.group(2)]
    if not classes:
        raise UserError("the proposed source defines no subclass of Pass")
    cls = classes[0]
    digest = hashlib.sha256(source.encode()).hexdigest()[:10]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"llm_{re.sub(r'[^A-Za-z0-9_]', '_', cls)}_{digest}.py"
    path.write_text(source)
    item = f"+{path}:{cls}"
    passes = {}
    for r in roles:
        items = split_pipeline(best.passes.get(r, ""))
        at = items.index("dce") if "dce" in items else len(items)
        items.insert(at, item)
        passes[r] = ",".join(items)
    # the hash of what was proposed, pinned before anything runs it: the memory records this one
    sources = {**best.sources, item[1:]: hashlib.sha256(source.encode()).hexdigest()}
    return Candidate(passes, best.num_draft, {r: dict(o) for r, o in best.options.items()},
                     mechanism=f"llm pass {cls} ({path.name})", origin="llm", sandbox=True, sources=sources)


class LLMProposer(Proposer):
    """Asks an OpenAI-compatible chat endpoint once per round (see the module docstring)."""

    name = "llm"

    def __init__(self, endpoint: str, model: str, *, api_key: str | None = None, max_requests: int | None = None,
                 timeout: float = 120.0, pass_dir: str | os.PathLike | None = None):
        self.endpoint, self.model, self.api_key, self.timeout = endpoint, model, api_key, timeout
        self.max_requests = max_requests
        self.requests = 0
        self.pass_dir = Path(pass_dir) if pass_dir else None
        self.log: list[dict[str, Any]] = []

    def messages(self, ctx) -> list[dict[str, str]]:
        best = ctx.best.candidate
        registered = "\n".join(f"- {name}: {info.doc}" for name, info in sorted(ctx.passes.items()))
        parts = [
            f"Deployment: {ctx.deployment.name} ({ctx.deployment.gpu}, batch {ctx.deployment.batch_size}).",
            f"Method: {ctx.method}; current best: {best.describe()}.",
            "Gap report (largest gap first):\n" + (ctx.gap_report.text() if ctx.gap_report is not None else "-"),
            "IR summary:\n" + ctx.ir_summary(),
            "Registered passes:\n" + registered,
            "Guide to writing passes (docs/writing-passes.md):\n" + docs_text(),
        ]
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(parts)}]

    def propose(self, ctx) -> list[Candidate]:
        if self.max_requests is not None and self.requests >= self.max_requests:
            return []
        self.requests += 1
        entry: dict[str, Any] = {"round": ctx.round}
        self.log.append(entry)
        try:
            reply = chat(self.endpoint, self.model, self.messages(ctx), api_key=self.api_key, timeout=self.timeout)
        except UserError as exc:
            entry["error"] = str(exc)
            ctx.notes.append(f"llm: {exc}")
            return []
        kind, payload = parse_reply(reply)
        entry["kind"] = kind
        try:
            if kind == "plan":
                cand = plan_candidate(payload, ctx.best.candidate, ctx.roles, registered=ctx.passes)
            elif kind == "source":
                directory = self.pass_dir or ((Path(ctx.memory.path).parent if ctx.memory is not None else
                                               Path.cwd()) / "llm_passes")
                cand = source_candidate(payload, ctx.best.candidate, ctx.roles, directory)
            else:
                raise UserError(payload)
        except UserError as exc:
            entry["error"] = str(exc)
            ctx.notes.append(f"llm reply rejected: {exc}")
            return []
        entry["candidate"] = cand.describe()
        return [cand]

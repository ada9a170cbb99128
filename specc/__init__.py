"""specc: a compiler for speculative decoding of large language models.

    engine = specc.load("model.specc")          # a compiled artifact (see `specc compile`)
    result = engine.generate(prompt_ids, max_new_tokens=128)
    result.tokens, result.stats.tau
"""

__version__ = "0.1.0"

__all__ = ["__version__", "load", "compile_artifact"]


# The package root is a leaf of the layering (specc.codegen.emit and others read __version__ from
# it): it has no import statements, and the two entry points resolve on first use, so that
# `import specc` loads nothing else and `specc.load` loads only the runtime.
_LAZY = {"load": "specc.runtime.engine", "compile_artifact": "specc.compiler"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'specc' has no attribute {name!r}")

"""specc: a compiler for speculative decoding of large language models.

    engine = specc.load("model.specc")          # a compiled artifact (see `specc compile`)
    result = engine.generate(prompt_ids, max_new_tokens=128)
    result.tokens, result.stats.tau
"""

__version__ = "0.1.0"

__all__ = ["__version__", "load", "compile_artifact"]


def __getattr__(name):  # keep `import specc` light: torch loads on first use
    if name == "load":
        from specc.runtime.engine import load

        return load
    if name == "compile_artifact":
        from specc.compiler import compile_artifact

        return compile_artifact
    raise AttributeError(f"module 'specc' has no attribute {name!r}")

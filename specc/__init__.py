"""specc: a compiler for speculative decoding of large language models.

    engine = specc.load("model.specc")          # a compiled artifact (see `specc compile`)
    result = engine.generate(prompt_ids, max_new_tokens=128)
    result.tokens, result.stats.tau
"""

__version__ = "0.1.0"

__all__ = ["__version__", "load", "compile_artifact"]


def load(path, device=None, *args, threads: int | None = None, **kwargs):
    """Load a compiled artifact (:func:`specc.runtime.engine.load`). On CPU, torch's intra-op
    threads are set to ``threads``, else specc's default (:mod:`specc.threads`: ``SPECC_THREADS``,
    else min(physical cores, 4, idle cores)); ``threads=0`` leaves torch's setting alone."""
    from specc.runtime.engine import load as _load

    engine = _load(path, device, *args, **kwargs)
    if threads != 0 and engine.device.type == "cpu":
        from specc.threads import configure_threads

        configure_threads(threads)
    return engine


def __getattr__(name):  # keep `import specc` light: torch loads on first use
    if name == "compile_artifact":
        from specc.compiler import compile_artifact

        return compile_artifact
    raise AttributeError(f"module 'specc' has no attribute {name!r}")

"""User-facing errors: the CLI prints their message as one line and exits with status 2."""


class UserError(Exception):
    """Bad input from the user (unknown model, mismatched pair, unreadable file...).

    Subclasses: ``specc.models.loading.CheckpointError``, ``specc.models.config.ConfigError``,
    ``specc.codegen.artifact.ArtifactError``, ``specc.passes.PipelineError``. The message is
    one line."""


def auto_off_or_int(value, option: str, count: str) -> str | int:
    """An ``auto|off|N`` option's value (``--tree``, ``--two-level``): "auto", "off" or the
    integer N (range checks are the caller's, which knows what N counts); anything else is a
    UserError naming the option and what N is (``count``, e.g. "a node budget")."""
    if value in ("auto", "off"):
        return value
    try:
        return int(value)
    except (TypeError, ValueError):
        raise UserError(f"{option} takes auto, off or {count}, not {value!r}") from None

"""User-facing errors: the CLI prints their message as one line and exits with status 2."""


class UserError(Exception):
    """Bad input from the user (unknown model, mismatched pair, unreadable file...).

    Subclasses: ``specc.models.loading.CheckpointError``, ``specc.models.config.ConfigError``,
    ``specc.codegen.artifact.ArtifactError``, ``specc.passes.PipelineError``. The message is
    one line."""

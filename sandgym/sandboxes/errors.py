"""Errors raised by the sandbox layer."""


class SandboxError(RuntimeError):
    """Base class for sandbox failures (creation, exec transport, provider)."""


class SandboxCreateError(SandboxError):
    """The provider could not create or start a sandbox."""


class SandboxGoneError(SandboxError):
    """The sandbox no longer exists (destroyed, crashed or reaped).

    `reason` is the provider's verdict when it knows one (result.ErrorType: OOM_KILLED,
    TIMEOUT, EXITED, REMOVED, LOST), else None; `Sandbox.info()` gives the same later.
    """

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class SandboxLostError(SandboxGoneError):
    """The machine holding the sandbox was lost (a fleet node died or stopped answering):
    an infrastructure failure, never the policy's; the work may be retried elsewhere."""


class SandboxInterruptedError(SandboxError):
    """A call was cut short by a fault inside the sandbox that the sandbox survived (its exec
    daemon was killed and started again): the sandbox, its files and processes are intact;
    whether the call took effect is unknown. An infrastructure failure, never the policy's;
    retry what is idempotent."""


class SandboxFileNotFound(SandboxError, FileNotFoundError):
    """A file read inside the sandbox named a path that does not exist."""


class SpecError(ValueError):
    """A SandboxSpec is invalid for the chosen provider (names the field and range)."""


class ImagePullError(SandboxCreateError, SpecError):
    """The image could not be pulled from its registry (the engine's message included; the
    message starts with "image:", the spec field at fault). Not retried: pulling again will
    not help until someone fixes the name, the credentials or the registry. Prime reports
    it as error type IMAGE_PULL_FAILED (`error_type`)."""

    retryable = False
    error_type = "IMAGE_PULL_FAILED"


class HookError(SandboxError):
    """A lifecycle hook raised; the sandbox it ran for is failed and destroyed."""

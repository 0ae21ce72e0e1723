"""Errors raised by the sandbox layer."""


class SandboxError(RuntimeError):
    """Base class for sandbox failures (creation, exec transport, provider)."""


class SandboxCreateError(SandboxError):
    """The provider could not create or start a sandbox."""


class SandboxGoneError(SandboxError):
    """The sandbox no longer exists (destroyed, crashed or reaped)."""


class SandboxLostError(SandboxGoneError):
    """The machine holding the sandbox was lost (a fleet node died or stopped answering):
    an infrastructure failure, never the policy's; the work may be retried elsewhere."""


class SandboxFileNotFound(SandboxError, FileNotFoundError):
    """A file read inside the sandbox named a path that does not exist."""


class SpecError(ValueError):
    """A SandboxSpec is invalid for the chosen provider (names the field and range)."""


class HookError(SandboxError):
    """A lifecycle hook raised; the sandbox it ran for is failed and destroyed."""

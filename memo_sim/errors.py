"""Errors a user can fix. The CLI prints them as one line and exits with code 2."""


class MemoError(Exception):
    """Bad input or an impossible request; the message names the field and the fix."""


class ProfileError(MemoError):
    """A hardware profile file is malformed."""


class PlanError(MemoError):
    """A plan.json file is malformed or of an unknown schema version."""


class TraceError(MemoError):
    """A request trace (JSON) or a static-allocation CSV is malformed."""

"""User-facing errors.

Every problem caused by the user's input (a missing file, an impossible setting, a corrupt
artifact) is raised as :class:`LmlabError` with a one-line message that names the problem and
the fix. The CLI prints it as ``error: ...`` and exits with code 2, never with a traceback.
"""

from __future__ import annotations


class LmlabError(Exception):
    """Bad input or configuration; the message says what is wrong and how to fix it."""

    exit_code = 2

    def __init__(self, problem: str, fix: str | None = None):
        message = problem if not fix else f"{problem.rstrip('.')}; {fix}"
        super().__init__(message)
        self.problem = problem
        self.fix = fix

"""The one overwrite/resume policy: what a run does with the files an earlier run left.

A run writes to three places an earlier run may have filled: its output folder (``config.json``
and results, :func:`~deqjax.harness.prepare_run_dir`), its checkpoint folder
(:meth:`~deqjax.training.Checkpoints.restore_or_claim`) and its metrics file
(:class:`~deqjax.training.JsonlWriter`). One :class:`RunPolicy` decides for all three; each place
only says what it found, how it words a refusal and how it deletes:

* ``resume`` and ``overwrite`` contradict each other: refused.
* A fresh run (no ``resume``) over an earlier run's files is refused unless ``overwrite``, which
  deletes those files and only those.
* ``resume`` continues the files (the newest good checkpoint, the metrics file appended to, the
  folder's flags compared). With nothing to resume it is refused and nothing is renamed or
  deleted: resuming never silently starts from step 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

T = TypeVar("T")


class RunPolicy(NamedTuple):
    """A run's ``resume`` and ``overwrite`` flags, and the decisions they imply."""

    resume: bool = False  # continue the earlier run's files
    overwrite: bool = False  # a fresh run may delete an earlier run's files

    def check(self, *, flags: bool = False, error: type[Exception] = ValueError) -> RunPolicy:
        """Returns the policy if its flags agree.

        Args:
          flags: name them as command-line flags (``--resume``, ``--overwrite``).
          error: the exception raised.

        Raises:
          error: ``resume`` and ``overwrite`` are both set.
        """
        if self.resume and self.overwrite:
            dash = "--" if flags else ""
            raise error(f"{dash}resume and {dash}overwrite contradict each other: choose one.")
        return self

    def to_delete(self, earlier: Sequence[T], refuse: Callable[[], Exception]) -> list[T]:
        """What to delete of an earlier run's files ``earlier`` before this run writes.

        Args:
          earlier: the earlier run's files found (empty: none).
          refuse: the error of a fresh run over them without ``overwrite``.

        Returns:
          ``earlier`` for a fresh run with ``overwrite``; nothing for a resumed run (it continues
          them) or when there are none.

        Raises:
          refuse(): a fresh run finds files and ``overwrite`` is not set.
        """
        if self.resume or not earlier:
            return []
        if not self.overwrite:
            raise refuse()
        return list(earlier)

    def resume_from(self, found: T | None, refuse: Callable[[], Exception]) -> T | None:
        """What a resumed run continues: ``found`` (None for a fresh run).

        Args:
          found: what there is to resume (None or empty: nothing).
          refuse: the error of a resumed run with nothing to resume (nothing is changed).

        Raises:
          refuse(): ``resume`` and nothing found.
        """
        if not self.resume:
            return None
        if not found:
            raise refuse()
        return found

"""The unit of pretraining data: packed windows of token ids with their document structure.

:mod:`lmlab.data.packing` makes them from token shards; an objective
(:class:`lmlab.objectives.base.Objective`) turns them into model inputs and labels.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from lmlab.arguments import tensor_argument
from lmlab.errors import LmlabError


@dataclass
class TokenBatch:
    """Packed windows of token ids, ``[B, T]`` each.

    * ``input_ids`` - documents packed back to back, no padding;
    * ``doc_ids`` - which document of the row each token belongs to (0, 1, 2, ... per row), so
      attention can be kept inside documents (block-diagonal masks);
    * ``position_ids`` - position of each token inside its own document (reset at each start).
    * ``offsets`` - where each token sits in the whole split (token index), when the batch was
      read from a corpus (None otherwise): static masking keys its draws on it, so a token is
      masked the same way in every epoch even though windows shift between epochs.
    """

    input_ids: Tensor
    doc_ids: Tensor
    position_ids: Tensor
    offsets: Tensor | None = None
    #: every row holds one document (no mask to build); known on the host once the batch has been
    #: moved by :meth:`to` from the CPU, so deciding costs no device read. None: not looked at yet.
    single_document: bool | None = None

    def __post_init__(self) -> None:
        """Three ``[B, T]`` integer tensors of one shape (and ``offsets`` too when given), else a
        one-line error (:func:`lmlab.arguments.tensor_argument`): no value is read."""
        shape = tensor_argument(self.input_ids, "TokenBatch's input_ids", dims=2, kind="integer").shape
        for name in ("doc_ids", "position_ids", "offsets"):
            t = getattr(self, name)
            if t is None and name == "offsets":
                continue
            if tensor_argument(t, f"TokenBatch's {name}", dims=2, kind="integer").shape != shape:
                raise LmlabError(f"TokenBatch's {name} has shape {tuple(t.shape)}, its input_ids "
                                 f"{tuple(shape)}", "pass one entry per token")

    def to(self, device, non_blocking: bool = False) -> TokenBatch:
        single = self.single_document
        if single is None and self.doc_ids.device.type == "cpu":
            single = bool((self.doc_ids == self.doc_ids[:, :1]).all())

        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return TokenBatch(move(self.input_ids), move(self.doc_ids), move(self.position_ids),
                          move(self.offsets), single)

    def pin_memory(self) -> TokenBatch:
        """The same batch in page-locked host memory (its copy to a GPU can then overlap compute)."""
        pin = [None if t is None else t.pin_memory()
               for t in (self.input_ids, self.doc_ids, self.position_ids, self.offsets)]
        return TokenBatch(*pin, self.single_document)

    def is_single_document(self) -> bool:
        """Every row holds a single document (read on the device only when not known already)."""
        if self.single_document is None:
            return bool((self.doc_ids == self.doc_ids[:, :1]).all())
        return self.single_document

    def same_document(self) -> Tensor:
        """Boolean ``[B, T, T]``: True where query and key tokens are in the same document."""
        return self.doc_ids[:, :, None] == self.doc_ids[:, None, :]

    @property
    def num_tokens(self) -> int:
        return self.input_ids.numel()

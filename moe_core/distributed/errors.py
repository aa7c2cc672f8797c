"""What expert parallelism does not build yet, refused by name instead of run wrongly."""

from __future__ import annotations


class RedundantExpertsError(NotImplementedError):
    """A placement with more physical expert slots than logical experts (EPLB-style redundant copies).

    Running it needs a logical-to-physical map and a replica choice per token
    in the dispatchers; until they exist such a placement is refused.
    """


class GraphCaptureError(RuntimeError):
    """A dispatcher that reads sizes back to the host was called while a CUDA graph is being captured.

    Uneven all-to-all (and the all-gather of uneven token counts) learn their
    split sizes at run time, so a captured graph would replay stale sizes.
    """

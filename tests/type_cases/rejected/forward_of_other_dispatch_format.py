"""A forward written for another dispatch format than its dispatcher delivers: the layer's format parameter refuses it."""

import attrs
import torch

from moe_core import MoeRunnerConfig
from moe_core.distributed import ExpertParallelMoe, LocalDispatcher


@attrs.frozen(eq=False)
class ExpertSortedRows:
    """Rows grouped by expert with each expert's row count, as a grouped-GEMM kernel takes them (a later format)."""

    hidden_states: torch.Tensor
    rows_per_expert: torch.Tensor


def grouped_gemm_forward(dispatch: ExpertSortedRows) -> torch.Tensor:
    return dispatch.hidden_states


def build_layer(config: MoeRunnerConfig) -> None:
    ExpertParallelMoe(LocalDispatcher(), grouped_gemm_forward, config=config)  # expect: [arg-type] Argument 2 to "ExpertParallelMoe" has incompatible type "Callable[[ExpertSortedRows], Tensor]"; expected "Callable[[StandardDispatchOutput], Tensor]"

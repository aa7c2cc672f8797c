"""A runner of bf16 rows behind a dispatcher that quantizes each token to FP8 before the exchange: the layer's format
parameter refuses it (the rows arrive as codes and scales, which a ``DispatchOutput`` runner would never see)."""

import torch
import torch.distributed as dist

from moe_core import DenseMoeWeights, MoeRunnerConfig, StandardDispatchOutput, create_runner
from moe_core.backends.reference import REFERENCE_DENSE
from moe_core.distributed import ExpertParallelMoe, ExpertPlacement, Fp8TokenQuantizer, QuantizedAllToAllDispatcher


def build_layer(group: dist.ProcessGroup, config: MoeRunnerConfig, weights: DenseMoeWeights) -> None:
    placement = ExpertPlacement(config.num_experts, group.size())
    dispatcher = QuantizedAllToAllDispatcher(group, placement, Fp8TokenQuantizer())
    runner = create_runner(REFERENCE_DENSE, dispatcher.runner_config(config))

    def bf16_forward(dispatch: StandardDispatchOutput) -> torch.Tensor:
        return runner.run(dispatch, weights)

    ExpertParallelMoe(dispatcher, bf16_forward, config=config)  # expect: [arg-type] Argument 2 to "ExpertParallelMoe" has incompatible type "Callable[[StandardDispatchOutput], Tensor]"; expected "Callable[[Fp8SlotRows], Tensor]"

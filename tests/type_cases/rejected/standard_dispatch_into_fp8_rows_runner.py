"""Unquantized slot rows handed to the runner of rows quantized before the exchange: it would skip their quantization."""

from moe_core import Fp8ChannelMoeWeights, StandardDispatchOutput
from moe_core.distributed import Fp8RowsReferenceRunner


def run(runner: Fp8RowsReferenceRunner, dispatch: StandardDispatchOutput, weights: Fp8ChannelMoeWeights) -> None:
    runner.run(dispatch, weights)  # expect: [arg-type] Argument 1 to "run" of "Fp8RowsReferenceRunner" has incompatible type "StandardDispatchOutput"; expected "Fp8SlotRows"

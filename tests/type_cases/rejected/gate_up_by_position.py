"""Gate and up halves (and their scales) given by position: same types, so which is which is the caller's guess;
every gate/up pair is keyword-only."""

from moe_core.fp8 import ExpertFp8Scales, Fp8ChannelScales, Fp8ExpertWeights, Fp8GateUpWeights
from moe_core.nvfp4 import Nvfp4ExpertWeights, Nvfp4GateUpWeights


def halves(up: Nvfp4ExpertWeights, gate: Nvfp4ExpertWeights) -> Nvfp4GateUpWeights:
    return Nvfp4GateUpWeights(up, gate)  # expect: [call-arg] Too many positional arguments for "Nvfp4GateUpWeights"


def fp8_halves(up: Fp8ExpertWeights, gate: Fp8ExpertWeights) -> Fp8GateUpWeights:
    return Fp8GateUpWeights(up, gate)  # expect: [call-arg] Too many positional arguments for "Fp8GateUpWeights"


def channel_scales(up: ExpertFp8Scales, gate: ExpertFp8Scales) -> Fp8ChannelScales:
    return Fp8ChannelScales.from_halves(up, gate, 64)  # expect: [call-arg] Too many positional arguments for "from_halves" of "Fp8ChannelScales"

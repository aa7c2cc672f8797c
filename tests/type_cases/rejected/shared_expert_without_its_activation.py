"""A shared expert names its activation: a model's shared expert may compute another than its routed experts (Step
3.7 limits them apart), so there is no default to stand in for the one it has."""

import torch

from moe_core import SharedExpert

FORGOTTEN = SharedExpert(w13=torch.zeros(8, 4), w2=torch.zeros(4, 4))  # expect: [call-arg] Missing named argument "activation" for "SharedExpert"
AS_TEXT = SharedExpert(w13=torch.zeros(8, 4), w2=torch.zeros(4, 4), activation="silu")  # expect: [arg-type] Argument "activation" to "SharedExpert" has incompatible type "str"; expected "Activation | ClampedSwiglu | LimitedSwiglu"

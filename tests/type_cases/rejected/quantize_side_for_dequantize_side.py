"""A quantize-side scale where a dequantize-side one is expected."""

from moe_core import QuantizeGlobalScale


def from_modelopt(weight_scale_2: QuantizeGlobalScale) -> QuantizeGlobalScale:
    return QuantizeGlobalScale.from_dequantize(weight_scale_2)  # expect: [arg-type] Argument 1 to "from_dequantize" of "QuantizeGlobalScale" has incompatible type "QuantizeGlobalScale"; expected "DequantizeGlobalScale"

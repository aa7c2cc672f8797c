"""Quantization schemes (one module each): they build a backend's quant info
once after weight loading and delegate the forward pass to its runner."""

"""Pure-PyTorch models of the FlashInfer functions the FlashInfer backends call, for CPU tests of the adapters."""

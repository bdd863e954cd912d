"""INT8 power-of-two post-training quantizer with vai_q semantics (ONNX / PyTorch in; xmodel, QDQ ONNX, goldens out)."""

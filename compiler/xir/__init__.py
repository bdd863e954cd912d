"""XIR graph IR and .xmodel (protobuf) I/O shared by quant, compiler and runtime."""

"""Dtype names as PyTorch's C++ messages print them (the refusals of ops/blas.py,
ops/convolution.py and ops/losses.py say what the CUDA kernels say)."""
from __future__ import annotations

# C++'s names of dtypes, as the kernels' messages print them.
_CPP_DTYPE = {"float32": "float", "float64": "double", "float16": "c10::Half", "bfloat16": "c10::BFloat16",
              "int32": "int", "int64": "long int", "int16": "short int", "int8": "signed char", "uint8": "unsigned char"}
# ScalarType names (toString), as AT_DISPATCH's "not implemented for" prints them.
_SCALAR_TYPE = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16", "int32": "Int",
                "int16": "Short", "int8": "Char", "bool": "Bool", "uint8": "Byte", "int64": "Long"}

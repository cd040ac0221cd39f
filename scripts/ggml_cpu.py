"""ggml's CPU backend through ctypes (llama.cpp as built into llama-cpp-python 0.3.36): the
shared libraries, `ggml_get_type_traits_cpu` and the function types of its entries
(`ggml/include/ggml-cpu.h`). Used by kquants_golden.py and kquant_speed.py."""
import ctypes
import os

import llama_cpp

LIB = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
base = ctypes.CDLL(os.path.join(LIB, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
cpu = ctypes.CDLL(os.path.join(LIB, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)

Q8_K = 15
# ggml type id and bytes per super-block (the types whose activations are Q8_K).
K_TYPES = {"Q2_K": (10, 84), "Q3_K": (11, 110), "Q4_K": (12, 144), "Q5_K": (13, 176),
           "Q6_K": (14, 210), "IQ4_XS": (23, 136)}

FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                           ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


class TraitsCpu(ctypes.Structure):
    _fields_ = [("from_float", ctypes.c_void_p), ("vec_dot", ctypes.c_void_p),
                ("vec_dot_type", ctypes.c_int), ("nrows", ctypes.c_int64)]


cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TraitsCpu)
cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
cpu.ggml_cpu_init()


def traits(t):
    """`ggml_get_type_traits_cpu(t)`."""
    return cpu.ggml_get_type_traits_cpu(t).contents


def ptr(a):
    """A numpy array's data pointer."""
    return a.ctypes.data_as(ctypes.c_void_p)


def quantize_q8k(x, out):
    """ggml's CPU quantizer for Q8_K (what its matmuls call) on f32 `x` into uint8 `out`."""
    FROM_FLOAT(traits(Q8_K).from_float)(ptr(x), ptr(out), len(x))


def vec_dot(tid):
    """ggml's CPU `vec_dot` of type `tid` (against its `vec_dot_type`)."""
    return VEC_DOT(traits(tid).vec_dot)

#!/usr/bin/env python3
"""Writes the GGUF fuzz seeds next to this file: small valid files with every metadata value
type, arrays, and tensors (made with the `gguf` package), plus truncated copies. They are
named .bin so that nothing in the repo looks like a model file."""
import os

import numpy as np
import gguf

here = os.path.dirname(os.path.abspath(__file__))
for name, arch in (("seed_llama.bin", "llama"), ("seed_qwen2.bin", "qwen2")):
    w = gguf.GGUFWriter(os.path.join(here, name), arch)
    w.add_uint8("t.u8", 7)
    w.add_int8("t.i8", -7)
    w.add_uint16("t.u16", 700)
    w.add_int16("t.i16", -700)
    w.add_uint32("t.u32", 70000)
    w.add_int32("t.i32", -70000)
    w.add_float32("t.f32", 0.5)
    w.add_uint64("t.u64", 1 << 40)
    w.add_int64("t.i64", -(1 << 40))
    w.add_float64("t.f64", 0.25)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_array("t.arr_str", ["a", "bc", ""])
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_tensor("f32", np.arange(64, dtype=np.float32).reshape(2, 32))
    w.add_tensor("f16", np.ones((1, 32), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = open(os.path.join(here, name), "rb").read()
    with open(os.path.join(here, name.replace(".bin", "_truncated.bin")), "wb") as f:
        f.write(data[: len(data) // 2])

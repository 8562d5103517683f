// cuda_runtime.h for the CUDA simulator (tests/cudasim/cudasim.h has all of it).
#include "tests/cudasim/cudasim.h"

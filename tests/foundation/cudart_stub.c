/* SPDX-License-Identifier: MIT */
/*
 * cudart_stub - an empty library built as libcudart.so.12: driver_probe_cost
 * loads it as PyTorch's CUDA builds load the CUDA runtime at import, long
 * before anything loads the driver (libcuda.so.1).
 */
int wex_cudart_stub;
